"""The user's code reading torch.is_grad_enabled() / is_inference_mode_enabled()
while traced sees the caller's mode, and the program serves only calls in that
mode (ops/ambient_modes.py): another mode converts again. It used to see the
trace's own mode (gradients always on) and run that branch for every call."""

import pytest
import torch

import d2s
from runtime.errors import ConversionError


def reads_grad_mode(x):
    if x.sum() > 0:  # a tensor branch: a cond op
        y = x * 2
    else:
        y = x - 3
    if torch.is_grad_enabled():
        return y + 1
    return y - 1


def reads_inference_mode(x):
    if x.sum() > 0:
        y = x * 2
    else:
        y = x - 3
    return y + 1 if torch.is_inference_mode_enabled() else y - 1


def reads_inside_no_grad(x):
    with torch.no_grad():
        inner = torch.is_grad_enabled()  # False in every caller's mode
    return x + 1 if inner else x - 1


def never_reads(x):
    with torch.no_grad():  # torch's own no_grad reads the mode: not the user's read
        s = x.sum()
    return x * s


MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode}


def _ops(static):
    return [op.type for op in static.concrete_program.main_program.global_block().ops]


@pytest.mark.parametrize("fn", [reads_grad_mode, reads_inference_mode])
@pytest.mark.parametrize("order", [("grad", "no_grad", "inference", "grad"), ("no_grad", "grad", "no_grad"),
                                   ("inference", "grad", "inference")])
def test_the_users_read_sees_the_callers_mode(fn, order):
    static = d2s.declarative(fn)
    for mode in order:
        for x in (torch.ones(3), -torch.ones(3)):  # both sides of the tensor if
            with MODES[mode]():
                assert torch.equal(static(x), fn(x)), mode
            ops = _ops(static)
            assert ops[0] == "check_modes" and "cond" in ops
    assert len(static.program_cache) >= 1


def test_gradients_flow_in_the_program_converted_with_gradients():
    static = d2s.declarative(reads_grad_mode)
    with torch.no_grad():
        static(torch.ones(3))  # first converted without gradients
    x, y = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    static(x).sum().backward()
    reads_grad_mode(y).sum().backward()
    assert torch.equal(x.grad, y.grad)


@pytest.mark.parametrize("fn", [reads_inside_no_grad, never_reads])
def test_a_read_inside_the_users_no_grad_or_by_torch_is_exact_everywhere(fn):
    static = d2s.declarative(fn)
    for mode in ("grad", "no_grad", "grad"):
        with MODES[mode]():
            assert torch.equal(static(torch.ones(3)), fn(torch.ones(3)))
    if fn is never_reads:  # nothing read by the user: one program serves both modes
        assert "check_modes" not in _ops(static) and len(static.program_cache) == 1


def test_a_read_after_the_user_turns_gradients_on_in_a_call_without_is_refused():
    def f(x):
        with torch.enable_grad():
            if torch.is_grad_enabled():
                return x + 1
        return x

    with torch.no_grad():
        with pytest.raises(ConversionError, match="turns gradients on") as info:
            d2s.declarative(f)(torch.ones(2))
    assert info.value.filename == __file__
    assert torch.is_grad_enabled is torch._C.is_grad_enabled  # nothing left wrapped
