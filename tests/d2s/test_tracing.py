"""TracedLayer: capture a forward on example inputs, call it, save it."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s

from test_module_attr_writes import Counts


class Digits(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 13 * 13, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return F.softmax(self.fc(x.flatten(1)), -1)


@pytest.fixture()
def traced():
    torch.manual_seed(0)
    model = Digits().eval()
    x = torch.randn(5, 1, 28, 28)
    outputs, traced = d2s.TracedLayer.trace(model, [x])
    return model, x, outputs, traced


def test_trace_returns_eager_outputs_and_a_bit_identical_program(traced):
    model, x, outputs, layer = traced
    assert torch.equal(outputs, model(x))
    other = torch.randn(5, 1, 28, 28)
    assert torch.equal(layer(other), model(other))
    types = [op.type for op in layer.program.global_block().ops]
    assert "torch.conv2d" in types and "torch.nn.functional.batch_norm" in types


def test_traced_save_and_load_in_a_fresh_process(traced, tmp_path):
    model, _, _, layer = traced
    layer.save_inference_model(str(tmp_path / "digits"))
    x = np.random.RandomState(0).randn(5, 1, 28, 28).astype("float32")
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "run.py"
    script.write_text(
        "import sys, numpy as np, d2s\n"
        "exe = d2s.Executor(d2s.CPUPlace())\n"
        "program, feeds, fetches = d2s.load_inference_model(sys.argv[1], exe)\n"
        "out, = exe.run(program, feed={feeds[0]: np.load(sys.argv[2])}, fetch_list=fetches)\n"
        "np.save(sys.argv[3], out)\n")
    # This checkout's packages (the installed d2s may be another checkout); no model code.
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    subprocess.run([sys.executable, str(script), str(tmp_path / "digits"), str(tmp_path / "x.npy"),
                    str(tmp_path / "out.npy")], check=True, cwd=tmp_path, env=env)
    want = model(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-5, atol=1e-7)


def test_tensor_control_flow_cannot_be_traced():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x
            return -x

    with pytest.raises(d2s.ConversionError, match="known only when the program runs"):
        d2s.TracedLayer.trace(Branchy(), [torch.ones(2)])


class _StoresState(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = torch.zeros(1, 2)

    def forward(self, x):
        h = x + self.h
        self.h = h
        return h * 2


@pytest.mark.parametrize("cls, name", [(_StoresState, "h"), (Counts, "calls")])
def test_a_forward_that_assigns_module_state_cannot_be_traced(cls, name):
    # The capture is a second call of the forward: it left a graph value on the
    # module (`h`), or counted the call twice (`calls`), and the traced layer
    # repeated the traced call's state on every run (eager 4, 6; traced 4, 4).
    layer, eager = cls(), cls()
    x = torch.ones(1, 2)
    with pytest.raises(d2s.ConversionError, match=rf"assigns `{cls.__name__}.{name}`, which a traced layer cannot carry"):
        d2s.TracedLayer.trace(layer, [x])
    eager(x)  # the module is as the one eager call leaves it
    assert torch.equal(layer(x), eager(x))


def test_a_batch_norm_updating_its_statistics_in_place_traces():
    torch.manual_seed(0)
    layer, eager = nn.BatchNorm1d(2).train(), nn.BatchNorm1d(2).train()
    x = torch.randn(4, 2)
    _, traced = d2s.TracedLayer.trace(layer, [x])
    eager(x)
    for _ in range(2):
        assert torch.equal(traced(x), eager(x))
        assert torch.equal(layer.running_mean, eager.running_mean)
        assert layer.num_batches_tracked == eager.num_batches_tracked
