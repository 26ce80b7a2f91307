"""A loaded call-style op checked against the signature of its torch kernel.

A saved op stores its call as attributes: `args` (a tuple), `kwargs` (a
dict) of JSON values, `$in` references to its inputs and a few tagged torch
constants. Every value is harmless by construction (runtime/attrs.py), but a
file can still hand a kernel a call torch never made: a keyword it does not
take (`__class__`), a device where a dtype goes, a string where a layout
goes. Each would fail, or do something else, only when the program runs.
`check_call` refuses such a call at load, before anything runs:

  - Python kernels (torch.nn.functional.*, d2s's own): the arguments must
    bind to the function's signature (`inspect.Signature.bind`);
  - native kernels (torch.*, Tensor methods): some overload among torch's
    native schemas must take the keywords (its argument names, plus the
    names Python's binding adds: `input` for `self`, `out`, tensor options),
    and the positional arguments (a list argument may be spelt as several:
    `x.view(2, 3)`), or a signature only the binding has: a hand-written
    binding's keyword (`x.nonzero(as_tuple=True)`), a deprecated order
    (`torch.addmm(beta, input, alpha, mat1, mat2)`);
  - either way, the closed-set kinds go only where their kind goes: a
    parameter of kind dtype (ScalarType, or named `dtype`) takes a
    `torch.dtype` or None; device a device, a device string (cpu, cuda:N,
    ...), an index or None; layout a `torch.layout` or None; memory format
    a `torch.memory_format` or None; and a dtype, device, layout or memory
    format value goes to no other parameter.

Kernels with neither a Python signature nor a native schema (operators such
as `__getitem__`, property getters) get the last rule alone and no keyword
beginning with `__`.
"""

import functools
import inspect
import re

import torch

from .attrs import leaves

_CLOSED = {"dtype": torch.dtype, "device": torch.device, "layout": torch.layout,
           "memory_format": torch.memory_format}
# Schema argument types of each kind (optional forms included).
_SCHEMA_KINDS = {"ScalarType": "dtype", "Device": "device", "Layout": "layout", "MemoryFormat": "memory_format"}
_DEVICE = re.compile(r"(cpu|cuda|meta|mps|xpu)(:[0-9]{1,3})?")
# Keywords Python's bindings accept beyond a native schema's argument names.
_PYTHON_KEYWORDS = {"input", "self", "out", "dtype", "layout", "device", "pin_memory", "requires_grad",
                    "memory_format", "names", "generator", "non_blocking", "copy"}
# Keyword-only arguments of torch's hand-written Python bindings
# (python_torch_functions_manual.cpp, python_variable_methods.cpp) that no
# native schema names: `x.nonzero(as_tuple=True)`.
_BINDING_KEYWORDS = {"nonzero": {"as_tuple"}, "sparse_coo_tensor": {"check_invariants"},
                     "sparse_compressed_tensor": {"check_invariants"}, "sparse_csr_tensor": {"check_invariants"},
                     "sparse_csc_tensor": {"check_invariants"}, "sparse_bsr_tensor": {"check_invariants"},
                     "sparse_bsc_tensor": {"check_invariants"}}
# torch's deprecated signatures (tools/autograd/deprecated.yaml), which its
# Python binding still takes, with the scalars before the tensors:
# `torch.addmm(beta, input, alpha, mat1, mat2)`, `x.addmm_(beta, alpha, m1, m2)`
# (old ReID code: `dist.addmm_(1, -2, x, y.t())`), `torch.addcmul(x, value, t1, t2)`.
# In-place and method forms take as many arguments, counting `self`.
_DEPRECATED = {name: ("beta", "self", "alpha", a, b) for name, a, b in [
    ("addmm", "mat1", "mat2"), ("addmv", "mat", "vec"), ("addr", "vec1", "vec2"),
    ("addbmm", "batch1", "batch2"), ("baddbmm", "batch1", "batch2")]}
_DEPRECATED.update(addcmul=("self", "value", "tensor1", "tensor2"), addcdiv=("self", "value", "tensor1", "tensor2"))
# NumPy's spellings that torch's argument parser takes for a schema's
# names (`torch.mean(x, axis=1, keepdims=True)`), as python_arg_parser.cpp.
_NUMPY_NAMES = {"axis": "dim", "keepdims": "keepdim", "x": "input", "a": "input", "x1": "input", "x2": "other"}


class CallError(ValueError):
    """An op's stored call that its kernel's signature does not take."""


def _kind_of_value(value):
    for kind, cls in _CLOSED.items():
        if isinstance(value, cls):
            return kind
    return None


def _check_value(kind, name, value):
    """`value`, given to parameter `name` of `kind` ("dtype", ...; None for
    any other parameter), must be of that kind."""
    value_kind = _kind_of_value(value)
    if kind is None:
        for leaf in leaves(value):
            if _kind_of_value(leaf) is not None:
                raise CallError(f"argument {name!r} takes no {_kind_of_value(leaf)}, got {leaf!r:.40}")
        return
    if value is None or value_kind == kind:
        return
    if kind == "device" and (isinstance(value, str) and _DEVICE.fullmatch(value)
                             or type(value) is int and 0 <= value < 1024):
        return
    raise CallError(f"argument {name!r} takes a {kind.replace('_', ' ')}, got {value!r:.40}")


def _kind_of_param(name, annotation=None):
    if annotation is not None:
        for schema_type, kind in _SCHEMA_KINDS.items():
            if schema_type in annotation:
                return kind
    return name if name in _CLOSED else None


@functools.lru_cache(maxsize=None)
def _python_signature(kernel):
    if not (inspect.isfunction(kernel) or inspect.ismethod(kernel)):
        return None
    try:
        return inspect.signature(kernel)
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=None)
def _schemas(kernel):
    """[(positional [(name, type text)], keyword {name: type text})] of the
    native overloads of `kernel`, or None when it has none."""
    name = getattr(kernel, "__name__", "") or ""
    if not name.isidentifier() or name.startswith("__"):
        return None
    packet = getattr(torch.ops.aten, name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return None
    out = []
    binding_only = {key: "bool" for key in _BINDING_KEYWORDS.get(name, ())}
    for overload in packet.overloads():
        arguments = getattr(packet, overload)._schema.arguments
        # real_type: `ScalarType`, `Optional[MemoryFormat]` (`type` says `int` for both).
        out.append(([(a.name, str(a.real_type)) for a in arguments if not a.kwarg_only],
                    {a.name: str(a.real_type) for a in arguments} | binding_only))
    deprecated = _DEPRECATED.get(name.rstrip("_"))
    if out and deprecated:  # scalars and tensors, none of a closed kind
        out.append(([(a, "Tensor") for a in deprecated], {"out": "Tensor"}))
    return out or None


def check_call(kernel, args, kwargs):
    """Raise CallError unless `kernel(*args, **kwargs)` is a call its
    signature takes (see the module docstring)."""
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise CallError(f"'kwargs' must map argument names to values, got the key {key!r:.40}")
        if key.startswith("__"):
            raise CallError(f"keyword {key!r} is not an argument of any torch function")
    signature = _python_signature(kernel)
    if signature is not None:
        return _check_python(signature, args, kwargs)
    schemas = _schemas(kernel)
    if schemas is not None:
        return _check_native(schemas, args, kwargs)
    for key, value in kwargs.items():  # positions unknown: only what the keywords say
        _check_value(_kind_of_param(key), key, value)


def _check_python(signature, args, kwargs):
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise CallError(str(exc)) from None
    for name, value in bound.arguments.items():
        param = signature.parameters[name]
        if param.kind is param.VAR_POSITIONAL:
            for i, item in enumerate(value):
                _check_value(None, f"{name}[{i}]", item)
        elif param.kind is param.VAR_KEYWORD:
            for key, item in value.items():
                _check_value(_kind_of_param(key), key, item)
        else:
            _check_value(_kind_of_param(name), name, value)


def _check_native(schemas, args, kwargs):
    """Some overload takes the call; else the first overload's complaint."""
    first = None
    for positional, by_name in schemas:
        try:
            return _check_overload(positional, by_name, args, kwargs)
        except CallError as exc:
            first = first or exc
    raise first


def _check_overload(positional, by_name, args, kwargs):
    if positional and positional[0][0] == "self":
        by_name = dict(by_name, input=by_name.get("self", ""))
    for key, value in kwargs.items():
        if key not in by_name and _NUMPY_NAMES.get(key) in by_name:
            key = _NUMPY_NAMES[key]
        if key not in by_name and key not in _PYTHON_KEYWORDS:
            raise CallError(f"keyword {key!r} is not an argument of this function "
                            f"(it takes {', '.join(sorted(by_name))})")
        _check_value(_kind_of_param(key, by_name.get(key)), key, value)
    for i, value in enumerate(args):
        if i < len(positional):
            name, annotation = positional[i]
        elif positional and positional[-1][1].startswith(("List[", "Optional[List[")):
            name, annotation = positional[-1]  # `x.view(2, 3)`: the list argument spelt out
        else:
            raise CallError(f"{len(args)} positional arguments, but this function takes {len(positional)}")
        _check_value(_kind_of_param(name, annotation), name, value)
