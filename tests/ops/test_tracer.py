"""The tracer owns trace state; one rollback removes what a trial trace added."""

import torch

import runtime
from ops import tracer
from ops.capture import CaptureMode
from ops.recording import lift


def test_rollback_removes_ops_vars_blocks_and_lifted_tensors():
    p = runtime.Program()
    lin = torch.nn.Linear(3, 2)
    with runtime.program_guard(p), tracer.Tracer(p, {id(lin.weight): "weight"}) as tr:
        x = runtime.data("x", [None, 3])
        y = torch.relu(x)
        before = p.to_string()
        mark = tr.mark()
        block = tr.new_block()
        with tr.block_guard(block):
            lin(y)
        assert "weight" in p.bound and len(p.blocks) == 2
        lin(y)
        tr.rollback(mark)
        assert p.to_string() == before
        assert "weight" not in p.bound and tr.lifted == {} and tr.block is p.global_block()
        assert lift(lin.weight).name == "weight"  # lifted again after the rollback


def test_tracer_is_scoped_to_its_trace_and_program():
    p, q = runtime.Program(), runtime.Program()
    with runtime.program_guard(p):
        implicit = tracer.current()
        assert implicit.program is p and tracer.current() is implicit
        with tracer.Tracer(p) as tr:
            assert tracer.current() is tr
            with runtime.program_guard(q):
                assert tracer.current().program is q
        assert tracer.current() is implicit


def test_program_holds_only_ir():
    p = runtime.Program()
    layer = torch.nn.Linear(3, 2)
    with runtime.program_guard(p), tracer.Tracer(p), CaptureMode():
        layer(runtime.data("x", [2, 3]))
    assert set(vars(p)) == {"blocks", "_name_counters", "_version", "bound", "_device", "mode", "autocast",
                            "default_dtype"}
