"""Arguments that are the user's own types holding tensors: a ModelOutput
or another class registered with `torch.utils._pytree`, a dict subclass,
a dataclass or a plain object such as a key/value cache.

Their tensors are feeds of the program like any other argument's (were
they lifted as constants, a later call with other tensors in the same or
a new object would run the first call's values: a silent wrong result),
and the cache key holds the structure around them: the type, the keys and
each non-tensor value. While tracing, the function gets a copy of the same
type holding the feed Variables, made as `copy.copy` makes one (registered
classes by their own unflatten function), so a trace never writes into the
caller's object. What the trace writes into the copies is written into
the caller's objects after each run (d2s/argument_writes.py); a change the
walk behind that cannot see is refused by name: `changed_argument`.
"""

import collections
import weakref

import torch
import torch.utils._pytree as pytree

from runtime.ir import Variable

_MAX_DEPTH = 16

# Classes whose objects a declarative function's trace wrote graph values
# into when they came as arguments (an empty key/value cache it filled):
# their objects are keyed by structure and given to traces as copies even
# while they hold no tensor, so the next fresh empty cache of the same shape
# (a new `generate` call's) is served by the same program rather than keyed
# by its identity (d2s/argument_writes.py).
WRITTEN_CLASSES = weakref.WeakSet()


class Node:
    """One argument value with children: its class, a hashable description
    of its structure (its kind, "pytree" or "object", first), the children
    (label, value), and how to make a new one from new children."""

    __slots__ = ("cls", "structure", "children", "rebuild")

    def __init__(self, cls, structure, children, rebuild):
        self.cls, self.structure, self.children, self.rebuild = cls, structure, children, rebuild


def node(value, depth=0):
    """The Node of `value` when it is a user type holding tensors; None for
    everything else (tensors, builtin containers, modules, plain values,
    objects holding no tensor)."""
    cls = type(value)
    if cls in (list, tuple, dict) or isinstance(value, (torch.Tensor, torch.nn.Module, type, Variable)) \
            or hasattr(value, "_fields") or depth > _MAX_DEPTH:
        return None
    if cls in pytree.SUPPORTED_NODES:
        children, context = pytree.SUPPORTED_NODES[cls].flatten_fn(value)
        structure = _frozen(context)
        if structure is _UNHASHABLE:
            return None
        unflatten = pytree.SUPPORTED_NODES[cls].unflatten_fn
        return Node(cls, ("pytree", structure), [(f"[{i}]", c) for i, c in enumerate(children)],
                    lambda new: unflatten(new, context))
    attrs = getattr(value, "__dict__", None)
    if type(attrs) is not dict or cls.__module__.partition(".")[0] == "torch" \
            or (cls not in WRITTEN_CLASSES and not _holds_tensor(value, 0, set())):
        return None  # torch's own objects (an optimizer holds parameters: state, not inputs)
    items = list(value.items()) if isinstance(value, dict) else None
    children = [(f".{k}", v) for k, v in attrs.items()] + [(f"[{k!r}]", v) for k, v in items or ()]
    names, keys = tuple(attrs), None if items is None else tuple(k for k, _ in items)

    def rebuild(new):
        obj = cls.__new__(cls)
        if keys is not None:
            setitem = _setitem(obj)
            for key, item in zip(keys, new[len(names):]):
                setitem(obj, key, item)
        obj.__dict__.update(zip(names, new[:len(names)]))
        return obj
    return Node(cls, ("object", names, keys), children, rebuild)


def _setitem(obj):
    # Not the class's own __setitem__ (ModelOutput's also sets attributes).
    return collections.OrderedDict.__setitem__ if isinstance(obj, collections.OrderedDict) else dict.__setitem__


_UNHASHABLE = object()


def _frozen(context):
    """A hashable form of a pytree context (lists as tuples), or _UNHASHABLE."""
    if isinstance(context, (list, tuple)):
        items = [_frozen(c) for c in context]
        return _UNHASHABLE if any(i is _UNHASHABLE for i in items) else tuple(items)
    try:
        hash(context)
    except TypeError:
        return _UNHASHABLE
    return context


def _holds_tensor(value, depth, seen):
    """Whether a tensor other than a parameter (module state, which programs
    read by identity) is reachable from `value`."""
    if isinstance(value, torch.Tensor):
        return not isinstance(value, torch.nn.Parameter)
    if isinstance(value, Variable):
        return True  # a graph value (an object a branch or loop carries, d2s/operators/state.py)
    if value is None or isinstance(value, (str, bytes, int, float, type, torch.nn.Module)) \
            or depth > 4 or id(value) in seen:
        return False
    seen.add(id(value))
    if isinstance(value, dict):
        return any(_holds_tensor(v, depth + 1, seen) for v in value.values()) or \
            _holds_tensor(getattr(value, "__dict__", None), depth + 1, seen)
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v, depth + 1, seen) for v in value)
    attrs = getattr(value, "__dict__", None)
    return type(attrs) is dict and any(_holds_tensor(v, depth + 1, seen) for v in attrs.values())


# -- the copies a trace gets, and whether it changed them -----------------------------------

def copy_with(n, new_children, path, made):
    """A new value of Node `n` with `new_children`; `made` gets (path, copy,
    what it holds) for `changed_argument`."""
    value = n.rebuild(new_children)
    if n.structure[0] == "object":
        made.append((path, value, _contents(value)))
        for label, child in zip((lab for lab, _ in n.children), new_children):
            if type(child) in (list, dict):  # a list in a cache (its layers): appending to it changes it
                made.append((path + label, child, _contents(child)))
    return value


def _contents(value):
    if type(value) is list:
        return list(value)
    if type(value) is dict:
        return dict(value)
    return dict(vars(value)), (dict(value) if isinstance(value, dict) else None)


def changed_argument(made):
    """(path, type name) of the first copy the trace changed, or None."""
    for path, value, before in made:
        if not _same(before, _contents(value)):
            return path, type(value).__name__
    return None


def _same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, list):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(a[k] is b[k] for k in a)
    return a is b


def record_state(values, depth=0, out=None, seen=None):
    """What the plain Python objects among `values` hold (their attributes,
    the lists and dicts in them, three levels down), so a trace refused for
    writing graph values into one (an empty cache it filled) can leave the
    caller's objects as they were (`restore`)."""
    out = [] if out is None else out
    seen = set() if seen is None else seen
    for value in values:
        if depth > 3 or id(value) in seen or isinstance(value, (torch.Tensor, torch.nn.Module, type, str, bytes)):
            continue
        seen.add(id(value))
        if type(value) in (list, dict) or type(getattr(value, "__dict__", None)) is dict:
            out.append((value, _contents(value)))
            inner = value if type(value) is list else value.values() if type(value) is dict else vars(value).values()
            record_state(list(inner), depth + 1, out, seen)
    return out


def restore(records):
    for value, before in records:
        if type(value) is list:
            value[:] = before
        elif type(value) is dict:
            value.clear()
            value.update(before)
        else:
            attrs, items = before
            vars(value).clear()
            vars(value).update(attrs)
