"""PyTorch's own tracers and compilers applied to d2s programs: each either
gives eager's results on every path or refuses with an error naming the d2s
way (runtime/foreign_tracers.py), never a file or graph with one branch
frozen. Tested for a declarative module, a declarative function and a
loaded TranslatedLayer, each holding a cond op."""

import io
import warnings

import pytest
import torch
import torch.nn as nn

import d2s

D2S_WAY = "d2s.onnx.export"


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:
            h = h + 1
        else:
            h = h - 1
        return h


def branchy(x):
    if x.sum() > 0:
        return x * 2
    return x - 1


class Calls(nn.Module):
    """An ordinary module that calls a declarative function (what
    torch.export and torch.onnx take)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


POS, NEG = torch.ones(2, 4), -10 * torch.ones(2, 4)


def _objects(tmp_path):
    torch.manual_seed(0)
    module = d2s.declarative(Branchy())
    function = d2s.declarative(branchy)
    path = str(tmp_path / "saved")
    d2s.jit.save(module, path, input_spec=[d2s.InputSpec([None, 4])])
    loaded = d2s.jit.load(path)
    for obj in (module, function, loaded):  # one program, both branches, before any foreign tracer
        obj(POS), obj(NEG)
    return {"declarative module": module, "declarative function": function, "loaded layer": loaded}


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return _objects(tmp_path_factory.mktemp("foreign"))


KINDS = ["declarative module", "declarative function", "loaded layer"]


def _as_module(obj):
    return obj if isinstance(obj, nn.Module) else Calls(obj)


def test_each_object_holds_a_cond_op(objects):
    programs = [objects["declarative module"].forward.concrete_program.main_program,
                objects["declarative function"].concrete_program.main_program, objects["loaded layer"].program]
    for program in programs:
        assert "cond" in [op.type for op in program.global_block().ops]


@pytest.mark.parametrize("kind", KINDS)
def test_jit_trace_refuses(objects, kind):
    with pytest.raises(RuntimeError, match=D2S_WAY):
        torch.jit.trace(objects[kind], (POS,))


@pytest.mark.parametrize("kind", KINDS)
def test_jit_script_refuses(objects, kind):
    with pytest.raises(RuntimeError, match=r"TorchScript .* cannot compile a d2s program.*d2s\.onnx\.export"):
        torch.jit.script(objects[kind])


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_torch_export_refuses(objects, kind, strict):
    if strict:
        torch.compile(_as_module(objects[kind]))(POS)  # Dynamo loaded and d2s's way around it made once
    with pytest.raises(Exception, match=D2S_WAY):
        torch.export.export(_as_module(objects[kind]), (POS,), strict=strict)


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_torch_onnx_export_refuses_and_writes_nothing(objects, kind, dynamo):
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception, match=D2S_WAY):
            torch.onnx.export(_as_module(objects[kind]), (POS,), f, dynamo=dynamo)
    assert f.getvalue() == b""


@pytest.mark.parametrize("kind", KINDS)
def test_torch_compile_gives_eager_results_on_both_branches(objects, kind):
    obj = objects[kind]
    compiled = torch.compile(_as_module(obj))
    for x in (POS, NEG, POS):
        torch.testing.assert_close(compiled(x), obj(x), rtol=0, atol=0)
    eager = objects["declarative function"].dygraph_function if kind == "declarative function" else None
    if eager is not None:
        torch.testing.assert_close(compiled(NEG), eager(NEG), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["declarative module", "declarative function"])
def test_torch_compile_fullgraph_refuses_naming_d2s(objects, kind):
    torch.compile(_as_module(objects[kind]))(POS)  # as above: Dynamo loaded first
    torch._dynamo.reset()  # forget the graphs compiled without fullgraph (Dynamo caches them by code object)
    with pytest.raises(Exception, match=D2S_WAY):
        torch.compile(_as_module(objects[kind]), fullgraph=True)(POS)


def test_a_harmless_dispatch_mode_still_runs_the_program(objects):
    from torch.utils.flop_counter import FlopCounterMode
    fn = objects["declarative function"]
    with FlopCounterMode(display=False):
        assert torch.equal(fn(NEG), branchy(NEG))
        assert torch.equal(fn(POS), branchy(POS))


def _static_graph():
    """A program built with the static API: y = x * 2 if x.sum() > 0 else x - 1."""
    main = d2s.Program()
    with d2s.program_guard(main):
        x = d2s.data("x", [None, 4])
        y = d2s.cond(x.sum() > 0, lambda: x * 2, lambda: x - 1)
    assert "cond" in [op.type for op in main.global_block().ops]
    exe = d2s.Executor(d2s.CPUPlace())
    return lambda t: exe.run(main, feed={"x": t}, fetch_list=[y], return_numpy=False)[0]


def test_executor_run_refuses_jit_trace_and_runs_under_torch_compile():
    run = _static_graph()
    with pytest.raises(RuntimeError, match=r"torch\.jit\.trace .* is recording Executor\.run of a d2s program"):
        torch.jit.trace(run, (POS,))
    compiled = torch.compile(run)
    for x in (POS, NEG):
        assert torch.equal(compiled(x), branchy(x))
