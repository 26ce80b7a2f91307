"""Forwards that return an input unchanged, a constant, a parameter, no tensor
or the same tensor twice, or pass a legacy tensor type, save with jit.save and reload with jit.load,
returning what the function returns: the same structure and constants."""

import collections
import re

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


class Mixed(nn.Module):
    def forward(self, x):
        return x * 2, 3, None, "label"


class Named(nn.Module):
    Out = collections.namedtuple("Out", "logits count")

    def forward(self, x):
        return self.Out(x.softmax(0), 2)


class Nested(nn.Module):
    def forward(self, x):
        return {"a": [x + 1, (x * 2, 0.5)], 7: True, "shape": x.shape}


class Numbers(nn.Module):
    # Python numbers read from tensors (and a counter a tensor loop carries)
    # are Python numbers in what the call returns, as eager's (not 0-d tensors).
    def forward(self, x):
        acc = []
        for i in range(2):
            acc.append((x * i).sum().item())
        n = 0
        while x.abs().sum() > n:
            n += 1
        return x * 2, acc, {"top": int(x.argmax()), "pos": bool(x.sum() > 0)}, n


class ModeFlag(nn.Module):
    # A constant that differs between the modes: each saved program returns its own.
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x), self.training


def _leaves(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _leaves(v)]
    return []


def _same(got, want):
    """Equal values in an equal structure: types, lengths, keys, fields and constants too."""
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got.detach(), want.detach())
    if type(got).__name__ != type(want).__name__ or getattr(got, "_fields", None) != getattr(want, "_fields", None):
        return False
    if isinstance(want, dict):
        return list(got) == list(want) and all(_same(got[k], want[k]) for k in want)
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want))
    return type(got) is type(want) and got == want


@pytest.mark.parametrize("make", [Identity, Constant, Twice, NoTensor, Weight, LegacyType, Mixed, Named, Nested,
                                  Numbers])
def test_forward_form_saves_and_reloads(make, tmp_path):
    module = make()
    x = torch.randn(2)
    eager = module(x)
    static = d2s.declarative(module)
    assert _same(static(x), eager)
    d2s.jit.save(static, str(tmp_path / "m"))
    assert _same(d2s.jit.load(str(tmp_path / "m"))(x), eager)


def test_each_mode_returns_its_own_constants(tmp_path):
    module = ModeFlag()
    d2s.jit.save(d2s.declarative(module), str(tmp_path / "m"), input_spec=[d2s.InputSpec([None])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    x = torch.randn(4)
    assert _same(loaded.eval()(x), module.eval()(x))
    assert loaded.train()(x)[1] is True


class ReturnsADtype(nn.Module):
    def forward(self, x):
        return x, x.dtype


def test_a_returned_value_a_saved_model_cannot_give_back_is_refused(tmp_path):
    static = d2s.declarative(ReturnsADtype())
    static(torch.randn(2))
    with pytest.raises(ValueError, match=r"returns torch.float32 \(dtype\), which a saved model cannot give back"):
        d2s.jit.save(static, str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()


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


def test_inspect_shows_what_a_call_returns(tmp_path, capsys):
    from d2s.__main__ import main
    static = d2s.declarative(Nested())
    static(torch.randn(2))
    d2s.jit.save(static, str(tmp_path / "m"))
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "m")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("returns: "))
    assert re.fullmatch(r"returns: \{'a': \[\w+, \(\w+, 0\.5\)\], 7: True, 'shape': torch\.Size\(\[2\]\)\}", line)


# -- module state: a saved model carries it from call to call as eager does ----------------------------

class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3, 3)
        self.hidden = None
        self.seen = torch.zeros(1, 3)  # a plain tensor attribute, replaced below

    def forward(self, x):
        h = torch.zeros_like(x) if self.hidden is None else self.hidden
        h = torch.tanh(self.fc(x) + h + self.seen)
        self.hidden = h
        return h * 2


def _twins():
    eager, module = Recurrent(), Recurrent()
    return eager, module, d2s.declarative(module)


@pytest.mark.parametrize("with_spec", [False, True])
def test_state_a_forward_stores_is_carried_by_the_saved_model(with_spec, tmp_path):
    eager, module, static = _twins()
    x = torch.randn(1, 3)
    for _ in range(2):
        assert torch.equal(static(x), eager(x))
    eager.seen = module.seen = torch.full((1, 3), 0.25)  # saved as it is now
    d2s.jit.save(static, str(tmp_path / "m"), input_spec=[d2s.InputSpec([1, 3])] if with_spec else None)
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for _ in range(3):
        assert torch.equal(loaded(x), eager(x))
    d2s.jit.save(loaded, str(tmp_path / "again"))  # a loaded model saves the state it holds now
    assert torch.equal(d2s.jit.load(str(tmp_path / "again"))(x), eager(x))


class StatisticsInBranch(nn.Module):
    """A buffer a tensor `if` rebinds on one path and writes in place on the other."""

    def __init__(self):
        super().__init__()
        self.register_buffer("stat", torch.zeros(2))

    def forward(self, x):
        if x.sum() > 0:
            self.stat = self.stat * 0.5 + x.mean(0)
        else:
            self.stat.mul_(0.9)
        return x + self.stat


def test_state_a_tensor_if_writes_is_carried_by_the_saved_model(tmp_path):
    eager, static = StatisticsInBranch(), d2s.declarative(StatisticsInBranch())
    xs = [torch.ones(3, 2), -torch.ones(3, 2), torch.full((3, 2), 2.0), -torch.ones(3, 2)]
    assert torch.equal(static(xs[0]), eager(xs[0]))
    d2s.jit.save(static, str(tmp_path / "m"), input_spec=[d2s.InputSpec([3, 2])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for x in xs:  # both paths, from the state saved
        assert torch.equal(loaded(x), eager(x))
        assert torch.equal(loaded.state_dict()["stat"], eager.stat)


def test_saving_the_program_of_a_first_call_from_none_state_is_refused(tmp_path):
    # That program starts from `hidden = None`; the module now holds a tensor: the next call takes another.
    _, _, static = _twins()
    static(torch.randn(1, 3))
    with pytest.raises(ValueError, match="built for module state `hidden` as it was before that call"):
        d2s.jit.save(static, str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()


class Growing(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = torch.zeros(1, 2)

    def forward(self, x):
        self.cache = torch.cat([self.cache, x])
        return self.cache.sum(0)


def test_state_that_changes_shape_every_call_is_refused_at_save(tmp_path):
    static = d2s.declarative(Growing())
    static(torch.ones(1, 2))
    static(torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"reads module state as float32\[2, 2\] and stores float32\[3, 2\] back"):
        d2s.jit.save(static, str(tmp_path / "m"))


class NumpyKeywords(nn.Module):
    """NumPy's spellings of torch's argument names, which torch's own
    argument parser takes (ParityBench: nfnets, VRCNet)."""

    def forward(self, x):
        y = torch.cat([x, x], axis=1)
        return torch.mean(y, axis=1, keepdims=True) + y.sum(axis=-1, keepdims=True), torch.sub(x, x2=y[:, :1])


def test_numpy_keyword_spellings_save_and_reload(tmp_path):
    module = NumpyKeywords()
    x = torch.randn(3, 2)
    eager = module(x)
    static = d2s.declarative(module)
    assert _same(static(x), eager)
    d2s.jit.save(static, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 2])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for rows in (3, 1):
        x = torch.randn(rows, 2)
        assert _same(loaded(x), module(x))
