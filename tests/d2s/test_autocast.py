"""`torch.autocast` in declarative code and around a declarative call.

Eagerly, autocast picks the dtype each kernel computes in. A program
records, on each call made inside a `with torch.autocast(...)` of the
user's code, the autocast state it was made in, and runs the call in that
state (runtime/run_modes.py); shape inference computes autocast's dtypes,
so a branch on a dtype decides as eager does. The caller's autocast state
is part of the cache key: a program traced under autocast does not serve
a call made without it. Before, the program ran every call in float32: a
silent wrong value and dtype."""

import pytest
import torch
import torch.nn as nn

import d2s
from test_translate_control_flow import all_op_types


def _inner_branch(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
    if y.sum() > 0:
        y = y * 2
    return y


def _dtype_decides(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = torch.relu(x @ w)
    if z.dtype == torch.bfloat16:
        return z.float() * 2
    return z


def _autocast_in_a_branch(x, w):
    if x.sum() > 0:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.tanh(x @ w)
        y = y.float()
    else:
        y = x @ w
    return y


def _turned_off_inside(x, w):
    y = x @ w
    with torch.autocast("cpu", enabled=False):
        z = y.float() @ w.t()
    return z


def _loop(x, w, n):
    i = torch.zeros((), dtype=torch.int64)
    while i < n:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            x = torch.tanh(x @ w)
        x = x.float()
        i = i + 1
    return x


def _inputs(sign):
    torch.manual_seed(0)
    x, w = torch.randn(3, 4).abs() * sign, torch.randn(4, 4).abs()
    return x, w


def _same(a, b):
    assert a.dtype == b.dtype and torch.equal(a, b), (a, b)


@pytest.mark.parametrize("fn", [_inner_branch, _dtype_decides, _autocast_in_a_branch])
def test_autocast_inside_the_function_every_branch(fn):
    static = d2s.declarative(fn)
    for sign in (1, -1):
        x, w = _inputs(sign)
        _same(static(x, w), fn(x, w))
    assert len(static.program_cache) == 1
    program = static.concrete_program.main_program
    assert any(op.attrs.get("autocast") for b in program.blocks for op in b.ops)
    if fn is not _dtype_decides:
        assert "cond" in all_op_types(program)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_autocast_inside_a_loop_zero_one_and_several_trips(n):
    static = d2s.declarative(_loop)
    x, w = _inputs(1)
    _same(static(x, w, torch.tensor(n)), _loop(x, w, torch.tensor(n)))
    assert "while" in all_op_types(static.concrete_program.main_program)


def test_the_callers_autocast_is_part_of_the_key():
    static = d2s.declarative(_turned_off_inside)
    x, w = _inputs(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = _turned_off_inside(x, w), static(x, w)
    _same(got, want)
    _same(static(x, w), _turned_off_inside(x, w))  # without autocast: another program
    assert len(static.program_cache) == 2


def test_gradients_under_autocast_equal_eager():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    static = d2s.declarative(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
    static.load_state_dict(eager.state_dict())
    x = torch.randn(5, 4)
    for model in (eager, static):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().sum().backward()
    for a, b in zip(eager.parameters(), static.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_a_saved_program_keeps_its_autocast_calls(tmp_path):
    class M(nn.Module):
        def forward(self, x, w):
            return _inner_branch(x, w)

    static = d2s.declarative(M())
    x, w = _inputs(1)
    static(x, w)
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for sign in (1, -1):
        x, w = _inputs(sign)
        _same(loaded(x, w), _inner_branch(x, w))


def _clamp_if_half(x, w):
    y = x @ w
    if y.dtype == torch.bfloat16:  # T5's clamp, under the caller's autocast
        y = torch.clamp(y, -1, 1)
    return y * 3


def test_a_dtype_read_under_the_callers_autocast():
    static = d2s.declarative(_clamp_if_half)
    x, w = _inputs(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _same(static(x, w), _clamp_if_half(x, w))
    _same(static(x, w), _clamp_if_half(x, w))


def _other_device_type(x, w):
    # Autocast of a device type the tensors are not on changes no kernel
    # here; on that device it would: the calls record it all the same.
    with torch.autocast("xpu", dtype=torch.bfloat16):
        y = x @ w
    if y.sum() > 0:
        y = y * 2
    return y


def test_autocast_of_any_device_type_is_recorded(tmp_path):
    static = d2s.declarative(_other_device_type)
    for sign in (1, -1):
        x, w = _inputs(sign)
        _same(static(x, w), _other_device_type(x, w))
    program = static.concrete_program.main_program
    assert [["xpu", "bfloat16", True]] in [op.attrs.get("autocast") for op in program.global_block().ops]
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    _same(loaded(x, w), _other_device_type(x, w))


class _ZerosOfItsDtype(nn.Module):
    # `torch.zeros(..., dtype=y.dtype)`: the dtype is fixed when traced, so
    # a program traced outside autocast would add float32 zeros where eager
    # under autocast adds bfloat16 ones.
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y + torch.zeros(4, dtype=y.dtype)


_CONTEXTS = {"off": lambda: torch.autocast("cpu", enabled=False),
             "cpu bfloat16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
             "xpu bfloat16": lambda: torch.autocast("xpu", dtype=torch.bfloat16)}


def _load(how, model, x, tmp_path):
    """A runner that cannot retrace, made from `model` in the caller's autocast."""
    if how == "TracedLayer":
        return d2s.TracedLayer.trace(model, [x])[1]
    if how == "jit.load":
        d2s.jit.save(d2s.declarative(model), str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 4], "float32")])
        return d2s.jit.load(str(tmp_path / "m"))
    layer = d2s.TracedLayer.trace(model, [x])[1]
    layer.save_inference_model(str(tmp_path / "e"))
    exe = d2s.Executor()
    program, feeds, fetches = d2s.load_inference_model(str(tmp_path / "e"), exe)
    return lambda x: exe.run(program, feed={feeds[0]: x}, fetch_list=fetches, return_numpy=False)[0]


@pytest.mark.parametrize("how", ["jit.load", "TracedLayer", "Executor.run"])
@pytest.mark.parametrize("traced", ["off", "cpu bfloat16"])
def test_a_program_that_cannot_retrace_runs_only_in_its_traced_autocast(how, traced, tmp_path):
    torch.manual_seed(0)
    model = _ZerosOfItsDtype()
    x = torch.randn(3, 4)
    with _CONTEXTS[traced]():
        run = _load(how, model, x, tmp_path)
    for called, context in _CONTEXTS.items():
        with context():
            if called == traced:
                _same(run(x), model(x))
            else:
                with pytest.raises(RuntimeError, match=r"this program was traced .* and is called"):
                    run(x)
