"""Forwards that return an input unchanged, a constant, a parameter, no tensor
or the same tensor twice, or pass a legacy tensor type, save with jit.save and reload with jit.load."""

import pytest
import torch
import torch.nn as nn

import d2s


class Identity(nn.Module):
    def forward(self, x):
        return x


class Constant(nn.Module):
    def forward(self, x):
        return torch.ones(2)


class Twice(nn.Module):
    def forward(self, x):
        y = x + 1
        return y, y


class NoTensor(nn.Module):
    def forward(self, x):
        return 3


class Weight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(2))

    def forward(self, x):
        return self.w


class LegacyType(nn.Module):
    # `x.type(torch.LongTensor)`: the legacy tensor-type class is an op argument.
    def forward(self, x):
        return (x * 3).type(torch.LongTensor) + 1


def _leaves(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _leaves(v)]
    return []


@pytest.mark.parametrize("make", [Identity, Constant, Twice, NoTensor, Weight, LegacyType])
def test_forward_form_saves_and_reloads(make, tmp_path):
    module = make()
    x = torch.randn(2)
    eager = module(x)
    static = d2s.declarative(module)
    got = static(x)
    assert [torch.equal(a, b) for a, b in zip(_leaves(got), _leaves(eager))] == [True] * len(_leaves(eager))
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    out = loaded(x)
    out = list(out) if isinstance(out, tuple) else [out]
    assert len(out) == len(_leaves(eager))
    for a, b in zip(out, _leaves(eager)):
        assert torch.equal(a.detach(), b.detach())


class OddSizes(nn.Module):
    """Vectors of odd lengths: stored back to back in params.safetensors, most
    of them start off a 64-byte boundary in the file; the dot / mv reductions
    on them round differently on unaligned memory (hifi_gan's spectral norm)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.u = nn.Parameter(torch.randn(37))
        self.v = nn.Parameter(torch.randn(1313))
        self.w = nn.Parameter(torch.randn(37, 1313))
        self.register_buffer("b", torch.randn(1313))

    def forward(self, x):
        sigma = torch.dot(self.u, torch.mv(self.w, self.v))
        return (x * self.b).sum() / sigma, torch.mv(self.w, x * self.v)


def test_reloaded_parameters_are_fresh_aligned_copies(tmp_path):
    module = OddSizes()
    x = torch.randn(1313)
    eager = module(x)
    static = d2s.declarative(module)
    static(x)
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for name, tensor in list(loaded.named_parameters()) + list(loaded.named_buffers()):
        assert tensor.data_ptr() % 64 == 0, name
    assert [torch.equal(a, b) for a, b in zip(loaded(x), eager)] == [True, True]


class Attention(nn.Module):
    """multi_head_attention_forward returns (out, None) without weights."""

    def __init__(self, need_weights):
        super().__init__()
        torch.manual_seed(0)
        self.mha = nn.MultiheadAttention(8, 2)
        self.need_weights = need_weights

    def forward(self, x):
        out, weights = self.mha(x, x, x, need_weights=self.need_weights)
        return out if weights is None else (out, weights)


@pytest.mark.parametrize("need_weights", [False, True])
def test_an_op_result_holding_none_saves_and_reloads(need_weights, tmp_path):
    module = Attention(need_weights).eval()
    x = torch.randn(5, 2, 8)
    static = d2s.declarative(module)
    static(x)
    d2s.jit.save(static, str(tmp_path / "m"))
    out = d2s.jit.load(str(tmp_path / "m"))(x)
    assert [torch.allclose(a, b, atol=1e-6) for a, b in zip(_leaves(out), _leaves(module(x)))] == \
        [True] * (2 if need_weights else 1)
