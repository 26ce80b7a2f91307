"""`d2s.cuda_graph`: declarative calls replayed as CUDA graphs where that is
exact, and plain declarative calls everywhere else (d2s/cuda_graphs.py).

Each model runs eagerly and through the graphed callable on inputs that
change values between calls; a replay must give eager's results bit for bit
(the same kernels, launched from a graph). Programs a replay cannot serve
(a tensor `if` or a `while` that reads GPU values, Python state, an
argument written in place, random numbers) must run as plain calls with
eager's results, on inputs taking every side, and say why. The GPU tests skip without a device; the CPU tests
check the plain-call path CI can run.
"""

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICE = "cuda"


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(6))
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.tanh(self.drop(layer(x)))
        return F.log_softmax(x, -1), x.shape[0]


class CellLoop(nn.Module):
    """A loop of a size's trips (decided on the host, the same for every
    call of a shape) or of a count passed as a 0-d CPU tensor (read on the
    host: a key by its value)."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(8, 16)

    def forward(self, x, length=None):
        h = torch.zeros(x.shape[0], 16, device=x.device)
        c = torch.zeros(x.shape[0], 16, device=x.device)
        for t in range(x.shape[1] if length is None else length):
            h, c = self.cell(x[:, t], (h, c))
        return h + c


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        y = self.lin(x)
        if x.mean() > 0:
            y = y * 2
        else:
            y = -y
        return y


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(16, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, h):
        steps = torch.zeros((), dtype=torch.long, device=h.device)
        while steps < 6:
            h = self.cell(h, h)
            steps = steps + 1
            if self.out(h).argmax(-1)[0] == 0:
                break
        return h, steps


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        x.mul_(2)
        return self.lin(x)


def _inputs(shape, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(DEVICE) for _ in range(n)]


def _same(got, want):
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            assert g.device == w.device and torch.equal(g, w)
        else:
            assert int(g) == w


def _ops(static):
    program = static.forward.concrete_program.main_program
    return {op.type for b in program.blocks for op in b.ops}


def _both_signs(shape):
    """Inputs that take a tensor `if`'s either side, alternating."""
    return [(x.abs() + 0.1) * sign for x in _inputs(shape, 2) for sign in (1, -1)]


@cuda
@pytest.mark.parametrize("name,make,shapes,inputs,ops", [
    ("mlp", MLP, [(3, 16), (5, 16)], _inputs, set()),
    ("cell loop", CellLoop, [(2, 0, 8), (2, 1, 8), (2, 7, 8)], _inputs, set()),
])
def test_replays_give_eager_results_with_one_capture_per_shape(name, make, shapes, inputs, ops):
    torch.manual_seed(0)
    eager = make().to(DEVICE).eval()
    static = d2s.declarative(copy.deepcopy(eager))
    graphed = d2s.cuda_graph(static)
    kept = []
    with torch.no_grad():
        for shape in shapes:
            for x in inputs(shape):
                got = graphed(x)
                _same(got, eager(x))
                kept.append((x, got))
        for x, got in kept:  # a later replay does not overwrite an earlier call's results
            _same(got, eager(x))
    # The first call of a shape runs plainly (and is watched); the others replay.
    assert not graphed.not_captured
    assert graphed.captures == len(shapes) and graphed.replays == len(kept) - len(shapes)
    assert ops <= _ops(static)


@cuda
@pytest.mark.parametrize("name,make,inputs,ops,why", [
    ("tensor if", Branchy, lambda: _both_signs((3, 16)), {"cond"}, "reads a GPU value on the host"),
    ("while with break", Decoder, lambda: _inputs((2, 16), 6), {"while"}, "reads a GPU value on the host"),
    ("python state", Counting, lambda: _inputs((3, 16)), set(), "Python state"),
    ("argument written in place", InPlace, lambda: _inputs((3, 16)), set(), "in place"),
])
def test_calls_a_graph_cannot_serve_run_plainly_with_eager_results(name, make, inputs, ops, why):
    torch.manual_seed(0)
    eager = make().to(DEVICE)
    static = d2s.declarative(copy.deepcopy(eager))
    graphed = d2s.cuda_graph(static)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in inputs():
            want = eager(x.clone())
            xs = x.clone()
            got = graphed(xs)
            _same(got, want)
            if name == "argument written in place":
                assert torch.equal(xs, x * 2)
    assert graphed.replays == 0 and graphed.captures == 0
    assert len(graphed.not_captured) == 1 and why in next(iter(graphed.not_captured.values()))
    assert sum("without a CUDA graph" in str(w.message) for w in caught) == 1
    assert ops <= _ops(static)
    if name == "python state":
        assert static.calls == eager.calls


@cuda
def test_a_count_passed_as_a_cpu_tensor_is_a_key_by_its_value():
    torch.manual_seed(0)
    eager = CellLoop().to(DEVICE).eval()
    static = d2s.declarative(copy.deepcopy(eager))
    graphed = d2s.cuda_graph(static)
    with torch.no_grad():
        for n in (0, 1, 5, 0, 1, 5, 5):
            x = _inputs((2, 6, 8), 1, seed=n)[0]
            _same(graphed(x, torch.tensor(n)), eager(x, torch.tensor(n)))
    assert "while" in _ops(static)
    assert graphed.captures == 3 and graphed.replays == 4 and not graphed.not_captured


@cuda
def test_dropout_replays_in_eval_mode_and_runs_plainly_in_training_mode():
    torch.manual_seed(0)
    model = d2s.declarative(MLP().to(DEVICE))
    graphed = d2s.cuda_graph(model)
    x = _inputs((3, 16), 1)[0]
    with torch.no_grad():
        model.eval()
        graphed(x)
        assert graphed.captures == 1
        model.train()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(1)
            got = graphed(x)
        torch.manual_seed(1)
        want = model(x)
    assert "random numbers" in " ".join(graphed.not_captured.values())
    _same(got, want)


@cuda
def test_parameters_updated_in_place_are_read_and_new_ones_capture_again():
    torch.manual_seed(0)
    eager = MLP().to(DEVICE).eval()
    static = d2s.declarative(copy.deepcopy(eager))
    graphed = d2s.cuda_graph(static)
    x = _inputs((3, 16), 1)[0]
    with torch.no_grad():
        _same(graphed(x), eager(x))
        for model in (eager, static):  # an optimizer step: the same storage
            model.layers[0].weight.add_(0.5)
        _same(graphed(x), eager(x))
        assert graphed.captures == 1
        for model in (eager, static):  # a new Parameter: another address
            model.layers[1].weight = nn.Parameter(model.layers[1].weight * 3)
        _same(graphed(x), eager(x))
    assert graphed.captures == 2


@cuda
def test_kinds_of_arguments_past_the_limit_run_plainly(monkeypatch):
    monkeypatch.setattr(d2s.cuda_graphs, "MAX_KEYS", 2)
    torch.manual_seed(0)
    eager = CellLoop().to(DEVICE).eval()
    graphed = d2s.cuda_graph(d2s.declarative(copy.deepcopy(eager)))
    x = _inputs((2, 6, 8), 1)[0]
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (1, 2, 3, 4, 3, 1):
            _same(graphed(x, torch.tensor(n)), eager(x, torch.tensor(n)))
    assert graphed.captures == 2 and graphed.replays == 1
    assert sum("kinds of arguments" in str(w.message) for w in caught) == 1


@cuda
def test_a_model_saved_on_the_cpu_and_loaded_onto_the_gpu_replays(tmp_path):
    torch.manual_seed(0)
    eager = MLP().eval()
    d2s.jit.save(d2s.declarative(copy.deepcopy(eager)), str(tmp_path / "m"), input_spec=[torch.randn(3, 16)])
    loaded = d2s.jit.load(str(tmp_path / "m")).to(DEVICE).eval()
    eager = eager.to(DEVICE)
    graphed = d2s.cuda_graph(loaded)
    with torch.no_grad():
        for x in _inputs((3, 16)):
            _same(graphed(x), eager(x))
    assert graphed.captures == 1 and graphed.replays == 3 and not graphed.not_captured


@cuda
def test_grad_mode_and_cpu_arguments_run_plainly():
    torch.manual_seed(0)
    eager = MLP().to(DEVICE).eval()
    graphed = d2s.cuda_graph(d2s.declarative(copy.deepcopy(eager)))
    x = _inputs((3, 16), 1)[0]
    _same(graphed(x), eager(x))  # grad mode on: autograd is recorded, no graph
    assert graphed.captures == graphed.replays == 0


# -- without a GPU (CI) --------------------------------------------------------------------------

def test_a_loaded_model_on_cpu_arguments_runs_plainly(tmp_path):
    torch.manual_seed(0)
    eager = MLP().eval()
    x = torch.randn(3, 16)
    d2s.jit.save(d2s.declarative(copy.deepcopy(eager)), str(tmp_path / "m"), input_spec=[x])
    graphed = d2s.cuda_graph(d2s.jit.load(str(tmp_path / "m")).eval())
    with torch.no_grad():
        got, want = graphed(x), eager(x)
    assert torch.equal(got[0], want[0]) and int(got[1]) == want[1]
    assert graphed.captures == graphed.replays == 0


def test_cpu_arguments_run_as_plain_declarative_calls():
    torch.manual_seed(0)
    eager = MLP().eval()
    graphed = d2s.cuda_graph(d2s.declarative(copy.deepcopy(eager)))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 16, generator=g)
            got, want = graphed(x), eager(x)
            assert torch.equal(got[0], want[0]) and got[1] == want[1]
    assert graphed.captures == graphed.replays == 0 and not graphed.not_captured


def test_the_state_a_replay_depends_on_sees_new_storage_and_new_parameters():
    """What `_state` compares before a replay (CPU: the same code path)."""
    model = d2s.declarative(MLP().eval())
    graphed = d2s.cuda_graph(model)
    x = torch.randn(3, 16)
    with torch.no_grad():
        model(x)
        token, program = graphed._source.program((x,), {})
        before = graphed._state(token, program)
        model.layers[0].weight.add_(1)  # an optimizer step: the replay reads it
        assert graphed._state(token, program) == before
        model.layers[0].weight.data = model.layers[0].weight.data.clone()  # moved storage
        moved = graphed._state(token, program)
        assert moved != before
        model.layers[1].weight = nn.Parameter(model.layers[1].weight * 2)  # a new Parameter
        assert graphed._state(token, program) != moved


@pytest.mark.parametrize("view,buffered", [
    (lambda: torch.randn(4, 16), True),
    (lambda: torch.randn(16, 4).t(), True),          # transposed: a buffer of its strides takes it
    (lambda: torch.randn(4, 1).expand(4, 16), False),  # stride 0: no buffer of its strides can
    (lambda: torch.randn(8, 16)[::2], False),          # torch cannot tell quickly: plainly
])
def test_only_arguments_a_buffer_of_their_strides_can_take_are_replayed(view, buffered):
    assert d2s.cuda_graphs._no_overlap(view()) == buffered


@pytest.mark.parametrize("target", [MLP(), lambda x: x, torch.tanh])
def test_only_declarative_targets_are_taken(target):
    with pytest.raises(TypeError, match="declarative"):
        d2s.cuda_graph(target)
