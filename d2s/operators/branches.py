"""``if`` / ``else`` and conditional expressions on Python values and on graph tensors.
"""

import contextlib
import dataclasses
import sys
import threading
import weakref

import torch

from ops import control_flow as cf
from ops import tracer
from ops.user_frames import error_at_user_line
from runtime.errors import ConversionError
from runtime.ir import TENSOR_ARRAY, Variable

from .effects import (Effects, EffectsChanged, is_missing, known_deep, known_slots, merge_slots, remember_deep,
                      remember_slots)
from .raising import raising_as_op
from .state import (Deeper, LoopFirst, State, Undefined, changed_objects, describe, flatten, is_var,
                    local_object_paths, loop_init, maybe_unbound, object_alias, refill, refuse_dropped,
                    refuse_list_aliases, tested, unflatten)
from .unbound_names import FIRST_BOUND, MaybeUnbound, bound_flag, find_unbound, keep_unbound_flag, side_kind


def convert_ifelse(pred, true_fn, false_fn, state, outputs, return_names=(), return_flags=(), lines=(),
                   jump=None, jump_flags=(), exits=(False, False)):
    """Equivalent Python::

        if pred:
            true_fn()
        else:
            false_fn()
        return state  # the current values of the names in `state`

    With a graph ``pred`` both branches are traced into a ``cond`` op (the
    ``state`` names are restored before each) and the outputs become the
    op's results (the other ``state`` names keep their values from before
    the ``if``, which the branches may have read). A name need only be defined on the paths that reach its
    use: names in ``return_names`` (the lowered return value) may be
    undefined on one side, and so may every name on a side that has
    returned (a flag in ``return_flags`` is True there). A branch that raises
    while it is traced (a ``raise``, a failed ``assert``, an ``IndexError``)
    becomes a ``raise`` op that raises the same exception when the program
    runs and takes that branch. ``lines`` gives, for each output, the user's
    lines where the true and the false branch first assign it (None: not
    assigned), for the messages of ``cond``; ``jump`` is ``(kind, line,
    live)`` when this ``if`` is the guard that ``break``/``continue`` lowering
    put around the statements after a jump (messages then name the jump, and
    its false side, the path that jumped, need only define the names in
    ``live``); ``jump_flags`` pairs each jump flag among the outputs with the
    names a path may still read once that flag is True. ``exits`` says which
    sides never fall through in the user's code (every path returns, raises,
    breaks or continues): when their flags are tensors (a `break` under a
    tensor `if`, then a `return`), such a side need only define what the
    jumps it may take can still read.
    """
    st = State((true_fn, false_fn), state)
    pred = tested(pred)
    if not is_var(pred):
        taken = true_fn if pred else false_fn
        if _ran_to_an_exit(taken) or exits[0 if pred else 1]:
            _mark_exit(sys._getframe(1).f_code)
        return st.get()
    before = st.snapshot()
    site = _IfSite(st, before, tuple(outputs), tuple(return_names), return_flags,
                   dict(zip(outputs, lines or ())), jump, jump_flags, true_fn.__code__,
                   Effects((true_fn, false_fn), covered={id(obj) for obj, _ in before[1]}))
    merged, trace = _trace_cond(pred, site, ((true_fn, "true", exits[0]), (false_fn, "false", exits[1])))
    return _after_cond(site, trace, merged)


@dataclasses.dataclass(eq=False)
class _IfSite:
    """One `if` on a graph tensor: what every trace of its two sides shares
    (the facts of the call site, the state before the `if`), and what the
    retries of `_trace_cond` learned to carry or take apart (each retry
    traces both sides again from `before`)."""
    st: State
    before: tuple  # st.snapshot() before the `if`
    outputs: tuple  # the names a later read sees (without `extra`)
    return_names: tuple
    return_flags: tuple
    lines: dict  # output -> the user's lines where each side first assigns it
    jump: tuple  # (kind, line, live) or None: see `convert_ifelse`
    jump_flags: tuple
    code: object  # the true branch's code: the key of what earlier traces learned
    effects: Effects
    # Set by __post_init__ (the last five grown by `learn`):
    tr: object = dataclasses.field(init=False)  # the tracer
    old: dict = dataclasses.field(init=False)  # state name -> its value before the `if`
    existed: tuple = dataclasses.field(init=False)  # `_held_elsewhere`, `local_object_paths`
    extra: list = dataclasses.field(init=False)
    slots: list = dataclasses.field(init=False)
    deep: set = dataclasses.field(init=False)
    arrays: set = dataclasses.field(init=False)
    first_bound: set = dataclasses.field(init=False)

    def __post_init__(self):
        self.tr = tr = tracer.current()
        # Outputs carried as one tensor array: a list that a tensor loop in one
        # branch turned into an array is turned into one in the other branch too.
        self.arrays = set()
        # A list or dict the branches change in place that no later code reads by its
        # name may still be read through another name bound to it (`alias = ys`): it
        # is an output too, unless the branches leave it different shapes (then it is
        # dropped: one program cannot hold both, and its own name is not read again).
        self.extra = [n for n, v in zip(self.st.names, self.before[0])
                      if n not in self.outputs and type(v) in (list, dict)]
        # The structure (a tuple, a list, ...) the false side gives a name the
        # true side leaves unbound: the true side's Undefined takes it, so the
        # op's leaves line up whichever side it is converted for (`_Shaped`).
        self.unbound_specs = {}
        # Other Python objects the branches reach (`res["a"][0] = 2`, `foo.c = y`):
        # each slot a branch writes is one more output, set after the op.
        self.slots = known_slots(self.effects, self.code)
        self.old = dict(zip(self.st.names, self.before[0]))
        # Paths of user objects the branches bind to different ones (`out = model(x)`
        # on one side): carried as their parts (state.changed_objects).
        self.deep = known_deep(self.code)
        # Objects that existed before the `if`: one that another name or a
        # container also holds is never taken apart (`_held_elsewhere`); and the
        # blocks whose values the code after the `if` sees.
        self.existed = ({id(v) for v in self.before[0]} | {id(obj) for _, obj, _, _ in self.effects.saved},
                        self.effects, _visible_blocks(tr.block))
        # Names a side leaves unbound, or maybe unbound (a tensor loop or `if` in
        # it first assigned them), where a later read sees them (`find_unbound`).
        self.first_bound = set(FIRST_BOUND.get(tr, {}).get(self.code, ()))
        # The lists an earlier trace of this `if` (in this conversion) carried as
        # tensor arrays: an enclosing `if` or loop traces it again for each of its
        # own retries, and relearning them each time made nested `if`s cost
        # 2**depth traces (fuzz nov26f program 713).
        # (The trace that learned them refused the lists' other names.)
        outs = self.outputs + tuple(self.extra)
        self.arrays = {outs.index(n) for n in _ARRAYS.get(tr, {}).get(self.code, ()) if n in outs}

    def learn(self, retry, outs):
        """Take in what a trace's `retry` (an exception `_trace_cond` retries
        on) found to carry: slots, objects to take apart, tensor arrays, an
        extra output to drop, names to carry with a bound flag. `outs`: the
        outputs of that trace."""
        if isinstance(retry, (EffectsChanged, Deeper)):
            self.st.restore(self.before)
            self.effects.restore()
            if isinstance(retry, EffectsChanged):
                self.slots = retry.slots
            self.deep |= set(retry.paths)
        elif isinstance(retry, _AsArrays):
            grown = [outs[k] for k in retry.outputs if outs[k] in self.old]
            refuse_list_aliases(grown, [self.old[n] for n in grown])
            self.arrays |= retry.outputs
            _ARRAYS.setdefault(self.tr, {})[self.code] = frozenset(outs[k] for k in self.arrays)
        elif isinstance(retry, _Drop):
            refuse_dropped(retry.name, self.old[retry.name])
            self.extra.remove(retry.name)
        elif isinstance(retry, _Shaped):
            self.unbound_specs.update(retry.specs)
        else:
            self.first_bound |= retry.names


def _visible_blocks(block):
    """The indices of `block` and the blocks around it: the blocks whose
    values the code after an `if` traced in `block` sees."""
    visible = set()
    while block is not None:
        visible.add(block.idx)
        block = block.program.blocks[block.parent_idx] if block.parent_idx >= 0 else None
    return visible


class _Trace:
    """What one trace of both sides of an `if` collects for the op and the
    merge after it, per side ("true", "false"): the values of the outputs
    (`seen`), their flattening specs (`specs`; the slots' in `slot_specs`),
    the indices of the lists of tensors (`tensor_lists`), how each side
    leaves each output (`kinds`, `_kind`); and the op's names of the leaves
    (`leaf_names`), the slots the sides wrote (`written`)."""

    def __init__(self, site):
        self.outs = site.outputs + tuple(site.extra)
        # Names that may be unbound after the `if`: first assigned in an
        # earlier graph loop (bound only when it ran), or found so by
        # `find_unbound`; each also carries, as one more output, whether it is bound.
        self.flagged = [k for k, name in enumerate(self.outs) if name in site.first_bound or (
            name in site.old and (maybe_unbound(site.old[name]) or isinstance(site.old[name], LoopFirst)))]
        self.seen, self.specs, self.leaf_names, self.tensor_lists = {}, {}, [], {}
        self.slot_specs, self.written, self.kinds = {}, [], {}

    def names_leaves(self, side):
        """Whether the leaves of `side` give the op's leaf names: the true
        side's do, the false side's where the true side raised (no specs)."""
        return side == "true" or "true" not in self.specs


def _trace_cond(pred, site, sides):
    """The `cond` op of the `if` over `sides` ((branch function, "true" or
    "false", whether it never falls through) each), traced again from the
    state before the `if` while a trace finds more to carry (`_IfSite.learn`);
    -> (the op's outputs, the trace that made it)."""
    tr = site.tr
    while True:
        mark = tr.mark()
        trace = _Trace(site)
        branches = [_branch(site, trace, fn, side, exited) for fn, side, exited in sides]
        try:
            # (Outputs that may be dropped are dropped before one side is converted.)
            merged = cf.cond(pred, *branches, names=trace.leaf_names, return_names=site.return_names,
                             lines=site.lines, jump=site.jump and site.jump[:2], one_side=not site.extra)
        except (EffectsChanged, Deeper, _AsArrays, _Drop, _Shaped, MaybeUnbound) as retry:
            tr.rollback(mark)
            site.learn(retry, trace.outs)
            continue
        except ConversionError:
            if not site.extra:
                raise
            # The containers read by no later name may be what the op cannot
            # merge (elements of other dtypes): without them, as before.
            tr.rollback(mark)
            site.extra = []
            continue
        return merged, trace


def _after_cond(site, trace, merged):
    """Bind the outputs to the op's outputs `merged` (and set the slots),
    keeping what this trace learned for the next trace of the same `if`;
    -> the state's values after the `if`."""
    st, old, outs = site.st, site.old, trace.outs
    st.restore(site.before)
    site.effects.restore()
    remember_slots(site.code, site.slots)
    remember_deep(site.code, site.deep)
    if site.first_bound:
        FIRST_BOUND.setdefault(site.tr, {})[site.code] = frozenset(site.first_bound)
    if isinstance(merged, cf.Unreachable):  # both branches raise: nothing after the `if` runs
        return st.get()
    leaves = iter(merged)
    merged = [_one_undefined(unflatten(leaves, spec)) for spec in trace.specs.get("true", trace.specs.get("false"))]
    for slot, spec in zip(site.slots, trace.slot_specs.get("true", trace.slot_specs.get("false", ()))):
        slot.set(unflatten(leaves, spec))
    sides = trace.seen.values()  # (each side's values: a side that raised has none)
    for k in trace.flagged:
        keep_unbound_flag(outs[k], old[outs[k]], [values[k] for values in sides], merged, k, next(leaves))
    # A list or dict both branches changed in place (rather than rebinding its name) is
    # changed in place here too: other names bound to it see the change, as in eager.
    for k, name in enumerate(outs):
        if name in old and all(values[k] is old[name] for values in sides):
            merged[k] = refill(old[name], merged[k])
    st.set(merged, outs)
    return st.get()


def _one_undefined(value):
    """A container whose every leaf is one Undefined (a name unbound on the
    side the `if` was converted for, given the other side's structure) as
    that Undefined; any other value as it is."""
    leaves = [value]
    found = None
    while leaves:
        leaf = leaves.pop()
        if isinstance(leaf, (tuple, list)):
            leaves += list(leaf)
        elif isinstance(leaf, dict):
            leaves += list(leaf.values())
        elif isinstance(leaf, Undefined) and (found is None or leaf is found):
            found = leaf
        else:
            return value
    return value if found is None else found


_LOCAL = threading.local()


def _exit_marks():
    """The branch functions being run in this thread, innermost last, each
    with whether an `if` on a Python value in it took an arm that never
    falls through."""
    marks = getattr(_LOCAL, "exit_marks", None)
    if marks is None:
        marks = _LOCAL.exit_marks = []
    return marks


@contextlib.contextmanager
def _exit_scope(fn):
    """While `fn` runs: its entry of `_exit_marks`, `[code, exited]`."""
    marks = _exit_marks()
    entry = [getattr(fn, "__code__", None), False]
    marks.append(entry)
    try:
        yield entry
    finally:
        marks.pop()


def _ran_to_an_exit(fn):
    """Run `fn` (an arm an `if` on a Python value takes); whether it took an
    arm that never falls through of an `if` on a Python value in it."""
    with _exit_scope(fn) as entry:
        fn()
    return entry[1]


def _mark_exit(code):
    """An arm that never falls through (every path returns, raises, breaks or
    continues) was taken by an `if` on a Python value in the function `code`:
    the branch function running `code` falls through on no path either (the
    arm of an `elif` chain that the Python value picks returns, where other
    arms would not). Only for the function itself: an exit inside a loop body
    (another function) ends the iteration, not the branch."""
    marks = _exit_marks()
    if marks and marks[-1][0] is code:
        marks[-1][1] = True


def _branch(site, trace, fn, side, exited):
    """The function `cf.cond` traces for one side: run the branch `fn` from
    the state before the `if`, then return its outputs flattened (tuples and
    lists are flattened: the op merges their elements), except the outputs in
    `site.arrays`, which are tensor arrays; then the objects' slots
    (`site.slots`), then, for each output `trace.flagged` (one that may be
    unbound after the `if`), whether it is bound. A value no later use can
    see (the branch returned, or it is the return value and undefined) is
    `Unreachable`; a branch that raises yields one `Unreachable` for all its
    values. The false side, traced second, compares the two sides and raises
    for a retry (`_IfSite.learn`) where they need more carried: a slot written
    that is not among the slots (``EffectsChanged``), objects to take apart
    (``Deeper``), lists to carry as tensor arrays, names to flag
    (`find_unbound`). `exited`: the side never falls through in the user's
    code."""

    def run():
        nonlocal exited
        result, prior, values, ran_to_an_exit = _run_side(site, trace, fn)
        exited = ran_to_an_exit or exited
        raised = isinstance(result, cf.Unreachable)
        replaced = _replaced_objects(site, trace, side, values, raised)
        if side == "false":
            found = merge_slots(site.slots, trace.written)
            if len(found) > len(site.slots):
                raise EffectsChanged(found, replaced)
        if raised:
            if replaced:
                raise Deeper(replaced)
            if side == "false":
                find_unbound(site, trace)
            return cf.Unreachable(side)
        trace.seen[side] = values
        trace.tensor_lists[side] = _tensor_lists(values)
        if side == "false":
            became_arrays = _lists_become_arrays(trace.seen, site.arrays)
            if became_arrays:
                raise _AsArrays(became_arrays)
            if replaced:
                raise Deeper(replaced)
        leaves = _output_leaves(site, trace, side, values, exited)
        leaves += _slot_leaves(site, trace, side)
        for k in trace.flagged:
            leaves.append(bound_flag(values[k], prior[k]))
            if trace.names_leaves(side):
                trace.leaf_names.append(trace.outs[k])
        if side == "false":
            _compare_sides(site, trace)
        return tuple(leaves)
    return run


def _run_side(site, trace, fn):
    """Run the branch `fn` from the state before the `if` (a side that
    raises as a `raise` op: `raising_as_op`); -> (its result, the outputs'
    values before it and after it, whether it took an arm that never falls
    through of an `if` on a Python value in it)."""
    site.st.restore(site.before)
    site.effects.restore()
    prior = site.st.get(trace.outs)
    with _exit_scope(fn) as entry:
        result = raising_as_op(fn)()
    if not isinstance(result, cf.Unreachable):  # a side that raises leaves nothing behind
        trace.written.extend(site.effects.written())
    return result, prior, site.st.get(trace.outs), entry[1]


def _replaced_objects(site, trace, side, values, raised):
    """The paths of the user objects, not yet taken apart (`site.deep`), that
    the false side (its `values`; `raised`: it raised on every path) binds
    to other objects than the true side (`state.changed_objects`) or, where
    one side raises on every path, that hold values of the other's own
    block: the `if` is traced again taking them apart (``Deeper``)."""
    outputs, arrays, deep = trace.outs, site.arrays, site.deep
    if side == "false" and "true" in trace.seen and not raised:
        true_values = trace.seen["true"]
        return [p for k, (a, b) in enumerate(zip(true_values, values)) if k not in arrays
                for p in changed_objects(a, b, deep, (outputs[k],)) if p not in deep
                and not _held_elsewhere(p, outputs, (true_values, values), site.existed)]
    if side == "false" and ("true" in trace.seen or not raised):
        # One side raises on every path: the other's values pass as they are,
        # but an object holding values of its own block leaves it as its parts.
        live = trace.seen["true"] if "true" in trace.seen else values
        return [p for k, v in enumerate(live) if k not in arrays
                for p in local_object_paths(v, site.existed[2], (outputs[k],)) if p not in deep]
    return []


def _output_leaves(site, trace, side, values, exited):
    """The op's leaves for the outputs' `values` on `side` (each output's
    flattening spec goes to `trace.specs`, how the side leaves it to
    `trace.kinds`): a value no later read can see is `Unreachable`.
    `exited`: the side never falls through in the user's code."""
    outputs, specs = trace.outs, trace.specs
    returned = any(values[outputs.index(f)] is True for f in site.return_flags)
    still_read = _still_read(site, side, outputs, values, exited and not returned)
    leaves, specs[side] = [], []
    for k, value in enumerate(values):
        if k in site.arrays and type(value) is list:
            value = loop_init(value)
        if isinstance(value, Undefined) and (returned or outputs[k] in site.return_names or isinstance(
                value, LoopFirst) or any(outputs[k] not in live for live in still_read)):
            value = cf.Unreachable(outputs[k])
        trace.kinds.setdefault(side, []).append((side_kind(value), value))
        # (A name that may be unbound after the `if`, unbound on this
        # side: a placeholder, its flag False, `bound_flag`.)
        if isinstance(value, Undefined) and k in trace.flagged:
            value = cf.Unreachable(outputs[k])
        # An unbound name takes the other side's structure, each leaf the
        # Undefined (`_after_cond` makes it one Undefined again).
        other_spec = (specs["true"][k] if side == "false" and "true" in specs
                      else site.unbound_specs.get(outputs[k]) if side == "true" else None)
        if isinstance(value, Undefined) and other_spec is not None:
            value = unflatten(iter(lambda: value, None), other_spec)
        flat, spec = flatten(value, True, site.deep, (outputs[k],))
        leaves += flat
        specs[side].append(spec)
        if trace.names_leaves(side):
            trace.leaf_names.extend([outputs[k]] * len(flat))
    return leaves


def _still_read(site, side, outputs, values, exited):
    """The sets of names that a path of `side` which took a break/continue
    may still read (each jump taken narrows them). `exited`: the side never
    falls through in the user's code and no return flag of it is True."""
    still_read = [set(live) for f, live in site.jump_flags if values[outputs.index(f)] is True]
    if side == "false" and site.jump is not None:
        still_read.append(set(site.jump[2]))
    if exited:
        # Every path of this side returned or jumped: it may still be read by
        # the jumps whose flag it may have set (none: it returned).
        still_read.append(set().union(*(live for f, live in site.jump_flags
                                        if values[outputs.index(f)] is not False)))
    return still_read


def _slot_leaves(site, trace, side):
    """The op's leaves for the objects' slots on `side` (their flattening
    specs go to `trace.slot_specs`); a slot must have a value on both sides
    and the same structure."""
    leaves, slot_specs = [], trace.slot_specs
    slot_specs[side] = []
    for i, slot in enumerate(site.slots):
        value = slot.get()
        if is_missing(value):
            raise error_at_user_line(
                f"{slot.name!r} is set in a branch of the `if` on a tensor at this line but has no value on "
                "the other path; set it before the `if` (or in both branches)")
        flat, spec = flatten(value)
        leaves += flat
        slot_specs[side].append(spec)
        if trace.names_leaves(side):
            trace.leaf_names.extend([slot.name] * len(flat))
        if side == "false" and "true" in slot_specs and slot_specs["true"][i] != spec:
            raise error_at_user_line(
                f"{slot.name!r} is a {describe(slot_specs['true'][i])} in the true "
                f"branch but a {describe(spec)} in the false branch of the `if` on a tensor at this line; "
                "a Python list, tuple or dict cannot change its length or keys under a tensor condition")
    return leaves


def _compare_sides(site, trace):
    """Once both sides are traced: raise for a retry where a name needs a
    bound flag (`find_unbound`) or lists of tensors differ in length (carried
    as tensor arrays); raise where the sides leave an output different
    structures (`_structure_error`)."""
    find_unbound(site, trace)
    grown = _lists_of_tensors_that_differ(trace.tensor_lists, trace.specs, site.arrays)
    if grown:
        raise _AsArrays(grown)
    shaped = _shapes_for_unbound(trace)
    if shaped:
        raise _Shaped(shaped)
    structure = _structure_error(trace.specs, trace.outs, site.extra, site.return_names)
    if structure is not None:
        raise structure


def _held_elsewhere(path, outputs, sides, existed):
    """Whether the object a side binds at the top-level `path` existed
    before the `if` and another name or a container holds it too
    (state.object_alias): taken apart, the name would be bound to a rebuilt
    object where eager keeps that one. Such objects stay whole: values no
    op output holds on both paths, a program per side (d2s/decisions.py)."""
    ids, effects, _ = existed
    if len(path) != 1 or effects is None:
        return False
    k = outputs.index(path[0])
    named = [(path[0], values[k]) for values in sides if id(values[k]) in ids]
    return object_alias(named, effects) is not None


class _Drop(Exception):
    """Retry the ``if`` without this extra output (a container no later code reads by name)."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


class _Shaped(Exception):
    """Retry the ``if`` with the true side's unbound names given these structures."""

    def __init__(self, specs):
        super().__init__(specs)
        self.specs = specs


# Per trace, per `if` (the true branch's code): the names of the outputs its
# traces carried as tensor arrays (`_IfSite.__post_init__`).
_ARRAYS = weakref.WeakKeyDictionary()


class _AsArrays(Exception):
    """Retry the ``if`` with these outputs (indices) carried as tensor arrays."""

    def __init__(self, outputs):
        super().__init__(outputs)
        self.outputs = outputs


def _lists_become_arrays(seen, arrays):
    """Outputs that are a Python list in one branch and a tensor array in the other."""
    if "true" not in seen or "false" not in seen:
        return set()
    def kind(value):
        # A SymInt (a run-time size) is a var too, with no `kind`
        array = isinstance(value, Variable) and value.kind == TENSOR_ARRAY
        return "list" if type(value) is list else "array" if array else None
    return {k for k, (a, b) in enumerate(zip(seen["true"], seen["false"]))
            if k not in arrays and {kind(a), kind(b)} == {"list", "array"}}


def _tensor_lists(values):
    """Indices of the values that are Python lists of tensors only."""
    return {k for k, v in enumerate(values)
            if type(v) is list and all(is_var(e) or isinstance(e, torch.Tensor) for e in v)}


def _lists_of_tensors_that_differ(tensor_lists, specs, arrays):
    """Outputs that are lists of tensors of different lengths in the two
    branches (`out.append(t)` in one): carried as tensor arrays."""
    if "true" not in tensor_lists or "true" not in specs:
        return set()
    both = tensor_lists["true"] & tensor_lists["false"]
    return {k for k in both if k not in arrays and specs["true"][k] != specs["false"][k]}


def _shapes_for_unbound(trace):
    """{name: the false side's structure} for the names the true side leaves
    unbound and the false side binds to a container (`_Shaped`)."""
    if "true" not in trace.specs or "false" not in trace.specs or "true" not in trace.kinds:
        return {}
    return {trace.outs[k]: b for k, ((kind, _), a, b) in enumerate(
        zip(trace.kinds["true"], trace.specs["true"], trace.specs["false"])) if kind == "unbound" and a != b}


def _structure_error(specs, outputs, extra=(), return_names=()):
    if "true" not in specs or "false" not in specs:
        return None
    for name, a, b in zip(outputs, specs["true"], specs["false"]):
        if a != b and not (a is None and b is None):
            if name in extra:
                return _Drop(name)
            if name in return_names:
                error = error_at_user_line(
                    f"the value returned is a {describe(a)} on the true side but a {describe(b)} on the "
                    "false side of the `if` on a tensor at this line; a function must return values of one "
                    "structure on every path (a tuple of the same length, a dict with the same keys)")
                # One side a single value, the other a container: inside a
                # loop whose return value starts unbound, that single value
                # is the loop's placeholder, which takes the container's
                # structure when the loop is traced again (while_loops.py).
                if (a is None) != (b is None):
                    error.return_structure = (name, b if a is None else a)
                return error
            return error_at_user_line(
                f"{name!r} is a {describe(a)} in the true branch but a {describe(b)} in the false branch "
                "of the `if` on a tensor at this line; a Python list, tuple or dict cannot change its length "
                "or keys under a tensor condition: build it the same way in both branches, or use a tensor "
                "(torch.cat / torch.stack / torch.where)")
    return None


def convert_ifexp(pred, true_fn, false_fn):
    """``true_fn() if pred else false_fn()``; a ``cond`` op for a graph ``pred``.
    As for an ``if``, a side that raises while it is traced (it reads a name
    no path bound) raises when a run takes it (``raising_as_op``)."""
    pred = tested(pred)
    if not is_var(pred):
        return true_fn() if pred else false_fn()
    return cf.cond(pred, raising_as_op(true_fn), raising_as_op(false_fn))
