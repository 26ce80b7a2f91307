"""Each torch callable's canonical ATen operator (`OpDef.aten`), derived once.

Backends key their tables by the ATen operator an op calls, not by the
Python spelling the user wrote: `torch.add(x, y)`, `x.add(y)`, `x + y` and
`y.__radd__(x)` are all "add", so a backend that runs "add" runs all four.
The name is only given where it is exact, that is where the op's arguments
*are* the operator's arguments as torch's binding reads them:

  - a C-bound torch function or Tensor method (`torch.add`, `x.view`,
    `F.conv2d`, which is `torch._C._nn.conv2d`) calls the ATen operator of
    its own name with its own arguments: torch generates the binding from
    the operator's schema;
  - a Python operator method is named in OPERATORS (`__add__` is add;
    `__and__` is ATen's own `__and__`). Reversed operators whose binding
    swaps the operands (`__rpow__`, `__rtruediv__`) call no operator with
    the same arguments and get none; `__radd__` and `__rmul__` are bound to
    add and mul with self first (values equal: IEEE + and * commute);
  - a Python wrapper is named in WRAPPERS with the parameters it adds and
    the values under which it is exactly the operator (`F.relu(x,
    inplace=False)` is relu); anything else (F.embedding swaps weight and
    indices and shifts padding_idx) gets none;
  - ALIASES: C functions whose name is not their operator's (`torch.dsmm`
    is mm's binding; `torch.negative` is ATen's alias of neg);
  - a Tensor method passes the tensor as the operator's `self`, which is
    not the first argument of every schema (`x.where(cond, y)` is
    where(cond, x, y)): such methods get none.

A wrong name here would lower an op to another computation, so a name is
only ever added with the reason it is exact.
"""

import inspect

import torch

from runtime.optable import ANY, Wrapper

OPERATORS = {
    "__add__": "add", "__radd__": "add", "__sub__": "sub", "__rsub__": "rsub", "__mul__": "mul",
    "__rmul__": "mul", "__truediv__": "div", "__matmul__": "matmul", "__pow__": "pow", "__mod__": "remainder",
    "__floordiv__": "floor_divide", "__neg__": "neg", "__abs__": "abs", "__invert__": "bitwise_not",
    "__eq__": "eq", "__ne__": "ne", "__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge",
    "__and__": "__and__", "__or__": "__or__", "__xor__": "__xor__",
}

ALIASES = {"dsmm": "mm", "negative": "neg", "absolute": "abs", "multiply": "mul", "subtract": "sub",
           "divide": "div"}

_INPLACE_FALSE = (("inplace", False),)

# Python function -> (ATen operator, parameters that must hold a value, as in Wrapper.fixed).
WRAPPERS = {
    "torch.nn.functional.relu": ("relu", _INPLACE_FALSE),
    "torch.nn.functional.silu": ("silu", _INPLACE_FALSE),
    "torch.nn.functional.tanh": ("tanh", ()),
    "torch.nn.functional.sigmoid": ("sigmoid", ()),
    # dim=None picks a dimension by the input's rank (legacy): a backend
    # reads `dim` as an int, which None is not.
    "torch.nn.functional.softmax": ("softmax", (("_stacklevel", ANY),)),
    "torch.nn.functional.log_softmax": ("log_softmax", (("_stacklevel", ANY),)),
    # `torch.layer_norm(..., torch.backends.cudnn.enabled)`: ATen ignores cudnn_enable.
    "torch.nn.functional.layer_norm": ("layer_norm", ()),
    "torch.nn.functional.adaptive_avg_pool2d": ("adaptive_avg_pool2d", ()),
}

_C_BOUND = ("builtin_function_or_method", "method_descriptor")


def _is_packet(name):
    return isinstance(getattr(torch.ops.aten, name, None), torch._ops.OpOverloadPacket)


def _wrapper(fn, fixed):
    params = inspect.signature(fn).parameters.values()
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        raise ImportError(f"ops/aten_names.py: {fn.__qualname__} takes *args; name its parameters")
    names = tuple(p.name for p in params)
    defaults = tuple(p.default for p in params if p.default is not p.empty)
    return Wrapper(names, defaults, fixed)


def _self_first(name):
    packet = getattr(torch.ops.aten, name)
    return all(not args or args[0].name == "self" or all(a.name != "self" for a in args)
               for args in (getattr(packet, o)._schema.arguments for o in packet.overloads()))


def aten_call(type_name, fn):
    """(ATen operator name, Wrapper or None) for the op type `type_name`
    recording calls to `fn`; (None, None) where no operator is exact."""
    short = type_name.rsplit(".", 1)[1]
    if short.startswith("__") and short.endswith("__"):
        return OPERATORS.get(short) if type_name.startswith("torch.Tensor.") else None, None
    if type_name in WRAPPERS:
        name, fixed = WRAPPERS[type_name]
        if not _is_packet(name):
            raise ImportError(f"ops/aten_names.py names aten::{name}, which this torch does not have")
        return name, _wrapper(fn, fixed)
    if type(fn).__name__ not in _C_BOUND:
        return None, None
    name = ALIASES.get(fn.__name__, fn.__name__)
    if not _is_packet(name) or type_name.startswith("torch.Tensor.") and not _self_first(name):
        return None, None
    return name, None
