"""Helpers of the tests of names a run may leave unbound (test_loop_first_names,
test_branch_first_names, test_kept_locals): eager's outcome, and a program run
through the Executor."""

import d2s


def outcome(fn, x):
    """`fn(x)`, or the UnboundLocalError eager raises for it."""
    try:
        return fn(x)
    except UnboundLocalError as exc:
        return exc


def run_executor(concrete, x):
    """The ConcreteProgram `concrete` run by the Executor on the one feed `x`."""
    feed = {concrete.inputs[0].name: x}
    out = d2s.Executor().run(concrete.main_program, feed=feed, fetch_list=concrete.fetch_vars,
                             return_numpy=False)
    return out[0] if len(out) == 1 else tuple(out)
