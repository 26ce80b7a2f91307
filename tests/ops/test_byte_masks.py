"""Indexing and `torch.where` with a uint8 mask (`x[m]`, `torch.where(m, a,
b)`: torch's deprecated byte masks, still in older code: ParityBench's face_evoLVe). Eager indexes with `m != 0`;
the meta kernels shape inference runs refuse uint8 indices, so the program
passes `m.bool()` (ops/capture.py `_byte_masks_as_bool`). Before, the
call was refused."""

import warnings

import pytest
import torch

import d2s


def _inside(x):
    m = (x > 0).to(torch.uint8)
    return x[m] * 2


def _fed(x, m):
    return x[m].sum() + x[:, 0][m[:, 0]].sum()


def _in_a_tuple(x, m):
    return x[m[:, 0], 1:] * 3


def _in_a_branch(x, m):
    if x.sum() > 0:
        y = x[m]
    else:
        y = x[m] * -1
    return y.sum()


def _masks(x, kind):
    if kind == "none":
        return torch.zeros_like(x, dtype=torch.uint8)
    return (x > 0).to(torch.uint8) * (3 if kind == "non-one" else 1)  # any non-zero byte selects


@pytest.mark.parametrize("kind", ["none", "some", "non-one"])
@pytest.mark.parametrize("fn", [_inside, _fed, _in_a_tuple, _in_a_branch])
def test_byte_mask_indexing_equals_eager_values_and_gradients(fn, kind):
    static = d2s.declarative(fn)
    for sign in (1, -1):
        torch.manual_seed(0)
        x = torch.randn(4, 3) * sign
        args = (x,) if fn is _inside else (x, _masks(x, kind))
        xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's deprecation of byte masks
            want, got = fn(xs[0], *args[1:]), static(xs[1], *args[1:])
            want.sum().backward()
            got.sum().backward()
        assert want.dtype == got.dtype and torch.equal(want, got)
        assert torch.equal(xs[0].grad, xs[1].grad)
    assert len(static.program_cache) == 1
    types = {op.type for b in static.concrete_program.main_program.blocks for op in b.ops}
    assert "torch.Tensor.bool" in types
    if fn is _in_a_branch:
        assert "cond" in types


def _where(x, m):
    return torch.where(m, x, x * -2) + x.where(m, 0.5) + torch.where(condition=m, input=x, other=x.exp())


@pytest.mark.parametrize("kind", ["none", "some", "non-one"])
def test_byte_mask_where_equals_eager(kind):
    test_byte_mask_indexing_equals_eager_values_and_gradients(_where, kind)
