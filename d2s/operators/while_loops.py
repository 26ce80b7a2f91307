"""``while`` loops: plain Python while the test is a Python value, a ``while``
op as soon as it is a graph tensor.
"""

from ops import control_flow as cf
from ops import tracer

from .state import State, is_var, loop_init


def convert_while(test, body, names, return_names=()):
    """Equivalent Python::

        while test():
            body()
        return names  # the final values of the loop variables

    As soon as ``test()`` is a graph tensor the loop becomes a ``while`` op
    over the loop variables ``names`` (the body may be traced more than once).
    Names in ``return_names`` may start undefined.
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

    def cond_fn(*values):
        st.set(values)
        return test()

    def body_fn(*values):
        st.set(values)
        body()
        return list(st.get())

    init = [loop_init(v) for v in st.get()]
    final = cf.while_loop(cond_fn, body_fn, init, names=tuple(names), return_names=tuple(return_names))
    st.set(final)
    return tuple(final)
