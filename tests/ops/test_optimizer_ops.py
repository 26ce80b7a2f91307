"""The training ops' kernels (ops/optimizer_ops.py) against eager, step by
step and bit for bit: a d2s.Graph whose step holds a tensor `if` (a
parameter only one branch uses gets no gradient on the other path) trains
exactly as the eager loop with the same optimizer, whether the step takes
the kernels' shortcuts (plain SGD's update, zero_grad, the engine call
behind torch.autograd.grad) or the optimizer's own Python (momentum, hooks,
a profiler, an lr scheduler, no native extension)."""

import contextlib
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

import d2s
from ops import optimizer_ops
from runtime import native


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.pos = nn.Linear(8, 4)
        self.neg = nn.Linear(8, 4)

    def forward(self, x, y):
        h = torch.relu(self.fc(x))
        if x.mean() > 0:
            out = self.pos(h)
        else:
            out = self.neg(h) * 2
        return F.cross_entropy(out, y)


class Step(d2s.Graph):
    def __init__(self, model, opt, scheduler=None, optimize=None):
        super().__init__(optimize=optimize)
        self.model = model
        self.add_optimizer(opt, lr_scheduler=scheduler)

    def build(self, x, y):
        loss = self.model(x, y)
        loss.backward()
        return loss


def _batches():
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(6):  # both branches, alternately
        shift = 2.0 if i % 2 else -2.0
        out.append((torch.randn(5, 6, generator=g) + shift, torch.randint(0, 4, (5,), generator=g)))
    return out


def _sgd(**kw):
    return lambda params: torch.optim.SGD(params, **({"lr": 0.1} | kw))


def _groups(params):
    params = list(params)
    return torch.optim.SGD([{"params": params[:2], "lr": 0.05}, {"params": params[2:]}], lr=0.2)


# name -> (optimizer maker, whether the step takes optimizer_ops' shortcut)
OPTIMIZERS = {
    "sgd": (_sgd(), True),
    "sgd-int-lr": (_sgd(lr=1), True),
    "sgd-groups": (_groups, True),
    "sgd-foreach-off": (_sgd(foreach=False), True),
    "sgd-momentum": (_sgd(momentum=0.9), True),
    "sgd-momentum-dampening": (_sgd(momentum=0.9, dampening=0.3), True),
    "sgd-nesterov": (_sgd(momentum=0.9, nesterov=True, weight_decay=0.01), True),
    "sgd-weight-decay": (_sgd(weight_decay=0.1), True),
    "sgd-maximize": (_sgd(maximize=True, momentum=0.5), True),
    "sgd-tensor-lr": (_sgd(lr=torch.tensor(0.1)), False),
    "sgd-bool-lr": (_sgd(lr=True), False),  # a bool is not a number here: `-lr` is -1, not a negated bool
    "sgd-foreach": (_sgd(foreach=True, momentum=0.9), False),
    "adam": (lambda p: torch.optim.Adam(p, lr=0.01), False),
}


def _eager_and_graph(make_opt, optimize="default", scheduler=None):
    torch.manual_seed(0)
    eager = Branchy()
    model = Branchy()
    model.load_state_dict(eager.state_dict())
    eager_opt, graph_opt = make_opt(eager.parameters()), make_opt(model.parameters())
    eager_sched = graph_sched = None
    if scheduler is not None:
        eager_sched, graph_sched = scheduler(eager_opt), scheduler(graph_opt)
    return eager, eager_opt, eager_sched, model, Step(model, graph_opt, graph_sched, optimize), graph_opt


def _train_alike(eager, eager_opt, eager_sched, model, graph, batches=None):
    taken = set()
    for x, y in batches or _batches():
        eager_opt.zero_grad()
        want = eager(x, y)
        want.backward()
        eager_opt.step()
        if eager_sched is not None:
            eager_sched.step()
        got = graph(x, y)
        assert torch.equal(got, want)
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            assert torch.equal(p, q), name
            assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)), name
        taken.add(x.mean().item() > 0)
    assert taken == {True, False}  # both branches, each leaving one Linear without a gradient
    types = [op.type for op in graph.program.global_block().ops]
    assert "cond" in types and types[-1] == "optimizer_step"
    assert len(graph._build_fn.program_cache) == 1


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("optimize", ["default", "fast"])
def test_graph_steps_match_eager_bit_for_bit(name, optimize):
    make_opt, plain = OPTIMIZERS[name]
    eager, eager_opt, _, model, graph, graph_opt = _eager_and_graph(make_opt, optimize)
    assert optimizer_ops._plain_sgd(graph_opt) == plain
    if optimize == "fast":
        # The fast level's fused node sums gradient contributions in its own
        # order: values, not bits (docs/performance.md), on the same path.
        for x, y in _batches():
            eager_opt.zero_grad()
            want = eager(x, y)
            want.backward()
            eager_opt.step()
            torch.testing.assert_close(graph(x, y), want, rtol=1e-5, atol=1e-6)
        for p, q in zip(eager.parameters(), model.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
        return
    _train_alike(eager, eager_opt, None, model, graph)
    # The optimizer's state (momentum buffers, Adam's moments and steps) is eager's too.
    want, got = eager_opt.state_dict(), graph_opt.state_dict()
    assert want["param_groups"] == got["param_groups"] and want["state"].keys() == got["state"].keys()
    for k, entry in want["state"].items():
        assert entry.keys() == got["state"][k].keys()
        for key, value in entry.items():
            same = torch.equal(value, got["state"][k][key]) if isinstance(value, torch.Tensor) else \
                value == got["state"][k][key]
            assert same, (k, key)


def test_lr_scheduler_sees_its_steps_called_in_order():
    scheduler = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)  # noqa: E731
    eager, eager_opt, eager_sched, model, graph, graph_opt = _eager_and_graph(_sgd(), scheduler=scheduler)
    assert optimizer_ops._plain_sgd(graph_opt)  # the scheduler's wrapper keeps the shortcut
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()" would fail here
        _train_alike(eager, eager_opt, eager_sched, model, graph)
    assert graph_opt.param_groups[0]["lr"] == eager_opt.param_groups[0]["lr"] < 0.1


@pytest.mark.parametrize("where", ["optimizer", "global"])
def test_step_hooks_run_on_every_step(where):
    eager, eager_opt, _, model, graph, graph_opt = _eager_and_graph(_sgd())
    calls = []
    register = graph_opt.register_step_pre_hook if where == "optimizer" else \
        register_optimizer_step_post_hook
    handle = register(lambda opt, args, kwargs: calls.append(opt) if opt is graph_opt else None)
    try:
        assert not optimizer_ops._plain_sgd(graph_opt)
        _train_alike(eager, eager_opt, None, model, graph)
    finally:
        handle.remove()
    assert calls == [graph_opt] * len(_batches())
    assert optimizer_ops._plain_sgd(graph_opt)


def test_a_profiler_sees_the_optimizers_own_scopes():
    eager, eager_opt, _, model, graph, graph_opt = _eager_and_graph(_sgd())
    graph(*_batches()[0])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        graph(*_batches()[1])
    names = {e.name for e in prof.events()}
    assert "Optimizer.step#SGD.step" in names and "Optimizer.zero_grad#SGD.zero_grad" in names


@pytest.mark.parametrize("method", ["step", "zero_grad"])
def test_an_instance_method_of_the_users_own_is_called(method):
    eager, eager_opt, _, model, graph, graph_opt = _eager_and_graph(_sgd())
    calls = []
    original = getattr(graph_opt, method)

    def own(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    setattr(graph_opt, method, own)
    assert (not optimizer_ops._plain_sgd(graph_opt)) == (method == "step")
    _train_alike(eager, eager_opt, None, model, graph)
    assert len(calls) == len(_batches())


class Subclassed(torch.optim.SGD):
    def step(self, closure=None):
        self.count = getattr(self, "count", 0) + 1
        return super().step(closure)


def test_a_subclass_step_is_called():
    eager, eager_opt, _, model, graph, graph_opt = _eager_and_graph(lambda p: Subclassed(p, lr=0.1))
    assert not optimizer_ops._plain_sgd(graph_opt)
    _train_alike(eager, eager_opt, None, model, graph)
    assert graph_opt.count == len(_batches())


def test_without_the_native_extension_backward_is_torch_autograd_grad(monkeypatch):
    monkeypatch.setattr(native, "load", lambda: None)
    _train_alike(*_eager_and_graph(_sgd())[:5])


class MyHookError(Exception):
    pass


def _cause(exc):
    """The error an op raised: d2s re-raises it naming the op and the user's line."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


@pytest.mark.parametrize("engine", ["native", "python"])
def test_backward_errors_are_eagers(monkeypatch, engine):
    if engine == "python":
        monkeypatch.setattr(native, "load", lambda: None)
    elif native.load() is None:
        pytest.skip(f"native executor unavailable: {native.unavailable_reason()}")
    eager, eager_opt, _, model, graph, graph_opt = _eager_and_graph(_sgd())

    def fail(grad):
        raise MyHookError("from a hook")

    handles = [eager.pos.weight.register_hook(fail), model.pos.weight.register_hook(fail)]
    x, y = _batches()[1]  # the branch that uses `pos`
    with pytest.raises(MyHookError, match="from a hook"):
        eager(x, y).backward()
    with pytest.raises(Exception) as raised:
        graph(x, y)
    assert type(_cause(raised.value)) is MyHookError and "loss.backward()" in str(raised.value)
    for h in handles:
        h.remove()

    def twice(x, y):
        loss = model(x, y)
        loss.backward()
        loss.backward()
        return loss

    with pytest.raises(RuntimeError) as want:
        twice(x, y)
    with pytest.raises(Exception) as got:
        d2s.declarative(twice)(x, y)
    assert type(_cause(got.value)) is RuntimeError and str(_cause(got.value)) == str(want.value)


class OwnParameter(nn.Parameter):
    """A parameter subclass: SGD's calls on it are Python calls (it may
    override __torch_function__), so the step must not bypass them."""


class CountCalls(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _sgd_params(seed, kind):
    g = torch.Generator().manual_seed(seed)
    cls = OwnParameter if kind == "subclass" else nn.Parameter
    return [cls(torch.randn(3, 4, generator=g)), cls(torch.randn(4, generator=g)), cls(torch.randn(2, generator=g))]


@pytest.mark.parametrize("engine", ["native", "python"])
@pytest.mark.parametrize("kind", ["plain", "subclass", "function-mode"])
@pytest.mark.parametrize("name", sorted(n for n in OPTIMIZERS if n.startswith("sgd")))
def test_the_sgd_shortcut_is_taken_exactly_when_it_is_sgds_own_path(monkeypatch, engine, kind, name):
    """The native `sgd_step` and `_plain_sgd_groups` accept the same groups
    (else the step is the optimizer's own), and either way the parameters,
    the momentum state and the calls a torch function mode sees are eager's,
    over steps where one parameter has no gradient."""
    if engine == "python":
        monkeypatch.setattr(native, "loaded", lambda: None)
    elif native.load() is None:
        pytest.skip(f"native executor unavailable: {native.unavailable_reason()}")
    make_opt, plain = OPTIMIZERS[name]
    want_params, got_params = _sgd_params(0, kind), _sgd_params(0, kind)
    want_opt, got_opt = make_opt(want_params), make_opt(got_params)
    ref = optimizer_ops.OptimizerRef(got_opt)
    with CountCalls() if kind == "function-mode" else contextlib.nullcontext():
        expected = plain and kind == "plain"
        assert optimizer_ops._plain_sgd_groups(got_opt.param_groups) == expected
        if engine == "native":  # no gradients yet: the step it takes changes nothing
            assert native.loaded().sgd_step(got_opt.param_groups, got_opt.state) == expected
            assert not got_opt.state and all(torch.equal(p, q) for p, q in zip(want_params, got_params))
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        for want, got in zip(want_params, got_params):
            grad = torch.randn(want.shape, generator=g)
            if step == 1 and want.dim() == 1 and want.numel() == 2:
                grad = None  # skipped by torch.optim: no update, no state entry
            want.grad, got.grad = grad, None if grad is None else grad.clone()
        modes = [CountCalls(), CountCalls()] if kind == "function-mode" else [None, None]
        with modes[0] or contextlib.nullcontext():
            want_opt.step()
        with modes[1] or contextlib.nullcontext():
            optimizer_ops._optimizer_step_kernel(ref)
        if modes[0] is not None:
            assert modes[1].calls == modes[0].calls and modes[0].calls
        for want, got in zip(want_params, got_params):
            assert torch.equal(want, got)
        want_state, got_state = want_opt.state_dict()["state"], got_opt.state_dict()["state"]
        assert want_state.keys() == got_state.keys()
        for k in want_state:
            assert torch.equal(want_state[k]["momentum_buffer"], got_state[k]["momentum_buffer"])


@pytest.mark.parametrize("engine", ["native", "python"])
@pytest.mark.parametrize("kind", ["plain", "subclass"])
def test_zero_grad_under_a_function_mode_makes_eagers_calls(monkeypatch, engine, kind):
    if engine == "python":
        monkeypatch.setattr(native, "loaded", lambda: None)
    seen = []
    for kernels in (False, True):
        params = _sgd_params(0, kind)
        opt = torch.optim.SGD(params, lr=0.1)
        for p in params[:2]:
            p.grad = torch.ones_like(p)
        with CountCalls() as mode:
            optimizer_ops._optimizer_zero_grad_kernel(optimizer_ops.OptimizerRef(opt)) if kernels else \
                opt.zero_grad()
        seen.append(mode.calls)
        assert all(p.grad is None for p in params)
    assert seen[0] == seen[1] and "_record_function_enter_new" in seen[0]


@pytest.mark.parametrize("kind", ["plain", "subclass"])
def test_native_zero_grads_resets_plain_parameters_only(kind):
    engine = native.load()
    if engine is None:
        pytest.skip(f"native executor unavailable: {native.unavailable_reason()}")
    params = _sgd_params(0, kind)
    opt = torch.optim.SGD([{"params": params[:1]}, {"params": params[1:]}], lr=0.1)
    for p in params[:2]:
        p.grad = torch.ones_like(p)
    assert engine.zero_grads(opt.param_groups) == (kind == "plain")
    assert all((p.grad is None) == (kind == "plain" or i == 2) for i, p in enumerate(params))
    optimizer_ops._optimizer_zero_grad_kernel(optimizer_ops.OptimizerRef(opt))
    assert all(p.grad is None for p in params)


@pytest.mark.parametrize("settings", [{}, {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True}, {"maximize": True}])
def test_sparse_gradients_take_sgds_calls(settings):
    """An nn.Embedding(sparse=True): its sparse `.grad` goes through the same
    update calls as in SGD.step (the momentum buffer a sparse clone)."""
    runs = []
    for kernels in (False, True):
        torch.manual_seed(0)
        embed = nn.Embedding(10, 4, sparse=True)
        opt = torch.optim.SGD(embed.parameters(), lr=0.1, **settings)
        ref = optimizer_ops.OptimizerRef(opt)
        for ids in ([1, 2, 2, 5], [0, 5], [9]):
            optimizer_ops._optimizer_zero_grad_kernel(ref) if kernels else opt.zero_grad()
            embed(torch.tensor(ids)).pow(2).sum().backward()
            optimizer_ops._optimizer_step_kernel(ref) if kernels else opt.step()
        runs.append((embed.weight.detach(), opt.state_dict()["state"]))
    (want, want_state), (got, got_state) = runs
    assert torch.equal(want, got) and want_state.keys() == got_state.keys()
    for k in want_state:
        a, b = want_state[k]["momentum_buffer"], got_state[k]["momentum_buffer"]
        assert a.layout == b.layout and torch.equal(a.to_dense(), b.to_dense())


class CountedBuffer(torch.Tensor):
    """A momentum buffer of a subclass (loaded into the state by the user):
    SGD's calls on it reach its __torch_function__."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        CountedBuffer.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_momentum_buffer_of_a_subclass_sees_sgds_calls():
    counts, results = [], []
    for kernels in (False, True):
        params = _sgd_params(0, "plain")
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        opt.state[params[0]]["momentum_buffer"] = torch.ones_like(params[0]).as_subclass(CountedBuffer)
        if kernels and native.load() is not None:
            assert native.loaded().sgd_step(opt.param_groups, opt.state) is False  # nothing done: no grads read
        for p in params:
            p.grad = torch.full_like(p, 0.5)
        CountedBuffer.calls = 0
        optimizer_ops._optimizer_step_kernel(optimizer_ops.OptimizerRef(opt)) if kernels else opt.step()
        counts.append(CountedBuffer.calls)
        results.append([p.detach().clone() for p in params])
    assert counts[0] == counts[1] > 0
    assert all(torch.equal(a, b) for a, b in zip(*results))
