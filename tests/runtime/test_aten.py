"""Canonical ATen names (OpDef.aten) and the facts backends read through them
(runtime/aten.py): every spelling of one operator gets its name, a spelling
whose arguments are not the operator's gets none, and the derived families
(in-place forms, fresh results) hold for the torch that runs."""

import math

import pytest
import torch
import torch.nn.functional as F

import d2s  # noqa: F401  (fills the op table)
from ops.aten_names import WRAPPERS
from runtime import aten, native
from runtime.optable import get_op_def, registered_types


@pytest.mark.parametrize("op_type, name", [
    ("torch.add", "add"), ("torch.Tensor.add", "add"), ("torch.Tensor.__add__", "add"),
    ("torch.Tensor.__radd__", "add"), ("torch.Tensor.__rsub__", "rsub"), ("torch.dsmm", "mm"),
    ("torch.negative", "neg"), ("torch.Tensor.__neg__", "neg"), ("torch.nn.functional.relu", "relu"),
    ("torch.nn.functional.softmax", "softmax"), ("torch.nn.functional.conv2d", "conv2d"),
    ("torch.Tensor.view", "view"), ("torch.where", "where"), ("torch.Tensor.__and__", "__and__"),
    ("torch.Tensor.relu_", "relu_"),
    # No ATen operator with the same arguments:
    ("torch.Tensor.where", None),  # x.where(c, y) is where(c, x, y)
    ("torch.Tensor.polygamma", None),  # x.polygamma(n) is polygamma(n, x)
    ("torch.Tensor.__rpow__", None), ("torch.Tensor.__rtruediv__", None),
    ("torch.nn.functional.embedding", None),  # weight and indices swapped, padding_idx shifted
    ("torch.equal", None),  # its kernel makes a tensor of the bool
    ("torch.Tensor.__getitem__", None), ("torch.Tensor.__iadd__", None),
    ("torch.mul!", None),  # called with out=: it writes an argument
])
def test_each_spelling_names_its_operator(op_type, name):
    assert get_op_def(op_type).aten == name


def test_every_name_is_an_aten_operator():
    for op_type in registered_types():
        name = get_op_def(op_type).aten
        if name is not None:
            assert isinstance(getattr(torch.ops.aten, name, None), torch._ops.OpOverloadPacket), op_type


_X = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))

# Each wrapper called as the user calls it, and its operator with the arguments the binding reads.
_WRAPPER_CALLS = {
    "torch.nn.functional.relu": ((_X,), {"inplace": False}),
    "torch.nn.functional.silu": ((_X,), {}),
    "torch.nn.functional.tanh": ((_X,), {}),
    "torch.nn.functional.sigmoid": ((_X,), {}),
    "torch.nn.functional.softmax": ((_X, 1), {"_stacklevel": 5}),
    "torch.nn.functional.log_softmax": ((_X,), {"dim": -1, "dtype": torch.float64}),
    "torch.nn.functional.layer_norm": ((_X, (4, 4)), {"eps": 1e-3}),
    "torch.nn.functional.adaptive_avg_pool2d": ((_X, (2, 3)), {}),
}


class _Op:
    """A recorded call with constant arguments, as `bind` reads one."""

    def __init__(self, args, kwargs):
        self.attrs = {"args": args, "kwargs": kwargs}


@pytest.mark.parametrize("op_type", sorted(WRAPPERS))
def test_a_wrapper_bound_as_its_operator_computes_the_same(op_type):
    opdef = get_op_def(op_type)
    args, kwargs = _WRAPPER_CALLS[op_type]
    packet = getattr(torch.ops.aten, opdef.aten)
    schema = getattr(packet, "default" if "default" in packet.overloads() else "int")._schema
    names = tuple("input" if a.name == "self" else a.name for a in schema.arguments if not a.kwarg_only)
    defaults = tuple(a.default_value for a in schema.arguments if not a.kwarg_only and a.has_default_value())
    bound = aten.bind(_Op(args, kwargs), opdef, names, defaults)
    assert bound is not None
    want = opdef.kernel(*args, **kwargs)
    got = packet(*[bound[n] for n in names])
    assert torch.equal(got, want)


@pytest.mark.parametrize("args, kwargs", [((_X, 1), {"_stacklevel": 3, "dtype": None}), ((_X,), {"inplace": True})])
def test_a_wrapper_call_outside_its_fixed_values_is_not_bound(args, kwargs):
    op_type = "torch.nn.functional.relu" if "inplace" in kwargs else "torch.nn.functional.softmax"
    opdef = get_op_def(op_type)
    got = aten.bind(_Op(args, kwargs), opdef, ("input", "dim", "dtype"), (None,))
    assert (got is None) == ("inplace" in kwargs)


_INPLACE_FAMILY = sorted(n for n in dir(torch.ops.aten) if aten.inplace_unary(n))


def _inputs(dtype):
    special = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -3.75, 1e-7, 88.0, -88.0, math.inf, -math.inf, math.nan]
    values = torch.tensor(special + torch.randn(50, generator=torch.Generator().manual_seed(1)).tolist())
    return values.to(dtype) if dtype.is_floating_point else (values.nan_to_num(0) * 7).to(dtype)


def test_the_in_place_family_is_derived_from_aten():
    assert {"tanh", "sigmoid", "relu", "exp", "neg", "abs", "sqrt", "sin", "erf", "floor"} <= set(_INPLACE_FAMILY)
    for name in ("softmax", "where", "clamp", "add", "conj", "isnan", "tanh_"):
        assert not aten.inplace_unary(name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("name", _INPLACE_FAMILY)
def test_an_in_place_family_member_writes_the_values_its_operator_computes(name, dtype):
    """The `inplace` pass rewrites NAME(t) as t.NAME_() where the dtypes
    agree: the two must be bit-identical for every such input."""
    x = _inputs(dtype)
    try:
        want = getattr(torch.ops.aten, name)(x)
    except RuntimeError:
        return  # no kernel for this dtype
    if want.dtype != x.dtype:
        return  # the pass never writes a temporary of another dtype
    got = x.clone()
    getattr(got, name + "_")()
    assert torch.equal(got.nan_to_num(), want.nan_to_num()) and torch.equal(got.isnan(), want.isnan())


def test_fresh_results_are_declared_for_existing_ops_and_alias_nothing():
    for name in aten.FRESH:
        if name.startswith("torch.") or not hasattr(torch.ops.aten, name):
            get_op_def(name)  # an op type of its own (`fill_constant`, a d2s op calling no ATen operator)
            continue
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            schema = getattr(packet, overload)._schema
            if not any(a.is_out for a in schema.arguments):
                assert all(r.alias_info is None for r in schema.returns), (name, overload)


def test_a_method_whose_tensor_is_not_the_first_argument_runs_as_eager():
    """`x.where(c, y)` is where(c, x, y): a backend keyed by `where` must not
    take the method's arguments in order."""
    @d2s.declarative
    def f(x, y):
        return (x * 2).where(x > 0, y * 3) + 1

    x, y = torch.randn(8), torch.randn(8)
    assert torch.equal(f(x, y), (x * 2).where(x > 0, y * 3) + 1)
    with torch.no_grad():
        assert torch.equal(f(x, y), (x * 2).where(x > 0, y * 3) + 1)


def _spellings(x, y):
    a = F.tanh(x) + torch.negative(y)
    b = y.__radd__(x) * F.layer_norm(x, (3,))
    return F.relu(a, inplace=False) - F.softmax(b, -1, _stacklevel=5)


@pytest.mark.skipif(native.load() is None, reason="native executor unavailable")
def test_spellings_of_one_operator_run_in_native_segments():
    """Wrappers and operators reach the entry of their ATen operator: the
    whole function is one segment (its Python statements are only the
    fallback for inputs the segment cannot take)."""
    static = d2s.declarative(_spellings)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    assert torch.equal(static(x, y), _spellings(x, y))
    compiled = static.concrete_program.compiled
    names = {v: k for k, v in native.load().opcodes().items()}
    codes = {names[c] for seg in compiled.segments for c in seg.codes()}
    assert {"tanh", "neg", "add", "mul", "layer_norm", "relu", "softmax", "sub"} <= codes
    assert len(compiled.segments) == 1 and compiled.source.splitlines()[1].strip() == "v_tmp_8 = seg_1(v_x, v_y)"
