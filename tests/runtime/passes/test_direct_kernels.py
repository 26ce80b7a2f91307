"""direct_kernels: Python wrappers of torch.nn.functional called as the C
kernel they call, golden before/after on a program with `cond` and
`while`, and bit-identical results (values, gradients, dropout draws)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s
from runtime.passes import PassContext, direct_kernels

from pass_programs import ops_text, traced


class Wrapped(nn.Module):
    """Each rewritten wrapper once, in block 0, a `cond` branch and a
    `while` body, plus the calls the pass must leave alone (max_norm,
    padding_idx past the table, return_indices, inplace, softmax dtype)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)

    def forward(self, tok, x, n):
        e = F.embedding(tok, self.embed.weight)                    # -> torch.embedding, padding -1
        e = e + F.embedding(tok, self.embed.weight, padding_idx=-2)  # -> padding 8
        if e.sum() > 0:
            y = F.relu(e)                                          # -> torch.relu
        else:
            y = F.softmax(e, dim=1)                                # -> Tensor.softmax
        i = 0
        while i < n:
            y = F.dropout(y, 0.25, self.training)                  # -> torch.dropout
            i += 1
        p = F.max_pool2d(x, 2)                                     # -> torch.max_pool2d, stride []
        q, idx = F.max_pool2d(x, 2, return_indices=True)           # kept: two results
        r = F.softmax(x, dim=-1, dtype=torch.float64)              # kept: dtype
        return y, p + q, idx, r


BEFORE = """\
block 0
  tmp_0 = torch.nn.functional.embedding(tok, embed.weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False)
  tmp_1 = torch.nn.functional.embedding(tok, embed.weight, padding_idx=-2, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False)
  tmp_2 = torch.Tensor.__add__(tmp_0, tmp_1)
  tmp_3 = torch.Tensor.sum(tmp_2)
  tmp_4 = torch.Tensor.__gt__(tmp_3, 0)
  Out=[y_0] = cond(Cond=[tmp_4], X=[tmp_2]) {false_block: block[2], false_outs: ['tmp_6'], true_block: block[1], true_outs: ['tmp_5']}
  tmp_8 = fill_constant(0, torch.int64)
  Out=[i_1, y_2] = while(Init=[tmp_8, y_0], X=[n]) {body_block: block[3], body_outs: ['tmp_12', 'tmp_11'], cond_block: block[4], cond_out: 'tmp_10', loop_vars: ['i_0', 'y_1']}
  tmp_13 = torch.nn.functional.max_pool2d(x, 2, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False)
  (tmp_14, tmp_15) = torch.nn.functional.max_pool2d_with_indices(x, 2, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=True)
  tmp_16 = torch.nn.functional.softmax(x, dim=-1, _stacklevel=3, dtype=torch.float64)
  tmp_17 = torch.Tensor.__add__(tmp_13, tmp_14)
block 1
  tmp_5 = torch.nn.functional.relu(tmp_2, inplace=False)
block 2
  tmp_6 = torch.nn.functional.softmax(tmp_2, dim=1, _stacklevel=3, dtype=None)
block 3
  tmp_11 = torch.nn.functional.dropout(y_1, p=0.25, training=True, inplace=False)
  tmp_12 = torch.Tensor.__add__(i_0, 1)
block 4
  tmp_10 = torch.Tensor.__lt__(i_0, n)
"""

AFTER = """\
block 0
  tmp_0 = torch.embedding(embed.weight, tok, -1, False, False)
  tmp_1 = torch.embedding(embed.weight, tok, 8, False, False)
  tmp_2 = torch.Tensor.__add__(tmp_0, tmp_1)
  tmp_3 = torch.Tensor.sum(tmp_2)
  tmp_4 = torch.Tensor.__gt__(tmp_3, 0)
  Out=[y_0] = cond(Cond=[tmp_4], X=[tmp_2]) {false_block: block[2], false_outs: ['tmp_6'], true_block: block[1], true_outs: ['tmp_5']}
  tmp_8 = fill_constant(0, torch.int64)
  Out=[i_1, y_2] = while(Init=[tmp_8, y_0], X=[n]) {body_block: block[3], body_outs: ['tmp_12', 'tmp_11'], cond_block: block[4], cond_out: 'tmp_10', loop_vars: ['i_0', 'y_1']}
  tmp_13 = torch.max_pool2d(x, 2, [], 0, 1, False)
  (tmp_14, tmp_15) = torch.nn.functional.max_pool2d_with_indices(x, 2, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=True)
  tmp_16 = torch.nn.functional.softmax(x, dim=-1, _stacklevel=3, dtype=torch.float64)
  tmp_17 = torch.Tensor.__add__(tmp_13, tmp_14)
block 1
  tmp_5 = torch.relu(tmp_2)
block 2
  tmp_6 = torch.Tensor.softmax(tmp_2, 1)
block 3
  tmp_11 = torch.dropout(y_1, 0.25, True)
  tmp_12 = torch.Tensor.__add__(i_0, 1)
block 4
  tmp_10 = torch.Tensor.__lt__(i_0, n)
"""


def _args(n=2):
    return torch.tensor([[1, 2, 3], [4, 5, 9]]), torch.randn(1, 2, 4, 4), torch.tensor(n)


def test_direct_kernels_golden():
    static = d2s.declarative(Wrapped())
    program, feeds, fetches = traced(static.forward, *_args())
    text = ops_text(program)
    assert text == BEFORE
    ctx = PassContext(program.copy(), feeds, fetches)
    direct_kernels.run(ctx)
    assert ops_text(ctx.program) == AFTER
    assert ops_text(program) == BEFORE  # the pass rewrote the copy only


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("n", [0, 1, 3])
@pytest.mark.parametrize("level", ["default", "fast"])
def test_direct_kernels_bit_identical_values_gradients_and_draws(sign, n, level):
    torch.manual_seed(0)
    eager = Wrapped()
    with torch.no_grad():
        eager.embed.weight.mul_(sign)
    static = Wrapped()
    static.load_state_dict(eager.state_dict())
    static = d2s.declarative(static, optimize=level)
    tok, x, length = _args(n)
    for mode in ("train", "eval"):
        getattr(eager, mode)()
        getattr(static, mode)()
        torch.manual_seed(1)
        want = eager(tok, x, length)
        torch.manual_seed(1)
        got = static(tok, x, length)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        assert "torch.embedding" in [op.type for op in _compiled_program_ops(static)]
        (ge,) = torch.autograd.grad(want[0].sum(), [eager.embed.weight])
        (gs,) = torch.autograd.grad(got[0].sum(), [static.embed.weight])
        assert torch.equal(gs, ge)


def _compiled_program_ops(static):
    entry = static.forward.concrete_program.compiled
    return [op for op in entry.line_ops.values()]


def test_a_padding_idx_the_wrapper_rejects_keeps_the_wrapper():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(5, 2))

        def forward(self, tok):
            return F.embedding(tok, self.w, padding_idx=7)

    static = d2s.declarative(Bad())
    with pytest.raises(Exception, match="[Pp]adding_idx"):
        static(torch.tensor([1]))
