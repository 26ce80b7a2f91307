"""Run-time checks exported to ONNX (runtime/onnx_checks.py): the ONNX model
fails, naming the check and the user's line, for exactly the inputs for
which the program raises; on every other input it equals eager. Checks
under a branch, in a loop body and at top level; the decisions of
d2s/decisions.py (decision_failed, check_sizes, check_dims, check_bool)
and the user's own assert / raise."""

import pytest
import torch

import d2s

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from tests.d2s.test_decisions import add, attend, causal_from_tensor, last_token  # noqa: E402


def _ops(static):
    program = static.concrete_program.main_program if hasattr(static, "concrete_program") else static
    return {op.type for block in program.blocks for op in block.ops}


def _session(static, tmp_path):
    path = str(tmp_path / "model.onnx")
    d2s.onnx.export(static, path)
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def _run(session, *tensors):
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), tensors)}
    return [torch.from_numpy(v) for v in session.run(None, feeds)]


def _latest_ops(static):
    return {op.type for block in static.program_cache.last.main_program.blocks for op in block.ops}


def checked_sum(x):
    total = torch.zeros(())
    i = torch.zeros((), dtype=torch.long)
    while i < x.shape[0]:
        if x[i] < 0:
            raise ValueError("negative entry")
        total = total + x[i]
        i = i + 1
    assert total < 100, "sum too large"
    return total


@pytest.mark.parametrize("ok, failing", [
    ([[], [2.0], [1.0, 2.0, 3.0]], [([1.0, -1.0], "negative entry"), ([60.0, 50.0], "sum too large")]),
])
def test_raise_in_a_loop_and_assert_after_it(tmp_path, ok, failing):
    static = d2s.declarative(checked_sum, input_spec=[d2s.InputSpec([None])])
    static(torch.tensor([1.0, 2.0]))
    assert {"while", "cond", "raise", "assert"} <= _latest_ops(static)
    session = _session(static, tmp_path)
    for values in ok:  # zero, one and several trips
        x = torch.tensor(values)
        assert torch.allclose(_run(session, x)[0], checked_sum(x))
    for values, message in failing:
        x = torch.tensor(values)
        with pytest.raises(Exception, match=message):
            checked_sum(x)
        with pytest.raises(Exception, match=f"d2s check failed: .*{message}.*test_onnx_checks.py"):
            _run(session, x)


FULL, PADDED = torch.ones(2, 3), torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


@pytest.mark.parametrize("taken, other", [(FULL, PADDED), (PADDED, FULL)])
def test_decision_failed_on_the_side_not_converted(tmp_path, taken, other):
    static = d2s.declarative(attend)
    x = torch.randn(2, 3, 3)
    static(x, taken)
    assert {"cond", "decision_failed"} <= _latest_ops(static)
    session = _session(static, tmp_path)
    assert torch.allclose(_run(session, x, taken)[0], attend(x, taken), atol=1e-6)
    with pytest.raises(Exception, match="d2s check failed: this program was converted for inputs that take"):
        _run(session, x, other)


@pytest.mark.parametrize("fn, specs, example, ok, failing, check", [
    (add, [[None], [None]], (3, 3), [(5, 5), (2, 2)], (4, 1), "check_sizes"),  # (size 1 may be a decision too)
    (last_token, [[2, None, 4]], (2, 1, 4), [(2, 1, 4)], (2, 3, 4), "check_dims"),
])
def test_size_decisions(tmp_path, fn, specs, example, ok, failing, check):
    static = d2s.declarative(fn, input_spec=[d2s.InputSpec(s) for s in specs])
    torch.manual_seed(0)
    shapes = [example] if len(specs) == 1 else [(n,) for n in example]
    static(*[torch.randn(s) for s in shapes])
    assert check in _latest_ops(static)
    session = _session(static, tmp_path)
    for case in ok:
        shapes = [case] if len(specs) == 1 else [(n,) for n in case]
        args = [torch.randn(s) for s in shapes]
        assert torch.allclose(_run(session, *args)[0], fn(*args), atol=1e-6)
    shapes = [failing] if len(specs) == 1 else [(n,) for n in failing]
    fn(*[torch.randn(s) for s in shapes])  # eager serves it: d2s would convert again; ONNX cannot
    # (check_dims tests a dimension the program fixed: the ONNX input's shape says so too)
    with pytest.raises(Exception, match="d2s check failed|invalid dimensions for input"):
        _run(session, *[torch.randn(s) for s in shapes])


def causal_twice(q, flag):
    """Two layers' attention: two checks of one message and line in one
    graph, whose ONNX nodes must still have names of their own
    (onnxruntime refuses the model otherwise)."""
    return causal_from_tensor(causal_from_tensor(q, flag), flag)


@pytest.mark.parametrize("fn", [causal_from_tensor, causal_twice])
def test_bool_decision(tmp_path, fn):
    static = d2s.declarative(fn)
    q = torch.randn(1, 2, 3, 4)
    static(q, torch.ones(2))
    assert "check_bool" in _latest_ops(static)
    session = _session(static, tmp_path)
    assert torch.allclose(_run(session, q, torch.ones(2))[0], fn(q, torch.ones(2)), atol=1e-6)
    with pytest.raises(Exception, match="d2s check failed: this program was converted for inputs where"):
        _run(session, q, torch.zeros(2))

