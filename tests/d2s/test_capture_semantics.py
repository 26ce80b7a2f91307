"""What eager PyTorch code does with modules, NumPy values and legacy APIs
behaves the same under @declarative (ParityBench's most common causes)."""

import gc
import inspect
import math
import warnings
import weakref

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.autograd import Variable

import d2s
from runtime.errors import ConversionError
from test_translate_control_flow import all_op_types, assert_same


def _same(a, b):
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.allclose(torch.as_tensor(a).float(), torch.as_tensor(b).float())
    return a == b


# -- NumPy scalars, arrays and ranges become constants the program holds and saves ----------------

def numpy_operands(q, k):
    scores = q @ k.transpose(-2, -1) / np.sqrt(k.shape[-1]) + np.float32(0.5) + np.int64(2)
    return scores + torch.tensor(range(3)) + torch.from_numpy(np.arange(3.0, dtype=np.float32))


def test_numpy_values_are_program_constants_and_save(tmp_path):
    q = torch.randn(3, 3)
    static = d2s.declarative(numpy_operands)
    assert torch.allclose(static(q, q), numpy_operands(q, q))
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert torch.allclose(loaded(q, q), numpy_operands(q, q))


# -- legacy Variable, builtin max/min, is_tensor ------------------------------------------------------

def legacy(x):
    y = Variable(x) + Variable(x * 2, requires_grad=True)
    return max(y.sum(), 0.5), min(1.0, y.sum()), torch.is_tensor(y), isinstance(y, torch.Tensor)


@pytest.mark.parametrize("scale", [1.0, -1.0])
def test_variable_max_min_is_tensor(scale):
    x = torch.ones(2) * scale
    static = d2s.declarative(legacy)
    assert _same(static(x), legacy(x))


BLOCK = 4


def blocks_by_min(x):
    """MiniMax's chunked attention: `min(start + block, seq_len)` with the
    loop counter a graph number and the length a run-time size (was: an
    AttributeError inside d2s that became a `raise` of the loop body)."""
    n = math.ceil(x.shape[1] / BLOCK)
    out = []
    for i in range(n):
        end = min(i * BLOCK + BLOCK, x.shape[1])
        start = max(end - BLOCK, 0)
        out.append(x[:, start:end] * (i + 1))
    return torch.cat(out, dim=-1)


def test_min_max_of_a_loop_counter_and_a_run_time_size():
    static = d2s.declarative(blocks_by_min, input_spec=[d2s.InputSpec([2, None])])
    for length in (1, 4, 6, 8, 10):  # one block (part of one), several, a last partial one
        x = torch.randn(2, length)
        assert torch.equal(static(x), blocks_by_min(x))
    program = static.concrete_program.main_program
    assert "while" in [op.type for b in program.blocks for op in b.ops]
    assert len(static.program_cache) == 1


# -- @staticmethod / @classmethod forward -------------------------------------------------------------

class StaticForward(nn.Module):
    @staticmethod
    def forward(x):
        return x + 1


class ClassForward(nn.Module):
    offset = 2.0

    @classmethod
    def forward(cls, x):
        return x + cls.offset


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = StaticForward(), ClassForward()

    def forward(self, x):
        return self.a(x) * self.b(x)


@pytest.mark.parametrize("make", [StaticForward, ClassForward, Holder])
def test_static_and_class_method_forwards(make):
    x = torch.randn(3)
    assert torch.allclose(d2s.declarative(make())(x), make()(x))


# -- module state ---------------------------------------------------------------------------------------

class Stateful(nn.Module):
    """Keeps the previous call's hidden state and attention pair on the module."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.hidden = None
        self.attn = None

    def forward(self, x):
        if self.hidden is None:
            h = torch.zeros_like(x)
        else:
            h = self.hidden
        h = torch.tanh(self.fc(x) + h)
        self.hidden = h
        self.attn = (h * 2, h.sum())
        return h


def test_state_stored_on_the_module_is_carried_across_calls_like_eager():
    torch.manual_seed(0)
    eager = Stateful()
    static = d2s.declarative(Stateful())
    static.load_state_dict(eager.state_dict())
    x = torch.randn(2, 3)
    for _ in range(3):
        assert torch.allclose(static(x), eager(x))
        assert type(static.hidden) is torch.Tensor
        assert _same(static.attn, eager.attn)
    eager.hidden = static.hidden = None  # a reset takes the other path again
    assert torch.allclose(static(x), eager(x))


class PlainAttributes(nn.Module):
    """Tensors kept as plain attributes (not buffers): one, a list, a dict."""

    def __init__(self):
        super().__init__()
        self.pe = torch.zeros(3)
        self.table = [torch.ones(3), torch.ones(3)]
        self.cache = {"scale": torch.ones(3)}

    def forward(self, x):
        y = x + self.pe + self.table[1] * self.cache["scale"]
        if y.sum() > 0:
            y = y * 2
        return y


@pytest.mark.parametrize("replace", [
    lambda m: setattr(m, "pe", torch.full((3,), 5.0)),
    lambda m: m.table.__setitem__(1, torch.full((3,), -4.0)),
    lambda m: m.cache.__setitem__("scale", torch.full((3,), 3.0)),
    lambda m: m.pe.add_(7.0),
])
def test_a_plain_tensor_attribute_replaced_between_calls_is_read_like_eager(replace):
    # The program read the object seen while tracing: after `m.pe = other` it
    # kept returning the old value (a silent wrong result).
    eager, module = PlainAttributes(), PlainAttributes()
    static = d2s.declarative(module)
    x = torch.tensor([1.0, -2.0, 0.5])
    assert torch.equal(static(x), eager(x))
    replace(eager)
    replace(module)
    assert torch.equal(static(x), eager(x))
    assert len(static.forward.program_cache) == 1
    assert [op.type for op in static.forward.concrete_program.main_program.global_block().ops].count("cond") == 1


SHIFT = torch.zeros(3)
SHIFTS = [torch.ones(3)]


@d2s.declarative
def shifted(x):
    y = x - SHIFT + SHIFTS[0]
    if y.sum() > 0:
        return y * 2
    return y


def test_a_global_tensor_rebound_between_calls_is_read_like_eager():
    global SHIFT
    x = torch.ones(3)
    for shift, shifts in ((None, None), (torch.full((3,), 5.0), None), (None, torch.full((3,), 10.0))):
        if shift is not None:
            SHIFT = shift
        if shifts is not None:
            SHIFTS[0] = shifts
        assert torch.equal(shifted(x), shifted.dygraph_function(x))
    assert len(shifted.program_cache) == 1
    program = shifted.concrete_program.main_program
    assert "cond" in [op.type for block in program.blocks for op in block.ops]


class Holds:
    """An object of settings holding tensors (a global's, a module's)."""

    def __init__(self):
        self.bias, self.table = torch.zeros(3), {"scale": torch.ones(3)}


class HoldsInSlots:
    __slots__ = ("bias", "table")  # no __dict__

    def __init__(self):
        self.bias, self.table = torch.zeros(3), {"scale": torch.ones(3)}


HELD = Holds()
HELD_IN_SLOTS = HoldsInSlots()


class KeepsHolder(nn.Module):
    def __init__(self):
        super().__init__()
        self.held = Holds()

    def forward(self, x):
        y = x + self.held.bias * self.held.table["scale"]
        if y.sum() > 0:
            return y * 2
        return y


def _from_global(x):
    y = x + HELD.bias * HELD.table["scale"]
    if y.sum() > 0:
        return y * 2
    return y


def _from_slots(x):
    y = x + HELD_IN_SLOTS.bias * HELD_IN_SLOTS.table["scale"]
    if y.sum() > 0:
        return y * 2
    return y


@pytest.mark.parametrize("where", ["global", "global with slots", "module"])
@pytest.mark.parametrize("x", [torch.ones(3), -torch.ones(3)], ids=["true-side", "false-side"])
def test_a_tensor_an_object_holds_is_read_like_eager(where, x):
    if where == "module":
        holder = KeepsHolder()
        function, static, held = holder.forward, d2s.declarative(holder).forward, holder.held
    else:
        function = _from_global if where == "global" else _from_slots
        static, held = d2s.declarative(function), HELD if where == "global" else HELD_IN_SLOTS
    before = held.bias, held.table["scale"]
    try:
        assert torch.equal(static(x), function(x))
        held.bias = torch.full((3,), 0.5)  # rebound
        assert torch.equal(static(x), function(x))
        held.table["scale"] = torch.full((3,), 4.0)  # an item of a dict it holds
        assert torch.equal(static(x), function(x))
        held.bias.mul_(-1)  # changed in place
        assert torch.equal(static(x), function(x))
        assert len(static.program_cache) == 1
        held.bias = torch.ones(1)  # another shape: another program
        assert torch.equal(static(x), function(x))
        assert len(static.program_cache) == 2
        program = static.concrete_program.main_program
        assert "cond" in [op.type for block in program.blocks for op in block.ops]
    finally:
        held.bias, held.table["scale"] = before


def test_a_plain_tensor_attribute_of_another_shape_builds_another_program():
    eager, module = PlainAttributes(), PlainAttributes()
    static = d2s.declarative(module)
    x = torch.ones(2, 3)
    static(x)
    eager.pe = module.pe = torch.ones(2, 3)
    assert torch.equal(static(x), eager(x))
    assert len(static.forward.program_cache) == 2


# -- declarative instances are held weakly ---------------------------------------------------------------

class Decorated(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    @d2s.declarative
    def forward(self, x):
        return self.fc(x)


@pytest.mark.parametrize("make", [Decorated, lambda: d2s.declarative(Holder())])
def test_deleted_declarative_module_is_garbage_collected(make):
    module = make()
    x = torch.randn(2) if isinstance(module, Decorated) else torch.randn(3)
    module(x)
    module(x)
    ref = weakref.ref(module)
    del module
    gc.collect()
    assert ref() is None


# -- type(x) of a graph tensor --------------------------------------------------------------------------

def pick_by_type(x):
    if type(x) is torch.Tensor:
        return x * 2
    s, v = x
    return s + v


def test_type_of_a_graph_tensor_is_tensor():
    x = torch.randn(2, 3)
    static = d2s.declarative(pick_by_type)
    assert torch.equal(static(x), pick_by_type(x))
    pair = (torch.randn(2), torch.randn(2))
    assert torch.equal(static(pair), pick_by_type(pair))


# -- param.data = ... in forward --------------------------------------------------------------------------

class DecayingWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def forward(self, x):
        self.w.data = self.w.data * 0.5 + x
        return self.w * 2


def test_assigning_param_data_updates_it_every_call_like_eager():
    eager, static = DecayingWeight(), d2s.declarative(DecayingWeight())
    x = torch.randn(2)
    for _ in range(3):
        assert torch.allclose(static(x), eager(x))
        assert torch.allclose(static.w, eager.w)


# -- @torch.jit.script helpers ------------------------------------------------------------------------------

@torch.jit.script
def scripted_mish(x):
    return x * torch.tanh(torch.nn.functional.softplus(x))


def uses_scripted(x):
    return scripted_mish(x) + 1


def test_a_torchscript_function_is_converted_from_its_python_source():
    x = torch.randn(3)
    assert torch.allclose(d2s.declarative(uses_scripted)(x), uses_scripted(x))


@torch.jit.script
def scripted_branch(x):
    if bool(x.sum() > 0):
        return x * 2
    return x - 1


def test_declarative_of_a_torchscript_function_converts_its_python_source():
    static = d2s.declarative(scripted_branch)
    for x in (torch.ones(3), -torch.ones(3)):
        assert torch.equal(static(x), scripted_branch(x))
    assert "cond" in {op.type for op in static.concrete_program.main_program.global_block().ops}


class HoldsScripted(nn.Module):
    def __init__(self, make):
        super().__init__()
        self.inner = make(nn.Linear(4, 4))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        return self.inner(x) + 1


@pytest.mark.parametrize("make", [torch.jit.script, lambda m: torch.jit.trace(m, torch.randn(2, 4))],
                         ids=["script", "trace"])
def test_a_torchscript_module_is_refused_at_the_users_line(make):
    """Its compiled code keeps no Python to convert. The refusal was hidden
    by a TypeError from putting the TorchScript module's state back."""
    model = HoldsScripted(make)
    with pytest.raises(ConversionError, match="TorchScript ScriptMethod `forward`.*call the Python module") as info:
        d2s.declarative(model)(torch.randn(2, 4))
    assert info.value.filename == __file__
    assert isinstance(model.calls, torch.Tensor)  # the model's own state, as before the call
    with pytest.raises(ConversionError, match="d2s.declarative of a TorchScript RecursiveScriptModule"):
        d2s.declarative(torch.jit.script(nn.Linear(4, 4)))


def test_an_aten_or_quantized_op_outside_the_table_is_named_as_torch_ops():
    model = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(4, 4)), {nn.Linear})
    with pytest.raises(ConversionError, match=r"`torch\.ops\.quantized\.linear_dynamic` cannot be captured"):
        d2s.declarative(model)(torch.randn(2, 4))


class Lazy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.LazyLinear(3)
        self.norm = nn.LazyBatchNorm1d()

    def forward(self, x):
        h = self.norm(self.fc(x))
        if h.sum() > 0:
            h = h * 2
        return h


def test_a_lazy_module_asks_for_its_dry_run_then_converts():
    """Its first eager call sizes and draws its parameters; inside a trace
    that call would record them as ops (it failed reading an uninitialized
    parameter's shape)."""
    torch.manual_seed(0)
    eager = Lazy()
    torch.manual_seed(0)
    model = d2s.declarative(Lazy())
    x = torch.randn(5, 6)
    with pytest.raises(ConversionError, match="fc.weight of a lazy module .* not initialized yet") as info:
        model(x)
    assert info.value.filename == __file__
    translator = d2s.ProgramTranslator()
    translator.enable(False)
    try:
        torch.manual_seed(1)
        want = eager(x)
        torch.manual_seed(1)
        assert torch.equal(model(x), want)  # the dry run, eagerly
    finally:
        translator.enable(True)
    for y in (x, -3 * x):
        assert torch.equal(model(y), eager(y))
    for name, value in eager.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert "cond" in {op.type for op in model.forward.concrete_program.main_program.global_block().ops}


# -- a module whose entry point is its own __call__ (no forward) ------------------------------------

class CallOnly(nn.Module):
    """Like DeblurGAN's GANLoss: `__call__` overridden, no `forward`."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))

    def __call__(self, x, flip):
        if x.sum() > 0:
            y = x * self.scale
        else:
            y = x - self.scale
        return -y if flip else y


class UsesCallOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = CallOnly()

    def forward(self, x):
        return self.inner(x, True) + 1


def _op_types(static):
    program = static.forward.concrete_program.main_program
    return {op.type for block in program.blocks for op in block.ops}


@pytest.mark.parametrize("make, args", [(CallOnly, (False,)), (CallOnly, (True,)), (UsesCallOnly, ())])
def test_module_with_its_own_call_and_no_forward_is_converted(make, args, tmp_path):
    eager, static = make(), d2s.declarative(make())
    assert isinstance(static, make)
    xs = [torch.ones(3), -torch.ones(3)]
    for x in xs:
        assert torch.equal(static(x, *args), eager(x, *args))
    assert len(static.forward.program_cache) == 1 and "cond" in _op_types(static)
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for x in xs:
        assert torch.equal(loaded(x), eager(x, *args))


# -- jit.save of a declarative module that has not run ----------------------------------------------

def test_save_before_any_call_uses_the_declared_input_spec(tmp_path):
    torch.manual_seed(0)
    module = nn.Linear(3, 2)
    static = d2s.declarative(module, input_spec=[d2s.InputSpec([None, 3], "float32")])
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for batch in (1, 5):
        x = torch.randn(batch, 3)
        assert torch.allclose(loaded(x), module(x))


def test_save_before_any_call_without_input_spec_says_what_to_do(tmp_path):
    static = d2s.declarative(nn.Linear(3, 2))
    with pytest.raises(ValueError, match=r"jit.save\(Linear\): Linear has not run yet.*call it once.*input_spec"):
        d2s.jit.save(static, str(tmp_path / "m"))


# -- x.type(): the legacy type name is metadata; x.type(dtype) is a cast ----------------------------

class TypeNames(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        t = x.type()
        y = x.long().type(t) * 2 + self.w.type(torch.float64).float()
        return y, t, self.w.type(), x.double().type(dtype=None)


def test_type_name_is_answered_while_tracing_and_the_program_saves(tmp_path):
    x = torch.randn(3) * 3
    eager, static = TypeNames(), d2s.declarative(TypeNames())
    got, want = static(x), eager(x)
    assert got[1:] == want[1:] == ("torch.FloatTensor", "torch.FloatTensor", "torch.DoubleTensor")
    assert torch.equal(got[0], want[0])
    program = static.forward.concrete_program.main_program
    assert [op for block in program.blocks for op in block.ops if op.type.endswith(".type")]  # the casts
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))(x)  # the returned strings too
    assert torch.equal(loaded[0], want[0]) and loaded[1:] == want[1:]


# -- a forward chosen per instance in __init__ (`self.forward = self._forward`) -----------------------

class ChosenForward(nn.Module):
    """Like bayeSDE's VerboseSequential: no forward in the class."""

    def __init__(self, double):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.forward = self._twice if double else self._once

    def _once(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            y = -y
        return y

    def _twice(self, x):
        return self._once(self._once(x))


class HoldsChosen(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = ChosenForward(True)

    def forward(self, x):
        return self.inner(x) * 2


@pytest.mark.parametrize("make", [lambda: ChosenForward(False), lambda: ChosenForward(True), HoldsChosen])
def test_forward_assigned_in_init_is_converted(make):
    torch.manual_seed(0)
    eager = make()
    static = d2s.declarative(make())
    static.load_state_dict(eager.state_dict())
    for x in (torch.ones(2, 3), -torch.ones(2, 3), torch.randn(2, 3)):
        assert torch.allclose(static(x), eager(x))
    assert len(static.forward.program_cache) == 1 and "cond" in _op_types(static)


# -- torch._is_all_true: torch's own argument validation, checked when the program runs ------------

def validated_log(x):
    if not torch._is_all_true(x > 0):  # as torch.distributions validates its arguments
        raise ValueError("expected positive values")
    return x.log()


def test_is_all_true_is_a_run_time_check():
    static = d2s.declarative(validated_log)
    x = torch.rand(3) + 0.5
    assert torch.equal(static(x), validated_log(x))
    program = static.concrete_program.main_program
    assert "check_all_true" in {op.type for op in program.blocks[0].ops}
    with pytest.raises(ValueError, match="torch._is_all_true is false"):
        static(-x)
    assert len(static.program_cache) == 1


# -- a function that names itself (attribute caches, recursion) -----------------------------------------

def cached_positions(x):
    """Multimodal_Transformer's make_positions keeps a buffer on the function."""
    if not hasattr(cached_positions, "buf"):
        cached_positions.buf = torch.arange(10.0)
    return x + cached_positions.buf[:x.size(0)]


def factorial(n):
    return 1 if n <= 1 else n * factorial(n - 1)


def names_itself(x):
    def countdown(y, k):
        return y if k == 0 else countdown(y * 2, k - 1)
    return countdown(cached_positions(x), 2) * factorial(4)


def test_a_function_naming_itself_means_the_original():
    x = torch.ones(3)
    want = names_itself(x)  # eager first: it fills the function's buffer with a real tensor
    assert torch.equal(d2s.declarative(names_itself)(x), want)
    assert torch.equal(cached_positions.buf, torch.arange(10.0))


# -- a size wrapped in torch.tensor([...]) is a run-time value -------------------------------------------

def wrapped_sizes(x):
    n = torch.tensor([x.size(0)])
    return x.sum(1) * n, torch.tensor([x.size(0), x.shape[1]], dtype=torch.float32)


def test_size_wrapped_in_a_tensor_follows_the_run_time_size(tmp_path):
    static = d2s.declarative(wrapped_sizes, input_spec=[d2s.InputSpec([None, 3], "float32")])
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for batch in (1, 2, 5):
        x = torch.randn(batch, 3)
        want = wrapped_sizes(x)
        assert _same(static(x), want) and _same(loaded(x), want)
    assert len(static.program_cache) == 1


# -- x.item() is a number: no gradient flows through it ----------------------------------------------

def scaled_by_item(x):
    s = x.sum().item()
    if s > 0:
        return (x * s).sum()
    return (x * float(x.max())).sum()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_gradient_does_not_flow_through_item(sign):
    grads = []
    for fn in (scaled_by_item, d2s.declarative(scaled_by_item)):
        x = (torch.tensor([1.0, 2.0]) * sign).requires_grad_()
        fn(x).backward()
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])


# -- nn.Sequential: converted like user code, so the modules it calls are too --------------------------

class Heads(nn.Module):
    """timm's Attention under a Sequential: sizes read from `x.shape` at
    run time, and a tensor `if`."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        B, N, C = x.shape
        h = self.qkv(x).reshape(B, N, 3, 2, C // 2).sum(2).flatten(2)
        if h.mean() > 0:
            h = -h
        return h[:, : N - 1]


class Stack(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = blocks

    def forward(self, x):
        return self.blocks(x * 2)


@pytest.mark.parametrize("wrap", [lambda m: Stack(nn.Sequential(m)), lambda m: Stack(nn.Sequential(nn.Identity(), m))])
def test_modules_a_sequential_calls_are_converted(wrap):
    torch.manual_seed(0)
    model = wrap(Heads()).eval()
    static = d2s.declarative(model, input_spec=[d2s.InputSpec([None, None, 8])])
    for shape in [(2, 5, 8), (1, 3, 8), (3, 7, 8)]:
        for sign in (1.0, -1.0):
            x = sign * torch.randn(shape)
            assert torch.equal(static(x), model(x))
    (concrete,) = list(static.forward.program_cache)
    assert "cond" in {op.type for op in concrete.main_program.global_block().ops}


# -- torch.distributions: converted like user code (its isinstance checks see a tensor) -------------

def gaussian_nll(mu, sigma, target):
    return -torch.distributions.Normal(mu, sigma).log_prob(target).sum()


def test_distribution_log_prob_and_its_validation():
    static = d2s.declarative(gaussian_nll)
    grads = []
    for fn in (gaussian_nll, static):
        mu = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
        out = fn(mu, torch.tensor([1.0, 0.5, 2.0]), torch.tensor([0.0, 1.0, 3.0]))
        out.backward()
        grads.append((out.detach(), mu.grad))
    assert torch.allclose(grads[0][0], grads[1][0]) and torch.allclose(grads[0][1], grads[1][1])
    with pytest.raises(ValueError, match="torch._is_all_true is false"):  # a negative scale, as eager refuses
        static(torch.zeros(3, requires_grad=True), -torch.ones(3), torch.zeros(3))
    assert len(static.program_cache) == 1


# -- strides: what `x.stride()` and `is_contiguous()` read is the layout eager has -------------

def strided_window(x):
    s = x.stride()
    return x.as_strided((2, 2), (s[0], s[1])) * 1.0


def reshaped_window(x):
    # A reshape of a transpose is a view (strides (1, 4)) or a copy, as eager decides.
    y = x.transpose(0, 1).reshape(4, 2)
    return y.as_strided((3, 2), y.stride()) + x.stride()[0]


def overlapping_chunks(x, w):
    # Longformer's `_chunk`: overlapping windows by halving a stride.
    x = x.view(x.size(0), x.size(1) // (w * 2), w * 2, x.size(2))
    size, stride = list(x.size()), list(x.stride())
    size[1] = size[1] * 2 - 1
    stride[1] = stride[1] // 2
    return x.as_strided(size=size, stride=stride).sum(-1)


def chunks_sized_by_a_tensor(x, w):
    # Longformer's own `_chunk`: the view is sized by `torch.div(...)`, a
    # tensor, so tracing works on symbolic sizes; the strides read after are
    # still eager's, those of a view of this input's layout.
    x = x.view(x.size(0), torch.div(x.size(1), w * 2, rounding_mode="trunc"), w * 2, x.size(2))
    size, stride = list(x.size()), list(x.stride())
    size[1] = size[1] * 2 - 1
    stride[1] = stride[1] // 2
    return x.as_strided(size=size, stride=stride).sum(-1)


def strides_of_a_merged_value(x):
    if x.sum() > 0:
        y = x * 2
    else:
        y = x.t() * 1  # eager keeps the transposed layout: strides (1, 4)
    return y.as_strided((2, 2), y.stride()) + 0


def contiguity(x):
    return x * 2 if x.is_contiguous() else x - 1


def no_layout_read(x):
    return x.transpose(0, 1).reshape(-1) * 3


def _layouts():
    base = torch.arange(32.0).view(4, 8)  # every layout [2, 4]
    return {"contiguous": base[:2, :4].clone(), "transposed": base.t()[:2], "strided rows": base[:2, :4],
            "every other column": base[:2, ::2], "other contiguous": torch.arange(8.0).view(2, 4) + 0.5}


@pytest.mark.parametrize("fn", [strided_window, reshaped_window, contiguity, no_layout_read])
def test_one_function_every_input_layout_like_eager(fn):
    """The strides a trace reads are the example's (and those of views of
    it); a program that read them serves only inputs of those strides, so
    each layout gets eager's result. A function that reads none keeps one
    program for every layout."""
    static = d2s.declarative(fn)
    layouts = _layouts()
    for name, x in list(layouts.items()) + list(layouts.items()):  # twice: the cached programs again
        want = fn(x)
        got = static(x)
        assert (got == want) if isinstance(want, bool) else torch.equal(got, want), name
    n_layouts = len({tuple(x.stride()) for x in layouts.values()} | {(4, 1)})
    expected = 1 if fn is no_layout_read else None
    if expected is not None:
        assert len(static.program_cache) == expected
    else:
        assert 1 < len(static.program_cache) <= n_layouts


@pytest.mark.parametrize("fn", [overlapping_chunks, chunks_sized_by_a_tensor])
@pytest.mark.parametrize("transpose", [False, True])
def test_overlapping_chunks_of_a_view(fn, transpose):
    static = d2s.declarative(fn)
    x = torch.randn(3, 8, 4)
    x = x.transpose(0, 1).contiguous().transpose(0, 1) if transpose else x
    assert torch.equal(static(x, 2), fn(x, 2))


def test_strides_tracing_cannot_know_are_checked_when_the_program_runs():
    """A value a tensor `if` merges has the layout of the side a run takes:
    tracing answers contiguous strides and the program checks them where
    they are read, so the other side converts again (answering its own)
    instead of reading the wrong elements."""
    static = d2s.declarative(strides_of_a_merged_value)
    x = torch.arange(16.0).view(4, 4)
    assert torch.equal(static(x), strides_of_a_merged_value(x))
    ops = [op.type for op in static.concrete_program.main_program.global_block().ops]
    assert "cond" in ops and ops.count("check_strides") == 1 and ops.count("check_layout") == 1  # input, merged value
    assert torch.equal(static(-x), strides_of_a_merged_value(-x))
    assert len(static.program_cache) == 2


def test_strides_of_a_feed_whose_sizes_vary_are_its_contiguous_ones():
    """Sizes known at run time: the strides are expressions of them, those
    of a contiguous feed, which the program checks; a feed of another
    layout is refused at the user's line."""
    static = d2s.declarative(strided_window, input_spec=[d2s.InputSpec([None, 4])])
    for x in (torch.arange(8.0).view(2, 4), torch.arange(12.0).view(3, 4)):
        assert torch.equal(static(x), strided_window(x))
    assert len(static.program_cache) == 1
    with pytest.raises(d2s.ConversionError, match="the input 'x' is not contiguous while its sizes vary"):
        static(torch.arange(8.0).view(4, 2).t())


def strided_window_with_draws(x, g):
    return strided_window(x) + torch.rand(2, 2, generator=g)


def test_a_program_reading_strides_takes_a_generator():
    """A generator argument beside a tensor whose strides are read: the
    program checks the tensors' layout only (it checked the generator's
    too, and crashed: a generator has no strides)."""
    static = d2s.declarative(strided_window_with_draws)
    x = torch.arange(8.0).view(2, 4)
    assert torch.equal(static(x, torch.Generator().manual_seed(1)),
                       strided_window_with_draws(x, torch.Generator().manual_seed(1)))


def test_a_saved_program_that_read_strides_checks_its_inputs_layout(tmp_path):
    """Saved, the program has no retrace to fall back on: it checks the
    layout it was traced for and refuses another (never a silent window
    over the wrong elements)."""
    static = d2s.declarative(strided_window)
    x = torch.arange(8.0).view(2, 4)
    static(x)
    assert [op.type for op in static.concrete_program.main_program.global_block().ops][0] == "check_strides"
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert torch.equal(loaded(x + 1), strided_window(x + 1))
    with pytest.raises(Exception, match=r"traced for 'x' strides \(4, 1\); got strides \(1, 2\)"):
        loaded(torch.arange(8.0).view(4, 2).t())


# -- `x.requires_grad = v` inside a forward is `x.requires_grad_(v)`, as eager -----------------

def target_without_grad(x, t):
    a = t[0]
    a.requires_grad = False  # a leaf view of an input: allowed, a no-op
    return x * a


def fresh_leaf_with_grad(x):
    out = torch.zeros_like(x)
    out.requires_grad = True  # a new leaf that requires grad, returned
    return out


def computed_without_grad(x):
    y = x * 2
    y.requires_grad = False  # a non-leaf: eager's RuntimeError when it runs
    return y


@pytest.mark.parametrize("fn, args", [
    (target_without_grad, lambda: (torch.ones(2, requires_grad=True), torch.ones(2, 2))),
    (fresh_leaf_with_grad, lambda: (torch.ones(2),)),
])
def test_setting_requires_grad_like_eager(fn, args):
    want, got = fn(*args()), d2s.declarative(fn)(*args())
    assert torch.equal(got, want)
    assert got.requires_grad == want.requires_grad and (got.grad_fn is None) == (want.grad_fn is None)


def test_setting_requires_grad_of_a_non_leaf_is_eagers_error():
    with pytest.raises(RuntimeError, match="only change requires_grad flags of leaf variables"):
        computed_without_grad(torch.ones(2, requires_grad=True))
    with pytest.raises(RuntimeError, match="only change requires_grad flags of leaf variables"):
        d2s.declarative(computed_without_grad)(torch.ones(2, requires_grad=True))


class Freezable(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        if self.fc.weight.requires_grad:  # a flag fine-tuning code flips between calls
            return self.fc(x) * 2
        return self.fc(x) - 1


@pytest.mark.parametrize("first", [True, False], ids=["trainable-first", "frozen-first"])
def test_a_parameters_requires_grad_read_by_the_code_is_checked_on_every_call(first, tmp_path):
    model = Freezable()
    static = d2s.declarative(model)
    x = torch.ones(1, 3)
    for flag in (first, not first, first):
        model.fc.weight.requires_grad_(flag)
        assert torch.equal(static(x), Freezable.forward(model, x))
    assert len(static.forward.program_cache) == 2  # a program for each flag, each converted once
    check = static.forward.concrete_program.main_program.global_block().ops[0]
    assert check.type == "check_python_values" and "fc.weight.requires_grad" in repr(check.attrs["args"][0])
    # A saved program keeps the path it was traced on (the check is a training-only op).
    model.fc.weight.requires_grad_(first)
    static(x)
    d2s.jit.save(static, str(tmp_path / "m"))
    model.fc.weight.requires_grad_(first)
    assert torch.equal(d2s.jit.load(str(tmp_path / "m"))(x), Freezable.forward(model, x))


# -- module attributes assigned in a tensor `if`: carried out of it, per path (were refused) --

class CountsInBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.count = torch.zeros(())

    def forward(self, x):
        if x.sum() > 0:
            self.count = self.count + 1
        return x * self.count


class GrowsBufferInBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("pe", torch.arange(8.0))

    def forward(self, x):
        if max(x) >= self.pe.shape[0]:
            self.register_buffer("pe", torch.arange(20.0))
        return self.pe[x]


class UpdatesStatisticsInBranch(nn.Module):
    """A buffer written in place on one path, rebound on the other, a Python
    int counter on one path, and a submodule's plain tensor attribute."""

    def __init__(self):
        super().__init__()
        self.register_buffer("stat", torch.zeros(2))
        self.hits = 0
        self.inner = nn.Module()
        self.inner.memory = torch.zeros(2)

    def forward(self, x):
        if x.sum() > 0:
            self.stat.mul_(0.9).add_(x.mean(0) * 0.1)
            self.hits += 1
            self.inner.memory = x.mean(0)
        else:
            self.stat = self.stat * 0.5
        return x + self.stat * self.hits + self.inner.memory


class PrivateStateThroughAProperty(nn.Module):
    """`self.cache = ...` through a property setter writes `self._cache`."""

    def __init__(self):
        super().__init__()
        self._cache = torch.zeros(2)
        self._n = 0

    @property
    def cache(self):
        return self._cache

    @cache.setter
    def cache(self, value):
        self._cache = value

    def forward(self, x):
        if x.sum() > 0:
            self.cache = self.cache + x
            self._n += 1
        return x + self.cache * self._n


class CountsAfterBranch(nn.Module):
    """The same with a local name in the branch."""

    def __init__(self):
        super().__init__()
        self.count = torch.zeros(())

    def forward(self, x):
        count = self.count
        if x.sum() > 0:
            count = count + 1
        self.count = count
        return x * self.count


_TORCH_ATTRS = frozenset(vars(nn.Module()))


def _module_state(module):
    tensors = {k: v.clone() for k, v in module.state_dict().items()}
    plain = {k: v for k, v in vars(module).items() if k not in _TORCH_ATTRS and k != "forward"}
    return tensors, plain, getattr(getattr(module, "inner", None), "memory", None)


@pytest.mark.parametrize("make, xs", [
    (CountsInBranch, [torch.ones(2), -torch.ones(2), torch.ones(2)]),
    (GrowsBufferInBranch, [torch.arange(4), torch.arange(10), torch.arange(4), torch.arange(15)]),
    (UpdatesStatisticsInBranch, [torch.ones(3, 2), -torch.ones(3, 2), torch.full((3, 2), 2.0), -torch.ones(3, 2)]),
    (CountsAfterBranch, [torch.ones(2), -torch.ones(2), torch.ones(2)]),
    (PrivateStateThroughAProperty, [torch.ones(2), -torch.ones(2), torch.ones(2)]),
])
def test_module_attribute_assigned_in_a_tensor_branch_holds_the_taken_paths_value(make, xs):
    eager, static = make(), d2s.declarative(make())
    for x in xs:
        assert_same(static(x.clone()), eager(x.clone()))
        (want_t, want_p, want_m), (got_t, got_p, got_m) = _module_state(eager), _module_state(static)
        assert want_t.keys() == got_t.keys() and all(torch.equal(want_t[k], got_t[k]) for k in want_t)
        assert got_p.keys() == want_p.keys()
        for k in want_p:
            assert_same(got_p[k], want_p[k])
        assert_same(got_m, want_m)
    assert "cond" in all_op_types(static.forward.program_cache.last.main_program)


def row_stride_scaled(x):
    r = x[0]
    return x * r.stride()[0]  # a stride of a tensor made from a feed whose sizes vary


def test_strides_read_from_a_feed_whose_sizes_vary():
    """The trace takes such a feed as contiguous: contiguous inputs of every
    size share its program; a non-contiguous one is refused at the line that
    read strides (was an AttributeError inside d2s)."""
    static = d2s.declarative(row_stride_scaled, input_spec=[d2s.InputSpec([None, 4])])
    for n in (3, 5):
        x = torch.randn(n, 4)
        assert torch.equal(static(x), row_stride_scaled(x))
    assert len(static.program_cache) == 1
    fresh = d2s.declarative(row_stride_scaled, input_spec=[d2s.InputSpec([None, 4])])
    with pytest.raises(d2s.ConversionError, match="input 'x' is not contiguous while its sizes vary") as info:
        fresh(torch.randn(4, 3).t())
    assert info.value.filename == __file__ and "r.stride()" in str(info.value)


class WritesTooDeepInBranch(nn.Module):
    """An attribute 9 modules down: past the depth the branch's walk follows."""

    def __init__(self):
        super().__init__()
        m = self
        for _ in range(8):
            m.l = nn.Module()
            m = m.l
        m.memory = torch.zeros(2)

    def forward(self, x):
        if x.sum() > 0:
            self.l.l.l.l.l.l.l.l.memory = x * 2
        return x + self.l.l.l.l.l.l.l.l.memory


def test_a_module_attribute_the_branch_walk_does_not_reach_is_refused_by_name():
    model = WritesTooDeepInBranch()
    leaf = model.l.l.l.l.l.l.l.l
    before = dict(vars(leaf))
    for _ in range(2):  # the same refusal each time: the failed conversion left no graph value behind
        with pytest.raises(d2s.ConversionError, match="`memory` of Module is assigned inside an `if`") as info:
            d2s.declarative(model)(torch.ones(2))
        assert vars(leaf) == before
        assert info.value.filename == __file__  # the assignment's line
        lines = inspect.getsourcelines(WritesTooDeepInBranch.forward)
        assert info.value.lineno == lines[1] + next(i for i, line in enumerate(lines[0]) if "memory =" in line)


# -- text made from a graph tensor: a key or name is refused, a message keeps the repr ---------------

WEIGHTS = {"k0": 1.0, "k1": 2.0}


def key_from_a_tensor(x):
    i = x.argmax()
    return x * WEIGHTS.get(f"k{i}", 5.0)  # eager: "k0" or "k1"; was "kVariable(...)", the default, silently


def name_from_a_tensor(x):
    return x * len(str(x.sum()))


def repr_of_a_tensor(x):
    return x * (2 if repr(x).startswith("tensor") else 3)


def message_from_a_tensor(x):
    print(f"input {x}")  # printed while the program is built (docs: syntax_and_limitations.md)
    # ParityBench's bayeSDE `Print` module: the text made on a line of its own, warned of on the next
    msg = f"mean: {x.mean()}"
    warnings.warn(msg)
    if x.sum() > 100:
        raise ValueError(f"too large: {x.sum()}")
    return x + 1


@pytest.mark.parametrize("fn", [key_from_a_tensor, name_from_a_tensor, repr_of_a_tensor])
def test_text_made_from_a_graph_tensor_is_refused_at_the_users_line(fn):
    with pytest.raises(d2s.ConversionError, match=r"test_capture_semantics.py\", line \d+: .*cannot be used as text"):
        d2s.declarative(fn)(torch.tensor([3.0, 1.0]))


def test_a_message_made_from_a_graph_tensor_converts():
    static = d2s.declarative(message_from_a_tensor)
    x = torch.tensor([3.0, 1.0])
    assert torch.equal(static(x), x + 1)
    with pytest.raises(ValueError, match="too large"):
        static(x * 100)
    assert "raise" in all_op_types(static.concrete_program.main_program)


def type_of_a_run_time_size(x):
    n = x.shape[0]  # a run-time size under the InputSpec: eagerly a Python int
    if x.sum() > 0:  # transformers' `q_offset.to(...) if isinstance(q_offset, torch.Tensor) else q_offset`
        n = n.to(x.device) if isinstance(n, torch.Tensor) else n + 1
    try:
        found = 3 in x.shape[1]  # Python's TypeError (an int is no container), not d2s's AttributeError
    except TypeError:
        found = None
    return x * n, type(x.shape[1]) is int, found


def test_isinstance_and_type_of_a_run_time_size_are_a_python_ints():
    # Was an AttributeError ('SymInt' object has no attribute 'dtype') inside
    # d2s, recorded as the branch's own error: every run taking it raised.
    static = d2s.declarative(type_of_a_run_time_size, input_spec=[d2s.InputSpec([None, None])])
    for x in (torch.ones(3, 2), -torch.ones(2, 4)):
        want, got = type_of_a_run_time_size(x), static(x)
        assert torch.equal(got[0], want[0]) and got[1] is want[1] is True and got[2] is want[2] is None
    assert "cond" in all_op_types(static.concrete_program.main_program)


# -- a ModuleList indexed by an int known only when the program runs --------------------------------

class Experts(nn.Module):
    """Mixture-of-experts routing as older code writes it: each token to the
    expert its router picks, the experts a `ModuleList` indexed by a tensor."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.router = nn.Linear(3, 3)
        self.experts = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])

    def forward(self, x, k):
        out = self.experts[k](x)                      # was refused: ModuleList.__getitem__ of a graph int
        choice = self.router(x).argmax(-1)
        for e in torch.unique(choice):                # a tensor loop over the experts hit
            rows = choice == e
            out = out + torch.where(rows[:, None], self.experts[e](x), torch.zeros_like(x))
        return out


def test_a_module_list_indexed_by_a_run_time_int_calls_the_item_the_run_names():
    model = Experts()
    static = d2s.declarative(Experts())
    for k in (0, 2, -1, 1):
        x = torch.randn(5, 3)
        assert torch.equal(static(x, torch.tensor(k)), model(x, torch.tensor(k)))
    assert len(list(static.forward.program_cache)) == 1
    assert {"cond", "while"} <= all_op_types(static.forward.concrete_program.main_program)
    with pytest.raises(IndexError, match="ModuleList index out of range"):
        static(torch.randn(5, 3), torch.tensor(3))
    x = torch.randn(5, 3)
    model(x, torch.tensor(1)).sum().backward()
    static(x, torch.tensor(1)).sum().backward()
    assert torch.equal(static.experts[1].weight.grad, model.experts[1].weight.grad)


# -- Python ints past int64 ---------------------------------------------------------------------------

def big_python_ints(x, power):
    n = int(x.sum())                               # eagerly a Python int: no bound
    return n * 3, -7 * n, n ** 2, 2 ** int(power), n << 2, (n * 10**15) // 10**15, n * 10**12 * int(power)


@pytest.mark.parametrize("power, overflows", [(3, False), (62, False), (63, True), (70, True)])
def test_a_python_int_past_int64_is_an_overflow_error_not_a_wrapped_value(power, overflows):
    # Was torch's int64 arithmetic: 2 ** 70 came back as 0, n * 10**12 * 10**7 wrapped, silently.
    static = d2s.declarative(big_python_ints)
    x, p = torch.tensor([3.0, -1.0]), torch.tensor(power)
    if overflows:
        with pytest.raises(OverflowError, match=r"exceeds 64 bits.*\n  created at .*test_capture_semantics.py"):
            static(x, p)
    else:
        assert static(x, p) == big_python_ints(x, p)
    assert "check_int64" in all_op_types(static.concrete_program.main_program)


def compares_lists_of_whole_tensors(x, y):
    if [x, 1] == [y, 1]:  # the truth of `x == y`, a tensor of 3 elements
        return x + 1
    return x


def test_sequences_whose_items_compare_to_a_tensor_of_many_elements_are_refused_at_the_line():
    """Eager's `[x, 1] == [y, 1]` raises (the truth of a 3-element tensor);
    the program is refused at the user's line, naming the item."""
    with pytest.raises(d2s.ConversionError, match=r"truth of tensor `x` == its counterpart, a tensor of shape \[3\]") \
            as caught:
        d2s.declarative(compares_lists_of_whole_tensors)(torch.ones(3), torch.ones(3))
    assert caught.value.filename == __file__
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        compares_lists_of_whole_tensors(torch.ones(3), torch.ones(3))
