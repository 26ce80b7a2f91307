"""Operator attribute values: the few Python/torch objects an attribute may
hold, their JSON encoding (for `program.json`) and their text form (for
`Program.to_string()`).

Plain JSON values (None, bool, int, float, str, list, dict with str keys)
encode as themselves. Everything else is a one-key object whose key starts
with `$`, so decoding never guesses and never constructs anything that is not
listed here.
"""

import math
import re

import torch

from .errors import ModelFormatError
from .ir import Block, dtype_name, torch_dtype


class InputRef:
    """Position `index` of an op's input list, inside a call's argument tree."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __eq__(self, other):
        return isinstance(other, InputRef) and other.index == self.index

    def __hash__(self):
        return hash(("in", self.index))

    def __repr__(self):
        return f"InputRef({self.index})"


class OutputRef:
    """Position `index` of an op's output list, inside a call's result tree."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __eq__(self, other):
        return isinstance(other, OutputRef) and other.index == self.index

    def __hash__(self):
        return hash(("out", self.index))

    def __repr__(self):
        return f"OutputRef({self.index})"


class ReturnType:
    """A torch structseq result (e.g. `torch.max(x, 1)` -> values, indices),
    kept so that `.values` / `.indices` work on the captured result."""

    __slots__ = ("name", "items")

    def __init__(self, name, items):
        self.name = name
        self.items = tuple(items)

    def __eq__(self, other):
        return isinstance(other, ReturnType) and (self.name, self.items) == (other.name, other.items)

    def build(self, values):
        return getattr(torch.return_types, self.name)(values)


def leaves(tree):
    """The leaves of an attribute tree (containers, slices and structseq
    results opened), in order."""
    if isinstance(tree, (list, tuple)):
        for t in tree:
            yield from leaves(t)
    elif isinstance(tree, dict):
        for t in tree.values():
            yield from leaves(t)
    elif isinstance(tree, slice):
        yield from leaves((tree.start, tree.stop, tree.step))
    elif isinstance(tree, ReturnType):
        yield from leaves(tree.items)
    else:
        yield tree


def refs(tree):
    """The InputRef/OutputRef leaves of an attribute tree, in order."""
    return (leaf for leaf in leaves(tree) if isinstance(leaf, (InputRef, OutputRef)))


_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "preserve_format": torch.preserve_format,
}
_LAYOUTS = {"strided": torch.strided}
# The legacy tensor-type classes (`x.type(torch.LongTensor)`), by their names:
# a closed set, like the other named values.
_TENSOR_TYPES = {f"{prefix}.{name}": getattr(module, name)
                 for prefix, module in (("torch", torch), ("torch.cuda", torch.cuda))
                 for name in ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor",
                              "CharTensor", "ShortTensor", "IntTensor", "LongTensor", "BoolTensor")
                 if hasattr(module, name)}
_TENSOR_TYPE_NAMES = {id(v): k for k, v in _TENSOR_TYPES.items()}
# Devices a saved program may name: a closed set, so that a file cannot make
# torch parse an arbitrary string ("os.system" is a RuntimeError there).
_DEVICE = re.compile(r"(cpu|cuda|meta|mps|xpu)(:[0-9]{1,3})?")
# The structseq types of torch.return_types; the module also holds helper
# functions (`pytree_register_structseq`, ...) that a file must never reach.
_RETURN_TYPES = frozenset(getattr(torch.return_types, "all_return_types", ()))


def encode(value, device=None):
    """A JSON-able form of an attribute value. `device`: the program's device
    object; a leaf that is that object follows the device the program runs
    on (runtime/ir.py `Program.device`) and is written `$program_device`
    (its body the device it was traced on, for readers), not `$device`."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    e = lambda v: encode(v, device)
    if isinstance(value, list):
        return [e(v) for v in value]
    if isinstance(value, torch.Size):
        return {"$size": list(value)}
    if isinstance(value, tuple):
        return {"$tuple": [e(v) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"attribute dict keys must be strings: {value!r}")
        if any(k.startswith("$") for k in value):
            return {"$dict": {k: e(v) for k, v in value.items()}}
        return {k: e(v) for k, v in value.items()}
    if isinstance(value, torch.dtype):
        return {"$dtype": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"$program_device" if value is device else "$device": str(value)}
    if isinstance(value, slice):
        return {"$slice": [e(value.start), e(value.stop), e(value.step)]}
    if value is Ellipsis:
        return {"$ellipsis": True}
    if isinstance(value, InputRef):
        return {"$in": value.index}
    if isinstance(value, OutputRef):
        return {"$out": value.index}
    if isinstance(value, ReturnType):
        return {"$return_type": value.name, "items": [e(v) for v in value.items]}
    if isinstance(value, Block):
        return {"$block": value.idx}
    if isinstance(value, torch.memory_format):
        return {"$memory_format": next(k for k, v in _MEMORY_FORMATS.items() if v == value)}
    if isinstance(value, torch.layout):
        return {"$layout": next(k for k, v in _LAYOUTS.items() if v == value)}
    if id(value) in _TENSOR_TYPE_NAMES:
        return {"$tensor_type": _TENSOR_TYPE_NAMES[id(value)]}
    raise TypeError(f"cannot store {type(value).__name__} {value!r} in a program attribute")


def decode(data, program):
    """The attribute value of `data` (from JSON); `program` resolves block refs."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode(v, program) for v in data]
    if not isinstance(data, dict):
        raise ModelFormatError(f"malformed attribute value {data!r}")
    tags = [k for k in data if k.startswith("$")]
    if not tags:
        return {k: decode(v, program) for k, v in data.items()}
    tag, body = tags[0], data[tags[0]]
    allowed_keys = 2 if tag == "$return_type" else 1
    if len(tags) != 1 or len(data) != allowed_keys:
        raise ModelFormatError(f"malformed attribute {data!r}: a tagged value has exactly one tag")
    if tag in ("$in", "$out", "$block") and (type(body) is not int or body < 0):
        raise ModelFormatError(f"malformed attribute {data!r}: {tag} takes a non-negative int")
    try:
        if tag == "$tuple":
            return tuple(decode(v, program) for v in body)
        if tag == "$dict":
            return {k: decode(v, program) for k, v in body.items()}
        if tag == "$size":
            return torch.Size([int(v) for v in body])
        if tag == "$float":
            if body not in ("inf", "-inf", "nan"):
                raise ValueError(body)
            return float(body)
        if tag == "$dtype":
            return torch_dtype(body)
        if tag in ("$device", "$program_device"):
            if not isinstance(body, str) or not _DEVICE.fullmatch(body):
                raise ValueError(f"{body!r:.40} is not a device (cpu, cuda, cuda:N, meta, mps, xpu)")
            # A follower is the program's own device object, whatever device
            # that is now; the loader sets it (runtime/ir.py Program.device).
            return program.device if tag == "$program_device" else torch.device(body)
        if tag == "$slice":
            return slice(*(decode(v, program) for v in body))
        if tag == "$ellipsis":
            return Ellipsis
        if tag == "$in":
            return InputRef(int(body))
        if tag == "$out":
            return OutputRef(int(body))
        if tag == "$return_type":
            if not isinstance(body, str) or getattr(torch.return_types, body, None) not in _RETURN_TYPES:
                raise ValueError(f"unknown return type {body!r:.40}")
            return ReturnType(body, [decode(v, program) for v in data["items"]])
        if tag == "$block":
            return program.blocks[int(body)]
        if tag == "$memory_format":
            return _MEMORY_FORMATS[body]
        if tag == "$layout":
            return _LAYOUTS[body]
        if tag == "$tensor_type":
            return _TENSOR_TYPES[body]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RuntimeError) as exc:
        raise ModelFormatError(f"malformed attribute {data!r:.80}: {exc}") from None
    raise ModelFormatError(f"unknown attribute tag {tag!r}")


def render(value, input_names=(), output_names=()):
    """The text form used by `Program.to_string()`."""
    r = lambda v: render(v, input_names, output_names)
    if isinstance(value, InputRef):
        return input_names[value.index] if value.index < len(input_names) else f"<in{value.index}?>"
    if isinstance(value, OutputRef):
        return output_names[value.index] if value.index < len(output_names) else f"<out{value.index}?>"
    if isinstance(value, Block):
        return f"block[{value.idx}]"
    if isinstance(value, torch.dtype):
        return "torch." + dtype_name(value)
    if isinstance(value, type) and id(value) in _TENSOR_TYPE_NAMES:
        return _TENSOR_TYPE_NAMES[id(value)]
    if isinstance(value, torch.Size):
        return f"({', '.join(map(str, value))})"
    if isinstance(value, tuple):
        inner = ", ".join(r(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(r(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {r(v)}" for k, v in value.items()) + "}"
    if isinstance(value, slice):
        parts = ["" if x is None else r(x) for x in (value.start, value.stop, value.step)]
        return ":".join(parts[:2]) + (f":{parts[2]}" if value.step is not None else "")
    if value is Ellipsis:
        return "..."
    if isinstance(value, ReturnType):
        return f"{value.name}({', '.join(r(v) for v in value.items)})"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, torch.device):
        return f"device({str(value)!r})"
    return repr(value)
