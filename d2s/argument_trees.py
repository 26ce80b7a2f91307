"""Walks over the arguments of a declarative call: the cache key's part for
each argument (`flatten_args`, on every call), its tensors in order
(`tensor_leaves`, the feeds), the arguments with Variables in place of the
tensors (`replace_tensors`, for tracing), and feed names."""

import re
from typing import NamedTuple, Optional

import torch

from runtime.ir import Variable

from . import input_trees


class SymbolicArguments(Exception):
    """A Variable among the arguments: the caller is building a program."""


def flatten_args(value, specs, tensors, depth=0):
    """A hashable key for `value`, collecting its tensors (in order) into
    `tensors`. (`specs` is unused: InputSpecs apply to whole arguments, see
    `StaticFunction._spec_key`.) This runs on every call: it builds nothing
    but the key."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        # torch.Size hashes and compares as the tuple of its sizes.
        return ("tensor", value.shape, value.dtype, value.device, value.requires_grad)
    if isinstance(value, torch.Generator):
        tensors.append(value)  # a feed as well: each call's own generator (see `is_generator`)
        return ("generator", value.device)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(flatten_args(v, specs, tensors, depth + 1) for v in value)
    if type(value) is dict:
        return ("dict",) + tuple((k, flatten_args(v, specs, tensors, depth + 1)) for k, v in value.items())
    if isinstance(value, torch.nn.Module):
        return ("module", id(value))
    if isinstance(value, Variable):
        raise SymbolicArguments
    n = input_trees.node(value, depth)  # a ModelOutput, a dataclass, a cache holding tensors
    if n is not None:
        return ("node", n.cls, n.structure) + tuple(flatten_args(v, specs, tensors, depth + 1)
                                                    for _, v in n.children)
    if isinstance(value, dict):  # a dict subclass holding no tensor
        return ("dict", type(value)) + tuple((k, flatten_args(v, specs, tensors, depth + 1))
                                             for k, v in value.items())
    try:
        hash(value)
        return ("value", type(value).__name__, value)
    except TypeError:
        return ("object", id(value))


def tensor_leaves(value, path, depth=0):
    """(where, tensor) for each tensor (or generator) of `value` ("args[0]",
    "kwargs['h']"), in the order `flatten_args` collects them; used to name
    feeds."""
    if isinstance(value, (torch.Tensor, torch.Generator)):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from tensor_leaves(v, f"{path}[{i}]", depth + 1)
    elif type(value) is dict:
        for k, v in value.items():
            yield from tensor_leaves(v, f"{path}[{k!r}]", depth + 1)
    elif not isinstance(value, (torch.nn.Module, Variable)):
        n = input_trees.node(value, depth)
        for label, v in n.children if n is not None else ():
            yield from tensor_leaves(v, path + label, depth + 1)


def replace_tensors(value, feeds, path="", made=None, depth=0):
    """`value` with its tensors replaced by `feeds` (in `tensor_leaves`
    order); a user type holding tensors becomes a copy holding them
    (d2s/input_trees.py), recorded in `made`."""
    if isinstance(value, (torch.Tensor, torch.Generator)):
        return feeds.pop(0)
    if isinstance(value, (list, tuple)):
        items = [replace_tensors(v, feeds, f"{path}[{i}]", made, depth + 1) for i, v in enumerate(value)]
        return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
    if type(value) is dict:
        return {k: replace_tensors(v, feeds, f"{path}[{k!r}]", made, depth + 1) for k, v in value.items()}
    if isinstance(value, (torch.nn.Module, Variable)):
        return value
    n = input_trees.node(value, depth)
    if n is None:
        return value
    children = [replace_tensors(v, feeds, path + label, made, depth + 1) for label, v in n.children]
    return input_trees.copy_with(n, children, path, made if made is not None else [])


def mode_of(instance, args, kwargs):
    """The `training` mode a program is traced in: that of the module it is
    the forward of, else of the first module passed in; None without one."""
    module = next((v for v in (instance, *args, *kwargs.values()) if isinstance(v, torch.nn.Module)), None)
    return None if module is None else "train" if module.training else "eval"


def python_object(value):
    """An argument the trace may have written graph values into (an empty
    cache it filled): not a tensor, a module, a number or a string."""
    return not isinstance(value, (torch.Tensor, torch.Generator, torch.nn.Module, Variable, int, float, str,
                                  type(None)))


def is_feed(value):
    """A tensor, or a `torch.Generator`: a call's generator is a feed of the
    program like its tensors (a generator kind Variable while tracing), so
    the random ops that take it draw from the one each call passes, and a
    new generator object (or a saved model's caller's) needs no program of
    its own."""
    return isinstance(value, (torch.Tensor, torch.Generator))


def is_generator(value):
    return isinstance(value, torch.Generator)


class FeedLeaf(NamedTuple):
    """One tensor (or generator) of a call's arguments, in feed order."""
    path: str  # where it is, for names and messages: "args[0][1]", "kwargs['h']"
    tensor: torch.Tensor
    position: Optional[int]  # the positional argument it is (not one inside it): its InputSpec, its name
    keyword: Optional[str]  # the keyword argument it is


def feed_leaves(args, kwargs):
    """The tensors of a call (positional arguments, then keywords), in the
    order `flatten_args` collects them and `replace_tensors` takes feeds."""
    leaves = [FeedLeaf(path, t, i if is_feed(a) else None, None)
              for i, a in enumerate(args) for path, t in tensor_leaves(a, f"args[{i}]", 1)]
    leaves += [FeedLeaf(path, t, None, k if is_feed(v) else None)
               for k, v in kwargs.items() for path, t in tensor_leaves(v, f"kwargs[{k!r}]", 1)]
    return leaves


def feed_name(leaf, arg_names):
    """'x' for the positional argument named x, 'h' for the keyword h,
    'args_2_0' for a tensor inside an argument."""
    if leaf.position is not None and leaf.position < len(arg_names):
        return arg_names[leaf.position]
    if leaf.keyword is not None:
        return leaf.keyword
    return re.sub(r"\W+", "_", leaf.path).strip("_")


def same_tensors(tensors):
    """Where one tensor object is passed as several arguments: (position,
    earlier position of the same object) pairs, else (). Eager code may ask
    `q is k` (nn.MultiheadAttention's self-attention projects once), so
    such a call keys a program of its own, traced with one value for both."""
    if len(tensors) < 2 or len(set(map(id, tensors))) == len(tensors):
        return ()
    first = {}
    return tuple((i, first[id(t)]) for i, t in enumerate(tensors) if first.setdefault(id(t), i) != i)
