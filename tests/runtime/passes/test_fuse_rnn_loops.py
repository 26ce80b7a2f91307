"""The fast level replaces a cell loop by the fused RNN op: one program for
every length (0 trips, some, all), outputs and gradients within tolerance,
past-the-end lengths fail as eager does, other loops untouched."""

import pytest
import torch
import torch.nn as nn

import d2s
from runtime import passes

from fused_models import CellLoop, CellLoopWithOutputs

RTOL, ATOL = 1e-5, 1e-6  # docs/performance.md: the fast level's tolerance

CELLS = {
    "lstm": lambda bias: nn.LSTMCell(8, 16, bias=bias),
    "gru": lambda bias: nn.GRUCell(8, 16, bias=bias),
    "rnn_tanh": lambda bias: nn.RNNCell(8, 16, bias=bias),
    "rnn_relu": lambda bias: nn.RNNCell(8, 16, bias=bias, nonlinearity="relu"),
}


def _pair(kind, bias, time_first):
    torch.manual_seed(0)
    eager = CellLoop(CELLS[kind](bias), 16, time_first)
    fast = CellLoop(CELLS[kind](bias), 16, time_first)
    fast.load_state_dict(eager.state_dict())
    return eager, d2s.declarative(fast, optimize="fast")


def _optimized_types(static):
    concrete = static.forward.concrete_program
    program, _ = passes.optimize(concrete.main_program, [v.name for v in concrete.inputs],
                                 [v.name for v in concrete.fetch_vars], "fast")
    return {op.type for b in program.blocks for op in b.ops}


@pytest.mark.parametrize("kind", sorted(CELLS))
@pytest.mark.parametrize("bias, time_first", [(True, False), (False, True)])
def test_fused_loop_matches_eager_for_every_length_with_one_program(kind, bias, time_first):
    eager, fast = _pair(kind, bias, time_first)
    x = torch.randn(12, 3, 8) if time_first else torch.randn(3, 12, 8)
    for length in (0, 1, 5, 12):
        want = eager(x, torch.tensor(length))
        got = fast(x, torch.tensor(length))
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)
    assert len(fast.forward.program_cache) == 1
    traced = {op.type for b in fast.forward.concrete_program.main_program.blocks for op in b.ops}
    assert "while" in traced  # the traced program keeps the loop; the compiled one is fused
    assert "fused_rnn_loop" in _optimized_types(fast) and "while" not in _optimized_types(fast)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_fused_loop_gradients_match_eager(kind):
    eager, fast = _pair(kind, True, False)
    x = torch.randn(3, 10, 8)
    grads = []
    for model in (eager, fast):
        xi = x.clone().requires_grad_()
        h, c = model(xi, torch.tensor(7))
        (h.square().sum() + c.sum()).backward()
        grads.append([xi.grad] + [p.grad for p in model.parameters()])
    for w, g in zip(*grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_length_past_the_sequence_fails_like_eager():
    eager, fast = _pair("lstm", True, False)
    x = torch.randn(3, 4, 8)
    with pytest.raises(IndexError):
        eager(x, torch.tensor(5))
    with pytest.raises(Exception, match="out of range"):
        fast(x, torch.tensor(5))


def test_a_loop_doing_more_than_the_cell_is_not_fused():
    torch.manual_seed(0)
    eager = CellLoopWithOutputs()
    fast = CellLoopWithOutputs()
    fast.load_state_dict(eager.state_dict())
    d2s.declarative(fast, optimize="fast")
    x = torch.randn(2, 6, 8)
    for length in (0, 3, 6):
        (wh, wn), (gh, gn) = eager(x, torch.tensor(length)), fast(x, torch.tensor(length))
        assert torch.equal(gh, wh) and int(gn) == wn
    assert "fused_rnn_loop" not in _optimized_types(fast)


def test_level_is_settable_on_the_translator_and_part_of_the_key():
    translator = d2s.ProgramTranslator()
    torch.manual_seed(0)
    model = d2s.declarative(CellLoop(nn.GRUCell(8, 16), 16))
    x = torch.randn(2, 5, 8)
    default = model(x, torch.tensor(5))
    translator.optimize = "fast"
    try:
        fast = model(x, torch.tensor(5))
        assert model.forward.concrete_program.optimize == "fast"
    finally:
        translator.optimize = "default"
    assert len(model.forward.program_cache) == 2
    torch.testing.assert_close(fast[0], default[0], rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="optimize must be one of"):
        translator.optimize = "turbo"
    with pytest.raises(ValueError, match="optimize must be one of"):
        d2s.declarative(lambda x: x, optimize="O3")
