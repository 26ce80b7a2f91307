"""`torch.set_default_dtype` between calls.

Eagerly, a factory without a dtype (`torch.zeros(n)`), a constant made
from Python floats (`torch.tensor([0.5])`) and an integer tensor times a
Python float (`torch.arange(n) * 0.5`) take the default dtype. A program
traced under float32 held float32 constants and dtypes, and a later call
under float64 got them: a silent wrong dtype and value. The default dtype
is now part of a declarative call's key (another default traces another
program); a program that cannot retrace (jit.load, TracedLayer,
Executor.run) records the default it was traced under, saved with it, and
refuses a call under another, as it does another autocast."""

import json

import pytest
import torch
import torch.nn as nn

import d2s
from test_translate_control_flow import all_op_types, assert_same


@pytest.fixture(autouse=True)
def _restore_default_dtype():
    before = torch.get_default_dtype()
    yield
    torch.set_default_dtype(before)


def _takes_the_default(x):
    z = torch.zeros(2)
    c = torch.tensor([0.1, 0.2])
    steps = torch.arange(2) * 0.1
    if x.sum() > 0:
        y = x + z + c + steps
    else:
        y = x - c
    return y, z, steps, c.dtype


class _Model(nn.Module):
    # No tensor `if`: TracedLayer records one path and does not convert.
    def forward(self, x):
        z = torch.zeros(2)
        steps = torch.arange(2) * 0.1
        return x + z + torch.tensor([0.1, 0.2]) + steps, z, steps


@pytest.mark.parametrize("sign", [1.0, -1.0])  # both sides of the tensor `if`
def test_a_declarative_call_follows_the_default_dtype(sign):
    static = d2s.declarative(_takes_the_default)
    x = torch.full((2,), sign, dtype=torch.float64)
    for default in (torch.float32, torch.float64, torch.float32):
        torch.set_default_dtype(default)
        assert_same(_takes_the_default(x), static(x))
    program = static.get_concrete_program(x).main_program
    assert "cond" in all_op_types(program)
    assert len(static.program_cache) == 2  # one program per default dtype


def _runner(how, model, x, tmp_path):
    if how == "TracedLayer":
        return d2s.TracedLayer.trace(model, [x])[1]
    if how == "jit.load":
        d2s.jit.save(d2s.declarative(model), str(tmp_path / "m"), input_spec=[d2s.InputSpec([2], x.dtype)])
        return d2s.jit.load(str(tmp_path / "m"))
    layer = d2s.TracedLayer.trace(model, [x])[1]
    layer.save_inference_model(str(tmp_path / "e"))
    exe = d2s.Executor()
    program, feeds, fetches = d2s.load_inference_model(str(tmp_path / "e"), exe)
    return lambda x: exe.run(program, feed={feeds[0]: x}, fetch_list=fetches, return_numpy=False)


@pytest.mark.parametrize("how", ["jit.load", "TracedLayer", "Executor.run"])
@pytest.mark.parametrize("traced", [torch.float32, torch.float64])
def test_a_program_that_cannot_retrace_runs_only_under_its_default_dtype(how, traced, tmp_path):
    model = _Model()
    x = torch.tensor([1.0, -3.0])
    torch.set_default_dtype(traced)
    run = _runner(how, model, x, tmp_path)
    for default in (torch.float32, torch.float64):
        torch.set_default_dtype(default)
        if default == traced:
            assert_same(list(model(x)), list(run(x)))
        else:
            with pytest.raises(RuntimeError, match="traced under the default dtype .* and is called under"):
                run(x)


def test_the_default_dtype_is_saved_only_when_it_is_not_float32(tmp_path):
    model = _Model()
    for default, name in ((torch.float32, None), (torch.float64, "float64")):
        torch.set_default_dtype(default)
        path = tmp_path / str(default)
        d2s.jit.save(d2s.declarative(model), str(path), input_spec=[d2s.InputSpec([2], "float32")])
        doc = json.loads((path / "program.json").read_text())
        assert [part.get("default_dtype") for part in _parts(doc)] == [name] * len(_parts(doc))


def _parts(doc):
    return doc["parts"] if "parts" in doc else [doc]


def test_a_file_naming_another_default_dtype_is_refused_before_it_runs(tmp_path):
    path = tmp_path / "m"
    d2s.jit.save(d2s.declarative(_Model()), str(path), input_spec=[d2s.InputSpec([2], "float32")])
    doc = json.loads((path / "program.json").read_text())
    for part in _parts(doc):
        part["default_dtype"] = "int64"
    (path / "program.json").write_text(json.dumps(doc))
    with pytest.raises(d2s.ModelFormatError, match="default_dtype"):
        d2s.jit.load(str(path))
