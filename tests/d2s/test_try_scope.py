"""A `raise`/`assert` a tensor condition decides, inside a user `try` with
handlers: the program has no `except`, so the call would fail where eager
runs the handler. Refused at the raise's line (d2s/transformers/try_scope.py);
what Python raises while tracing is still caught by the handler."""

import pytest
import torch

import d2s
from runtime.errors import ConversionError


def raise_in_tensor_if(x):
    try:
        if x.sum() > 3:
            raise ValueError("big")
        y = x + 1
    except ValueError:
        y = x - 1
    return y


def assert_in_tensor_loop(x):
    try:
        i = torch.tensor(0)
        while i < x.sum():
            assert i < 3, "too many"
            i = i + 1
    except AssertionError:
        i = torch.tensor(-1)
    return x * i


def raise_from_helper(x):
    def check(v):
        if v.max() > 1:
            raise RuntimeError("over")
        return v

    try:
        return check(x)
    except RuntimeError:
        return x * 0


@pytest.mark.parametrize("fn, what", [(raise_in_tensor_if, "raise"), (assert_in_tensor_loop, "assert"),
                                      (raise_from_helper, "raise")])
def test_a_run_time_raise_under_a_handler_is_refused_at_its_line(fn, what):
    for x in (torch.ones(2), 3 * torch.ones(2)):  # eager runs both paths fine
        fn(x)
    with pytest.raises(ConversionError, match=f"this `{what}` happens only when the program runs") as info:
        d2s.declarative(fn)(torch.ones(2))
    assert info.value.filename == __file__


def python_error_caught_while_tracing(x):
    try:
        scale = {"a": 2}["b"]  # a Python KeyError, caught while tracing as eagerly
    except KeyError:
        scale = 3
    if x.sum() > 0:
        return x * scale
    return x - scale


def raise_without_handler(x):
    try:
        if x.sum() > 3:
            raise ValueError("big")
        y = x + 1
    finally:
        z = 1
    return y + z


@pytest.mark.parametrize("fn", [python_error_caught_while_tracing, raise_without_handler])
def test_handlers_of_python_errors_and_try_finally_still_convert(fn):
    static = d2s.declarative(fn)
    for x in (torch.ones(2), -torch.ones(2), 3 * torch.ones(2)):
        try:
            want = fn(x)
        except ValueError as exc:
            with pytest.raises(ValueError, match=str(exc)):
                static(x)
            continue
        assert torch.equal(static(x), want)
    ops = [op.type for op in static.concrete_program.main_program.global_block().ops]
    assert "cond" in ops
