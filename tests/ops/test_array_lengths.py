"""The length of a list a graph loop fills, where the loop says it
(ops/control_flow/array_lengths.py): `for t in range(x.size(1))` appending
once per trip makes a list of x.size(1) items, so what is stacked from it
lines up with `x` for every length a saved or `None`-dimension program
takes (a fresh length symbol could not be shown to, and the trace failed)."""

import pytest
import torch

import d2s

W = torch.randn(4, 4) * 0.3


def rnn_residual(x, w):
    h = torch.zeros(x.shape[0], x.shape[2])
    outs = []
    for t in range(x.shape[1]):
        h = torch.tanh(x[:, t] + h @ w)
        outs.append(h)
    return torch.stack(outs, 1) + x  # the stacked length is x.size(1)


def two_per_trip(x, w):
    outs = []
    for t in range(x.shape[1]):
        outs.append(x[:, t] @ w)
        outs.append(-x[:, t])
    return torch.stack(outs, 1).view(x.shape[0], x.shape[1], 2, x.shape[2]) * x[:, :, None]


def seeded_from_the_first_step(x, w):
    outs = [x[:, 0]]
    for t in range(1, x.shape[1]):  # tests `t + 1 < n`: n - 1 trips after one item
        outs.append(torch.relu(outs[-1] @ w + x[:, t]))
    return torch.stack(outs, 1) - x


def appended_after_the_loop(x, w):
    outs = []
    for t in range(x.shape[1] - 1):
        outs.append(x[:, t] @ w)
    outs.append(x[:, -1])
    return torch.stack(outs, 1) + x


@pytest.mark.parametrize("fn", [rnn_residual, two_per_trip, seeded_from_the_first_step, appended_after_the_loop])
def test_a_list_a_loop_fills_lines_up_with_the_input(fn):
    static = d2s.declarative(fn, input_spec=[d2s.InputSpec([None, None, 4]), d2s.InputSpec([4, 4])])
    for batch, length in [(2, 3), (3, 6), (2, 2)]:
        x = torch.randn(batch, length, 4)
        assert torch.equal(static(x, W), fn(x, W))
    assert len(static.program_cache) == 1
    assert "while" in {op.type for op in static.concrete_program.main_program.global_block().ops}
    x = torch.randn(1, 1, 4)  # sizes of 1 may broadcast: a program of their own, as every size-1 assumption
    assert torch.equal(static(x, W), fn(x, W))


def stops_early(x, w):
    outs = []
    for t in range(x.shape[1]):
        if x[:, t].sum() > 3:  # a `break`: the loop's trips are not its range's
            break
        outs.append(x[:, t] @ w)
    return torch.stack(outs, 1).sum() if outs else x.sum()


def test_a_loop_that_may_stop_early_keeps_its_list_length_unknown():
    static = d2s.declarative(stops_early, input_spec=[d2s.InputSpec([None, None, 4]), d2s.InputSpec([4, 4])])
    for x in (torch.full((2, 5, 4), 0.1), torch.full((2, 5, 4), 1.0), torch.full((3, 2, 4), -1.0)):
        assert torch.equal(static(x, W), stops_early(x, W))
    assert len(static.program_cache) == 1
