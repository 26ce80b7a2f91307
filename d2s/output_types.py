"""What a traced function returned, as the tree `runtime/output_tree.py`
rebuilds after each run: the user's own types around the fetched tensors.

Eager code returns ModelOutputs, dataclasses, named tuples, dict subclasses
and objects holding tensors (transformers' `DynamicCache`). A program must
give back the same types holding the *run's* tensors: an object kept from
tracing would hold the trace's Variables (a silent wrong value). So every
value on the way to a Variable becomes a node rebuilt on each run:

- tuples, lists (and their subclasses), named tuples, `torch.Size`, dicts:
  as before;
- a class registered with `torch.utils._pytree` (ModelOutput,
  OrderedDict, defaultdict, ...): flattened and rebuilt by its own
  registered functions;
- any other object whose `__dict__` reaches a Variable (a dataclass, a
  cache object, a dict subclass): a new instance with the same attributes
  (and items), made as `copy.copy` makes one.

A value that reaches no Variable stays the object itself (a constant). A
value that holds a Variable where no node can reach it (`__slots__`, a set)
is refused by name: returning it would hand out graph values.
"""

import types
from typing import NamedTuple

import torch
import torch.utils._pytree as pytree

from ops import number_paths
from ops.capture import dispatch
from ops.recording import graph_condition, lift, number_or_tensor, stands_for_number
from ops.framework import scalar_copy
from ops.storage_address import StorageAddress
from runtime.errors import ConversionError
from runtime.ir import SCALAR, TENSOR_ARRAY, Variable

_MAX_DEPTH = 64
_CODE = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType)


def output_tree(value, fetch, numbers=False, known=None, shared=None, again=False):
    """The returned structure with ('fetch', i) for each Variable.
    `numbers` (the function's return value): a Variable standing for a
    Python number (`t.item()`, `int(t)`, a carried counter) is ('number', i),
    given back as the Python number eager returns. `known(value)`: a leaf
    for values the caller places itself (d2s/argument_writes.py: the
    caller's own objects), else None; with it, a plain object holding no
    Variable is rebuilt too rather than kept (each run's is a new one).

    A container met twice (`return ys, ys`, one new object appended to two
    lists) is one node, met twice, so the run rebuilds one object where
    eager has one (runtime/output_tree.py `rebuild` with a memo, where `repeated` finds one):
    `shared` (id -> (value, node)) carries that across the trees of one
    program, whose trees all index one `fetch` list (the returned value's
    first). `again`: a Variable `fetch` holds already is that fetch again
    (state a run writes that the function returns too: one object, as in
    eager), where the returned value's own repeats are views of their own
    (see `_leaf`)."""
    return _tree(value, _Walk(fetch, numbers, known, {} if shared is None else shared, again), 0, ())


class _Walk(NamedTuple):
    """One `output_tree` call's settings (its arguments of those names)."""
    fetch: list
    numbers: bool
    known: object
    shared: dict
    again: bool


def _tree(value, walk, depth, path):
    if depth > _MAX_DEPTH:
        raise ConversionError(f"the returned value is nested deeper than {_MAX_DEPTH} levels ({_where(path)})")
    if walk.known is not None:
        leaf = walk.known(value)
        if leaf is not None:
            return leaf
    if id(value) in walk.shared:
        return walk.shared[id(value)][1]
    node = _node(value, walk, depth, path)
    if node[0] not in ("fetch", "number", "const"):
        walk.shared[id(value)] = (value, node)  # (the value too: its id stays its own)
    return node


def _made_at(var):
    """(file, line) of the user's line whose op made `var` (the `if` or loop
    merging a returned value), else (None, None)."""
    for op in var.block.ops:
        if var.name in op.output_names and op.origin:
            return tuple(op.origin[:2])
    return None, None


def _node(value, walk, depth, path):
    value = graph_condition(value)  # a returned run-time size: fetched as a Python number
    if isinstance(value, Variable):
        # A number on one path, a tensor on another, given back: its type shows (ops/number_paths.py).
        number_paths.observe(value)
        if number_or_tensor(value):
            # Not decided (a loop variable read in the trip that makes it a
            # tensor, or after a trip that may not): one program value
            # cannot be given back as a number on some runs, a tensor on others.
            raise ConversionError(
                f"{number_or_tensor(value)} is a Python number on some paths and a tensor on others (a tensor "
                "loop or `if` makes it a tensor on some paths only), and it is given back, which shows its "
                "type; make it a tensor on every path (e.g. `torch.tensor(0.0)` in place of `0.0`) or a "
                "number on every path", *_made_at(value))
        return _leaf(value, walk)
    if isinstance(value, torch.Tensor):
        walk.fetch.append(lift(value))
        return ("fetch", len(walk.fetch) - 1)
    if isinstance(value, StorageAddress):
        value.refuse_returned()  # an address exists only while a program runs
    if isinstance(value, (list, tuple)):
        return (type(value), [_tree(v, walk, depth + 1, path + (f"[{i}]",))
                              for i, v in enumerate(value)])
    if type(value) in pytree.SUPPORTED_NODES and type(value) is not dict:
        # Registered by its package (transformers' ModelOutputs) or by torch
        # (OrderedDict, defaultdict, deque): that package's flatten and unflatten.
        node = pytree.SUPPORTED_NODES[type(value)]
        children, context = node.flatten_fn(value)
        return ("pytree", (type(value), context, [
            _tree(c, walk, depth + 1, path + (f"[{i}]",)) for i, c in enumerate(children)]))
    if type(value) is dict:
        return (dict, {k: _tree(v, walk, depth + 1, path + (f"[{k!r}]",))
                       for k, v in value.items()})
    if not _holds_variable(value, depth, set()) and (walk.known is None or not _rebuilt_anew(value)):
        return ("const", value)
    attrs = getattr(value, "__dict__", None)
    if type(attrs) is not dict or _slots(type(value)) or isinstance(value, (torch.nn.Module, set, frozenset)):
        raise ConversionError(
            f"the returned value holds a tensor computed by the program inside a {type(value).__name__} "
            f"({_where(path)}), which d2s cannot rebuild with each run's tensors; return tensors in tuples, "
            "lists, dicts, named tuples, dataclasses or plain objects, or register the class with "
            "torch.utils._pytree")
    items = None
    if isinstance(value, dict):
        items = [(k, _tree(v, walk, depth + 1, path + (f"[{k!r}]",)))
                 for k, v in value.items()]
    return ("object", (type(value), {k: _tree(v, walk, depth + 1, path + (f".{k}",))
                                      for k, v in attrs.items()}, items))


def _rebuilt_anew(value):
    """A plain object of the user's or a library's (not torch's, not code, a
    class or a module): one a program writing it into the caller's objects
    makes anew on every run, as eager does."""
    attrs = getattr(value, "__dict__", None)
    return type(attrs) is dict and not _slots(type(value)) and not callable(value) and \
        not isinstance(value, (type, torch.nn.Module, torch.Tensor, set, frozenset) + _CODE) and \
        (type(value).__module__ or "").partition(".")[0] != "torch"


def _leaf(value, walk):
    fetch = walk.fetch
    index = next((i for i, v in enumerate(fetch) if v is value), None)
    if index is not None and not walk.again and value.kind != TENSOR_ARRAY:
        # Returned twice (`return y, y`): the second is a view of the
        # first under a name of its own, so the fetch list never repeats
        # a name and a saved program returns both.
        value = scalar_copy(value) if value.kind == SCALAR else dispatch(torch.Tensor.view_as, (value, value), {})
        index = None
    # Else written state that is returned too, or a list met twice: the
    # same fetch, so the run gives one object where eager has one.
    if index is None:
        fetch.append(value)
        index = len(fetch) - 1
    number = walk.numbers and value.kind != SCALAR and stands_for_number(value)
    return ("number" if number else "fetch", index)


def holds_variable(value):
    """Whether a graph Variable is reachable from `value` (containers and
    object attributes; not modules)."""
    return _holds_variable(value, 0, set())


def _slots(cls):
    return any(getattr(c, "__slots__", ()) for c in cls.__mro__[:-1] if c not in (dict, list, tuple))


def _holds_variable(value, depth, seen):
    """Whether a Variable is reachable from `value` through containers and
    object attributes (modules, types and functions are not looked into)."""
    if isinstance(value, Variable):
        return True
    if value is None or isinstance(value, (torch.Tensor, str, bytes, int, float, complex, type, torch.nn.Module)) \
            or isinstance(value, _CODE) or depth > _MAX_DEPTH or id(value) in seen:
        return False
    seen.add(id(value))
    if isinstance(value, dict):
        if any(_holds_variable(v, depth + 1, seen) for v in value.values()):
            return True
    elif isinstance(value, (list, tuple, set, frozenset)):
        if any(_holds_variable(v, depth + 1, seen) for v in value):
            return True
    attrs = getattr(value, "__dict__", None)
    if type(attrs) is dict and any(_holds_variable(v, depth + 1, seen) for v in attrs.values()):
        return True
    for cls in type(value).__mro__[:-1]:
        for slot in getattr(cls, "__slots__", ()):
            if isinstance(slot, str) and _holds_variable(getattr(value, slot, None), depth + 1, seen):
                return True
    return False


def _where(path):
    return "the returned value" + "".join(path)
