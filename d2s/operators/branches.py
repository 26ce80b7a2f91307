"""``if`` / ``else`` and conditional expressions on Python values and on graph tensors.
"""

import contextlib
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
from .state import (Deeper, LoopFirst, State, Undefined, changed_objects, constant, describe, flatten, is_var,
                    local_object_paths, loop_init, maybe_unbound, object_alias, refill, refuse_list_aliases,
                    unflatten)


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
    if not is_var(pred):
        taken = true_fn if pred else false_fn
        if _ran_to_an_exit(taken) or exits[0 if pred else 1]:
            _mark_exit(sys._getframe(1).f_code)
        return st.get()
    before = st.snapshot()
    tr = tracer.current()
    # Outputs carried as one tensor array: a list that a tensor loop in one
    # branch turned into an array is turned into one in the other branch too.
    arrays = set()
    # A list or dict the branches change in place that no later code reads by its
    # name may still be read through another name bound to it (`alias = ys`): it
    # is an output too, unless the branches leave it different shapes (then it is
    # dropped: one program cannot hold both, and its own name is not read again).
    extra = [n for n, v in zip(state, before[0]) if n not in outputs and type(v) in (list, dict)]
    # Other Python objects the branches reach (`res["a"][0] = 2`, `foo.c = y`):
    # each slot a branch writes is one more output, set after the op.
    effects = Effects((true_fn, false_fn), covered={id(obj) for obj, _ in before[1]})
    slots = known_slots(effects, true_fn.__code__)
    old = dict(zip(state, before[0]))
    # Paths of user objects the branches bind to different ones (`out = model(x)`
    # on one side): carried as their parts (state.changed_objects).
    deep = known_deep(true_fn.__code__)
    # Objects that existed before the `if`: one that another name or a
    # container also holds is never taken apart (`_branch`).
    existed = ({id(v) for v in before[0]} | {id(obj) for _, obj, _, _ in effects.saved}, effects)
    visible, block = set(), tr.block  # the blocks whose values the code after the `if` sees
    while block is not None:
        visible.add(block.idx)
        block = block.program.blocks[block.parent_idx] if block.parent_idx >= 0 else None
    existed += (visible,)
    # Names a side leaves unbound, or maybe unbound (a tensor loop or `if` in
    # it first assigned them), where a later read sees them (`_find_unbound`).
    first_bound = set(_FIRST_BOUND.get(tr, {}).get(true_fn.__code__, ()))
    while True:
        mark = tr.mark()
        outs = tuple(outputs) + tuple(extra)
        # Names that may be unbound after the `if`: first assigned in an
        # earlier graph loop (bound only when it ran), or found so by
        # `_find_unbound`; each also carries, as one more output, whether it is bound.
        flagged = [k for k, name in enumerate(outs) if name in first_bound or (
            name in old and (maybe_unbound(old[name]) or isinstance(old[name], LoopFirst)))]
        seen, specs, leaf_names, tensor_lists = {}, {}, [], {}
        slot_specs, written, kinds = {}, [], {}
        branches = [_branch(st, before, fn, side, outs, arrays, seen, specs, leaf_names,
                            return_names, return_flags, jump, jump_flags, extra, exited, tensor_lists,
                            (effects, slots, slot_specs, written), flagged, deep, existed,
                            (kinds, dict(zip(outputs, lines or ())), first_bound))
                    for fn, side, exited in ((true_fn, "true", exits[0]), (false_fn, "false", exits[1]))]
        try:
            merged = cf.cond(pred, *branches, names=leaf_names, return_names=tuple(return_names),
                             lines=dict(zip(outputs, lines or ())), jump=jump and jump[:2])
        except EffectsChanged as retry:
            tr.rollback(mark)
            st.restore(before)
            effects.restore()
            slots = retry.slots
            deep |= set(retry.paths)
            continue
        except Deeper as retry:
            tr.rollback(mark)
            st.restore(before)
            effects.restore()
            deep |= set(retry.paths)
            continue
        except _AsArrays as retry:
            tr.rollback(mark)
            old = dict(zip(state, before[0]))
            grown = [outs[k] for k in retry.outputs if outs[k] in old]
            refuse_list_aliases(grown, [old[n] for n in grown])
            arrays |= retry.outputs
            continue
        except _Drop as retry:
            tr.rollback(mark)
            extra.remove(retry.name)
            continue
        except _MaybeUnbound as retry:
            tr.rollback(mark)
            first_bound |= retry.names
            continue
        except ConversionError:
            if not extra:
                raise
            # The containers read by no later name may be what the op cannot
            # merge (elements of other dtypes): without them, as before.
            tr.rollback(mark)
            extra = []
            continue
        break
    st.restore(before)
    effects.restore()
    remember_slots(true_fn.__code__, slots)
    remember_deep(true_fn.__code__, deep)
    if first_bound:
        _FIRST_BOUND.setdefault(tr, {})[true_fn.__code__] = frozenset(first_bound)
    if isinstance(merged, cf.Unreachable):  # both branches raise: nothing after the `if` runs
        return st.get()
    leaves = iter(merged)
    merged = [unflatten(leaves, spec) for spec in specs.get("true", specs.get("false"))]
    for slot, spec in zip(slots, slot_specs.get("true", slot_specs.get("false", ()))):
        slot.set(unflatten(leaves, spec))
    for k in flagged:
        _keep_unbound_flag(outs[k], old[outs[k]], [values[k] for values in seen.values()], merged, k, next(leaves))
    # A list or dict both branches changed in place (rather than rebinding its name) is
    # changed in place here too: other names bound to it see the change, as in eager.
    for k, name in enumerate(outs):
        if name in old and all(values[k] is old[name] for values in seen.values()):
            merged[k] = refill(old[name], merged[k])
    st.set(merged, outs)
    return st.get()


def _keep_unbound_flag(name, old, sides, merged, k, flag):
    """A name that may be unbound (first assigned in a graph loop, or on one
    path of this or an earlier `if`: `_find_unbound`) stays that value, with
    its flag, where no branch assigns it; where every branch that reaches
    the merge binds it, it is bound; otherwise (a side leaves it unbound or
    maybe unbound) it is bound after the `if` when the path taken bound it:
    `flag`, the op's output that each side sets (`_bound_flag`), says so
    when the program runs."""
    if all(v is old for v in sides):
        merged[k] = old
    elif isinstance(merged[k], Undefined):
        # The sides that bind it became `decision_failed` checks (values of
        # theirs could not be merged with the other side's, cf.cond): where
        # this program goes on, the name is unbound.
        merged[k] = old if isinstance(old, Undefined) else Undefined(name)
    elif any(isinstance(v, Undefined) or maybe_unbound(v) for v in sides):
        if not isinstance(merged[k], Variable):
            # (A Python value bound on one path only: no op output to flag.)
            raise error_at_user_line(
                f"{name!r} is first assigned inside a loop over a tensor, on one path of this `if` on a tensor, "
                "to a Python value; assign it before the loop, or make it a tensor")
        merged[k].unbound_unless, merged[k].unbound_unless_name = flag, name


def _bound_flag(value, old):
    """Whether the name holding `value` after one side of an `if` is bound,
    as a value of that side: the flag it had before (`old`, not assigned),
    the flag of a value itself maybe unbound (an inner `if` assigned it on
    one path), else True."""
    if isinstance(value, Undefined):  # (not bound yet: the loop's first trip, `LoopFirst`)
        return constant(False)
    if maybe_unbound(value):  # (also `old` itself, left as it was)
        return value.unbound_unless
    return constant(True)


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


def _branch(st, before, fn, side, outputs, arrays, seen, specs, leaf_names, return_names, return_flags,
            jump=None, jump_flags=(), extra=(), exited=False, tensor_lists=None, python_effects=None, flagged=(),
            deep=frozenset(), existed=(frozenset(), None, frozenset()), unbound=({}, {}, set())):
    """The function `cf.cond` traces for one side: run the branch from the
    state `before`, then return its outputs flattened (tuples and lists are
    flattened: the op merges their elements), except the outputs in `arrays`,
    which are tensor arrays. A value no later use can see (the branch
    returned, or it is the return value and undefined) is `Unreachable`; a
    branch that raises yields one `Unreachable` for all its values.
    `python_effects` is ``(effects, slots, slot_specs, written)``: the
    objects' slots carried as outputs after the named ones (each side's
    flattening specs go to `slot_specs`); a slot written that is not among
    `slots` has both sides traced again with it (``EffectsChanged``).
    `flagged`: the outputs that may be unbound after the `if`; whether each
    is bound is one more output, after the slots. `unbound` is ``(kinds,
    lines, first_bound)``: each side's `_kind` of each output go to `kinds`
    (the false side then asks `_find_unbound` which ones need a flag, other
    than the names in `first_bound`); `lines` maps an output to the user's
    lines where each side assigns it."""
    effects, slots, slot_specs, written = python_effects
    kinds, lines, first_bound = unbound

    def run():
        nonlocal exited
        st.restore(before)
        effects.restore()
        prior = st.get(outputs)
        with _exit_scope(fn) as entry:
            result = raising_as_op(fn)()
        exited = entry[1] or exited
        if not isinstance(result, cf.Unreachable):  # a side that raises leaves nothing behind
            written.extend(effects.written())
        values = st.get(outputs)
        replaced = []
        if side == "false" and "true" in seen and not isinstance(result, cf.Unreachable):
            replaced = [p for k, (a, b) in enumerate(zip(seen["true"], values)) if k not in arrays
                        for p in changed_objects(a, b, deep, (outputs[k],)) if p not in deep
                        and not _held_elsewhere(p, outputs, (seen["true"], values), existed)]
        elif side == "false" and ("true" in seen or not isinstance(result, cf.Unreachable)):
            # One side raises on every path: the other's values pass as they are,
            # but an object holding values of its own block leaves it as its parts.
            live = seen["true"] if "true" in seen else values
            replaced = [p for k, v in enumerate(live) if k not in arrays
                        for p in local_object_paths(v, existed[2], (outputs[k],)) if p not in deep]
        if side == "false":
            found = merge_slots(slots, written)
            if len(found) > len(slots):
                raise EffectsChanged(found, replaced)
        if isinstance(result, cf.Unreachable):
            if replaced:
                raise Deeper(replaced)
            if side == "false":
                _find_unbound(kinds, outputs, flagged, first_bound, return_names, lines, jump)
            return cf.Unreachable(side)
        seen[side] = values
        tensor_lists[side] = _tensor_lists(values)
        if side == "false":
            became_arrays = _lists_become_arrays(seen, arrays)
            if became_arrays:
                raise _AsArrays(became_arrays)
            if replaced:
                raise Deeper(replaced)
        returned = any(values[outputs.index(f)] is True for f in return_flags)
        # Names a path that took a break/continue may still read (each jump taken narrows them).
        still_read = [set(live) for f, live in jump_flags if values[outputs.index(f)] is True]
        if side == "false" and jump is not None:
            still_read.append(set(jump[2]))
        if exited and not returned:
            # Every path of this side returned or jumped: it may still be read by
            # the jumps whose flag it may have set (none: it returned).
            still_read.append(set().union(*(live for f, live in jump_flags
                                            if values[outputs.index(f)] is not False)))
        leaves, specs[side] = [], []
        for k, value in enumerate(values):
            if k in arrays and type(value) is list:
                value = loop_init(value)
            if isinstance(value, Undefined) and (returned or outputs[k] in return_names or isinstance(
                    value, LoopFirst) or any(outputs[k] not in live for live in still_read)):
                value = cf.Unreachable(outputs[k])
            kinds.setdefault(side, []).append((_kind(value), value))
            # (A name that may be unbound after the `if`, unbound on this
            # side: a placeholder, its flag False, `_bound_flag`.)
            if isinstance(value, Undefined) and k in flagged:
                value = cf.Unreachable(outputs[k])
            true_spec = specs["true"][k] if side == "false" and "true" in specs else None
            if isinstance(value, Undefined) and true_spec is not None:
                value = unflatten(iter(lambda: value, None), true_spec)
            flat, spec = flatten(value, True, deep, (outputs[k],))
            leaves += flat
            specs[side].append(spec)
            if side == "true" or "true" not in specs:
                leaf_names.extend([outputs[k]] * len(flat))
        slot_specs[side] = []
        for slot in slots:
            value = slot.get()
            if is_missing(value):
                raise error_at_user_line(
                    f"{slot.name!r} is set in a branch of the `if` on a tensor at this line but has no value on "
                    "the other path; set it before the `if` (or in both branches)")
            flat, spec = flatten(value)
            leaves += flat
            slot_specs[side].append(spec)
            if side == "true" or "true" not in specs:
                leaf_names.extend([slot.name] * len(flat))
            if side == "false" and "true" in slot_specs and slot_specs["true"][len(slot_specs[side]) - 1] != spec:
                raise error_at_user_line(
                    f"{slot.name!r} is a {describe(slot_specs['true'][len(slot_specs[side]) - 1])} in the true "
                    f"branch but a {describe(spec)} in the false branch of the `if` on a tensor at this line; "
                    "a Python list, tuple or dict cannot change its length or keys under a tensor condition")
        for k in flagged:
            leaves.append(_bound_flag(values[k], prior[k]))
            if side == "true" or "true" not in specs:
                leaf_names.append(outputs[k])
        if side == "false":
            _find_unbound(kinds, outputs, flagged, first_bound, return_names, lines, jump)
            grown = _lists_of_tensors_that_differ(tensor_lists, specs, arrays)
            if grown:
                raise _AsArrays(grown)
            structure = _structure_error(specs, outputs, extra)
            if structure is not None:
                raise structure
        return tuple(leaves)
    return run


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


def _kind(value):
    """How a side leaves an output: "gone" (no later read sees it: the side
    returned, raised or jumped), "unbound", "maybe" (a tensor loop or `if`
    in the side first assigned it: its flag says whether a run bound it),
    or "bound"."""
    if isinstance(value, cf.Unreachable):
        return "gone"
    if isinstance(value, Undefined):
        return "unbound"
    return "maybe" if maybe_unbound(value) else "bound"


def _find_unbound(kinds, outputs, flagged, first_bound, return_names, lines, jump):
    """Once both sides are traced: raise `_MaybeUnbound` for the outputs not
    yet in `first_bound` that a later read may find unbound (one side binds
    the name, the other does not, or may not), as Python's scoping has it:
    the `if` is traced again with a flag for each (`_bound_flag`), and a
    read raises UnboundLocalError when the program took a path that left it
    unbound (`convert_load`). A value no program output can leave unset on
    some paths (a string, None, a list or tuple) is refused at the user's
    line. Names `flagged` for a loop that first assigned them before the
    `if` are `_keep_unbound_flag`'s; the lowered return value is not a name
    (cf.cond gives it a placeholder where a path has not returned)."""
    sides = [(side, kinds[side]) for side in ("true", "false") if side in kinds]
    found = set()
    for k, name in enumerate(outputs):
        if name in return_names or (k in flagged and name not in first_bound):
            continue
        here = {side: kind[k] for side, kind in sides}
        states = {state for state, _ in here.values()}
        if "maybe" in states or {"unbound", "bound"} <= states:
            for side, (state, value) in here.items():
                if state == "bound" and not _flaggable(value):
                    raise _unflaggable(name, side, value, here, lines, jump)
            found.add(name)
    if found - first_bound:
        raise _MaybeUnbound(found)


def _flaggable(value):
    """Whether a `cond` output can hold `value` with a placeholder on the
    path that leaves the name unbound: a tensor (or tensor array), a size,
    or a Python number (a 0-d tensor in the merge)."""
    if isinstance(value, (bool, int, float)) or isinstance(value, torch.Tensor):
        return True
    return is_var(value)


def _unflaggable(name, side, value, here, lines, jump):
    """The ConversionError for `name`, bound to `value` (not `_flaggable`) by
    `side` and left unbound (or maybe unbound) by the other side."""
    other = "false" if side == "true" else "true"
    why = (f"a name left unbound on one path must hold a tensor or a number on the others, and {name!r} "
           f"holds a value of type `{type(value).__name__}` there")
    if jump is not None and side == "true":
        kind, jump_line = jump[:2]
        return error_at_user_line(
            f"{name!r} is assigned at {_where(lines, name, side)}, after the `{kind}` at line {jump_line} that a "
            f"tensor decides, but not on the path that takes the `{kind}`, and is not defined before it; {why}: "
            "assign it before the loop")
    left = ("not in the {} branch" if here[other][0] == "unbound"
            else "may be left unbound by the {} branch (a loop or `if` on a tensor there binds it on some paths "
            "only)").format(other)
    return error_at_user_line(
        f"{name!r} is assigned in the {side} branch ({_where(lines, name, side)}) but {left} of the `if` on a "
        f"tensor at this line, and is not defined before it; {why}: assign it before the if or in both branches")


def _where(lines, name, side):
    line = lines.get(name, (None, None))[0 if side == "true" else 1]
    return f"line {line}" if line is not None else "its value from before the `if`"


# The names each `if` (by its true branch's code) carried with a flag when it
# was last traced, per trace: an enclosing branch or loop traces it again, and
# starting from them spares it a retry each time (an `elif` chain would
# otherwise trace its last arm 2**length times). A name carried with a flag
# that both sides bind in a later trace is bound after the `if` (its flag
# unused: `_keep_unbound_flag`).
_FIRST_BOUND = weakref.WeakKeyDictionary()


class _MaybeUnbound(Exception):
    """Retry the ``if`` carrying a bound flag for these names (`_find_unbound`)."""

    def __init__(self, names):
        super().__init__(names)
        self.names = names


class _Drop(Exception):
    """Retry the ``if`` without this extra output (a container no later code reads by name)."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


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


def _structure_error(specs, outputs, extra=()):
    if "true" not in specs or "false" not in specs:
        return None
    for name, a, b in zip(outputs, specs["true"], specs["false"]):
        if a != b and not (a is None and b is None):
            if name in extra:
                return _Drop(name)
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
    if not is_var(pred):
        return true_fn() if pred else false_fn()
    return cf.cond(pred, raising_as_op(true_fn), raising_as_op(false_fn))
