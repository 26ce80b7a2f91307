"""Branch and loop values as the program sees them, and how messages name them."""

import math
import re

import torch

from runtime.ir import Variable

from .. import framework
from ..recording import graph_tensor, lift
from ..user_frames import SYMBOLIC_TYPES, error_at_user_line
from .undefined import Undefined


def tensor_like(value):
    return isinstance(value, (Variable, torch.Tensor) + SYMBOLIC_TYPES) or (
        isinstance(value, (int, float, bool)) and not isinstance(value, Undefined))


def same_python_value(a, b):
    """Whether two branch values are one Python value (not graph tensors)."""
    if a is b:
        return not isinstance(a, (Variable, torch.Tensor) + SYMBOLIC_TYPES)
    if type(a) is not type(b) or isinstance(a, (Variable, torch.Tensor, Undefined) + SYMBOLIC_TYPES):
        return False
    try:
        equal = bool(a == b)
    except Exception:  # noqa: BLE001 - values that do not compare are not the same value
        return False
    # 0.0 == -0.0, but they are different values (1 / x tells them apart).
    return equal and not (type(a) is float and math.copysign(1.0, a) != math.copysign(1.0, b))


def output_label(names, i, return_names=()):
    """How a message names output ``i``: the user's variable, or "the
    returned value" for the compiler's lowered return value."""
    if not names or i >= len(names):
        return f"output {i}"
    return "the returned value" if names[i] in return_names else f"'{names[i]}'"


def assigned_at(lines, name, side):
    line = (lines or {}).get(name, (None, None))[0 if side == "true" else 1]
    return f"line {line}" if line is not None else "its value from before the `if`"


def flatten_outputs(value):
    if isinstance(value, (tuple, list)) and not isinstance(value, Variable):
        return list(value), (type(value), len(value))
    return [value], None


def unflatten_outputs(leaves, spec):
    if spec is None:
        return leaves[0]
    kind, _ = spec
    return kind(leaves) if kind in (tuple, list) else tuple(leaves)


def as_var(value, dtype=None):
    """A Variable in the current block for a Variable, tensor or number."""
    value = graph_tensor(value)  # sizes carried through branches and loops become 0-d tensors
    if isinstance(value, Variable):
        return value
    if isinstance(value, torch.Tensor):
        return lift(value)
    if isinstance(value, list):
        return framework.array_from_list(value)
    return framework.fill_constant(value, dtype)


def outer_reads(blocks):
    """Names read by the ops of `blocks` (and their sub-blocks) that none of
    them defines: the values a control-flow op takes from outside."""
    defined = defined_in(blocks)
    read = [n for block in _nested(blocks) for op in block.ops for n in op.input_names + op.output_names]
    return [n for n in dict.fromkeys(read) if n not in defined]


def defined_in(blocks):
    """The names `blocks` and the blocks nested in them declare."""
    return {name for block in _nested(blocks) for name in block.vars}


def _nested(blocks):
    stack = list(blocks)
    while stack:
        block = stack.pop()
        yield block
        stack += [sub for op in block.ops for sub in op.sub_blocks()]


def check_pred(pred):
    if any(d not in (1, -1) for d in pred.shape):
        raise error_at_user_line(
            f"a condition must be a tensor with one element, but this one has shape "
            f"{list(pred.shape)}; reduce it first (e.g. `.any()` / `.all()`)")



def var_base(names, i, default):
    """A variable name for output `i`: the user's name, with what is not a
    name character made `_` (a slot `cache.layers[0].keys` carried by an
    op: `cache_layers_0_keys`), else `default`."""
    name = names[i] if names and i < len(names) else None
    if not isinstance(name, str):
        return default
    name = re.sub(r"\W+", "_", name).strip("_")
    return name if name.isidentifier() else default


def relaxed(a, b):
    """The dimensions of two values of one name: those that differ become -1."""
    return tuple(x if x == y else -1 for x, y in zip(a, b))


def differing_dtype(what, dtypes, places, fix):
    """The error for a value whose dtype differs between two places
    (the branches of an `if`, before a loop and after a trip)."""
    return error_at_user_line(f"{what} has dtype {dtypes[0]} {places[0]} but {dtypes[1]} {places[1]}; {fix}")


def check_rank(what, shapes, places, fix):
    """Refuse a value whose rank differs between two places."""
    if len(shapes[0]) != len(shapes[1]):
        raise error_at_user_line(f"{what} has shape {list(shapes[0])} {places[0]} but {list(shapes[1])} "
                                 f"{places[1]}; {fix}")
