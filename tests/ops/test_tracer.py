"""The tracer owns trace state; one rollback removes what a trial trace added;
the caller's saved-tensor hooks see none of the trace's own tensors."""

import pytest
import torch

import d2s
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


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if h.sum() > 0:
            h = h * 2
        return self.b(h)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_callers_saved_tensor_hooks_see_the_programs_tensors_only(sign):
    """A memory tracker or `save_on_cpu` around the first call: its pack
    hook was handed the meta tensors tracing computes with autograd on (a
    tracker counted them, `t.numpy()` failed on them); it sees what eager's
    call saves."""
    def packed(run, x):
        seen = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
            y = run(x)
        return y, seen

    torch.manual_seed(0)
    module = _Block()
    x = torch.rand(3, 4).mul(sign).requires_grad_()
    want, eager_seen = packed(module, x)
    got, seen = packed(d2s.declarative(module), x)  # converted inside the hooks
    assert torch.equal(got, want) and len(seen) == len(eager_seen)
    assert all(a.device.type == "cpu" and torch.equal(a, b) for a, b in zip(seen, eager_seen))
