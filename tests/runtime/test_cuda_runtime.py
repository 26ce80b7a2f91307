"""The runtime on a CUDA device, against eager on the same device.

- native segments: every op group of test_native.py with gradients;
- models with `cond` / `while` (an LSTMCell loop, a GRU greedy decoder with
  `break`, residual layers with a tensor `if`) on every path, with
  gradients, at both levels;
- a program converted for CPU inputs and one for GPU inputs side by side;
- saved models: loaded and moved to the GPU, and through the Executor's
  `CUDAPlace`.

Bit for bit at the default level: the same kernels run in the same order.
cuDNN runs in deterministic mode here, so that eager's own backward
convolutions repeat. The fast level is within its rounding promise.
Skipped without a CUDA device.
"""

import copy
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s
from runtime import native

from test_native import CASES, UNARY, _check_case, _unary, _x

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEVICE = "cuda"
_RTOL, _ATOL = 1e-5, 1e-6  # the fast level's promise (docs/performance.md)
_NATIVE = native.load() is not None or bool(os.environ.get("D2S_REQUIRE_NATIVE"))


@pytest.fixture(autouse=True)
def _deterministic_cudnn():
    before = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    yield
    torch.backends.cudnn.deterministic = before


def _on_device(make_args):
    def make():
        return [a.detach().to(DEVICE).requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                for a in make_args()]
    return make


# -- native segments -------------------------------------------------------------------------

@pytest.mark.skipif(not _NATIVE, reason="native executor unavailable")
@pytest.mark.parametrize("name", sorted(CASES))
def test_native_op_groups_match_eager_on_cuda(name):
    fn, make_args = CASES[name]
    make = _on_device(make_args)
    try:
        fn(*make())
    except RuntimeError as exc:  # a group that makes CPU tensors beside the inputs: eager's error, as eagerly
        with pytest.raises(type(exc), match="same device"):
            d2s.declarative(fn)(*make())
        assert "same device" in str(exc)
        return
    _check_case(fn, make)


@pytest.mark.skipif(not _NATIVE, reason="native executor unavailable")
@pytest.mark.parametrize("op", UNARY, ids=lambda o: o.__name__)
def test_native_unary_ops_match_eager_on_cuda(op):
    _check_case(_unary(op), _on_device(lambda: [_x(3, 4)()]))


# -- models with control flow, every path, gradients ------------------------------------------

class LSTMLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(8, 16)

    def forward(self, x, length):
        h = torch.zeros(x.shape[0], 16, device=x.device)
        c = torch.zeros(x.shape[0], 16, device=x.device)
        for t in range(length):
            h, c = self.cell(x[:, t], (h, c))
        return h + c


class GreedyDecoder(nn.Module):
    def __init__(self, vocab=12, hidden=16, eos=1):
        super().__init__()
        self.eos = eos
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, h, max_len):
        token = torch.zeros(h.shape[0], dtype=torch.long, device=h.device)
        done = torch.zeros(h.shape[0], dtype=torch.bool, device=h.device)
        states = [h]
        step = 0
        while step < max_len:
            h = self.cell(self.embed(token), h)
            token = self.out(h).argmax(-1)
            states.append(h)
            done = done | (token == self.eos)
            step += 1
            if done.all():
                break
        return torch.stack(states, 1).sum(1), step


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
        self.conv = nn.Conv1d(2, 2, 3, padding=1)

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        if x.mean() > 0:
            x = x * 0.5
        else:
            x = self.conv(x.view(x.shape[0], 2, 8)).flatten(1) - 1.0
        return F.log_softmax(x, -1)


def _lstm_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, 8, generator=g)
    return [((x,), torch.tensor(n)) for n in (0, 1, 6)]


def _decoder_inputs():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 16, generator=g)
    return [((h,), torch.tensor(n)) for n in (0, 1, 5)]


def _residual_inputs():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 16, generator=g)
    return [((x.abs(),), None), ((-x.abs() - 4,), None)]


def _decoder_that_stops_at_once(model):
    with torch.no_grad():
        model.out.bias[model.eos] = 100.0  # every sequence ends with its first token: the break is taken
    return model


MODELS = {
    "lstm loop": (LSTMLoop, _lstm_inputs, {"while"}),
    "gru decoder": (GreedyDecoder, _decoder_inputs, {"while", "cond"}),
    "gru decoder, break at once": (lambda: _decoder_that_stops_at_once(GreedyDecoder()), _decoder_inputs,
                                   {"while", "cond"}),
    "residual": (Residual, _residual_inputs, {"cond"}),
}


def _flat(out):
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("level", ["default", "fast"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_match_eager_on_cuda_on_every_path_with_gradients(name, level):
    make, inputs, ops = MODELS[name]
    torch.manual_seed(0)
    eager = make().to(DEVICE)
    static = d2s.declarative(copy.deepcopy(eager), optimize=level)
    for tensors, extra in inputs():
        args = [t.to(DEVICE).requires_grad_() for t in tensors] + ([] if extra is None else [extra])
        static_args = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_cuda else a
                       for a in args]
        want, got = _flat(eager(*args)), _flat(static(*static_args))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            if not isinstance(w, torch.Tensor):  # the decoder's step count (a Python int eagerly)
                assert int(g) == w
                continue
            assert g.device == w.device and g.dtype == w.dtype and g.shape == w.shape
            if level == "default":
                assert torch.equal(g, w)
            else:
                torch.testing.assert_close(g, w, rtol=_RTOL, atol=_ATOL)
        want_grad = [w for w in want if isinstance(w, torch.Tensor) and w.requires_grad]
        got_grad = [g for g in got if isinstance(g, torch.Tensor) and g.requires_grad]
        assert len(got_grad) == len(want_grad)  # none where no trip ran
        if want_grad:
            sum(w.sum() for w in want_grad).backward()
            sum(g.sum() for g in got_grad).backward()
        pairs = list(zip(static.parameters(), eager.parameters())) + list(zip(static_args, args))
        for s, e in pairs:
            if not isinstance(e, torch.Tensor) or not e.requires_grad:
                continue
            assert (s.grad is None) == (e.grad is None)
            if e.grad is not None and level == "default":
                assert torch.equal(s.grad, e.grad)
            elif e.grad is not None:
                torch.testing.assert_close(s.grad, e.grad, rtol=_RTOL, atol=_ATOL)
        eager.zero_grad(set_to_none=True)
        static.zero_grad(set_to_none=True)
    assert len(static.forward.program_cache) == 1
    program = static.forward.concrete_program.main_program
    assert ops <= {op.type for block in program.blocks for op in block.ops}


@pytest.mark.parametrize("cudnn", [True, False], ids=["cudnn", "no cudnn"])
def test_fast_level_fuses_a_cuda_rnn_loop_only_without_cudnn(monkeypatch, cudnn):
    """cuDNN's fused RNN rounds outside the fast level's promise (TF32 by
    default; 1e-4 relative on small elements even in float32): with cuDNN on,
    the loop runs step by step; with it off, torch's fused kernels run, as
    on the CPU. Either way within the promise."""
    calls = []
    lstm = torch.lstm
    monkeypatch.setattr(torch, "lstm", lambda *a, **k: calls.append(1) or lstm(*a, **k))
    before = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = cudnn
    try:
        torch.manual_seed(0)
        eager = LSTMLoop().to(DEVICE)
        fast = d2s.declarative(copy.deepcopy(eager), optimize="fast")
        x = torch.randn(4, 48, 8, device=DEVICE)
        got, want = fast(x, torch.tensor(48)), eager(x, torch.tensor(48))
        torch.testing.assert_close(got, want, rtol=_RTOL, atol=_ATOL)
        got.sum().backward()
        want.sum().backward()
        for s, e in zip(fast.parameters(), eager.parameters()):
            torch.testing.assert_close(s.grad, e.grad, rtol=_RTOL, atol=_ATOL)
    finally:
        torch.backends.cudnn.enabled = before
    assert bool(calls) == (not cudnn)


def test_cpu_and_cuda_inputs_get_programs_of_their_own():
    def f(x):
        h = torch.zeros(x.shape[0], 3, device=x.device)
        if x.sum() > 0:
            h = h + 1
        return h * x
    static = d2s.declarative(f)
    for device in ("cpu", DEVICE, "cpu", DEVICE):
        for sign in (1.0, -1.0):
            x = torch.full((2, 3), sign, device=device)
            got, want = static(x), f(x)
            assert got.device == want.device and torch.equal(got, want)
    assert len(static.program_cache) == 2


def test_factories_follow_the_default_device_in_segments():
    # Tensors made without a device inside a straight-line run (a native segment).
    def f(x):
        z = torch.zeros(3, 4) + torch.ones(3, 4) * 2
        w = torch.arange(4.0).expand(3, 4)
        return torch.tanh(x * z + w) - z

    static = d2s.declarative(f)
    x = torch.randn(3, 4, device=DEVICE)
    with torch.device(DEVICE):
        want = f(x)
        got = static(x)
        got2 = static(x)
    assert got.device == want.device == got2.device and torch.equal(got, want) and torch.equal(got2, want)


# -- saved models on the GPU --------------------------------------------------------------------

def _example_call(inputs):
    tensors, extra = inputs()[-1]
    return [*tensors] + ([] if extra is None else [extra])


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if not isinstance(w, torch.Tensor):  # the decoder's step count (a Python int eagerly)
            assert int(g) == w
        else:
            assert g.device == w.device and torch.equal(g, w.detach())


@pytest.mark.parametrize("built_on", ["cpu", DEVICE])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_saved_model_loaded_and_moved_to_cuda_matches_eager(tmp_path, name, built_on):
    """Built on the CPU, the LSTM loop's and the decoder's `device=x.device`
    states follow the loaded model to the GPU (runtime/ir.py Program.device)."""
    make, inputs, _ = MODELS[name]
    torch.manual_seed(0)
    model = make().to(built_on)
    example = [t.to(built_on) if t.is_floating_point() else t for t in _example_call(inputs)]
    d2s.jit.save(d2s.declarative(copy.deepcopy(model)), str(tmp_path / "m"), input_spec=example)
    loaded = d2s.jit.load(str(tmp_path / "m")).to(DEVICE)
    model = model.to(DEVICE)
    for tensors, extra in inputs():
        args = [t.to(DEVICE) for t in tensors] + ([] if extra is None else [extra])
        _assert_same(_flat(loaded(*args)), _flat(model(*args)))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_executor_on_a_cuda_place_runs_a_saved_program(tmp_path, name):
    make, inputs, _ = MODELS[name]
    torch.manual_seed(0)
    model = make().eval()
    static = d2s.declarative(copy.deepcopy(model))
    static(*_example_call(inputs))
    d2s.ProgramTranslator().save_inference_model(str(tmp_path / "m"))
    exe = d2s.Executor(d2s.CUDAPlace(0))
    program, feed_names, fetch_targets = d2s.load_inference_model(str(tmp_path / "m"), exe)
    model = model.to(DEVICE)
    for tensors, extra in inputs():
        args = [t.to(DEVICE) for t in tensors] + ([] if extra is None else [extra])
        got = exe.run(program, feed=dict(zip(feed_names, args)), fetch_list=fetch_targets, return_numpy=False)
        _assert_same(got, _flat(model(*args)))


class Offset(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x) + torch.arange(16, device=self.lin.weight.device) \
            + torch.zeros(x.shape[0], 16, device=x.device)


def test_a_traced_layer_runs_on_the_device_of_its_inputs():
    torch.manual_seed(0)
    model = Offset()
    x = torch.randn(3, 16)
    _, traced = d2s.TracedLayer.trace(model, [x])
    model = model.to(DEVICE)  # moves the Parameters' storage: the traced layer reads them
    got, want = traced(x.to(DEVICE)), model(x.to(DEVICE))
    assert got.device == want.device and torch.equal(got, want.detach())
