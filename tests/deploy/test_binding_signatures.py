"""Models whose calls only torch's Python bindings define (not the native
schemas) save, load (the load-time signature check takes them) and give
eager's outputs: `x.nonzero(as_tuple=True)` (ParityBench espresso
AdaptiveSoftmax) and the deprecated `dist.addmm_(1, -2, x, y.t())` of old
re-identification code."""

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import d2s


class AsTuple(nn.Module):
    def forward(self, x):
        rows, cols = (x > 0).nonzero(as_tuple=True)
        return rows * 10 + cols


class TorchAsTuple(nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0, as_tuple=False)


class Distances(nn.Module):
    # Squared distances as 2019 ReID code wrote them (deprecated orders).
    def forward(self, x):
        sq = x.pow(2).sum(1, keepdim=True)
        dist = sq + sq.t()
        dist.addmm_(1, -2, x, x.t())
        return torch.addcmul(dist, 0.5, x @ x.t(), dist)


@pytest.mark.parametrize("cls", [AsTuple, TorchAsTuple, Distances])
def test_binding_only_call_saves_and_loads(cls, tmp_path):
    torch.manual_seed(0)
    eager = cls().eval()
    x = torch.randn(5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns of the deprecated orders
        static = d2s.declarative(copy.deepcopy(eager))
        static(x)
        d2s.jit.save(static, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 4])])
        loaded = d2s.jit.load(str(tmp_path / "m"))
        for inputs in (x, torch.randn(7, 4)):
            got, want = loaded(inputs), eager(inputs)
            assert torch.equal(got, want)
