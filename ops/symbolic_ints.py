"""The exact size a 0-d integer tensor holds, where tracing can tell it.

    chunks = torch.div(x.size(1), 2 * w, rounding_mode="trunc")  # Longformer's chunk count
    y = x.view(b, chunks, 2 * w, d)                                # read as an int by the kernel

The count is a tensor in eager code, which `view` reads as an int. At
run-time sizes a kernel's read of a tensor makes a fresh symbol
(ops/symbolic.py `_Items`), unrelated to x.size(1), so nothing later could
be shown to fit x's sizes (a view back to them failed the trace). Where
the tensor is integer arithmetic on sizes and ints, its value is that
expression in the sizes' symbols, exact on every run as a size read from a
shape is:

  - `fill_constant` of a size or an int (how a size becomes a tensor);
  - `+`, `-`, `*` (`torch.add` / `sub` / `mul` without `alpha`, their
    methods and operators) and floor division (`//`, `floor_divide`,
    `div(..., rounding_mode="floor")`);
  - `div(..., rounding_mode="trunc")` where both sides are known not
    negative (sizes), where it is floor division.

Anything else (a value read from data, a loop variable, a tensor something
writes in place) is unknown, and the kernel's read stays a fresh symbol.
"""

import operator

import torch

from runtime.attrs import InputRef
from runtime.ir import SCALAR, Variable

from .examples import producer, written_from

_INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_ARITHMETIC = {}
for _name, _fn in [("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                   ("floor_divide", operator.floordiv)]:
    for _op in (f"torch.{_name}", f"torch.Tensor.{_name}"):
        _ARITHMETIC[_op] = _fn
for _name, _fn in [("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                   ("floordiv", operator.floordiv)]:
    _ARITHMETIC[f"torch.Tensor.__{_name}__"] = _fn
    _ARITHMETIC[f"torch.Tensor.__r{_name}__"] = lambda a, b, f=_fn: f(b, a)
_DIVISIONS = ("torch.div", "torch.Tensor.div", "torch.divide", "torch.Tensor.divide")
_MAX_OPS = 32


def value_of(tr, var):
    """The int or SymInt the 0-d integer tensor (or the run-time size)
    `var` holds on every run, or None."""
    if not isinstance(var, Variable) or (var.kind != SCALAR and (
            var.kind != "tensor" or var.dims != () or var.dtype not in _INTS)):
        return None
    names = set()
    try:
        value = _value(tr, var, names, [_MAX_OPS])
    except (_Unknown, ZeroDivisionError):  # (a division by zero raises when the program runs, as eager's)
        return None
    return None if written_from(tr.program, names) else value


class _Unknown(Exception):
    pass


def _value(tr, var, names, budget):
    if var.kind == SCALAR:
        value = tr._shapes.scalars.get(id(var)) if tr._shapes is not None else None
        if not isinstance(value, (int, torch.SymInt)):
            raise _Unknown
        return value
    found = producer(var)
    op = found[0] if found is not None else None
    budget[0] -= 1
    if op is None or budget[0] < 0 or op.sub_blocks() or var.dtype not in _INTS:
        raise _Unknown
    names.add(var.name)
    args = [_operand(tr, op, a, names, budget) for a in op.attrs.get("args", ())]
    kwargs = dict(op.attrs.get("kwargs") or {})
    if op.type == "fill_constant" and len(args) == 2:
        return _int(args[0])
    if op.type in _ARITHMETIC and len(args) == 2 and not kwargs:
        return _ARITHMETIC[op.type](_int(args[0]), _int(args[1]))
    if op.type in _DIVISIONS and len(args) == 2 and set(kwargs) == {"rounding_mode"}:
        a, b = _int(args[0]), _int(args[1])
        if kwargs["rounding_mode"] == "floor" or (
                kwargs["rounding_mode"] == "trunc" and _not_negative(tr, a) and _not_negative(tr, b)):
            return a // b
    raise _Unknown


def _operand(tr, op, arg, names, budget):
    if isinstance(arg, InputRef):
        return _value(tr, op.block.find_var(op.input("X")[arg.index]), names, budget)
    return arg  # a constant of the call (an int, a dtype)


def _int(value):
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
        raise _Unknown
    return value


def _not_negative(tr, value):
    if isinstance(value, int):
        return value >= 0
    return tr._shapes.env.bound_sympy(value.node.expr).lower >= 0  # (a SymInt: the shapes exist)
