"""``while`` loops: plain Python while the test is a Python value, a ``while``
op as soon as it is a graph tensor.
"""

import dis
import functools
import weakref

from ops import control_flow as cf
from ops import tracer
from ops.user_frames import error_at_user_line
from runtime.errors import ConversionError
from runtime.ir import Variable

from .branches import convert_ifelse
from .effects import (Effects, EffectsChanged, is_missing, known_deep, known_slots, merge_slots, remember_deep,
                      remember_slots)
from .for_loops import PythonItemsInGraphLoop, convert_for_test
from .raising import raising_as_op
from .state import (Deeper, LoopFirst, State, Undefined, carried_node, changed_objects, describe, flatten, is_var,
                    loop_init, maybe_unbound, refill, refuse_list_aliases, refuse_object_aliases, tested,
                    unflatten)


def convert_while(test, body, names, return_names=(), counter=None):
    """Equivalent Python::

        while test():
            body()
        return names  # the final values of the loop variables

    As soon as ``test()`` is a graph tensor the loop becomes a ``while`` op
    over the loop variables ``names`` (the body may be traced more than once).
    Names in ``return_names`` may start undefined. A loop over a Python
    sequence of objects that a tensor may end early (``for layer in
    self.layers:`` with a ``break`` a tensor decides) is unrolled instead,
    each remaining iteration a ``cond`` on the test (see ``_guarded``);
    ``counter`` is ``(name, items)`` for a lowered ``for``: the loop variable
    that counts its iterations over ``items``.
    """
    st = State((body,), names)
    tr = tracer.current()
    while True:  # a plain Python loop while the test is a Python value
        mark = tr.mark()
        test_value = test()
        if is_var(test_value):
            tr.rollback(mark)  # the `while` op evaluates its test in its own block
            break
        if not test_value:
            return st.get()
        body()

    snapshot = st.snapshot()
    # Other Python objects the body reaches (`foo.c = i`, `res["a"][0] = i`):
    # each slot it writes is one more loop variable, set after the op.
    effects = Effects((test, body), covered={id(obj) for obj, _ in snapshot[1]})
    slots = known_slots(effects, body.__code__)
    # Paths of the user objects the body rebinds to new ones (`out = model(x)`):
    # carried as their parts (state.changed_objects).
    deep = known_deep(body.__code__)
    # Names of the lists carried as tensor arrays (the others as their items).
    arrays = set(_ARRAYS.get(tr, {}).get(body.__code__, ()))
    as_items_error = None  # what the trace carrying lists as their items raised
    # Return values that start unbound and that the body returns as a
    # container (`return h, c` from inside the loop): name -> its structure.
    returned = {}
    while True:
        fixed = _fixed_lists(names, st.get(), arrays, body)  # (what this trace carries as items)
        try:
            result = _graph_loop(test, body, names, return_names, st, effects, slots, deep, arrays, returned)
            remember_slots(body.__code__, slots)
            remember_deep(body.__code__, deep)
            if arrays:
                _ARRAYS.setdefault(tr, {})[body.__code__] = frozenset(arrays)
            return result
        except EffectsChanged as retry:
            slots = retry.slots
            deep |= set(retry.paths)
        except Deeper as retry:
            deep |= set(retry.paths)
        except _AsArrays as retry:
            arrays |= retry.names
        except PythonItemsInGraphLoop:
            tr.rollback(mark)
            st.restore(snapshot)
            effects.restore()
            return _guarded(test, body, names, return_names, counter, st)
        except ConversionError as exc:
            shape = getattr(exc, "return_structure", None)
            if shape is not None and shape[0] in return_names and shape[0] not in returned and \
                    isinstance(snapshot[0][names.index(shape[0])], Undefined):
                # This loop carried the return value as one placeholder; the
                # body returns a container: carry one placeholder per item.
                returned[shape[0]] = shape[1]
                tr.rollback(mark)
                st.restore(snapshot)
                effects.restore()
                continue
            # The body may use a list as only a tensor array can be used
            # (`ys[i]` with a tensor `i`): trace it again with every list an
            # array, as before lists of fixed length were carried as items.
            # Where that fails too, the first trace's error is the one to
            # show: its cause may have nothing to do with lists (an
            # `isinstance` of a number-or-tensor), and the arrays' own
            # complaint (elements of one rank and dtype) would hide it.
            if not fixed:
                if as_items_error is not None:
                    raise as_items_error from None
                raise
            as_items_error = exc
            arrays |= fixed
        tr.rollback(mark)
        st.restore(snapshot)
        effects.restore()


def _guarded(test, body, names, return_names, counter, st):
    """The loop over the Python sequence ``items`` (``counter`` is ``(name,
    items)``), unrolled: one iteration per item, each ``if test(): body()``
    (a ``cond`` once ``test()`` is a graph tensor, such as ``not broke``).
    What Python runs after a tensor ``break`` runs in no branch taken; the
    other side only advances the counter (as the body's first statement
    does), so it stays a Python int and the items stay Python objects."""
    if counter is None:
        raise error_at_user_line(
            "this loop over a Python sequence of objects became a graph loop (its condition depends on a "
            "tensor); loop over range(len(items)) with a tensor condition inside instead")
    name, items = counter

    def skip():
        st.set((st.get((name,))[0] + 1,), (name,))

    while convert_for_test(items, st.get((name,))[0]):
        test_value = tested(test())
        if not is_var(test_value):
            if not test_value:
                break
            body()
            continue
        convert_ifelse(test_value, body, skip, names, names, return_names)
    return st.get()


# The names each loop carried as tensor arrays when it was last traced, per
# trace and code object: an enclosing construct's retrace (or a conversion
# under another decision) starts from them instead of finding them again.
_ARRAYS = weakref.WeakKeyDictionary()


class _AsArrays(Exception):
    """Trace the loop again carrying the lists of these names as tensor
    arrays: the body changes their length."""

    def __init__(self, names):
        super().__init__(names)
        self.names = set(names)


def _lists_in(value):
    """The Python lists in `value` (itself, or in its dicts and tuples)."""
    if type(value) is list:
        return [value] + [inner for v in value for inner in _lists_in(v)]
    if type(value) is dict or isinstance(value, tuple):
        return [inner for v in (value.values() if type(value) is dict else value) for inner in _lists_in(v)]
    return []


def _fixed_lists(names, start, arrays, body):
    """The names whose lists a loop carries as their items, a leaf each,
    rather than as tensor arrays: a list whose length the body keeps
    (`hs[layer] = cell(x, hs[layer])`) keeps elements of any shape, dtype
    or kind, exactly as eager. Empty lists are appended to, so arrays; a
    body that changes a list's length sends it to `arrays` (`_AsArrays`).
    A body that stores no item anywhere (`ys.append(y)` only) makes no
    such list: its lists are arrays at once, without a trace to find out."""
    if not _stores_items(body.__code__):
        return set()
    return {n for n, v in zip(names, start)
            if n not in arrays and (lists := _lists_in(v)) and all(lists)}


@functools.lru_cache(maxsize=1024)
def _stores_items(code):
    """Whether `code` (or a function defined in it: a converted `if`'s
    branches) stores or deletes an item (`a[i] = v`, `del a[i]`)."""
    return any(i.opname in ("STORE_SUBSCR", "DELETE_SUBSCR", "STORE_SLICE") for i in dis.get_instructions(code)) \
        or any(_stores_items(c) for c in code.co_consts if hasattr(c, "co_code"))


def _graph_loop(test, body, names, return_names, st, effects, slots, deep=frozenset(), arrays=frozenset(),
                returned=None):
    """The ``while`` op over the loop variables ``names``, then the object
    ``slots`` of ``effects`` (see ``effects.py``), each as its leaves;
    lists as their items except those of the names in ``arrays``. An
    unbound return value named in ``returned`` starts as that structure of
    unbound leaves."""
    start = st.get()
    if returned:
        start = [unflatten(iter(lambda v=v: v, None), returned[n]) if n in returned and isinstance(v, Undefined)
                 else v for n, v in zip(names, start)]
        st.set(start)
    fixed = _fixed_lists(names, start, arrays, body)
    carried = _Carried(names, start, effects, slots, deep, fixed)
    leaf_names = carried.leaf_names()
    # (Lists carried as items are refilled: the same list, which other names see.)
    as_arrays = [(n, v) for n, v in zip(names, start) if n not in fixed]
    refuse_list_aliases([n for n, _ in as_arrays], [v for _, v in as_arrays])
    maybe = [n for n, v in zip(names, start)
             if (isinstance(v, Undefined) or maybe_unbound(v)) and n not in return_names]
    carried.start = start = [LoopFirst(n) if n in maybe and isinstance(v, Undefined) else v
                             for n, v in zip(names, start)]
    init = [loop_init(v) for v in carried.pack(start)]

    # Each trace of the test or the body (cf.while_loop traces the body again
    # when a shape relaxes or a list becomes a tensor array) starts from the
    # objects as they were before the loop: a slot an earlier trace wrote and
    # that is not (yet) carried must not hand that trace's values to this one.
    def cond_fn(*leaves):
        effects.restore()
        st.set(carried.unpack(leaves))
        return test()

    def body_fn(*leaves):
        effects.restore()
        st.set(carried.unpack(leaves))
        if isinstance(raising_as_op(body)(), cf.Unreachable):
            # The body raises on every path (`raise`, `[1, 2, 3][4]`): a `raise`
            # op that a run reaches only when it takes a trip; no trip ends.
            return list(leaves)
        return carried.pack(st.get())

    # A name the body first assigns (`for row in x: v = row * 2`), or one
    # that an earlier graph loop first assigned, is bound after the loop when
    # a run bound it: a flag per name carried with the loop says so, and a
    # read while it is False raises UnboundLocalError (see `convert_load`).
    if maybe:
        maybe_leaves = [(leaf_names.index(n), n) for n in maybe]  # (an undefined start is one leaf)
        flags = [start[names.index(n)].unbound_unless if maybe_unbound(start[names.index(n)]) else False
                 for n in maybe]
        cond_fn, body_fn, init = _with_bound_flags(cond_fn, body_fn, init, maybe_leaves, flags)
        leaf_names += [f"{n}@bound" for n in maybe]
    final = cf.while_loop(cond_fn, body_fn, init, names=tuple(leaf_names), return_names=tuple(return_names),
                          maybe_undefined=tuple(n for n in maybe if isinstance(start[names.index(n)], Undefined)))
    effects.restore()
    if maybe:
        final, bound = final[:-len(maybe)], final[-len(maybe):]
    st.set(carried.unpack(final))
    for name, value in zip(names, st.get()):
        if name in maybe and isinstance(value, Variable):
            value.unbound_unless, value.unbound_unless_name = bound[maybe.index(name)], name
    return st.get()


class _Carried:
    """How a graph loop carries its variables ``names`` and the object
    ``slots`` of ``effects`` as the ``while`` op's leaves. A dict or tuple
    the loop carries is carried as its leaves (a dict changed in place stays
    the same dict, as in eager); its keys and length must stay. So is a user
    object at a path in `deep`, one the body replaces with a new one of its
    class (`out = model(x)`): its class and structure must stay. So are the
    lists of the names in `fixed` (`_fixed_lists`); other lists are tensor
    arrays."""

    def __init__(self, names, start, effects, slots, deep, fixed=frozenset()):
        self.names, self.start, self.effects, self.slots, self.deep = names, start, effects, slots, deep
        self.fixed = fixed
        refuse_object_aliases([(n, v) for n, v in zip(names, start) if (n,) in deep and carried_node(v) is not None],
                              effects)
        # Each variable's flattening spec (None: carried as one leaf), each slot's.
        self.layout = [flatten(v, n in fixed, deep, (n,))[1]
                       if type(v) in (dict, tuple) or (n,) in deep or n in fixed else None
                       for n, v in zip(names, start)]
        slot_start = [slot.get() for slot in slots]
        for slot, value in zip(slots, slot_start):
            if is_missing(value):
                raise error_at_user_line(
                    f"{slot.name!r} is first set inside this loop on a tensor; a loop variable needs a value "
                    "before the loop: set it before the loop")
        self.slot_start = slot_start
        self.slot_layout = [flatten(v)[1] for v in slot_start]

    def leaf_names(self):
        """The while op's name of each leaf (of the values before the loop):
        the variables', then the slots'."""
        names = [n for n, v, spec in zip(self.names, self.start, self.layout)
                 for _ in (flatten(v, n in self.fixed, self.deep, (n,))[0] if spec is not None else [v])]
        return names + [slot.name for slot, v in zip(self.slots, self.slot_start) for _ in flatten(v)[0]]

    def unpack(self, leaves):
        """The variables' values from the op's `leaves` (a dict or list from
        before the loop refilled: `refill`); the slots set to theirs."""
        it = iter(leaves)
        values = [next(it) if spec is None else refill(old, unflatten(it, spec))
                  for old, spec in zip(self.start, self.layout)]
        for slot, spec in zip(self.slots, self.slot_layout):
            slot.set(unflatten(it, spec))
        return values

    def pack(self, values):
        """The op's leaves for the variables' `values` and the slots' values
        now. Raises for a retry (``EffectsChanged``, ``Deeper``) where the
        body wrote a slot not carried or replaced an object not taken apart,
        and where a value's structure is not the one it had before the loop."""
        found = merge_slots(self.slots, self.effects.written())
        replaced = [p for name, old, value in zip(self.names, self.start, values)
                    for p in changed_objects(old, value, self.deep, (name,), lists=name in self.fixed)
                    if p not in self.deep]
        if len(found) > len(self.slots):
            raise EffectsChanged(found, replaced)
        if replaced:
            raise Deeper(replaced)
        leaves = []
        for name, value, spec in zip(self.names, values, self.layout):
            if spec is None:
                leaves.append(value)
                continue
            flat, now = flatten(value, name in self.fixed, self.deep, (name,))
            if now != spec and name in self.fixed:
                raise _AsArrays({name})
            if now != spec:
                raise error_at_user_line(
                    f"loop variable {name!r} is a {describe(spec)} before the loop but a {describe(now)} after "
                    "one iteration; a loop over a tensor condition cannot change the length or keys of a "
                    "Python tuple or dict: build it before the loop with every entry it will have")
            leaves += flat
        return leaves + self._slot_leaves()

    def _slot_leaves(self):
        """The op's leaves for the slots' values now; their structure must be
        the one they had before the loop."""
        leaves = []
        for slot, spec in zip(self.slots, self.slot_layout):
            flat, now = flatten(slot.get())
            if now != spec:
                raise error_at_user_line(
                    f"{slot.name!r} is a {describe(spec)} before the loop but a {describe(now)} after one "
                    "iteration; a loop over a tensor condition cannot change the length or keys of a Python "
                    "list, tuple or dict it does not carry by name: build it before the loop with every entry")
            leaves += flat
        return leaves


def _with_bound_flags(cond_fn, body_fn, init, maybe_leaves, flags):
    """The loop functions with one more loop variable per name that may be
    unbound (`maybe_leaves`: (leaf index, name)), starting as `flags` (False
    for a name the loop first assigns, the flag of one an earlier loop did):
    whether the name is bound. Inside the loop a read checks it; after each
    trip it is True where the body bound the name, the flag of the value the
    body left otherwise (not assigned, or assigned on one path of an `if`:
    `convert_ifelse` carries that flag)."""
    n = len(maybe_leaves)

    def mark(leaves):
        for (i, name), flag in zip(maybe_leaves, leaves[-n:]):
            if isinstance(leaves[i], Variable):
                leaves[i].unbound_unless, leaves[i].unbound_unless_name = flag, name

    def cond_with_flags(*leaves):
        mark(leaves)
        return cond_fn(*leaves[:-n])

    def body_with_flags(*leaves):
        mark(leaves)
        out = list(body_fn(*leaves[:-n]))  # (a body that raises on every trip returns its marked inputs)
        return out + [v.unbound_unless if maybe_unbound(v) else True for v in (out[i] for i, _ in maybe_leaves)]

    return cond_with_flags, body_with_flags, init + [loop_init(f) for f in flags]
