"""Native segments (runtime/native): every opcode against eager, bit for bit,
with gradients; the fallback to Python (tensor subclasses, torch function
modes, errors at the user's line); segments inside `cond` / `while`; the
plan's registers and frees; building without a compiler."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import d2s
from runtime import native
from runtime.native import families, lower
from runtime.native import plan as native_plan

_AVAILABLE = native.load() is not None
# CI builds the extension first and sets D2S_REQUIRE_NATIVE: there, these tests never skip.
pytestmark = pytest.mark.skipif(not _AVAILABLE and not os.environ.get("D2S_REQUIRE_NATIVE"),
                                reason=f"native executor unavailable: {native.unavailable_reason()}")


def _compiled(fn):
    return fn.concrete_program.compiled


def _clone_inputs(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _check_case(fn, make_args):
    eager_args, static_args = make_args(), make_args()
    static = d2s.declarative(fn)
    static(*_clone_inputs(static_args))  # build the program
    compiled = _compiled(static)
    assert compiled.segments, compiled.source
    got = _flat(static(*static_args))
    assert [s.fallbacks() for s in compiled.segments] == [0] * len(compiled.segments), \
        [s.last_fallback() for s in compiled.segments]
    want = _flat(fn(*eager_args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w), (g, w)
    floats = [(g, w) for g, w in zip(got, want) if g.requires_grad]
    if floats:
        sum(g.sum() for g, _ in floats).backward()
        sum(w.sum() for _, w in floats).backward()
        for a, b in zip(static_args, eager_args):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                assert torch.equal(a.grad, b.grad)


def _x(*shape, grad=True, seed=0):
    def make():
        g = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=g).requires_grad_(grad)
    return make


def _args(*makers):
    return lambda: [m() for m in makers]


def _unary(op):
    def f(x):
        return op(x.abs() + 0.5) * 2
    return f


def transposed(x):
    return x.t()


def contiguous(x):
    return x.t().contiguous()


# Each family member as `torch.NAME` (the ops on masks are in `compare` and
# `inplace_chain`), and other spellings of the same ATen ops.
_ON_BOOL = ("logical_not", "bitwise_not")
UNARY = [getattr(torch, name) for name in families.UNARY if name not in _ON_BOOL] + [
    F.silu, F.tanh, F.sigmoid, torch.negative, torch.Tensor.__neg__, torch.Tensor.__abs__, transposed, contiguous]


@pytest.mark.parametrize("op", UNARY, ids=lambda o: o.__name__)
def test_unary_ops_match_eager(op):
    _check_case(_unary(op), _args(_x(3, 4)))


def arith(x, y):
    a = torch.add(x, y, alpha=2) - 3
    b = x * 0.5 + y / 3
    c = 2 - x
    d = 1 + x
    e = 3 * y
    f = torch.sub(x, y, alpha=0.5) * torch.mul(x, y) / torch.div(y, 2.0)
    return a + b + c + d + e + f, x ** 2 + (x.abs() + 1) ** y, torch.maximum(x, y) - torch.minimum(x, y)


def integers(n, m):
    return n + 1, n * 2, n - m, (n & m) | (n ^ 3), n // 1 + 0, n.sum() * 3


def compare(x, y):
    a = (x > 0) | (x <= y)
    b = (x == y) ^ (x != 0.5)
    c = (x < y) & (x >= -1)
    d = torch.logical_and(a, b) + 0
    e = torch.logical_or(~c, torch.logical_not(b))
    return a, b, c, d, e, torch.eq(x, y) & torch.gt(x, 0.25)


def select_fill(x, y):
    m = x > 0
    return torch.where(m, x, y) * 2, x.masked_fill(m, 0.0) + 1, x.masked_fill(~m, y.sum()) - 1


def reductions(x):
    return (x.sum() + 1, x.sum(1) * 2, x.sum((0, 1), keepdim=True) - 1, x.mean() * 3, x.mean(0) + 1,
            x.amax(1) - 1, x.amin() + 1, (x > 0).all() | (x > 5).any(), (x > 0).any(1) & (x > -5).all(1),
            x.argmax() + 1, x.argmax(1, keepdim=True) * 2, torch.argmin(x, 0) + 0, x.max() * 2, x.min() * 2)


def shapes(x):
    return (x.view(2, -1) + 1, x.view((-1,)) * 2, x.reshape(4, 3) - 1, torch.reshape(x, (-1, 2)) * 3,
            x.flatten() + 0.5, x.unsqueeze(0).squeeze() * 2, x.unsqueeze(1).squeeze(1) + 1,
            x.transpose(0, 1) * 2, x.permute(1, 0) - 1, torch.permute(x, (1, 0)) + 2,
            x.unsqueeze(0).expand(2, -1, -1) * 3, x.select(0, 1) + 1, x.detach() * 2 + x)


def linear_ops(x, w, b, m):
    return (F.linear(x, w, b) * 2, F.linear(x, w) + 1, torch.addmm(b, x, w.t()) - 1, (x @ w.t()) * 2,
            torch.matmul(x, m) + 1, torch.mm(x, m) * 3, torch.bmm(x.unsqueeze(0), m.unsqueeze(0)) + 1)


def conv_ops(img, k, kb, k1):
    a = F.conv2d(img, k, kb, stride=2, padding=1) * 2
    b = F.max_pool2d(torch.relu(F.conv2d(img, k)), 2)
    c = F.avg_pool2d(img, 2) + F.avg_pool2d(img, 3, stride=1, padding=1)[:, :, :4, :4].sum() * 0
    d = F.adaptive_avg_pool2d(img, 1) * 2
    e = F.conv1d(img.flatten(2), k1, padding=2) + 1
    return a, b, c, d, e


def nn_ops(x, ln_w, ln_b):
    return (F.softmax(x, dim=1) * 2, F.log_softmax(x, 1) + 1, x.softmax(0) - 1, torch.log_softmax(x, 1) * 2,
            F.layer_norm(x, (4,), ln_w, ln_b) * 2, F.layer_norm(x, (4,)) + 1, F.gelu(x, approximate="tanh") * 2,
            F.gelu(x) + 1)


def losses(x, probs, w):
    t = torch.tensor([0, 3, 1])
    return (F.cross_entropy(x, t), F.cross_entropy(x, t, reduction="sum") * 2,
            F.cross_entropy(x, t, reduction="none") + 1, F.cross_entropy(x, t, ignore_index=3) * 2,
            F.cross_entropy(x, t, weight=w.abs()) + 1, F.cross_entropy(x, t, label_smoothing=0.1) * 2,
            F.cross_entropy(x, probs.softmax(1)) + 1, F.cross_entropy(x[0], t[0]) * 2)


def join_ops(x, y):
    return torch.cat([x, y], 0) * 2, torch.stack((x, y), 1) + 1, torch.zeros(2, 3) + x[:2, :3].sum(), \
        torch.ones((4,), dtype=torch.float64) * 2


def cells(x, h, c, wih, whh, bih, bhh, wih3, whh3, bih3, bhh3, wih4, whh4, bih4, bhh4):
    h1 = torch.rnn_tanh_cell(x, h, wih, whh, bih, bhh) * 2
    h2 = torch.rnn_relu_cell(x, h, wih, whh, None, None) + 1
    h3 = torch.gru_cell(x, h, wih3, whh3, bih3, bhh3) * 2
    h4, c4 = torch.lstm_cell(x, (h, c), wih4, whh4, bih4, bhh4)
    return h1, h2, h3, h4 * 2, c4 + 1


def embed(table, idx):
    e = torch.embedding(table, idx) * 2
    return e + F.embedding(idx, table, padding_idx=1)


CASES = {
    "arith": (arith, _args(_x(3, 4), _x(3, 4, seed=1))),
    "integers": (integers, _args(lambda: torch.arange(12).view(3, 4), lambda: torch.arange(12).view(3, 4) % 5)),
    "compare": (compare, _args(_x(3, 4, grad=False), _x(3, 4, grad=False, seed=1))),
    "select_fill": (select_fill, _args(_x(3, 4), _x(3, 4, seed=1))),
    "reductions": (reductions, _args(_x(3, 4))),
    "shapes": (shapes, _args(_x(3, 4))),
    "linear": (linear_ops, _args(_x(5, 4), _x(6, 4, seed=1), _x(6, seed=2), _x(4, 7, seed=3))),
    "conv": (conv_ops, _args(_x(2, 3, 8, 8), _x(5, 3, 3, 3, seed=1), _x(5, seed=2), _x(4, 3, 5, seed=3))),
    "nn": (nn_ops, _args(_x(3, 4), _x(4, seed=1), _x(4, seed=2))),
    "join": (join_ops, _args(_x(3, 4), _x(3, 4, seed=1))),
    "losses": (losses, _args(_x(3, 4), _x(3, 4, seed=1), _x(4, grad=False, seed=2))),
    "cells": (cells, _args(_x(2, 3), _x(2, 5, seed=1), _x(2, 5, seed=2), _x(5, 3, seed=3), _x(5, 5, seed=4),
                           _x(5, seed=5), _x(5, seed=6), _x(15, 3, seed=7), _x(15, 5, seed=8), _x(15, seed=9),
                           _x(15, seed=10), _x(20, 3, seed=11), _x(20, 5, seed=12), _x(20, seed=13),
                           _x(20, seed=14))),
    "embedding": (embed, _args(_x(6, 3), lambda: torch.tensor([[0, 1, 5], [2, 1, 3]]))),
}


# Every elementwise family member, called as `torch.NAME` (the bool ops on a mask).
_UNARY_FNS = tuple((name in _ON_BOOL, getattr(torch, name)) for name in families.UNARY)


def inplace_chain(x, y):
    """Under no_grad the `inplace` pass writes each fresh temporary in place."""
    p = x.abs() + 0.5
    outs = [x * 2.4 + y, x * 2.5 - y, x * 2.6 * y, x * 2.7 / p, -(x * 1.5), torch.abs(x * 1.6)]
    for i, (on_bool, fn) in enumerate(_UNARY_FNS):
        scale = 1.0 + i / 64  # each temporary its own (cse would merge equal ones)
        outs.append(fn(p > scale) if on_bool else fn(p * scale))
    return tuple(outs)


def outside(x, y):
    t = F.conv3d(x.view(1, 1, 3, 2, 2), y[:2, :2].reshape(1, 1, 1, 2, 2))  # not in the table: made outside any segment
    return torch.tanh(t) + 1  # tanh_ and add_ on it stay Python statements


def _inference(static):
    return static.concrete_program._inference


@pytest.mark.parametrize("fn", [inplace_chain, outside], ids=lambda f: f.__name__)
def test_in_place_reuse_inside_segments_under_no_grad(fn):
    static = d2s.declarative(fn)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    args = (x, y)[:fn.__code__.co_argcount]
    with torch.no_grad():
        static(*args)
        got, want = _flat(static(*args)), _flat(fn(*args))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    compiled = _inference(static)
    names = {v: k for k, v in native.load().opcodes().items()}
    codes = {names[c] for seg in compiled.segments for c in seg.codes()}
    assert all(seg.fallbacks() == 0 for seg in compiled.segments)
    if fn is outside:
        assert "tanh_" not in codes and "k_tanh_" in compiled.source and "k_add_" in compiled.source
    else:
        assert {n for n in names.values() if n.endswith("_") and not n.endswith("__")} - {"and_", "or_", "xor_"} \
            <= codes


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_groups_match_eager_bitwise_with_grads(name):
    fn, make_args = CASES[name]
    _check_case(fn, make_args)


def test_every_opcode_is_covered_by_a_case():
    """The cases above reach every opcode of segment.cpp (a new opcode needs a case)."""
    seen = set()
    names = {v: k for k, v in native.load().opcodes().items()}
    for fn, make_args in list(CASES.values()) + [(_unary(op), _args(_x(3, 4))) for op in UNARY]:
        static = d2s.declarative(fn)
        static(*make_args())
        for plan in _compiled(static).segments:
            seen |= {names[i] for i in plan.codes()}
    static = d2s.declarative(inplace_chain)
    with torch.no_grad():
        static(torch.randn(3, 4), torch.randn(3, 4))
    seen |= {names[i] for seg in _inference(static).segments for i in seg.codes()}
    assert set(names.values()) - seen == set()


# -- control flow ---------------------------------------------------------------------------

def branchy(x, n):
    if x.sum() > 0:
        y = torch.tanh(x) * 2 + 1
    else:
        y = torch.sigmoid(x) - 1
    i = 0
    while i < n:
        y = torch.relu(y - 0.5) + y * 0.25
        if y.mean() > 3:
            break
        i += 1
    return y


@pytest.mark.parametrize("level", ["default", "fast"])
@pytest.mark.parametrize("sign,n", [(1.0, 0), (1.0, 3), (-1.0, 2), (1.0, 40)])
def test_segments_inside_cond_and_while_take_every_path(sign, n, level):
    """Both branches, zero and several trips, the early break: one program,
    its segments run natively, values as eager's, gradients as eager's
    (exactly at the default level, within tolerance at the fast one)."""
    static = d2s.declarative(branchy, optimize=level)
    for s, k in [(sign, n), (-sign, n + 1)]:
        make = lambda: (torch.randn(3, 4, generator=torch.Generator().manual_seed(k)).abs() * s).requires_grad_()
        xs, xe = make(), make()
        got, want = static(xs, torch.tensor(k)), branchy(xe, torch.tensor(k))
        assert torch.equal(got, want)
        got.sum().backward()
        want.sum().backward()
        if level == "default":
            assert torch.equal(xs.grad, xe.grad)
        else:
            torch.testing.assert_close(xs.grad, xe.grad, rtol=_RTOL, atol=_ATOL)
    program = static.concrete_program.main_program
    types = {op.type for b in program.blocks for op in b.ops}
    assert {"cond", "while"} <= types
    assert len(static.program_cache) == 1
    segments = _compiled(static).segments
    assert len(segments) >= 3  # both branches and the loop body
    assert all(seg.fallbacks() == 0 for seg in segments)
    assert any(seg.fused() for seg in segments) == (level == "fast")


# -- the fallback to Python ------------------------------------------------------------------

class Tagged(torch.Tensor):
    calls = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def two_ops(x):
    return torch.tanh(x) * 2


def test_tensor_subclass_sees_every_call():
    static = d2s.declarative(two_ops)
    static(torch.randn(3))
    x = torch.randn(3).as_subclass(Tagged)
    Tagged.calls.clear()
    want = two_ops(x)
    eager_calls = [c for c in Tagged.calls if c != "__get__"]
    Tagged.calls.clear()
    out = static(x)
    assert type(out) is Tagged and torch.equal(out, want)
    assert eager_calls == ["tanh", "mul"]
    assert [c for c in Tagged.calls if c != "__get__"][:2] == eager_calls  # then the runner's own checks
    assert _compiled(static).segments[0].fallbacks() == 1


def test_torch_function_mode_sees_every_call():
    from torch.overrides import TorchFunctionMode

    seen = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    static = d2s.declarative(two_ops)
    x = torch.randn(3)
    static(x)
    with Record():
        out = static(x)
    assert torch.equal(out, two_ops(x))
    assert "tanh" in seen


def lookup(table, idx):
    e = torch.embedding(table, idx) * 2  # the user's line
    return e + 1


def test_kernel_error_names_the_users_line():
    """An error only the values show (an index out of range): eager's error,
    at the user's line, from the Python path."""
    static = d2s.declarative(lookup)
    table = torch.randn(4, 3)
    static(table, torch.tensor([0, 3]))
    with pytest.raises(IndexError) as eager:
        lookup(table, torch.tensor([0, 9]))
    with pytest.raises(Exception) as info:  # eager's IndexError, wrapped with the op and line
        static(table, torch.tensor([0, 9]))
    assert str(eager.value) in str(info.value)
    assert "e = torch.embedding(table, idx) * 2" in str(info.value)
    assert isinstance(info.value.__cause__, IndexError) and info.value.__cause__.__context__ is None
    segment = _compiled(static).segments[0]
    assert segment.fallbacks() == 1 and "index out of range" in segment.last_fallback()


# -- the plan ----------------------------------------------------------------------------------

def test_plan_registers_outputs_and_frees():
    """Inputs take the low registers; a result is freed after its last read;
    only what the code after the segment reads is an output."""
    from runtime.attrs import InputRef, OutputRef
    from runtime.ir import Program

    p = Program()
    block = p.global_block()
    for n in ("x", "w", "t0", "t1", "t2"):
        block.create_var(n, shape=(2, 2))

    def op(t, ins, out, args):
        return block.append_op(t, inputs={"X": ins}, outputs={"Out": [out]},
                               attrs={"args": args, "out": OutputRef(0)})

    ops_ = [op("torch.tanh", ["x"], "t0", (InputRef(0),)),
            op("torch.Tensor.__mul__", ["t0", "w"], "t1", (InputRef(0), InputRef(1))),
            op("torch.Tensor.__add__", ["t1"], "t2", (InputRef(0), 1))]
    names = {"x", "w", "t0", "t1", "t2"}
    lowered = [lower.lower(o, names) for o in ops_]
    plan = native_plan.plan_segment(native.load(), ops_, lowered, live_after=lambda n: n in ("t2", "t0"))
    codes = native.load().opcodes()
    kinds = native.load().operand_kinds()
    assert plan.inputs == ["x", "w"] and plan.outputs == ["t0", "t2"] and plan.output_regs == [2, 4]
    assert plan.instructions == [
        (codes["tanh"], [(kinds["reg"], 0)], [2], [0]),
        (codes["mul"], [(kinds["reg"], 2), (kinds["reg"], 1)], [3], [1]),
        (codes["add"], [(kinds["reg"], 3), (kinds["wrapped"], 1), (kinds["scalar"], 1)], [4], [3]),
    ]


def test_ops_that_do_not_fit_stay_in_python():
    from runtime.attrs import InputRef, OutputRef
    from runtime.ir import Program

    p = Program()
    block = p.global_block()
    block.create_var("x", shape=(2, 2))
    block.create_var("y", shape=(2, 2))
    padded = block.append_op("torch.conv2d", inputs={"X": ["x", "x"]}, outputs={"Out": ["y"]},
                             attrs={"args": (InputRef(0), InputRef(1), None, 1, "same"), "out": OutputRef(0)})
    assert lower.lower(padded, {"x", "y"}) is None  # a string padding is another overload
    summed = block.append_op("torch.sum", inputs={"X": ["x"]}, outputs={"Out": ["y"]},
                             attrs={"args": (InputRef(0),), "kwargs": {"out": InputRef(0)}, "out": OutputRef(0)})
    assert lower.lower(summed, {"x", "y"}) is None
    assert lower.lower(padded, {"y"}) is None  # x is not known to be a plain tensor


# -- building ------------------------------------------------------------------------------------

def test_without_a_compiler_programs_run_as_python(tmp_path):
    """No compiler: one warning, then the same results from the Python path."""
    script = tmp_path / "no_compiler.py"
    script.write_text(textwrap.dedent("""
        import warnings, torch, d2s
        def f(x):
            return torch.tanh(x) * 2 + 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g = d2s.declarative(f)
            x = torch.randn(4)
            assert torch.equal(g(x), f(x))
            assert torch.equal(g(x), f(x))
        msgs = [str(w.message) for w in caught if "native executor" in str(w.message)]
        assert len(msgs) == 1, msgs
        assert not g.concrete_program.compiled.segments
        print("ok")
    """))
    env = dict(os.environ, D2S_CACHE_DIR=str(tmp_path), CXX=str(tmp_path / "no-such-compiler"))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert not any(p.suffix == ".so" for p in tmp_path.rglob("*"))


def test_native_off_by_environment(monkeypatch):
    monkeypatch.setenv("D2S_NATIVE", "0")
    static = d2s.declarative(two_ops)
    x = torch.randn(3)
    assert torch.equal(static(x), two_ops(x))
    assert not _compiled(static).segments


# -- the fast level: one autograd node per segment call -----------------------------------------

def fused_ops(x, w, b, v, s):
    h = torch.tanh(F.linear(x, w, b))                    # linear, tanh
    h = h + torch.sigmoid(h) * v - torch.relu(h) / 2.0   # broadcast mul (v is [4]), relu, div by a number
    h = 1.0 - h + torch.exp(-h).mean()                   # rsub, exp, neg, mean
    h = torch.sub(h, x @ s, alpha=0.5) / (h.abs() + 1)   # mm, sub with alpha, div by a tensor (abs: not fused)
    return h * (h > 0), h.sum()                          # comparison (no gradient), mul by a tensor, sum


def fused_chain(x, w, b, v, s):
    h = torch.tanh(F.linear(x, w, b))
    h = h + torch.sigmoid(h) * v - torch.relu(h) / 2.0
    h = 1.0 - h + torch.exp(-h).mean()
    h = torch.sub(h, torch.addmm(b, x, s), alpha=0.5) / (h * h + 1)
    return h * (h > 0), h.sum(), x * x


def fused_more(x, w, b, v, s):
    y = torch.mm(x, s) + 2                                # mm, add of a number
    z = torch.add(y, x, alpha=0.5) * -1.5 + v            # add with alpha, mul by a number, broadcast add
    k = z.argmax(1) + (z > 0).any(1) + (z < 1).all()     # no gradient through these
    return -z / (w.sum() + 3), z.mean() * torch.sigmoid(b).sum(), k


def fused_shapes(x, w, b, v, s):
    y = x.view(4, 3).t().reshape(2, 6).flatten().unsqueeze(0).squeeze(0).unsqueeze(1).squeeze(1) * 2
    z = torch.cat([x.transpose(0, 1), s.permute(1, 0)], 1).contiguous() + 1    # [4, 7]
    k = torch.stack([w, s], 0).sum((0, 2)) + z.mean(1, keepdim=True).sum(1)  # [4]
    return y.view(3, 4) + k.select(0, 1) + v.expand(3, 4), z.sum(0) * b.unsqueeze(0).expand(7, 4).sum(1)


def fused_nn(x, w, b, v, s):
    p = x.abs() + 0.5
    h = torch.sqrt(p) + torch.rsqrt(p) + torch.reciprocal(p) + torch.expm1(x * 0.1) + torch.log(p)
    h = h + torch.sin(x) * torch.cos(x) + torch.log1p(p) + F.silu(x) + F.gelu(x) + F.gelu(x, approximate="tanh")
    h = F.softmax(torch.mm(h, w), dim=1) + F.log_softmax(x, 1) + x ** 2 + p ** 0.5 + x ** 3
    e = torch.embedding(w, torch.tensor([[0, 1, 3], [3, 3, 2]]))  # [2, 3, 4]
    m = x > 0
    return torch.where(m, h, x * b) + h.masked_fill(m, 0.5) + x.masked_fill(~m, v.sum()), e.sum(0) * 2


def _fused_args(grad=(True, True, True, True, True)):
    shapes = [(3, 4), (4, 4), (4,), (4,), (4, 4)]
    return [torch.randn(*s, generator=torch.Generator().manual_seed(i)).requires_grad_(g)
            for i, (s, g) in enumerate(zip(shapes, grad))]


# Float32 gradients of the fused backward differ from eager's per-op ones
# by the order contributions are summed in at most.
_RTOL, _ATOL = 1e-5, 1e-6


@pytest.mark.parametrize("fn", [fused_chain, fused_more, fused_shapes, fused_nn], ids=lambda f: f.__name__)
@pytest.mark.parametrize("grad", [(True,) * 5, (False, True, True, False, True), (True, False, False, False, False)])
def test_fast_level_records_one_node_and_matches_eager(fn, grad):
    fast = d2s.declarative(fn, optimize="fast")
    args, eager_args = _fused_args(grad), _fused_args(grad)
    got = fast(*args)
    want = fn(*eager_args)
    compiled = _compiled(fast)
    assert any(s.fused() for s in compiled.segments)
    for g, w in zip(got, want):
        assert torch.equal(g, w)  # the same kernels: values are eager's
    assert got[0].grad_fn.name() == "D2SSegmentBackward"
    assert len({id(g.grad_fn) for g in got if g.requires_grad}) == 1  # one node for the call
    assert [g.requires_grad for g in got] == [w.requires_grad for w in want]
    def loss(outs):
        return sum(o.float().sum() * (i + 2) for i, o in enumerate(outs) if o.requires_grad)

    loss(got).backward()
    loss(want).backward()
    for a, b in zip(args, eager_args):
        if b.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, rtol=_RTOL, atol=_ATOL)
        else:
            assert a.grad is None


def classifier(x, w, b, t, reduction, ignore_index):
    return F.cross_entropy(torch.relu(F.linear(x, w, b)), t, reduction=reduction, ignore_index=ignore_index)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_fast_level_fuses_cross_entropy_of_class_indices(reduction, ignore_index):
    """F.cross_entropy(logits, classes) joins the call's one node; its
    gradient is nll_loss's then log_softmax's on the same values, so even
    fused it is eager's bit for bit."""
    fast = d2s.declarative(classifier, optimize="fast")
    t = torch.tensor([2, 0, 2, 1, 3])  # 2 is ignored where ignore_index=2
    args, eager_args = _fused_args()[:3], _fused_args()[:3]
    args[0] = eager_args[0] = None
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(7))
    got = fast(x, *args[1:], t, reduction, ignore_index)
    want = classifier(x, *eager_args[1:], t, reduction, ignore_index)
    assert torch.equal(got, want)
    assert got.grad_fn.name() == "D2SSegmentBackward"
    got.sum().backward()
    want.sum().backward()
    for a, b in zip(args[1:], eager_args[1:]):
        assert torch.equal(a.grad, b.grad)


def soft_targets(x, w, b, probs):
    return F.cross_entropy(F.linear(x, w, b), probs)


def unbatched(x, w, b, t):
    return F.cross_entropy(F.linear(x, w, b)[0], t)


@pytest.mark.parametrize("fn, target", [(soft_targets, torch.rand(3, 4)), (unbatched, torch.tensor(2))],
                         ids=["probabilities", "unbatched"])
def test_fast_level_cross_entropy_without_a_fused_gradient_runs_per_op(fn, target):
    """Targets other than a batch of class indices: at the fast level the
    loss stays a Python statement after the segment (which keeps its one
    node for the ops before it) and records eager's per-op nodes, with
    eager's gradients."""
    fast = d2s.declarative(fn, optimize="fast")
    args, eager_args = _fused_args()[:3], _fused_args()[:3]
    got, want = fast(*args, target), fn(*eager_args, target)
    assert torch.equal(got, want)
    assert got.grad_fn.name() != "D2SSegmentBackward"
    segments = _compiled(fast).segments
    names = {v: k for k, v in native.load().opcodes().items()}
    assert all(s.fallbacks() == 0 for s in segments) and any(s.fused() for s in segments)
    assert "cross_entropy" not in {names[c] for s in segments for c in s.codes()}
    got.backward()
    want.backward()
    for a, b in zip(args, eager_args):
        assert torch.equal(a.grad, b.grad)


def test_fast_level_with_unfused_ops_keeps_per_op_autograd():
    fast = d2s.declarative(fused_ops, optimize="fast")
    args, eager_args = _fused_args(), _fused_args()
    got, want = fast(*args), fused_ops(*eager_args)
    assert not any(s.fused() for s in _compiled(fast).segments)  # abs has no fused gradient
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    (got[0].sum() + got[1]).backward()
    (want[0].sum() + want[1]).backward()
    for a, b in zip(args, eager_args):
        assert torch.equal(a.grad, b.grad)  # per-op autograd: eager's graph, bit for bit


def test_fused_node_refuses_double_backward_and_second_backward():
    fast = d2s.declarative(fused_chain, optimize="fast")
    args = _fused_args()
    out = fast(*args)[1]
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out, args[0], create_graph=True)
    out = fast(*args)[1]
    g1 = torch.autograd.grad(out, args[1], retain_graph=True)[0]
    g2 = torch.autograd.grad(out, args[1])[0]
    assert torch.equal(g1, g2)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(out, args[1])


def test_fused_node_sees_in_place_changes_of_what_it_saved():
    fast = d2s.declarative(fused_chain, optimize="fast")
    args, eager_args = _fused_args(), _fused_args()
    out, want = fast(*args), fused_chain(*eager_args)
    with torch.no_grad():
        args[1].add_(1.0)        # a saved weight, as an optimizer step between forward and backward
        eager_args[1].add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        want[1].backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out[1].backward()


def saves_views(x, w, b, v, s):
    """mm keeps its operands: here views (made in the call) of the inputs w and s."""
    return torch.mm(x, w.t()).sum() + torch.mm(s.view(16, 1).t(), s.view(16, 1)).sum()


@pytest.mark.parametrize("written", [1, 4], ids=["w", "s"])
def test_fused_node_sees_in_place_changes_of_inputs_through_their_views(written):
    """The fused forward dispatches below autograd, where a view gets no
    version counter of its own base: it is given its input's, so a write to
    the input between forward and backward fails as eager's does."""
    fast = d2s.declarative(saves_views, optimize="fast")
    args, eager_args = _fused_args(), _fused_args()
    out, want = fast(*args), saves_views(*eager_args)
    assert out.grad_fn.name() == "D2SSegmentBackward"
    with torch.no_grad():
        args[written].add_(1.0)
        eager_args[written].add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        want.backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


def tanh_of_dead_linear(x, w, b, v, s):
    return torch.tanh(F.linear(x, w, b)) * 2, torch.sigmoid(torch.mm(x, s)).sum()  # both written in place


def tanh_of_live_linear(x, w, b, v, s):
    a = F.linear(x, w, b)
    return torch.tanh(a) + a                       # a is read after tanh: not written


def tanh_of_input(x, w, b, v, s):
    return torch.tanh(x) * w.sum()                 # an input: never written


def tanh_of_viewed(x, w, b, v, s):
    a = torch.mm(x, w)
    k = a.view(12)                                 # a view of a outlives it: not written
    return torch.tanh(a).sum() + (k * 1.0)


def tanh_of_expanded(x, w, b, v, s):
    e = (v * 2).expand(3, 4)                       # its base dies here: e alone holds the storage
    t = torch.tanh((x * 3).t())                    # a dead transposed temporary: written, strides kept
    return torch.tanh(e) * x, t * 1.0


def relu_then_saved(x, w, b, v, s):
    a = torch.mm(x, w)                             # mm keeps x and w, not a
    return torch.exp(torch.relu(a)) * v            # relu into a; exp keeps its result


@pytest.mark.parametrize("fn", [tanh_of_dead_linear, tanh_of_live_linear, tanh_of_input, tanh_of_viewed,
                                tanh_of_expanded, relu_then_saved], ids=lambda f: f.__name__)
def test_fused_forward_writes_only_dead_temporaries_in_place(fn):
    """The fused forward runs `tanh(a)` as `a.tanh_()` where nothing else
    reads or views a; values stay eager's bit for bit and no input changes."""
    fast = d2s.declarative(fn, optimize="fast")
    args, eager_args = _fused_args(), _fused_args()
    before = [a.detach().clone() for a in args]
    for _ in range(2):
        got, want = fast(*args), fn(*eager_args)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        assert all(torch.equal(g, w) and g.stride() == w.stride() for g, w in zip(got, want))
        assert all(torch.equal(a, b) for a, b in zip(args, before))
    compiled = _compiled(fast)
    assert any(s.fused() for s in compiled.segments)
    assert all(s.fallbacks() == 0 for s in compiled.segments)
    sum(g.sum() for g in got).backward()
    sum(w.sum() for w in want).backward()
    for a, b in zip(args, eager_args):
        torch.testing.assert_close(a.grad, b.grad, rtol=_RTOL, atol=_ATOL)


def test_fused_segments_fall_back_to_per_op_autograd_for_forward_mode():
    import torch.autograd.forward_ad as fwAD

    fast = d2s.declarative(fused_chain, optimize="fast")
    args = _fused_args()
    fast(*args)
    tangent = torch.randn(3, 4)
    with fwAD.dual_level():
        dual = fwAD.make_dual(args[0].detach(), tangent)
        got = fwAD.unpack_dual(fast(dual, *args[1:])[1]).tangent
        want = fwAD.unpack_dual(fused_chain(fwAD.make_dual(args[0].detach(), tangent), *args[1:])[1]).tangent
    assert torch.equal(got, want)


def test_fast_level_training_tracks_eager():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Sigmoid(),
                                torch.nn.Linear(8, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Sigmoid(),
                               torch.nn.Linear(8, 3))
    twin.load_state_dict(eager.state_dict())
    fast = d2s.declarative(twin, optimize="fast")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, twin)]
    x, y = torch.randn(16, 6), torch.randn(16, 3)
    for _ in range(5):
        for model, opt in zip((eager, fast), opts):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    assert any(s.fused() for s in fast.forward.concrete_program.compiled.segments)
    for a, b in zip(eager.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=_RTOL, atol=_ATOL)


def test_default_level_never_fuses():
    static = d2s.declarative(fused_chain)
    out = static(*_fused_args())
    assert not any(s.fused() for s in _compiled(static).segments)
    assert out[1].grad_fn.name() != "D2SSegmentBackward"


def test_saved_tensor_hooks_see_per_op_saves():
    fast = d2s.declarative(fused_chain, optimize="fast")
    args = _fused_args()
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fast(*args)
    assert out[1].grad_fn.name() != "D2SSegmentBackward" and packed
    eager = fused_chain(*_fused_args())
    eager[1].backward()
    out[1].backward()
    assert args[1].grad is not None


def users_in_place(x):
    acc = torch.zeros(3)
    acc.mul_(-1.0)              # the user's own in-place op, on a tensor the segment made
    b = acc.add_(x)             # its result is the written tensor, under another name
    v = x.view(3)
    v.mul_(2.0)                 # into a view of an input: must stay a Python statement
    return b * 2, acc + 1, v + 0


def test_users_in_place_ops_inside_and_outside_segments():
    static = d2s.declarative(users_in_place)
    for _ in range(2):
        x1, x2 = torch.randn(3), None
        x2 = x1.clone()
        got, want = static(x1), users_in_place(x2)
        assert all(torch.equal(g, w) for g, w in zip(got, want)) and torch.equal(x1, x2)
    compiled = _compiled(static)
    assert all(seg.fallbacks() == 0 for seg in compiled.segments)
    names = {v: k for k, v in native.load().opcodes().items()}
    codes = [names[c] for seg in compiled.segments for c in seg.codes()]
    assert "mul_" in codes and "add_" in codes and codes.count("mul_") == 1  # v.mul_ ran in Python


class Relus(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(True))
        self.l2 = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.ReLU(True))

    def forward(self, x):
        return self.l2(self.l1(x))


@pytest.mark.parametrize("shape", [(2, 4), (2, 3, 4), (4,), (4, 2, 3, 4)])
def test_fast_level_outputs_that_are_views_inside_the_call(shape):
    """`linear` of a 3-d input returns a view of its own matmul result; the
    caller writes it in place (ReLU(inplace=True)), as eagerly. A strided
    3-d input (`x[:, 0]` of a 4-d one) takes matmul's path, which folds the
    batch into one mm because the weight requires grad: as eager's, bit for bit."""
    torch.manual_seed(0)
    eager, twin = Relus(), Relus()
    twin.load_state_dict(eager.state_dict())
    fast = d2s.declarative(twin, optimize="fast")
    x = torch.randn(*shape)
    x = x[:, 0] if x.dim() == 4 else x
    got, want = fast(x), eager(x)
    assert torch.equal(got, want)
    got.sum().backward()
    want.sum().backward()
    for a, b in zip(twin.parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=_RTOL, atol=_ATOL)


class HookRefused(Exception):
    pass


def _refusing_pack(t):
    raise HookRefused("the pack hook refuses")


@pytest.mark.parametrize("level", ["default", "fast"])
def test_an_exception_a_saved_tensor_hook_raises_inside_a_segment_propagates(level):
    """torch's checkpoint stops its recomputation by raising from a pack
    hook: the exception leaves the segment as from eager's op (it was a
    SystemError: the segment fell back to Python with the error still set)."""
    static = d2s.declarative(two_ops, optimize=level)
    x = torch.randn(3, requires_grad=True)
    static(x)
    with torch.autograd.graph.saved_tensors_hooks(_refusing_pack, lambda t: t):
        with pytest.raises(HookRefused):
            two_ops(x)
        with pytest.raises(Exception) as info:  # the hook's exception, named with the op and line
            static(x)
    assert isinstance(info.value.__cause__, HookRefused) and "return torch.tanh(x) * 2" in str(info.value)
    assert _compiled(static).segments and static(x).requires_grad
