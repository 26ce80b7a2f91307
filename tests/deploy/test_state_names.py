"""Modules whose state-dict keys are not safe variable names save and load:
a submodule added as `add_module('initial-conv-3-64', ...)`, keys that
collide once sanitised (`level2_0.w` and a ModuleList's `level2.0.w`), tied
weights. The program holds a safe, distinct variable name per tensor; the
loaded layer's state-dict keys are the original module's, so state dicts
move both ways, and its outputs equal eager."""

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn

import d2s


class Dashed(nn.Module):
    # ParityBench ganomaly: `main.add_module('initial-conv-3-64', ...)`.
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential()
        self.main.add_module("initial-conv-3-4", nn.Conv2d(3, 4, 3))
        self.main.add_module("bn 4", nn.BatchNorm2d(4))
        self.main.add_module("relu/4", nn.ReLU())

    def forward(self, x):
        return self.main(x)


class Colliding(nn.Module):
    # ParityBench frostnet ESPNet: a submodule `level2_0` and a ModuleList `level2`.
    def __init__(self):
        super().__init__()
        self.level2_0 = nn.Linear(4, 4)
        self.level2 = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.level2_0_ = nn.Linear(4, 4)  # the name a renamed key could take

    def forward(self, x):
        return self.level2[1](self.level2[0](self.level2_0_(self.level2_0(x))))


class NonAscii(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({"größe": nn.Linear(4, 4), "x-1": nn.Linear(4, 4), "x_1": nn.Linear(4, 4)})
        self.register_buffer("scale-factor", torch.full((4,), 2.0))
        self.register_buffer("unread-buffer", torch.ones(3))

    def forward(self, x):
        for layer in self.layers.values():
            x = layer(x)
        return x * getattr(self, "scale-factor")


class Tied(nn.Module):
    # The same Parameter under two keys (an embedding and its output head).
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids))


class ConstantName(nn.Module):
    # An unread buffer named as the program names a lifted constant (`const_0`).
    def __init__(self):
        super().__init__()
        self.register_buffer("const_0", torch.full((4,), 7.0))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) + torch.as_tensor(np.arange(4, dtype=np.float32))


CASES = {
    "constant_name": (ConstantName, lambda: torch.randn(2, 4), [None, 4], "float32"),
    "dashed": (Dashed, lambda: torch.randn(2, 3, 8, 8), [None, 3, 8, 8], "float32"),
    "colliding": (Colliding, lambda: torch.randn(2, 4), [None, 4], "float32"),
    "non_ascii": (NonAscii, lambda: torch.randn(2, 4), [None, 4], "float32"),
    "tied": (Tied, lambda: torch.randint(0, 10, (2, 3)), [None, 3], "int64"),
}


def _saved(tmp_path, name):
    cls, make_input, shape, dtype = CASES[name]
    torch.manual_seed(0)
    eager = cls().eval()
    static = d2s.declarative(copy.deepcopy(eager))
    d2s.jit.save(static, str(tmp_path / name), input_spec=[d2s.InputSpec(shape, dtype)])
    return eager, d2s.jit.load(str(tmp_path / name)).eval(), make_input


@pytest.mark.parametrize("name", sorted(CASES))
def test_saved_with_the_original_state_dict_keys(tmp_path, name):
    eager, loaded, make_input = _saved(tmp_path, name)
    x = make_input()
    with torch.no_grad():
        assert torch.equal(loaded(x), eager(x))
    assert list(loaded.state_dict()) == list(eager.state_dict())
    for key, value in eager.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_dicts_move_both_ways(tmp_path, name):
    eager, loaded, make_input = _saved(tmp_path, name)
    other = CASES[name][0]().eval()  # other weights
    loaded.load_state_dict(other.state_dict())
    x = make_input()
    with torch.no_grad():
        assert torch.equal(loaded(x), other(x))  # the program reads what was loaded
    eager.load_state_dict(loaded.state_dict())
    with torch.no_grad():
        assert torch.equal(eager(x), other(x))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_loaded_layer_saves_again(tmp_path, name):
    eager, loaded, make_input = _saved(tmp_path, name)
    d2s.jit.save(loaded, str(tmp_path / "again"))
    again = d2s.jit.load(str(tmp_path / "again")).eval()
    x = make_input()
    with torch.no_grad():
        assert torch.equal(again(x), eager(x))
    assert list(again.state_dict()) == list(eager.state_dict())


def test_tied_weights_stay_tied(tmp_path):
    _, loaded, _ = _saved(tmp_path, "tied")
    assert loaded.state_dict(keep_vars=True)["embed.weight"] is loaded.state_dict(keep_vars=True)["head.weight"]


@pytest.mark.parametrize("name", ["colliding", "dashed", "non_ascii"])
def test_traced_layer_saves_such_a_module(tmp_path, name):
    # TracedLayer names persistables as a declarative trace does; it saves no state-dict keys.
    cls, make_input, _, _ = CASES[name]
    torch.manual_seed(0)
    eager = cls().eval()
    x = make_input()
    _, traced = d2s.TracedLayer.trace(eager, [x])
    traced.save_inference_model(str(tmp_path / name))
    loaded = d2s.jit.load(str(tmp_path / name))
    with torch.no_grad():
        assert torch.equal(loaded(x), eager(x))
