"""The fast level replaces a cell loop by the fused RNN op: one program for
every length (0 trips, some, all), outputs and gradients within tolerance,
past-the-end lengths fail as eager does, other loops untouched."""

import pytest
import torch
import torch.nn as nn

import d2s
from runtime import passes

from fused_models import CellLoop, CellLoopWithOutputs, CollectingLoop
from pass_programs import ops_text

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


def test_a_loop_collecting_its_states_is_fused_and_matches():
    """`hs.append(h)` after the cell: the fused op appends the output rows."""
    torch.manual_seed(0)
    eager = CellLoopWithOutputs()
    fast = CellLoopWithOutputs()
    fast.load_state_dict(eager.state_dict())
    d2s.declarative(fast, optimize="fast")
    x = torch.randn(2, 6, 8)
    for length in (0, 3, 6):
        (wh, wn), (gh, gn) = eager(x, torch.tensor(length)), fast(x, torch.tensor(length))
        torch.testing.assert_close(gh, wh, rtol=RTOL, atol=ATOL)
        assert int(gn) == wn
    assert "fused_rnn_loop" in _optimized_types(fast)


COLLECTING_FUSED = """\
block 0
  tmp_0 = torch.zeros(2, 16)
  tmp_1 = torch.zeros(2, 16)
  tmp_2 = py.const(0)
  array_0 = array_create()
  (ctr_2, h_2, c_2, hs_2) = fused_rnn_loop('lstm', 1, x, length, tmp_2, tmp_0, tmp_1, cell.weight_ih, \
cell.weight_hh, cell.bias_ih, cell.bias_hh, array_0, collect=array_0)
  tmp_15 = array_length(hs_2)
  tmp_16 = torch.Tensor.__gt__(tmp_15, 0)
  Out=[out_0] = cond(Cond=[tmp_16], X=[h_2, hs_2]) {false_block: block[4], false_outs: ['tmp_18'], \
true_block: block[3], true_outs: ['tmp_17']}
"""


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_collecting_loop_golden_values_and_gradients(kind):
    """Golden: the `while` (followed by a `cond` on the list's length)
    becomes one fused op appending to the list; stacked outputs, final
    state and gradients match eager for 0, some and all steps, and a
    length past the sequence fails as eager does."""
    torch.manual_seed(0)
    cell = CELLS[kind](True)
    eager, fast = CollectingLoop(cell), CollectingLoop(CELLS[kind](True))
    fast.load_state_dict(eager.state_dict())
    d2s.declarative(fast, optimize="fast")
    x = torch.randn(2, 7, 8)
    for length in (0, 1, 4, 7):
        grads = []
        for model in (eager, fast):
            xi = x.clone().requires_grad_()
            out, h = model(xi, torch.tensor(length))
            loss = out.square().sum() + h.sum()
            grads.append((out, h, torch.autograd.grad(loss, [xi] + list(model.parameters()), allow_unused=True)
                          if length else ()))  # 0 steps: zeros, nothing to differentiate
        (wo, wh, wg), (go, gh, gg) = grads
        torch.testing.assert_close(go, wo, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(gh, wh, rtol=RTOL, atol=ATOL)
        for w, g in zip(wg, gg):
            if w is not None:
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    assert len(fast.forward.program_cache) == 1
    if kind == "lstm":
        concrete = fast.forward.concrete_program
        program, _ = passes.optimize(concrete.main_program, [v.name for v in concrete.inputs],
                                     [v.name for v in concrete.fetch_vars], "fast")
        assert ops_text(program).split("block 1")[0] == COLLECTING_FUSED
    with pytest.raises(IndexError):
        eager(x, torch.tensor(9))
    with pytest.raises(Exception, match="out of range"):
        fast(x, torch.tensor(9))


def test_collected_states_can_be_written_in_place_as_in_eager():
    torch.manual_seed(0)
    eager, fast = CollectingLoop(nn.GRUCell(8, 16)), CollectingLoop(nn.GRUCell(8, 16))
    fast.load_state_dict(eager.state_dict())
    d2s.declarative(fast, optimize="fast")
    out, _ = fast(torch.randn(2, 3, 8), torch.tensor(3))
    out.mul_(2)  # a fresh stacked tensor, as in eager


def test_a_loop_collecting_the_state_before_the_step_is_not_fused():
    torch.manual_seed(0)
    eager, fast = CollectingLoop(nn.GRUCell(8, 16), before=True), CollectingLoop(nn.GRUCell(8, 16), before=True)
    fast.load_state_dict(eager.state_dict())
    d2s.declarative(fast, optimize="fast")
    x = torch.randn(2, 6, 8)
    for length in (0, 3, 6):
        for w, g in zip(eager(x, torch.tensor(length)), fast(x, torch.tensor(length))):
            assert torch.equal(g, w)
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
