"""A model whose forward calls `torch.utils.checkpoint.checkpoint`: its
program holds `checkpoint` ops (ops/control_flow/checkpoint_op.py). Saved
with `d2s.jit.save` it keeps them, and the loaded model gives eager's values
and gradients; `d2s.onnx.export` and `d2s.export` run the blocks inline (an
exported graph has no backward pass), matching eager on every path."""

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp

import d2s


class Layer(nn.Module):
    """A residual block whose tensor `if` takes a different activation."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(4)
        self.up = nn.Linear(4, 8)
        self.down = nn.Linear(8, 4)

    def forward(self, x, scale=1.0):
        h = self.up(self.norm(x))
        h = F.gelu(h) if h.sum() > 0 else torch.sigmoid(h)
        return x + self.down(h) * scale


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Layer()
        self.second = Layer()

    def forward(self, x, n):
        i = torch.zeros((), dtype=torch.long)
        while i < n:
            x = cp.checkpoint(self.first, x, 0.5, use_reentrant=False)
            i = i + 1
        return cp.checkpoint(self.second, x, use_reentrant=True)


class PassesOn(nn.Module):
    """Each block returns the scale it was given as it is, beside its result
    (T5's position bias): a result of the op that is a value of the caller."""

    def __init__(self):
        super().__init__()
        self.layer = Layer()

    def block(self, x, scale):
        return self.layer(x), scale

    def forward(self, x, n):
        scale = n.float() + 1
        for _ in range(2):
            x, scale = cp.checkpoint(self.block, x, scale, use_reentrant=False)
        return x * scale


SPEC = [d2s.InputSpec([3, 4], "float32"), d2s.InputSpec([], "int64")]
CASES = [(1.0, 0), (1.0, 2), (-5.0, 1)]  # zero and several trips; the layers' `if` both ways


def _inputs(sign, n):
    return torch.linspace(-1, 1, 12).reshape(3, 4) * sign, torch.tensor(n)


def _model():
    torch.manual_seed(0)
    return Stack()


def _types(program):
    return [op.type for block in program.blocks for op in block.ops]


def test_a_saved_model_keeps_its_checkpoints_and_trains_as_eagerly(tmp_path):
    eager = _model().train()
    static = d2s.declarative(copy.deepcopy(eager))
    static(*_inputs(1.0, 1))
    d2s.jit.save(static, str(tmp_path / "m"), input_spec=SPEC)
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert _types(loaded.program).count("checkpoint") == 2
    for sign, n in CASES:
        x, count = _inputs(sign, n)
        xe, xl = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = eager(xe, count), loaded(xl, count)
        assert torch.equal(got, want)
        want.sum().backward()
        got.sum().backward()
        assert torch.equal(xl.grad, xe.grad)


@pytest.mark.parametrize("cls", [Stack, PassesOn])
def test_exports_run_the_checkpointed_blocks_inline(tmp_path, cls):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    torch.manual_seed(0)
    eager = cls().eval()
    static = d2s.declarative(copy.deepcopy(eager))
    static(*_inputs(1.0, 1))
    assert "checkpoint" in _types(static.forward.concrete_program.main_program)
    d2s.onnx.export(static, str(tmp_path / "m.onnx"), input_spec=SPEC)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    exported = d2s.export(static, input_spec=SPEC)
    for sign, n in CASES:
        x, count = _inputs(sign, n)
        with torch.no_grad():
            want = eager(x, count)
        (onnx_out,) = session.run(None, {i.name: v.numpy() for i, v in zip(session.get_inputs(), (x, count))})
        np.testing.assert_allclose(onnx_out, want.numpy(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(exported.module()(x, count), want, rtol=1e-5, atol=1e-6)
