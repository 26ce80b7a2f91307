"""Helpers of the tests of names a run may leave unbound (test_loop_first_names,
test_branch_first_names, test_kept_locals): their inputs, eager's outcome, a
program run through the Executor, and the check that a run gives eager's
result or raises eager's UnboundLocalError."""

import pytest
import torch

import d2s

# Inputs taking zero, one and several rows, sums of both signs.
ROWS0 = torch.ones(0, 2)
ROWS1 = torch.ones(1, 2)
ROWS3 = torch.arange(6.0).reshape(3, 2)
NEG3 = -ROWS3
MIXED = torch.tensor([[1.0, 2.0], [-3.0, 0.0]])
ROWS_EVERY = [ROWS0, ROWS1, ROWS3, NEG3, MIXED]


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


def assert_same(got, want):
    """Equal values (tensors, numbers, tuples of them), bit for bit."""
    if isinstance(want, tuple):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for a, b in zip(got, want):
            assert_same(a, b)
        return
    assert torch.equal(torch.as_tensor(got), want), (got, want)


def check_run(run, fn, x):
    """`run(x)` gives what eager `fn(x)` gives, or raises its UnboundLocalError;
    returns whether eager raised it."""
    eager = outcome(fn, x)
    if isinstance(eager, UnboundLocalError):
        name = str(eager).split("'")[1]  # the name eager finds unbound
        with pytest.raises(UnboundLocalError, match=f"cannot access local variable '{name}' where it is not "
                                                    "associated with a value"):
            run(x)
        return True
    assert_same(run(x), eager)
    return False


def check_program(static, fn, x):
    """`check_run` for the declarative call and for its latest program run by
    the Executor; returns whether eager raised UnboundLocalError."""
    check_run(static, fn, x)
    return check_run(lambda v: run_executor(static.program_cache.last, v), fn, x)
