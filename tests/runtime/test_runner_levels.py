"""Every runner at every level: `d2s.jit.load`, `TracedLayer`, `Executor.run`
and `d2s.Graph` take `optimize=` and run the passes and native code of a
declarative call at that level: "default" bit-identical to eager (values
and gradients), "fast" equal up to rounding, with grad mode on and off."""

import copy

import pytest
import torch
import torch.nn as nn

import d2s
from d2s import TracedLayer
from runtime.executor import Executor


class LoopNet(nn.Module):
    """An LSTMCell loop over a tensor length (fused at the fast level), a
    Linear (pretransposed at the fast level with grad off) and a tensor `if`."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(6, 8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x, n):
        h = torch.zeros(x.shape[0], 8)
        c = torch.zeros(x.shape[0], 8)
        for t in range(n):
            h, c = self.cell(x[:, t], (h, c))
        y = self.fc(h)
        if y.sum() > 0:
            y = y * 2
        else:
            y = torch.tanh(y) - 1
        return y


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 5)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))) + x[:, :5]


class Step(d2s.Graph):
    def __init__(self, model, optimize):
        super().__init__(optimize=optimize)
        self.model = model

    def build(self, x, n):
        return self.model(x, n)


def _inputs(trips, sign):
    torch.manual_seed(trips + 10 * (sign > 0))
    return sign * torch.rand(3, 4, 6) + 0.1 * torch.randn(3, 4, 6), torch.tensor(trips)


def _check(got, want, level):
    if level == "default":
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want)


def _grads(model):
    return {n: p.grad for n, p in model.named_parameters()}


def _check_grads(got, want, level):
    assert set(got) == set(want)
    for name in want:
        if want[name] is None:  # zero trips: the cell never ran
            assert got[name] is None
        else:
            _check(got[name], want[name], level)


def _loaded(eager, tmp_path, level):
    spec = [d2s.InputSpec([None, 4, 6]), d2s.InputSpec([], "int64")]
    d2s.jit.save(d2s.declarative(copy.deepcopy(eager)), str(tmp_path / "m"), input_spec=spec)
    return d2s.jit.load(str(tmp_path / "m"), optimize=level)


@pytest.mark.parametrize("level", ["default", "fast"])
@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("trips,sign", [(0, 1), (1, -1), (3, 1), (4, -1)])
def test_loaded_model_at_each_level_matches_eager(tmp_path, level, grad, trips, sign):
    torch.manual_seed(0)
    eager = LoopNet()
    loaded = _loaded(eager, tmp_path, level)
    x, n = _inputs(trips, sign)
    with torch.set_grad_enabled(grad):
        want, got = eager(x, n), loaded(x, n)
    _check(got, want, level)
    if grad:
        want.sum().backward()
        got.sum().backward()
        _check_grads(_grads(loaded), _grads(eager), level)


@pytest.mark.parametrize("level", ["default", "fast"])
@pytest.mark.parametrize("grad", [True, False])
def test_traced_layer_at_each_level_matches_eager(level, grad):
    torch.manual_seed(0)
    eager = Plain()
    x = torch.randn(4, 6)
    _, traced = TracedLayer.trace(copy.deepcopy(eager), [x], optimize=level)
    other = torch.randn(4, 6)
    with torch.set_grad_enabled(grad):
        want, got = eager(other), traced(other)
    _check(got, want, level)
    if grad:
        want.sum().backward()
        got.sum().backward()
        bound = traced.program.bound
        got_grads = {n: bound[n].grad for n in traced._run.entry().param_names}
        assert sorted(g.shape for g in got_grads.values()) == sorted(p.grad.shape for p in eager.parameters())
        for p in eager.parameters():
            assert any(g.shape == p.grad.shape and torch.allclose(g, p.grad) for g in got_grads.values())
            if level == "default":
                assert any(torch.equal(g, p.grad) for g in got_grads.values())


@pytest.mark.parametrize("level", ["default", "fast"])
@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("trips,sign", [(0, -1), (2, 1), (4, -1)])
def test_executor_run_at_each_level_matches_eager(level, grad, trips, sign):
    torch.manual_seed(0)
    eager = LoopNet()
    static = d2s.declarative(copy.deepcopy(eager))
    x, n = _inputs(trips, sign)
    static(x, n)
    concrete = static.forward.concrete_program
    feed = dict(zip([v.name for v in concrete.inputs], [x, n]))
    with torch.set_grad_enabled(grad):
        want = eager(x, n)
        (got,) = Executor().run(concrete.main_program, feed, concrete.fetch_vars, return_numpy=False,
                                optimize=level)
    _check(got, want, level)


@pytest.mark.parametrize("level", ["default", "fast"])
@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("trips,sign", [(0, 1), (3, -1)])
def test_graph_at_each_level_matches_eager(level, grad, trips, sign):
    torch.manual_seed(0)
    eager = LoopNet()
    graph = Step(copy.deepcopy(eager), level)
    x, n = _inputs(trips, sign)
    with torch.set_grad_enabled(grad):
        want, got = eager(x, n), graph(x, n)
    _check(got, want, level)
    assert graph._build_fn.concrete_program.optimize == level


def test_level_reaches_the_compiled_code(tmp_path):
    """The loaded model runs the function compiled for its level, and with
    grad mode off at the fast level the Linear's weight pretransposed (a
    derived argument), as a declarative call does."""
    torch.manual_seed(0)
    eager = LoopNet()
    for level in ("default", "fast"):
        loaded = _loaded(eager, tmp_path / level, level)
        x, n = _inputs(3, 1)
        loaded(x, n)
        run = loaded._compiled[id(loaded.program)]
        fetches = [v.name for v in loaded.fetch_vars]
        assert run.entry() is Executor().compiled(loaded.program, loaded.feed_names, fetches, level)
        with torch.no_grad():
            loaded(x, n)
            assert bool(run.entry().derived) == (level == "fast")


def test_levels_are_checked(tmp_path):
    with pytest.raises(ValueError, match="optimize must be one of"):
        d2s.jit.load(str(tmp_path), optimize="fastest")
    with pytest.raises(ValueError, match="optimize must be one of"):
        Step(LoopNet(), "O3")


@pytest.mark.parametrize("how", ["setattr", "load_state_dict_assign", "apply"])
def test_loaded_model_reads_replaced_weights_after_a_call(tmp_path, how):
    """The loaded model keeps its parameter values between calls
    (d2s/slot_values.py) and looks them up again when a module's tensors
    are replaced."""
    torch.manual_seed(0)
    eager = LoopNet()
    loaded = _loaded(eager, tmp_path, "default")
    x, n = _inputs(2, 1)
    assert torch.equal(loaded(x, n), eager(x, n))
    with torch.no_grad():
        new = {k: torch.randn_like(v) for k, v in eager.state_dict().items()}
    eager.load_state_dict(new)
    if how == "setattr":
        for name, value in new.items():
            owner, key = loaded._slots[name]
            setattr(owner, key, nn.Parameter(value.clone()))
    elif how == "load_state_dict_assign":
        loaded.load_state_dict({k: nn.Parameter(v.clone()) for k, v in new.items()}, assign=True)
    else:  # Module._apply replaces each parameter by a new one when told to
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        try:
            before = [id(p) for p in loaded.parameters()]
            loaded.to(torch.float32)
            loaded.float()
            loaded._apply(lambda t: t.clone())
            assert [id(p) for p in loaded.parameters()] != before
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(False)
        loaded.load_state_dict(new)  # into the new tensors: the old ones keep the old weights
    assert torch.equal(loaded(x, n), eager(x, n))
