"""Plain values a forward assigns to its modules' attributes (issue 21,
d2s/python_writes.py `replay`). Outside every tensor `if` and loop, such a
value is the same for every run of the program (the program is keyed by the
modules' plain attribute values), so the program assigns it after each run:
the module holds eager's value after every call and the next call sees it.
Inside a tensor `if` or loop a write that changes the value is refused at
its line, the module left as it was."""

import numpy as np
import pytest
import torch
import torch.nn as nn

import d2s
from runtime.errors import ConversionError

from test_translate_control_flow import all_op_types


class Channels(torch.nn.Module):
    """ParityBench's `self.channel = c`, next to a tensor `if`."""

    def __init__(self):
        super().__init__()
        self.channel = None

    def forward(self, x):
        self.channel = x.shape[1]
        if x.sum() > 0:
            y = x * 2
        else:
            y = x - 1
        return y + self.channel


class Toggles(torch.nn.Module):
    """The value written depends on the value the call found."""

    def __init__(self):
        super().__init__()
        self.flip = False

    def forward(self, x):
        self.flip = not self.flip
        return x + 1 if self.flip else x - 1


class Counts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.calls


class Created(torch.nn.Module):
    """Attributes first made by forward: a tuple of sizes, and a string
    chosen by a Python `if`."""

    def forward(self, x):
        self.last_shape = tuple(x.shape)
        if x.dim() > 1:
            self.kind = "matrix"
        else:
            self.kind = "vector"
        return x.sum(0)


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 1.0

    def forward(self, x):
        self.scale = float(x.shape[0])
        return x / self.scale


class Outer(torch.nn.Module):
    """A submodule's own forward writes its attribute; the parent writes one of the submodule's."""

    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        self.inner.tag = "seen"
        i = 0
        while x.sum() > i:  # a tensor loop that writes no attribute
            x = x - 1
            i = i + 1
        return self.inner(x)


class SameValueInBranch(torch.nn.Module):
    """A write under a tensor `if` that gives the value already held
    changes nothing on any path."""

    def __init__(self):
        super().__init__()
        self.mode = "a"

    def forward(self, x):
        if x.sum() > 0:
            self.mode = "a"
            x = x + 1
        return x


def _run(cls, inputs, input_spec=None):
    """Eager and declarative instances side by side on `inputs`: each call's
    result and the instance's attributes after it agree."""
    eager, static = cls(), cls()
    static.load_state_dict(eager.state_dict())
    d2s.declarative(static, input_spec=input_spec)
    for x in inputs:
        want, got = eager(x), static(x)
        assert got.dtype == want.dtype and torch.equal(got, want)
        assert _plain_attrs(static) == _plain_attrs(eager)
    return static


def _plain_attrs(module):
    return {name: (type(v), v.tolist() if isinstance(v, torch.Tensor) else v)
            for sub_name, sub in module.named_modules() for name, v in
            [(f"{sub_name}.{k}", v) for k, v in vars(sub).items() if k not in ("training", "forward") and not k.startswith("_") or k == "_dtype"]}


def _programs(static):
    return list(static.forward.program_cache)


def test_a_size_written_outside_tensor_control_flow_is_replayed_after_each_run():
    static = _run(Channels, [torch.ones(2, 3), -torch.ones(2, 3), torch.ones(2, 3), torch.ones(4, 5),
                             -torch.ones(4, 5), torch.ones(2, 3)])
    # One program per (shape, channel found): (2x3, None), (2x3, 3), (4x5, 3),
    # (4x5, 5), (2x3, 5); the third call and each branch reuse one. Each holds the tensor `if`.
    assert all("cond" in all_op_types(c.main_program) for c in _programs(static))
    assert len(_programs(static)) == 5


def test_a_value_that_depends_on_the_last_call_picks_the_program_for_it():
    static = _run(Toggles, [torch.ones(3)] * 5)
    assert len(_programs(static)) == 2  # one per value of `flip`, each hit again


def test_a_counter_converts_on_every_call_and_warns():
    with pytest.warns(UserWarning, match="has built 8 programs"):
        _run(Counts, [torch.ones(2)] * 9)


@pytest.mark.parametrize("how", ["jit.save", "jit.save latest", "onnx"])
def test_saving_a_forward_that_changes_a_python_value_every_call_is_refused(how, tmp_path):
    # Saved, the loaded model returned the saved call's `x * calls` on every
    # run (eager: 3, then 4); exported to ONNX, the same.
    static = d2s.declarative(Counts())
    static(torch.ones(2))
    with pytest.raises(ValueError, match=r"changes `Counts.calls`, a Python value, .*\((0 to 1|1 to 2)\)"):
        if how == "onnx":
            d2s.onnx.export(static, str(tmp_path / "c.onnx"), input_spec=[d2s.InputSpec([2])])
        else:
            d2s.jit.save(static, str(tmp_path / "m"), input_spec=None if how.endswith("latest") else
                         [d2s.InputSpec([2])])


def test_a_python_value_that_settles_saves_once_it_has(tmp_path):
    # `self.channel = x.shape[1]`: the first call's program was converted from
    # `channel = None`; once the value holds, the latest call's program saves.
    static = d2s.declarative(Channels())
    x = torch.ones(2, 3)
    static(x)
    with pytest.raises(ValueError, match="call the model once more first"):
        d2s.jit.save(static, str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()
    static(x)
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded, eager = d2s.jit.load(str(tmp_path / "m")), Channels()
    for v in (x, -x):
        assert torch.equal(loaded(v), eager(v))


@pytest.mark.parametrize("cls, inputs", [
    (Created, [torch.ones(2, 3), torch.ones(3), torch.ones(2, 3)]),
    (Outer, [torch.zeros(2), torch.full((2,), 1.5), torch.full((3,), 4.0)]),
    (SameValueInBranch, [torch.ones(2), -torch.ones(2)]),
])
def test_writes_by_python_ifs_submodules_and_unchanged_values(cls, inputs):
    static = _run(cls, inputs)
    if cls is not Created:
        assert {"cond", "while"} & all_op_types(_programs(static)[-1].main_program)


class CachesKernel(torch.nn.Module):
    """ParityBench's LapLoss: a constant tensor built from numpy on the first
    call, and again when the channel count changes."""

    def __init__(self):
        super().__init__()
        self.kernel = None

    def forward(self, x):
        if self.kernel is None or self.kernel.shape[0] != x.shape[1]:
            grid = np.arange(x.shape[1] * 3, dtype=np.float32).reshape(x.shape[1], 3)
            self.kernel = torch.from_numpy(grid / grid.sum())
        if x.sum() > 0:
            x = x * 2
        return x @ self.kernel


def test_a_constant_tensor_kept_on_the_module_is_stored_after_each_run():
    static = _run(CachesKernel, [torch.ones(2, 3), -torch.ones(2, 3), torch.ones(2, 4), torch.ones(1, 3)])
    assert all("cond" in all_op_types(c.main_program) for c in _programs(static))


class NumberAfterBranch(torch.nn.Module):
    """A Python int set in a tensor `if`, assigned after it: the program
    carries it, and the attribute holds the int eager holds."""

    def __init__(self):
        super().__init__()
        self.c = 0

    def forward(self, x):
        if x.sum() > 0:
            c = 1
        else:
            c = 2
        self.c = c
        self.rows = x.shape[0]  # a run-time size under an InputSpec
        return x + self.c


@pytest.mark.parametrize("input_spec", [None, [d2s.InputSpec([None, 2])]])
def test_a_number_carried_by_the_program_is_stored_as_a_python_number(input_spec):
    static = _run(NumberAfterBranch, [torch.ones(3, 2), -torch.ones(3, 2), -torch.ones(1, 2), torch.ones(4, 2)],
                  input_spec)
    assert all("cond" in all_op_types(c.main_program) for c in _programs(static))


class WritesInBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = 0

    def forward(self, x):
        if x.sum() > 0:
            self.c = 1  # line: WritesInBranch
        else:
            self.c = 2
        return x + 1


class WritesInLoop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def forward(self, x):
        for _ in range(int(x.shape[0])):
            pass
        while x.sum() > 0:
            x = x - 1
            self.steps = 1  # line: WritesInLoop
        return x


class ConstantInBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.kernel = None

    def forward(self, x):
        if x.sum() > 0:
            self.kernel = torch.from_numpy(np.ones(3, np.float32))  # line: ConstantInBranch
        else:
            self.kernel = torch.from_numpy(np.zeros(3, np.float32))
        return x + 1


class WritesInAnOperand(torch.nn.Module):
    """`and` evaluates its right operand on some paths only."""

    def __init__(self):
        super().__init__()
        self.hit = False

    def _mark(self, x):
        self.hit = True
        return x.sum() > 1

    def forward(self, x):
        if x.sum() > 0 and self._mark(x):  # line: WritesInAnOperand
            x = x * 2
        return x


class WritesThroughDict(torch.nn.Module):
    """Past `nn.Module.__setattr__`: the write is not seen where it happens."""

    def __init__(self):
        super().__init__()
        self.c = 0

    def forward(self, x):
        self.__dict__["c"] = 3  # line: WritesThroughDict
        return x + 1


@pytest.mark.parametrize("cls, name, message", [
    (WritesThroughDict, "`self.c`", "reached from the module `self`"),
    (WritesInAnOperand, "`self.hit`", "the right operand of `and` on a tensor writes"),
])
def test_a_write_whose_value_depends_on_the_path_is_refused_at_its_line(cls, name, message):
    model = cls()
    before = dict(vars(model))
    d2s.declarative(model)
    with pytest.raises(ConversionError) as info:
        model(torch.ones(3))
    assert name in str(info.value) and message in str(info.value)
    assert info.value.lineno == _line(cls.__name__)
    assert {k: v for k, v in vars(model).items() if k != "forward"} == before


@pytest.mark.parametrize("cls", [WritesInBranch, WritesInLoop, ConstantInBranch])
def test_a_write_in_a_tensor_if_or_loop_holds_the_taken_paths_value(cls):
    """Carried out of the `if`/`while` as local objects' attributes are (these were refused)."""
    eager, static = cls(), d2s.declarative(cls())
    for x in (torch.ones(3), -torch.ones(3), torch.full((3,), 0.1), torch.ones(3)):
        assert torch.equal(static(x.clone()), eager(x.clone()))
        want = {k: v for k, v in vars(eager).items() if k != "training" and not k.startswith("_")}
        got = {k: v for k, v in vars(static).items() if k not in ("training", "forward") and not k.startswith("_")}
        assert want.keys() == got.keys()
        for k in want:
            assert type(got[k]) is type(want[k])
            assert torch.equal(got[k], want[k]) if isinstance(want[k], torch.Tensor) else got[k] == want[k]


class Scales(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k = 2

    def forward(self, x):
        k = self.k[1] if isinstance(self.k, tuple) else self.k
        return x * k


@pytest.mark.parametrize("values", [(2, 2.0, True, 2), ((1, 2), (1.0, 2.0), (1, 2))])
def test_equal_values_of_other_types_get_programs_of_their_own(values):
    # 2 == 2.0 == True as Python values, but `x * k` differs in dtype.
    eager, static = Scales(), d2s.declarative(Scales())
    x = torch.arange(3)
    for k in values:
        eager.k = static.k = k
        want, got = eager(x), static(x)
        assert got.dtype == want.dtype and torch.equal(got, want)


class Casts(torch.nn.Module):
    """torch's own constants kept on a module: read as constants, keyed as values."""

    def __init__(self):
        super().__init__()
        self.dtype, self.shape = torch.float32, torch.Size([3, 1])

    def forward(self, x):
        return x.to(self.dtype).reshape(self.shape)


@pytest.mark.parametrize("dtype, shape", [(torch.float64, torch.Size([3, 1])), (torch.float32, (1, 3)),
                                          (torch.int32, torch.Size([1, 3]))])
def test_dtypes_and_sizes_on_a_module_are_part_of_the_key(dtype, shape):
    eager, static = Casts(), d2s.declarative(Casts())
    x = torch.arange(3)
    assert torch.equal(static(x), eager(x))
    eager.dtype = static.dtype = dtype
    eager.shape = static.shape = shape
    want, got = eager(x), static(x)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


class KeepsDtype(torch.nn.Module):
    """ParityBench's `self._dtype = x.dtype`."""

    def __init__(self):
        super().__init__()
        self._dtype = None

    def forward(self, x):
        self._dtype = x.dtype
        self.device_type = x.device.type
        return x.float() * 2


def test_a_dtype_written_by_forward_is_replayed():
    _run(KeepsDtype, [torch.ones(2), torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.int64)])


def _line(marker):
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# line: {marker}"))


class ConvertsItself(torch.nn.Module):
    """switch_transformers' router: `self.classifier = self.classifier.to(self.dtype)` on every call."""

    def __init__(self, how):
        super().__init__()
        self.classifier, self.how = torch.nn.Linear(3, 2), how

    def forward(self, x):
        self.classifier = {"to dtype": lambda m: m.to(x.dtype), "to device": lambda m: m.to("cpu"),
                           "float": lambda m: m.float(), "cpu": lambda m: m.cpu(),
                           "to both": lambda m: m.to(torch.device("cpu"), torch.float32)}[self.how](self.classifier)
        if x.sum() > 0:
            return self.classifier(x)
        return self.classifier(x) * 2


@pytest.mark.parametrize("how", ["to dtype", "to device", "float", "cpu", "to both"])
def test_a_module_converting_itself_to_what_it_is_converts(how):
    # Was a ConversionError: Module._apply's `_has_compatible_shallow_copy_type` on a captured `param.to()`.
    model = ConvertsItself(how)
    static = d2s.declarative(model)
    for x in (torch.randn(4, 3).abs(), -torch.randn(4, 3).abs()):
        assert torch.equal(static(x), ConvertsItself.forward(model, x))
    assert {"cond"} <= all_op_types(static.forward.concrete_program.main_program)


def test_a_module_conversion_that_changes_parameters_is_refused_at_its_line():
    model = ConvertsItself("to dtype").double()
    with pytest.raises(ConversionError, match=r"test_module_attr_writes.py.*converts the module's `weight`"):
        d2s.declarative(model)(torch.randn(4, 3))
    assert model.classifier.weight.dtype == torch.float64  # left as it was


class CountsOnItsClass(torch.nn.Module):
    calls = 0
    marker = "type(self).calls += 1"

    def forward(self, x):
        if x.sum() > 0:
            type(self).calls += 1
        return x + 1


class CountsByName(torch.nn.Module):
    calls = 0
    marker = "CountsByName.calls += 1"

    def forward(self, x):
        CountsByName.calls += 1
        return x + CountsByName.calls


class FlagsItsClass(torch.nn.Module):
    marker = "self.__class__.seen = True"

    def forward(self, x):
        self.__class__.seen = True  # a new class attribute
        return x * 2


class ReadsItsClass(torch.nn.Module):
    scale = 3.0

    def forward(self, x):
        type(self).scale = type(self).scale  # the value it holds: no change
        return x * type(self).scale


@pytest.mark.parametrize("cls", [CountsOnItsClass, CountsByName, FlagsItsClass])
def test_a_write_to_a_class_attribute_is_refused_at_its_line(cls):
    """Shared by every instance, written once while the program was built:
    `type(self).calls += 1` under a tensor `if` never counted (a silent
    wrong value), `Cls.calls += 1` converted again on every trace until it
    gave up, and a new attribute failed. Refused now, the class put back."""
    before = {k: v for k, v in vars(cls).items() if not k.startswith("__")}
    with pytest.raises(ConversionError, match=r"an attribute of the class") as info:
        d2s.declarative(cls())(torch.ones(2))
    assert info.value.lineno == _line_of(cls.forward, cls.marker)
    assert {k: v for k, v in vars(cls).items() if not k.startswith("__")} == before


def test_reading_a_class_attribute_and_writing_its_own_value_converts():
    static = d2s.declarative(ReadsItsClass())
    assert torch.equal(static(torch.ones(2)), torch.full((2,), 3.0))
    assert ReadsItsClass.scale == 3.0


def _line_of(fn, text):
    import inspect
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line and "marker" not in line)


class NewParameterEachCall(nn.Module):
    """torchinfo's UninitializedParameterModel: a new parameter on every call."""

    def __init__(self):
        super().__init__()
        self.param = nn.UninitializedParameter()

    def init_param(self):
        self.param = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        self.init_param()
        return x * 2


def test_replacing_a_parameter_with_a_computed_value_is_refused_at_the_line():
    """It was torch's TypeError naming runtime.ir.Variable, raised inside d2s."""
    model = NewParameterEachCall()
    with pytest.raises(ConversionError, match="`param` is a parameter of this NewParameterEachCall") as info:
        d2s.declarative(model)(torch.ones(2))
    assert info.value.filename == __file__
    assert isinstance(model.param, nn.UninitializedParameter)
