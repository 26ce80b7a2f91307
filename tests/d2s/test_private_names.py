"""Private names in methods (d2s/transformers/private_names.py): the
converted code is compiled outside the class, so d2s gives `self.__x` the
name Python gives it in the class body (`self._Owner__x`); it raised
AttributeError for every input (ParityBench's torchkit CausalConv1d)."""

import pytest
import torch
import torch.nn as nn

import d2s
from d2s.transformers.private_names import mangled, mangling_class


class CausalConv1d(nn.Conv1d):
    def __init__(self, channels):
        self.__padding = 2
        super().__init__(channels, channels, 3, padding=self.__padding)

    def forward(self, x):
        res = super().forward(x)
        if res.sum() > 0:  # a tensor `if`: both sides read the private attribute
            return res[:, :, :-self.__padding]
        return res[:, :, self.__padding:]


class Outer:
    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.__scale = 3.0

        def forward(self, x, n):
            __total = x * 0  # a private local, carried by a tensor loop
            __parts = []
            i = 0
            while i < n:
                __total = __total + x * self.__scale
                __parts.append(__total)
                i += 1
            return __total, len(__parts)


class ___(nn.Module):  # only underscores: Python mangles nothing
    def forward(self, x):
        __y = x + 1
        return __y * 2


def _inputs(module):
    if isinstance(module, Outer.Inner):
        return [(torch.ones(3), torch.tensor(0)), (torch.ones(3), torch.tensor(3))]
    return [(torch.randn(1, 2, 6) + 3,), (torch.randn(1, 2, 6) - 3,)]


def _same(a, b):
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


@pytest.mark.parametrize("make, op", [(lambda: CausalConv1d(2), "cond"), (Outer.Inner, "while"), (___, None)])
def test_private_names_convert_as_in_the_class(make, op):
    torch.manual_seed(0)
    eager = make()
    static = d2s.declarative(make())
    static.load_state_dict(eager.state_dict())
    for args in _inputs(eager):
        assert _same(static(*args), eager(*args))
    types = [o.type for b in static.forward.concrete_program.main_program.blocks for o in b.ops]
    assert op is None or op in types


@pytest.mark.parametrize("qualname, owner", [
    ("f", None), ("A.f", "A"), ("Outer.Inner.forward", "Inner"), ("A.f.<locals>.g", "A"),
    ("f.<locals>.A.m", "A"), ("A.f.<locals>.<lambda>", "A")])
def test_the_owner_is_the_innermost_class(qualname, owner):
    assert mangling_class(qualname) == owner


@pytest.mark.parametrize("name, owner, want", [
    ("__x", "A", "_A__x"), ("__x_", "_A", "_A__x_"), ("__x__", "A", "__x__"), ("_x", "A", "_x"),
    ("__x", "___", "__x")])
def test_pythons_rules(name, owner, want):
    assert mangled(name, owner) == want
