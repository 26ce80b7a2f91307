"""``while`` loops: plain Python while the test is a Python value, a ``while``
op as soon as it is a graph tensor.
"""

from ops import control_flow as cf
from ops import tracer
from ops.capture import error_at_user_line

from .branches import convert_ifelse
from .for_loops import PythonItemsInGraphLoop, convert_for_test
from .state import State, describe, flatten, is_var, loop_init, refill, refuse_list_aliases, unflatten


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
    try:
        return _graph_loop(test, body, names, return_names, st)
    except PythonItemsInGraphLoop:
        tr.rollback(mark)
        st.restore(snapshot)
        return _guarded(test, body, names, return_names, counter, st)


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
        test_value = test()
        if not is_var(test_value):
            if not test_value:
                break
            body()
            continue
        convert_ifelse(test_value, body, skip, names, names, return_names)
    return st.get()


def _graph_loop(test, body, names, return_names, st):
    """The ``while`` op over the loop variables ``names``."""
    # A dict or tuple the loop carries is carried as its leaves (a dict changed
    # in place stays the same dict, as in eager); its keys and length must stay.
    start = st.get()
    layout = [flatten(v, lists=False)[1] if type(v) in (dict, tuple) else None for v in start]

    def unpack(leaves):
        it = iter(leaves)
        return [next(it) if spec is None else refill(old, unflatten(it, spec))
                for old, spec in zip(start, layout)]

    def pack(values):
        leaves = []
        for name, value, spec in zip(names, values, layout):
            if spec is None:
                leaves.append(value)
                continue
            flat, now = flatten(value, lists=False)
            if now != spec:
                raise error_at_user_line(
                    f"loop variable {name!r} is a {describe(spec)} before the loop but a {describe(now)} after "
                    "one iteration; a loop over a tensor condition cannot change the length or keys of a "
                    "Python tuple or dict: build it before the loop with every entry it will have")
            leaves += flat
        return leaves

    def cond_fn(*leaves):
        st.set(unpack(leaves))
        return test()

    def body_fn(*leaves):
        st.set(unpack(leaves))
        body()
        return pack(st.get())

    leaf_names = [n for n, v, spec in zip(names, start, layout)
                  for _ in (flatten(v, lists=False)[0] if spec is not None else [v])]
    refuse_list_aliases(names, start)
    init = [loop_init(v) for v in pack(start)]
    final = cf.while_loop(cond_fn, body_fn, init, names=tuple(leaf_names), return_names=tuple(return_names))
    st.set(unpack(final))
    return st.get()
