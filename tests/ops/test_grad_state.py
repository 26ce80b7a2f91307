"""`.grad` inside a program (ops/optimizer_ops.py `tensor_backward`,
`tensor_grad`, `read_grad`): `loss.backward()` runs the engine's backward
into the leaves, as eager's does (AccumulateGrad's layout rule, tensor
hooks and post-accumulate-grad hooks registered outside the function), and
`p.grad` after it is read when the program runs, so `clip_grad_norm_` and
other edits in place act on the real gradients. Every test compares with
the same function run eagerly, step by step, bit for bit, on inputs that
take both sides of a tensor `if`."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s
from runtime import native


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        if h.mean() > 0:  # both layers are used on both paths
            h = h * 3.0
        else:
            h = h - 1.0
        return self.out(h)


def _batches(scale=1.0):
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(6):  # both branches, alternately
        shift = 2.0 if i % 2 else -2.0
        out.append((torch.randn(5, 6, generator=g) * scale + shift, torch.randint(0, 4, (5,), generator=g)))
    return out


def _pair(make_opt=lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9)):
    torch.manual_seed(0)
    eager = Net()
    model = copy.deepcopy(eager)
    return eager, make_opt(eager.parameters()), model, make_opt(model.parameters())


def clipped_step(model, opt, x, y, max_norm):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    return loss, norm


def _types(static):
    return [op.type for block in static.concrete_program.main_program.blocks for op in block.ops]


def _assert_same_params(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
        assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("max_norm", [0.05, 1e6], ids=["clipping", "not-clipping"])
@pytest.mark.parametrize("engine", ["native", "python"])
def test_clip_grad_norm_in_the_step_equals_eager(monkeypatch, max_norm, engine):
    if engine == "python":
        monkeypatch.setattr(native, "load", lambda: None)
    eager, eager_opt, model, opt = _pair()
    static = d2s.declarative(clipped_step)
    for x, y in _batches(scale=20.0):
        want = clipped_step(eager, eager_opt, x, y, max_norm)
        got = static(model, opt, x, y, max_norm)
        for w, g in zip(want, got):
            assert torch.equal(w, g)
        _assert_same_params(eager, model)
    assert len(static.program_cache) == 1
    assert {"cond", "tensor_backward", "tensor_grad", "optimizer_step"} <= set(_types(static))


def test_a_grad_edited_in_place_is_what_the_step_uses():
    def step(model, opt, x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            p.grad.mul_(0.5).clamp_(-0.01, 0.01)
        opt.step()
        return model.out.weight.grad.sum()

    eager, eager_opt, model, opt = _pair()
    static = d2s.declarative(step)
    for x, y in _batches():
        assert torch.equal(step(eager, eager_opt, x, y), static(model, opt, x, y))
        _assert_same_params(eager, model)


def test_a_frozen_parameter_has_no_grad_as_in_eager():
    eager, eager_opt, model, opt = _pair()
    for m in (eager, model):
        m.fc.bias.requires_grad_(False)
    static = d2s.declarative(clipped_step)
    for x, y in _batches(scale=20.0):
        assert torch.equal(clipped_step(eager, eager_opt, x, y, 0.1)[1], static(model, opt, x, y, 0.1)[1])
    assert model.fc.bias.grad is None
    _assert_same_params(eager.out, model.out)


@pytest.mark.parametrize("engine", ["native", "python"])
def test_hooks_registered_outside_run_in_the_programs_backward(monkeypatch, engine):
    if engine == "python":
        monkeypatch.setattr(native, "load", lambda: None)

    def step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    logs = []
    eager, _, model, _ = _pair()
    for m in (eager, model):
        log = []
        logs.append(log)
        # the "optimizer in backward" pattern: a post-accumulate-grad hook steps each parameter
        for name, p in m.named_parameters():
            def step_now(p, name=name, log=log):
                log.append(("post", name, p.grad.sum()))
                with torch.no_grad():
                    p.add_(p.grad, alpha=-0.1)
                p.grad = None

            p.register_post_accumulate_grad_hook(step_now)
        m.out.bias.register_hook(lambda g, log=log: (log.append(("pre", g.sum())), g * 2)[1])
    static = d2s.declarative(step)
    for x, y in _batches():
        assert torch.equal(step(eager, x, y), static(model, x, y))
    assert len(logs[0]) == len(logs[1]) > 0
    for a, b in zip(*logs):
        assert a[:-1] == b[:-1] and torch.equal(a[-1], b[-1])
    for p, q in zip(eager.parameters(), model.parameters()):
        assert torch.equal(p, q) and p.grad is None and q.grad is None


@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_new_grad_takes_the_parameters_layout_as_in_eager(monkeypatch, engine):
    if engine == "python":
        monkeypatch.setattr(native, "load", lambda: None)
    w_eager = torch.randn(3, 4, requires_grad=True)
    w_static = w_eager.detach().clone().requires_grad_()

    def step(w, x):
        loss = (x @ w.t()).pow(2).sum()  # w's gradient comes out transposed: AccumulateGrad lays it out as w
        loss.backward()
        return loss

    x = torch.randn(5, 4)
    static = d2s.declarative(step)
    for _ in range(2):  # a new .grad, then a sum into it
        assert torch.equal(step(w_eager, x), static(w_static, x))
        assert torch.equal(w_eager.grad, w_static.grad)
        assert w_eager.grad.stride() == w_static.grad.stride()


def test_reading_grad_before_the_programs_backward_is_refused_at_the_users_line():
    eager, eager_opt, model, opt = _pair()

    def stale(model, x):
        scale = model.fc.weight.grad.norm()  # state left by the last step outside
        return model(x) * scale

    F.cross_entropy(model(_batches()[0][0]), _batches()[0][1]).backward()
    with pytest.raises(d2s.ConversionError, match=r"`\.grad` of .*fc.weight.* before this program's "
                                                  r"`loss.backward\(\)`") as err:
        d2s.declarative(stale)(model, _batches()[0][0])
    assert "scale = model.fc.weight.grad.norm()" in str(err.value)

    def zeroed(model, opt, x, y):
        F.cross_entropy(model(x), y).backward()
        opt.zero_grad()  # set_to_none: nothing to read after it
        return model.out.bias.grad * 1

    with pytest.raises(d2s.ConversionError, match=r"\.grad` of .*out.bias"):
        d2s.declarative(zeroed)(model, opt, *_batches()[0])


def test_a_grad_that_is_none_on_the_run_is_an_error_not_a_value():
    class OneSided(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 2)
            self.b = nn.Linear(3, 2)

        def forward(self, x):
            if x.sum() > 0:
                return self.a(x).sum()
            return self.b(x).sum()

    def step(model, x):
        model(x).backward()
        return model.a.weight.grad * 1

    model = OneSided()
    static = d2s.declarative(step)
    static(model, torch.ones(2, 3))
    model.zero_grad()
    with pytest.raises(Exception, match=r"`\.grad` is None on this run") as err:
        static(model, -torch.ones(2, 3))
    assert "return model.a.weight.grad * 1" in str(err.value)


class Step(d2s.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        return loss


def test_a_graph_refuses_grad_after_its_stepping_backward():
    _, _, model, opt = _pair()
    with pytest.raises(d2s.ConversionError, match=r"d2s.Graph's `build`: its `loss.backward\(\)` also steps"):
        Step(model, opt)(*_batches()[0])


class ClippedStep(d2s.Graph):
    def __init__(self, model, opt, max_norm, norm_type, optimize=None):
        super().__init__(optimize=optimize)
        self.model = model
        self.add_optimizer(opt, clip_grad_max_norm=max_norm, clip_grad_norm_type=norm_type)

    def build(self, x, y):
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


@pytest.mark.parametrize("max_norm,norm_type", [(0.05, 2.0), (0.05, float("inf")), (1e6, 2.0)],
                         ids=["l2", "inf", "not-clipping"])
@pytest.mark.parametrize("enabled", [True, False], ids=["program", "translator-off"])
def test_a_graph_clips_as_the_eager_loop_does(max_norm, norm_type, enabled):
    eager, eager_opt, model, opt = _pair()
    graph = ClippedStep(model, opt, max_norm, norm_type)
    assert f"gradients clipped to norm {max_norm:g} (norm type {norm_type:g})" in repr(graph)
    d2s.ProgramTranslator().enable(enabled)
    try:
        for x, y in _batches(scale=20.0):
            eager_opt.zero_grad()
            want = F.cross_entropy(eager(x), y)
            want.backward()
            torch.nn.utils.clip_grad_norm_(eager.parameters(), max_norm, norm_type)
            eager_opt.step()
            assert torch.equal(want, graph(x, y))
            _assert_same_params(eager, model)
    finally:
        d2s.ProgramTranslator().enable(True)
    if enabled:
        types = [op.type for op in graph.program.global_block().ops]
        assert types.index("tensor_backward") < types.index("tensor_grad") < types.index("optimizer_step")
        assert "cond" in types


def test_the_clip_settings_are_checked():
    _, _, model, opt = _pair()
    with pytest.raises(TypeError, match="must be numbers"):
        ClippedStep(model, opt, "1.0", 2.0)


def test_an_inference_copy_drops_the_clip_with_the_training_ops(tmp_path):
    _, _, model, opt = _pair()
    x, y = _batches(scale=20.0)[0]
    static = d2s.declarative(clipped_step)
    static(model, opt, x, y, 0.05)
    program = static.concrete_program.main_program
    types = [op.type for op in program.clone(for_test=True).global_block().ops]
    assert "cond" in types and "torch.nn.functional.cross_entropy" in types
    assert "tensor_grad" not in types and "torch.linalg.vector_norm" not in types
    # The step returns the clip's norm: made from gradients, which a saved program has not.
    with pytest.raises(ValueError, match="computed from gradients"):
        d2s.jit.save(static, str(tmp_path / "m"))


def test_the_grad_of_an_input_that_requires_grad():
    def saliency(model, x):
        model(x).max(dim=1).values.sum().backward()
        return x.grad.abs() * 2

    _, _, model, _ = _pair()
    static = d2s.declarative(saliency)
    for x, _ in _batches():
        want = saliency(model, x.clone().requires_grad_())
        got = static(model, x.clone().requires_grad_())
        assert torch.equal(got, want)
    assert "tensor_grad" in _types(static) and "cond" in _types(static)
