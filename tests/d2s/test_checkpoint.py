"""`torch.utils.checkpoint.checkpoint(block, x)` in converted code: the
block converted, its ops part of the program, values and gradients eager's
on every path (d2s/operators/calls.py `_checkpointed`). Called as it was,
torch's checkpoint ran the block unconverted on graph tensors: a custom
autograd.Function there lost its backward (the gradients of everything
before it were None: transformers' BLOOM with gradient checkpointing), and
a tensor `if` was refused."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as cp

import d2s


class HalfGradSiLU(torch.autograd.Function):
    """SiLU forward; half its derivative backward (on purpose: the user's backward must be the one run)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s + x * s * (1 - s)) * 0.5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        h = HalfGradSiLU.apply(self.a(x))
        if isinstance(h, torch.Tensor) and h.sum() > 0:  # converted: a cond, and a graph tensor is a Tensor
            h = self.drop(h) * 2
        return self.b(h)


class Checkpointed(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.block = Block()
        self.reentrant = reentrant

    def forward(self, x):
        return cp.checkpoint(self.block, x, use_reentrant=self.reentrant).sum()


XS = [torch.rand(3, 4) + 0.5, -torch.rand(3, 4) - 0.5]  # both sides of the block's `if`


def _step(module, run, x):
    for p in module.parameters():
        p.grad = None
    torch.manual_seed(5)
    y = run(x)
    if y.requires_grad:
        y.backward()
    return y.detach(), None if x.grad is None else x.grad, [p.grad for p in module.parameters()]


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("input_grad", [True, False])
def test_a_checkpointed_block_trains_as_eagerly(reentrant, input_grad):
    torch.manual_seed(0)
    eager = Checkpointed(reentrant).train()
    model = copy.deepcopy(eager)
    static = d2s.declarative(model)
    for x0 in XS:
        want = _step(eager, eager, x0.clone().requires_grad_(input_grad))
        got = _step(model, static, x0.clone().requires_grad_(input_grad))
        assert torch.equal(got[0], want[0])
        assert (got[1] is None) == (want[1] is None) and (want[1] is None or torch.equal(got[1], want[1]))
        for a, b in zip(want[2], got[2]):
            # The reentrant variant, with no input requiring grad: no gradient for the block, as eagerly.
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
        assert all(g is None for g in want[2]) == (reentrant and not input_grad)
    assert len(static.forward.program_cache) == 1
    types = {op.type for block in static.forward.concrete_program.main_program.blocks for op in block.ops}
    assert {"autograd_function", "cond"} <= types


def test_the_reentrant_variant_takes_no_keywords_as_eagerly():
    def keyword_call(x, block):
        return cp.checkpoint(block, x, use_reentrant=True, scale=2)

    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        d2s.declarative(keyword_call)(torch.ones(2, 4), Block())
