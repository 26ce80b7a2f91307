"""`@functools.lru_cache` / `@functools.cache` functions and methods called
by declarative code (d2s/operators/calls.py).

Called through its cache while a program was traced, such a function kept
the trace's graph values: the first call failed ("made by an earlier
conversion"), and the user's own eager calls got a graph value from the
cache afterwards. With arguments that hold no graph value the trace now
calls through the cache as eager does, with capture off (the result is a
constant of the program); with graph values it calls the function itself,
converted (its tensor `if`s become `cond`s), leaving the cache as it was."""

import functools

import pytest
import torch
import torch.nn as nn

import d2s


@functools.lru_cache(maxsize=None)
def causal_mask(n):
    return torch.triu(torch.ones(n, n), 1) * -1e9


@functools.cache
def scaled(x):
    if x.sum() > 0:  # a tensor `if` inside the cached function: converted too
        return x * 2
    return x - 1


class Masked(nn.Module):
    @functools.lru_cache(maxsize=None)
    def mask(self, n):
        return torch.triu(torch.ones(n, n), 1) * -1e9

    def forward(self, x):
        y = scaled(x + causal_mask(x.shape[0]) + self.mask(x.shape[0]))
        if y.mean() > -1e8:
            y = y + 1
        return y


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cached_functions_and_methods_are_traced_through_and_their_caches_keep_eager_values(sign):
    causal_mask.cache_clear()
    eager, static = Masked(), d2s.declarative(Masked())
    for n in (3, 4, 3):
        x = sign * torch.rand(n, n) + sign
        assert torch.equal(static(x), eager(x))
    program = static.forward.concrete_program.main_program
    conds = [op for block in program.blocks for op in block.ops if op.type == "cond"]
    assert len(conds) >= 2  # forward's `if`, and the cached function's own (with its early return)
    # The masks of a Python int came from the cache, as eager reads them: constants, no ops.
    assert not any(op.type.endswith("triu") for block in program.blocks for op in block.ops)
    # The caches hold what eager calls put there, never a graph value.
    for value in (causal_mask(3), static.mask(3), static.mask(4)):
        assert type(value) is torch.Tensor
    assert causal_mask.cache_info().currsize == 2  # eager's calls for 3 and 4 only


def cached_unless_compiling(func):
    """transformers' `compile_compatible_method_lru_cache` (BEiT's relative
    position index): a plain wrapper that calls the function through a cache."""
    through_cache = functools.lru_cache(maxsize=10)(func)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return through_cache(*args, **kwargs)
    return wrapper


class RelativeBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(9))

    @staticmethod
    @cached_unless_compiling
    def index(n):
        coords = torch.arange(n)
        return (coords[:, None] - coords[None, :]) + n - 1

    def forward(self, x):
        return x + self.table[self.index(x.shape[-1])]


def test_a_cache_behind_a_wrapper_keeps_eager_values_for_other_models():
    """Before, one declarative call left a graph value in the cache, and
    every eager model of the class then failed (BEiT under transformers)."""
    static = d2s.declarative(RelativeBias())
    x = torch.randn(2, 5, 5)
    assert torch.equal(static(x), x + static.table[RelativeBias.index(5)])
    eager = RelativeBias()
    assert torch.equal(eager(x), x + eager.table[RelativeBias.index(5)])  # an eager model of the class still runs
    assert type(RelativeBias.index(5)) is torch.Tensor
