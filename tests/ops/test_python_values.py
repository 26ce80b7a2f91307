"""Plain Python values a program's code read outside its arguments and
modules (ops/python_values.py): globals, closure cells and the attributes of
objects the modules keep (a config). Changed between calls, they send the
call to convert again, so every call computes what eager computes with the
values of that moment; unchanged, the program runs as it is."""

import argparse
import os
import dataclasses
import types

import pytest
import torch
import torch.nn as nn
from torch import are_deterministic_algorithms_enabled, get_num_threads

import d2s

SCALE = 2.0
USE_RELU = True
CFG = {"scale": 2.0, "name": "x"}


def scaled(x):
    if x.sum() > 0:  # a tensor `if`: both sides read the global
        return x * SCALE
    return x - SCALE


def flagged(x):
    return torch.relu(x) if USE_RELU else torch.tanh(x)


def from_settings(x):
    return x * CFG["scale"]


def test_an_item_of_a_global_dict_of_settings():
    static = d2s.declarative(from_settings)
    x = torch.ones(2)
    try:
        for value in (2.0, 4.0):
            CFG["scale"] = value
            assert torch.equal(static(x), from_settings(x))
    finally:
        CFG["scale"] = 2.0


def _ops(static):
    return [op.type for op in static.concrete_program.main_program.global_block().ops]


@pytest.mark.parametrize("x", [torch.ones(3), -torch.ones(3)], ids=["true-side", "false-side"])
def test_a_global_number_changed_between_calls(x):
    global SCALE
    static = d2s.declarative(scaled)
    try:
        for value in (2.0, 3.0, 2.0, 3.0):
            SCALE = value
            assert torch.equal(static(x), scaled(x))
        assert len(static.program_cache) == 2  # one program per value, each converted once
        assert _ops(static)[0] == "check_python_values" and "cond" in _ops(static)
    finally:
        SCALE = 2.0


def test_a_global_flag_picks_the_python_branch_of_the_call():
    global USE_RELU
    static = d2s.declarative(flagged)
    x = torch.randn(5)
    try:
        for flag in (True, False, True):
            USE_RELU = flag
            assert torch.equal(static(x), flagged(x))
    finally:
        USE_RELU = True


def test_unchanged_values_run_one_program():
    static = d2s.declarative(scaled)
    for _ in range(3):
        static(torch.ones(3))
    assert len(static.program_cache) == 1


def make_shifter():
    shift = 1.0

    def shifted(x):
        return x + shift

    def set_shift(value):
        nonlocal shift
        shift = value

    return shifted, set_shift


def test_a_closure_cell_changed_between_calls():
    shifted, set_shift = make_shifter()
    static = d2s.declarative(shifted)
    x = torch.zeros(2)
    for value in (1.0, 5.0, 1.0):
        set_shift(value)
        assert torch.equal(static(x), shifted(x))


class Settings:
    def __init__(self):
        self.scale = 2.0
        self.mode = "mul"

    @property
    def doubled(self):
        return self.scale * 2


class Configured(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.settings = Settings()

    def forward(self, x):
        h = self.fc(x)
        if self.settings.mode == "mul":
            return h * self.settings.doubled
        return h + self.settings.scale


@pytest.mark.parametrize("change", [("scale", 3.0), ("mode", "add")])
def test_an_attribute_of_an_object_the_module_keeps(change):
    model = Configured()
    static = d2s.declarative(model)
    x = torch.randn(2, 4)
    assert torch.equal(static(x), Configured.forward(model, x))
    setattr(model.settings, *change)
    assert torch.equal(static(x), Configured.forward(model, x))
    assert len(static.forward.program_cache) == 2
    assert static.forward.concrete_program.main_program.global_block().ops[0].type == "check_python_values"


def test_a_changed_value_is_named_by_the_decision(monkeypatch):
    from runtime.errors import DecisionFailed
    model = Configured()
    static = d2s.declarative(model)
    x = torch.randn(2, 4)
    static(x)
    program = static.forward.concrete_program
    model.settings.mode = "add"
    with pytest.raises(DecisionFailed, match=r"`Settings.mode` was 'mul'.*it is now 'add'"):
        program.run([x])


def test_a_saved_program_keeps_the_values_it_was_traced_with(tmp_path):
    global SCALE
    static = d2s.declarative(scaled)
    x = torch.ones(3)
    static(x)
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    try:
        SCALE = 7.0
        assert torch.equal(loaded(x), x * 2.0)
    finally:
        SCALE = 2.0
    assert "check_python_values" not in [op.type for op in loaded.program.global_block().ops]


def test_exporters_take_the_values_of_the_exporting_call(tmp_path):
    model = Configured()
    model.settings.scale = 3.0
    x = torch.randn(2, 4)
    want = Configured.forward(model, x)
    exported = d2s.export(d2s.declarative(model), input_spec=[d2s.InputSpec([2, 4])])
    assert torch.equal(exported.module()(x), want)
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    path = str(tmp_path / "m.onnx")
    d2s.onnx.export(d2s.declarative(model), path, input_spec=[d2s.InputSpec([2, 4])])
    onnx.checker.check_model(onnx.load(path))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    assert torch.allclose(torch.from_numpy(got), want, atol=1e-6)


def test_the_checks_a_cuda_graph_replay_runs_first():
    """d2s.cuda_graph replays a program that read Python state after running
    its checks on the host (the replay itself needs a GPU)."""
    from d2s.cuda_graphs import _program_refusal, host_checks
    from runtime.errors import DecisionFailed
    model = Configured()
    static = d2s.declarative(model)
    static(torch.randn(2, 4))
    program = static.forward.concrete_program.main_program
    assert _program_refusal(program, []) is None
    (kernel, args, kwargs), = host_checks(program)
    kernel(*args, **kwargs)  # holds
    model.settings.scale = 5.0
    with pytest.raises(DecisionFailed, match="Settings.scale"):
        kernel(*args, **kwargs)


STEP = 0


def annealed(x):
    return x * (1 - STEP / 1000)


def test_a_global_changing_on_every_call_is_named_by_the_many_programs_warning():
    global STEP
    static = d2s.declarative(annealed)
    x = torch.ones(2)
    try:
        with pytest.warns(UserWarning, match=r"has built 8 programs.*because .*`STEP` was 6.*it is now 7"):
            for step in range(8):
                STEP = step
                assert torch.equal(static(x), annealed(x))
    finally:
        STEP = 0


def lr_of(opt, x):
    return x * opt.param_groups[0]["lr"]


def test_an_optimizers_lr_read_by_the_code_follows_its_scheduler():
    weight = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([weight], lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    static = d2s.declarative(lr_of)
    x = torch.ones(2)
    for _ in range(3):
        assert torch.equal(static(opt, x), lr_of(opt, x))
        opt.step()
        scheduler.step()
    assert type(opt.param_groups[0]) is dict  # the group the trace read through is the optimizer's own again


def warm_up(opt, x):
    opt.param_groups[0]["lr"] = 0.1
    return x * 2


def test_writing_a_param_group_in_a_program_is_refused_at_the_users_line():
    opt = torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=1.0)
    with pytest.raises(d2s.ConversionError, match="writing an optimizer's param group") as err:
        d2s.declarative(warm_up)(opt, torch.ones(2))
    assert 'opt.param_groups[0]["lr"] = 0.1' in str(err.value)
    assert opt.param_groups[0]["lr"] == 1.0 and type(opt.param_groups[0]) is dict


# Values reached further: objects of settings held by globals, closure
# cells, arguments and other such objects, and lists and dicts of plain
# values changed in place. Each case is (holder, function of x, change).

class Options:
    SHIFT = 2.0  # a class attribute

    def __init__(self, scale):
        self.scale = scale
        self.sizes = [2.0]
        self.act = torch.relu


@dataclasses.dataclass
class DataOptions:
    scale: float = 2.0


class Slotted:
    __slots__ = ("scale", "act")  # no __dict__: the attributes live in slots

    def __init__(self, scale):
        self.scale, self.act = scale, torch.relu


@dataclasses.dataclass(slots=True)
class SlottedData:
    scale: float = 2.0


class SlotsHolding(nn.Module):
    def __init__(self):
        super().__init__()
        self.options = Slotted(2.0)

    def forward(self, x):
        return _signed(self.options.act(x) + 1, self.options.scale)


OPTIONS = Options(2.0)
SLOTTED = Slotted(2.0)
SLOTTED_DATA = SlottedData()
NAMESPACE = argparse.Namespace(scale=2.0)
SIMPLE = types.SimpleNamespace(scale=2.0, inner=Options(2.0))
DATA = DataOptions()
SIZES = [2.0]
TABLE = {"scale": 2.0}
SETTINGS = types.ModuleType("user_settings")  # another module of the user's (`import settings`)
SETTINGS.SCALE = 2.0
HELPED = Options(2.0)


class Helper:
    def apply(self, x):  # called through an object: its globals are followed when it runs
        return _signed(x, HELPED.scale)


HELPERS = [Helper()]
ACT = torch.relu  # functions and objects are compared by identity: rebinding one converts again


class Activated(nn.Module):
    def __init__(self):
        super().__init__()
        self.act, self.options = torch.relu, Options(2.0)

    def forward(self, x):
        return _signed(self.act(x) + 1, self.options.scale)


class Listed(nn.Module):
    """Functions and modules in plain containers (not ModuleList / ModuleDict)."""

    def __init__(self):
        super().__init__()
        self.acts, self.pair, self.blocks = {"a": torch.relu}, (torch.relu, 2.0), [nn.Identity()]

    def forward(self, x):
        return _signed(self.blocks[0](self.acts["a"](x) + self.pair[0](x)) + 1, self.pair[1])


def _rebind(name, value):
    before = globals()[name]
    return lambda: globals().__setitem__(name, value), lambda: globals().__setitem__(name, before)


class Shifted(nn.Module):
    SHIFT = 2.0

    def forward(self, x):
        return _signed(x, self.SHIFT)


class Holding(nn.Module):
    """Lists and dicts the module holds, changed in place between calls."""

    def __init__(self):
        super().__init__()
        self.sizes, self.table, self.options = [2.0], {"scale": 2.0}, [Options(2.0)]

    def forward(self, x):
        return _signed(x, self.sizes[0] + self.table["scale"] + self.options[0].scale)


def _signed(x, scale):
    if x.sum() > 0:  # a tensor `if`: both sides read the value
        return x * scale
    return x - scale


def _with_cell():
    options = Options(2.0)

    def from_cell(x):
        return _signed(x, options.scale)

    return from_cell, options


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = Options(2.0)
        self.config.text = Options(2.0)

    def forward(self, x):
        return _signed(x, self.config.text.scale)


def _setting(obj, name, value):
    """(change, undo) of setting `obj.name` to `value`."""
    before = getattr(obj, name)
    return lambda: setattr(obj, name, value), lambda: setattr(obj, name, before)


def _case(name):
    """(function, arguments after x, change, undo) of one holder."""
    if name == "global object":
        return (lambda x: _signed(x, OPTIONS.scale)), (), *_setting(OPTIONS, "scale", 3.0)
    if name == "argparse namespace":
        return (lambda x: _signed(x, NAMESPACE.scale)), (), *_setting(NAMESPACE, "scale", 3.0)
    if name == "simple namespace":
        return (lambda x: _signed(x, SIMPLE.scale)), (), *_setting(SIMPLE, "scale", 3.0)
    if name == "object in a simple namespace":
        return (lambda x: _signed(x, SIMPLE.inner.scale)), (), *_setting(SIMPLE.inner, "scale", 3.0)
    if name == "dataclass":
        return (lambda x: _signed(x, DATA.scale)), (), *_setting(DATA, "scale", 3.0)
    if name == "global list in place":
        return (lambda x: _signed(x, SIZES[0])), (), lambda: SIZES.__setitem__(0, 3.0), \
            lambda: SIZES.__setitem__(0, 2.0)
    if name == "global dict, a key added":
        return (lambda x: _signed(x, TABLE.get("shift", TABLE["scale"]))), (), \
            lambda: TABLE.__setitem__("shift", 3.0), lambda: TABLE.pop("shift")
    if name == "list attribute in place":
        return (lambda x: _signed(x, OPTIONS.sizes[-1])), (), lambda: OPTIONS.sizes.append(3.0), \
            lambda: OPTIONS.sizes.pop()
    if name == "closure cell object":
        fn, options = _with_cell()
        return fn, (), lambda: setattr(options, "scale", 3.0), lambda: None
    if name == "argument object":
        options = Options(2.0)
        return (lambda x, o: _signed(x, o.scale)), (options,), lambda: setattr(options, "scale", 3.0), \
            lambda: None
    if name == "class attribute through an object":
        return (lambda x: _signed(x, OPTIONS.SHIFT)), (), *_setting(Options, "SHIFT", 3.0)
    if name == "class attribute":
        return (lambda x: _signed(x, Options.SHIFT)), (), *_setting(Options, "SHIFT", 3.0)
    if name == "module's class attribute":
        return Shifted(), (), *_setting(Shifted, "SHIFT", 3.0)
    if name == "another module's constant":
        return (lambda x: _signed(x, SETTINGS.SCALE)), (), *_setting(SETTINGS, "SCALE", 3.0)
    if name == "global object a helper reads":
        return (lambda x: HELPERS[0].apply(x)), (), *_setting(HELPED, "scale", 3.0)
    if name in ("module's list in place", "module's dict in place", "module's list of objects"):
        model = Holding()
        change = {"module's list in place": lambda: model.sizes.__setitem__(0, 3.0),
                  "module's dict in place": lambda: model.table.__setitem__("scale", 3.0),
                  "module's list of objects": lambda: setattr(model.options[0], "scale", 3.0)}[name]
        return model, (), change, lambda: None
    if name == "global function rebound":
        return (lambda x: _signed(ACT(x) + 1, 2.0)), (), *_rebind("ACT", torch.tanh)
    if name == "global object rebound":
        return (lambda x: _signed(x, OPTIONS.scale)), (), *_rebind("OPTIONS", Options(3.0))
    if name == "object's function attribute":
        return (lambda x: _signed(OPTIONS.act(x) + 1, 2.0)), (), *_setting(OPTIONS, "act", torch.tanh)
    if name == "closure cell function":
        def from_cell(x):
            return _signed(function(x) + 1, 2.0)

        function = torch.relu
        fn = from_cell

        def change():
            nonlocal function
            function = torch.tanh
        return fn, (), change, lambda: None
    if name in ("module's function attribute", "module's object replaced"):
        model = Activated()
        change = (lambda: setattr(model, "act", torch.tanh)) if name == "module's function attribute" else \
            (lambda: setattr(model, "options", Options(3.0)))
        return model, (), change, lambda: None
    if name in ("module's dict of functions", "module's tuple rebound", "module's list of modules"):
        model = Listed()
        change = {"module's dict of functions": lambda: model.acts.__setitem__("a", torch.tanh),
                  "module's tuple rebound": lambda: setattr(model, "pair", (torch.tanh, 3.0)),
                  "module's list of modules": lambda: model.blocks.__setitem__(0, nn.Tanh())}[name]
        return model, (), change, lambda: None
    if name == "slots object":
        return (lambda x: _signed(x, SLOTTED.scale)), (), *_setting(SLOTTED, "scale", 3.0)
    if name == "slots object's function":
        return (lambda x: _signed(SLOTTED.act(x) + 1, 2.0)), (), *_setting(SLOTTED, "act", torch.tanh)
    if name == "slots dataclass":
        return (lambda x: _signed(x, SLOTTED_DATA.scale)), (), *_setting(SLOTTED_DATA, "scale", 3.0)
    if name == "module's slots object":
        model = SlotsHolding()
        return model, (), lambda: setattr(model.options, "scale", 3.0), lambda: None
    model = Nested()  # "nested config"
    return model, (), lambda: setattr(model.config.text, "scale", 3.0), lambda: None


@pytest.mark.parametrize("x", [torch.ones(3), -torch.ones(3)], ids=["true-side", "false-side"])
@pytest.mark.parametrize("holder", ["global object", "argparse namespace", "simple namespace",
                                    "object in a simple namespace", "dataclass", "global list in place",
                                    "global dict, a key added", "list attribute in place", "closure cell object",
                                    "argument object", "nested config", "class attribute through an object",
                                    "class attribute", "module's class attribute", "another module's constant",
                                    "global object a helper reads", "module's list in place",
                                    "module's dict in place", "module's list of objects", "global function rebound",
                                    "global object rebound", "object's function attribute", "closure cell function",
                                    "module's function attribute", "module's object replaced",
                                    "module's dict of functions", "module's tuple rebound",
                                    "module's list of modules", "slots object", "slots object's function",
                                    "slots dataclass", "module's slots object"])
def test_a_value_reached_further_changed_between_calls(holder, x):
    function, extra, change, undo = _case(holder)
    static = d2s.declarative(function)
    try:
        assert torch.equal(static(x, *extra), function(x, *extra))
        change()
        assert torch.equal(static(x, *extra), function(x, *extra))  # eager reads the new value
        assert torch.equal(static(x, *extra), function(x, *extra))
        converted = static.forward if isinstance(static, nn.Module) else static
        assert len(converted.program_cache) == 2
        ops = [op.type for op in converted.concrete_program.main_program.global_block().ops]
        assert ops[0] == "check_python_values" and "cond" in ops
    finally:
        undo()


def deterministic_scaled(x):
    if x.sum() > 0:
        return x * (2.0 if torch.are_deterministic_algorithms_enabled() else 3.0)
    return x - torch.get_num_threads()


def deterministic_scaled_by_name(x):  # the queries imported by name: not looked up on torch
    if x.sum() > 0:
        return x * (2.0 if are_deterministic_algorithms_enabled() else 3.0)
    return x - get_num_threads()


@pytest.mark.parametrize("x", [torch.ones(3), -torch.ones(3)], ids=["true-side", "false-side"])
@pytest.mark.parametrize("function, queries", [
    (deterministic_scaled, ["torch.are_deterministic_algorithms_enabled()", "torch.get_num_threads()"]),
    (deterministic_scaled_by_name, ["are_deterministic_algorithms_enabled()", "get_num_threads()"])],
    ids=["torch.query", "imported by name"])
def test_torchs_settings_read_are_asked_again(x, function, queries):
    static = d2s.declarative(function)
    threads = torch.get_num_threads()
    try:
        for deterministic, n in ((False, threads), (True, threads), (True, 1), (False, threads)):
            torch.use_deterministic_algorithms(deterministic)
            torch.set_num_threads(n)
            assert torch.equal(static(x), function(x))
        assert len(static.program_cache) == (3 if threads != 1 else 2)
        labels = [r[5] for r in static.concrete_program.main_program.global_block().ops[0].attrs["args"][0].reads]
        assert sorted(label for label in labels if label.endswith("()")) == queries
        assert "cond" in _ops(static)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)


def test_is_inference_of_a_program_value_is_refused_at_the_users_line():
    def asks(x):
        return x * 2 if x.is_inference() else x

    with pytest.raises(d2s.ConversionError, match="is_inference") as info:
        d2s.declarative(asks)(torch.ones(2))
    assert info.value.lineno == asks.__code__.co_firstlineno + 1


def debug_scaled(x):
    if x.sum() > 0:
        return x * (3.0 if os.environ.get("D2S_TEST_FLAG") == "1" else 2.0)
    return x - (1.0 if "D2S_TEST_FLAG" in os.environ else 0.0)


@pytest.mark.parametrize("x", [torch.ones(3), -torch.ones(3)], ids=["true-side", "false-side"])
def test_an_environment_variable_read_is_read_again(x, monkeypatch):
    static = d2s.declarative(debug_scaled)
    monkeypatch.delenv("D2S_TEST_FLAG", raising=False)
    assert torch.equal(static(x), debug_scaled(x))
    monkeypatch.setenv("D2S_TEST_FLAG", "1")
    assert torch.equal(static(x), debug_scaled(x))
    assert torch.equal(static(x), debug_scaled(x))
    assert len(static.program_cache) == 2
    labels = [r[5] for r in static.concrete_program.main_program.global_block().ops[0].attrs["args"][0].reads]
    assert "os.environ['D2S_TEST_FLAG']" in labels and "cond" in _ops(static)
