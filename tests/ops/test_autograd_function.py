"""A custom torch.autograd.Function is one op whose kernel is its `apply`:
the user's backward gives the gradients, as in eager code (traced inline,
its forward's ops would get torch's derivatives instead)."""

import pytest
import torch
import torch.nn as nn

import d2s


class RoundSTE(torch.autograd.Function):
    """Round forward; a backward that is not round's derivative (which is 0)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 3


class QuatLinear(torch.autograd.Function):
    """pytorch_kaldi's pattern: save_for_backward, a bias that may be None."""

    @staticmethod
    def forward(ctx, x, w, bias=None):
        ctx.save_for_backward(x, w, bias)
        out = x @ torch.cat([w, -w], dim=1)
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx, grad):
        x, w, bias = ctx.saved_tensors
        gw = x.t() @ (grad[:, :w.shape[1]] - grad[:, w.shape[1]:])
        gx = grad @ torch.cat([w, -w], dim=1).t()
        return gx, gw * 0.5, (grad.sum(0) if bias is not None else None)  # not the true derivative: on purpose


class Model(nn.Module):
    def __init__(self, bias):
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(3, 2))
        self.b = nn.Parameter(torch.randn(4)) if bias else None

    def forward(self, x):
        if x.sum() > 0:
            h = RoundSTE.apply(x * 2)
        else:
            h = x
        return QuatLinear.apply(h, self.w, self.b).sum()


@pytest.mark.parametrize("bias", [True, False])
def test_user_backward_gives_the_gradients_on_every_path(bias):
    eager, static = Model(bias), d2s.declarative(Model(bias))
    for x0 in (torch.ones(5, 3) * 0.7, -torch.ones(5, 3) * 0.7):
        grads = []
        for m in (eager, static):
            x = x0.clone().requires_grad_()
            m.zero_grad()
            y = m(x)
            y.backward()
            grads.append((y.detach(), x.grad, m.w.grad))
        for a, b in zip(*grads):
            assert torch.equal(a, b)
    program = static.forward.concrete_program.main_program
    types = [op.type for block in program.blocks for op in block.ops]
    assert len(static.forward.program_cache) == 1 and "cond" in types
    assert types.count("autograd_function") == 2  # RoundSTE in the branch, QuatLinear after it


@pytest.mark.parametrize("input_spec", [None, [d2s.InputSpec([None, 3])]])
def test_saved_program_inlines_the_forward_and_refuses_its_backward(input_spec, tmp_path):
    torch.manual_seed(0)
    eager, static = Model(True), d2s.declarative(Model(True))
    xs = [torch.ones(5, 3) * 0.7, -torch.ones(5, 3) * 0.7]
    static(xs[0])
    d2s.jit.save(static, str(tmp_path / "m"), input_spec=input_spec)
    loaded = d2s.jit.load(str(tmp_path / "m"))
    types = {op.type for block in loaded.program.blocks for op in block.ops}
    assert "autograd_function" not in types and "forward_only" in types
    for x in xs:
        assert torch.equal(loaded(x), eager(x))
    with pytest.raises(RuntimeError, match="QuatLinear inline; its backward was not saved"):
        loaded(xs[0]).backward()


def first_tensor(value):
    """revlib's helper: a tensor as it is, else the first of a sequence."""
    if isinstance(value, torch.Tensor):
        return value
    return list(value)[0]


class Residual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return x + first_tensor(torch.relu(y))

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


def test_saved_forward_is_converted_code(tmp_path):
    # Inlined for the save, the forward runs as converted code: its helper's
    # isinstance check sees a graph tensor as a tensor (it was False there,
    # and list(y) unbound the tensor: a wrong result after reload).
    static = d2s.declarative(lambda x, y: Residual.apply(x, y))
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    assert torch.equal(static(x, y), x + torch.relu(y))
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert torch.equal(loaded(x, y), x + torch.relu(y))


def with_python_argument(x, scale):
    return RoundSTE.apply(x * scale)


def test_saving_with_python_arguments_inlines_the_call_as_it_was(tmp_path):
    # As for any function, the saved model serves the latest call's Python
    # values (its inputs are the tensors); the call is traced again from a
    # copy of its arguments, with the Function inline.
    static = d2s.declarative(with_python_argument)
    x = torch.tensor([0.3, 0.8, -1.6])
    static(x, 2.0)
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert torch.equal(loaded(x), with_python_argument(x, 2.0))
    assert "forward_only" in {op.type for block in loaded.program.blocks for op in block.ops}


def with_a_module_argument(x, layer):
    return RoundSTE.apply(layer(x))


def test_saving_with_a_module_argument_is_refused_naming_the_function(tmp_path):
    static = d2s.declarative(with_a_module_argument)
    static(torch.ones(2, 3), nn.Linear(3, 2))
    with pytest.raises(ValueError, match=r"test_autograd_function.py:\d+: cannot save: .*\(<RoundSTE>\)"):
        d2s.jit.save(static, str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()


class KeywordRouter(nn.Module):
    """transformers' shape: keyword arguments with defaults, and a Function
    only the training mode calls (PhiMoE's router multiplier)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 3)

    def forward(self, inputs=None, mask=None, scale=1.0):
        h = self.lin(inputs) * scale
        if self.training:
            h = RoundSTE.apply(h)
        return h if mask is None else h * mask


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("spec", [False, True])
def test_a_keyword_call_and_a_function_of_one_mode_save_inline(mode, spec, tmp_path):
    eager = KeywordRouter().train(mode == "train")
    static = d2s.declarative(KeywordRouter().train(mode == "train"))
    x, mask = torch.randn(4, 3), torch.tensor([[1.0], [0.0], [1.0], [1.0]])
    assert torch.equal(static(inputs=x, mask=mask, scale=2.0), eager(inputs=x, mask=mask, scale=2.0))
    if spec:  # both modes, from the specs' examples: a positional wrapper, as a saved model is called
        def forward(inputs, mask):
            return static(inputs=inputs, mask=mask, scale=2.0)
        wrapper = type("Wrapper", (nn.Module,), {"forward": lambda self, a, b: forward(a, b)})()
        wrapper.inner = static
        wrapper.train(mode == "train")
        d2s.jit.save(d2s.declarative(wrapper), str(tmp_path / "m"),
                     input_spec=[d2s.InputSpec([None, 3]), d2s.InputSpec([None, 1])])
    else:
        d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for other in ("train", "eval") if spec else (mode,):
        eager.train(other == "train")
        loaded.train(other == "train")
        assert torch.equal(loaded(x, mask), eager(inputs=x, mask=mask, scale=2.0))
    if mode == "train" or spec:
        loaded.train()
        with pytest.raises(RuntimeError, match="RoundSTE inline; its backward was not saved"):
            loaded(x.requires_grad_(), mask).sum().backward()


def test_outside_declarative_apply_is_untouched():
    x = torch.ones(2, requires_grad=True)
    RoundSTE.apply(x).sum().backward()
    assert torch.equal(x.grad, torch.full((2,), 3.0))


# -- applied by code d2s does not convert -----------------------------------------------------

class Hooked(nn.Module):
    """A forward hook (called by torch's Module.__call__, not converted)
    applies the Function to a submodule's output."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = nn.Linear(3, 3)
        self.outer = nn.Linear(3, 1)
        self.inner.register_forward_hook(lambda module, args, out: RoundSTE.apply(out))

    def forward(self, x):
        h = self.inner(x)
        if h.sum() > 0:
            h = h * 2
        return self.outer(h).sum()


def test_a_function_applied_by_code_d2s_does_not_convert_keeps_its_backward():
    """torch's `apply` ran the forward on graph tensors with gradients off:
    round's ops with no gradient at all through them, silently (the
    parameters before it got None)."""
    eager, static = Hooked(), d2s.declarative(Hooked())
    for x in (torch.full((2, 3), 0.7), torch.full((2, 3), -0.7)):
        want = torch.autograd.grad(eager(x), list(eager.parameters()))
        got = torch.autograd.grad(static(x), list(static.parameters()))
        assert all(torch.equal(a, b) for a, b in zip(want, got))
    types = {op.type for block in static.forward.concrete_program.main_program.blocks for op in block.ops}
    assert {"autograd_function", "cond"} <= types
