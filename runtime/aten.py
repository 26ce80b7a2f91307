"""What backends know of an op through its canonical ATen operator.

`OpDef.aten` (filled by ops/aten_names.py) names the ATen operator an op
calls with its own arguments. Backend tables are keyed by that name, and
the facts they need come from ATen's declarations here, once:

  - `bind_args(op, names, defaults)`: a call op's arguments by parameter
    name;
  - `bind(op, opdef, names, defaults)`: the op's arguments by the names a
    backend entry uses (torch's binding's names), through the op's Python
    wrapper when it has one (`F.relu(x, inplace=False)` binds as relu(x));
  - `inplace_unary(name)`: an elementwise operator of one tensor whose
    in-place form (`x.NAME_()`) writes the same values (ATen tags it
    pointwise, its schema takes only `self`, returns a new tensor, and
    `NAME_` exists): the `inplace` pass and native segments use the family;
  - `returns_new(opdef)`: its result is always a new tensor, never an input
    or a view of one (FRESH, a declared list: ATen's schemas do not say
    this of composite operators such as einsum or type_as, which may return
    an input);
  - `fresh_by_schema(name)`: the same, read from the schemas of an
    operator with kernels of its own (d2s/decisions.py only).
"""

from functools import lru_cache

import torch

from .optable import ANY

# Canonical names (ATen operators, or the op type of an op that calls none)
# whose result is always a new tensor of its own.
FRESH = frozenset((
    "add sub rsub mul div pow remainder floor_divide eq ne lt le gt ge __and__ __or__ __xor__ "
    "linear matmul mm addmm conv1d conv2d conv3d cat stack embedding softmax max_pool2d "
    "clone zeros_like ones_like empty_like full_like "
    "torch.Tensor.__rtruediv__ torch.Tensor.__rfloordiv__ torch.Tensor.__rpow__ "
    "torch.nn.functional.embedding torch.nn.functional.max_pool2d fill_constant").split())


def bind_args(op, names, defaults):
    """A call op's arguments by parameter name, defaults filled in; None
    when they do not fit the signature."""
    args, kwargs = op.attrs["args"], op.attrs.get("kwargs") or {}
    if len(args) > len(names) or any(k not in names for k in kwargs):
        return None
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in bound:
            return None
        bound[k] = v
    return _with_defaults(bound, names, defaults)


def _with_defaults(bound, names, defaults):
    first_default = len(names) - len(defaults)
    for i, name in enumerate(names):
        if name not in bound:
            if i < first_default:
                return None
            bound[name] = defaults[i - first_default]
    return bound


def bind(op, opdef, names, defaults):
    """`op`'s arguments as {name: value} for a backend entry with parameters
    `names` (trailing `defaults`), or None when they do not fit."""
    wrapper = opdef.wrapper
    if wrapper is None:
        return bind_args(op, names, defaults)
    bound = bind_args(op, wrapper.params, wrapper.defaults)
    if bound is None:
        return None
    for key, value in wrapper.fixed:
        given = bound.pop(key)
        if value is not ANY and not (type(given) is type(value) and given == value):
            return None
    if any(key not in names for key in bound):
        return None
    return _with_defaults(bound, names, defaults)


def _overload(name):
    packet = getattr(torch.ops.aten, name, None)
    return None if packet is None else getattr(packet, "default", None)


@lru_cache(maxsize=None)
def inplace_unary(name):
    """Whether `x.NAME_()` computes `NAME(x)` into x (see the module docstring)."""
    if name is None or name.endswith("_"):
        return False
    op, inplace = _overload(name), _overload(name + "_")
    if op is None or inplace is None or torch.Tag.pointwise not in op.tags:
        return False
    schema = op._schema
    return (len(schema.arguments) == 1 and str(schema.arguments[0].type) == "Tensor"
            and len(schema.returns) == 1 and schema.returns[0].alias_info is None
            and hasattr(torch.Tensor, name + "_"))


def returns_new(opdef):
    return opdef.canonical in FRESH or inplace_unary(opdef.aten)


@lru_cache(maxsize=None)
def fresh_by_schema(name):
    """Whether ATen operator `name` returns new tensors as its schemas say:
    every overload but the `out=` ones returns without an alias annotation,
    and has kernels of its own (not a CompositeImplicitAutograd
    decomposition, which may hand an input on: `type_as`, `contiguous`;
    torch's autograd checks that such kernels' results alias no input).
    What may write into a result in place knowing nothing else of the op
    (d2s/decisions.py); the passes keep to `returns_new`."""
    packet = getattr(torch.ops.aten, name, None) if name else None
    if packet is None:
        return False
    seen = False
    for overload in packet.overloads():
        try:
            op = getattr(packet, overload)
            composite = torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
        except (AttributeError, RuntimeError):  # a TorchScript builtin on Python values (`add.int`)
            continue
        schema = op._schema
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            continue  # an `out=` or in-place form
        if composite or not schema.returns or any(r.alias_info is not None for r in schema.returns):
            return False
        seen = True
    return seen
