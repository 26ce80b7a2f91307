"""What a saved function returns, as plain data: the structure around the
fetched tensors (tuples, lists, dicts, named tuples, `torch.Size`) and the
Python constants in it, so a loaded model returns what the function
returned (`return y, 3` gives `(y, 3)`, `return {"logits": y}` a dict)
rather than only its tensors.

In memory a tree is what `d2s` builds when it traces a function:
``("fetch", i)`` for the i-th fetched tensor, ``("number", i)`` for one
that stands for a Python number (`t.item()`: given back as `.item()`),
``("const", value)``,
``(tuple | list | torch.Size | a namedtuple class, [trees])``,
``(dict, {key: tree})`` and the user's own types (d2s/output_types.py):
``("pytree", (cls, context, [trees]))`` for a class registered with
`torch.utils._pytree` (transformers' ModelOutputs, OrderedDict),
rebuilt by its unflatten function, and ``("object", (cls, {attribute:
tree}, [(key, tree)] or None))`` for any other object holding tensors (a
dataclass, a cache object, a dict subclass with its items), rebuilt as
a new instance with those attributes and items, without calling
`__init__` (as `copy.copy` does). In program.json:

    {"fetch": 0}   {"number": 1}   {"const": 3}   {"tuple": [...]}   {"list": [...]}
    {"size": [...]}   {"dict": [[key, tree], ...]}
    {"namedtuple": "Out", "fields": ["a", "b"], "items": [...]}
    {"pytree": "module.Class", "keys": [key, ...] | null, "items": [...]}
    {"object": "module.Class", "attrs": [[name, tree], ...], "items": [[key, tree], ...] | null,
     "complete": bool}
    attributes only: {"device": "cpu"}   {"dtype": "float32"}   {"class": "module.Class"}
    a node met twice (one list returned in two places): {"shared": k, "node": node}, then {"same": k}

A loaded file is untrusted: `from_json` checks every node (known kinds,
constants that JSON holds exactly, keys that Python can hash, fetch
indexes in range, bounded depth and size) before anything is built, and a
named tuple is rebuilt as a fresh class of that name and those fields,
never by importing the original. A user type is looked up by name only
among modules the loading process has already imported (nothing is
imported), and only a class registered with `torch.utils._pytree` or a
plain class (object's `__new__`, no `__del__`) is rebuilt; otherwise, or
when the saved attributes are incomplete (constants JSON cannot hold),
the value is plain data with the same keys in the same order: a
`pytree` node a dict (or a tuple when it has no keys), an `object` node
the dict of its items when it has some, else the dict of its attributes.
"""

import collections
import inspect
import keyword
import math
import sys

import torch
import torch.utils._pytree as pytree

from .errors import ModelFormatError

MAX_DEPTH = 64

_SEQUENCES = {"tuple": tuple, "list": list, "size": torch.Size}


def _constant_ok(value):
    """A Python value that JSON writes and reads back as the same value and type."""
    if value is None or type(value) in (bool, int, str):
        return True
    return type(value) is float and math.isfinite(value)


def to_json(tree, where):
    """The JSON form of an in-memory tree; ValueError (naming `where`) for a
    returned value a saved program cannot give back. A node met twice (one
    list returned in two places: d2s/output_types.py) is written once, as
    `{"shared": k, "node": ...}`, and as `{"same": k}` where it is met
    again, so the loaded model returns one object there too."""
    return _to_json(tree, where, repeated(tree), {})


def repeated(*trees):
    """The ids of the nodes met more than once among `trees`."""
    seen, again = set(), set()
    todo = list(trees)
    while todo:
        tree = todo.pop()
        if tree[0] in ("fetch", "number", "const", "argument", "fresh"):
            continue
        if id(tree) in seen:
            again.add(id(tree))
            continue
        seen.add(id(tree))
        todo.extend(children(tree))
    return again


def _to_json(tree, where, again, written):
    if id(tree) not in again:
        return _json_node(tree, where, again, written)
    if id(tree) in written:
        return {"same": written[id(tree)]}
    written[id(tree)] = len(written)
    return {"shared": written[id(tree)], "node": _json_node(tree, where, again, written)}


def _json_node(tree, where, again, written):
    tag, body = tree
    if tag in ("fetch", "number"):
        return {tag: body}
    if tag == "const":
        if not _constant_ok(body):
            raise ValueError(
                f"cannot save {where}: it returns {body!r:.60} ({type(body).__name__}), which a saved model "
                "cannot give back; return tensors, or numbers, strings, None and tuples, lists or dicts of them")
        return {"const": body}
    if tag is dict:
        for key in body:
            if not _constant_ok(key):
                raise ValueError(f"cannot save {where}: it returns a dict with the key {key!r:.60}; "
                                 "a saved model's dict keys are strings, numbers, booleans or None")
        return {"dict": [[key, _to_json(value, where, again, written)] for key, value in body.items()]}
    if tag == "plain":  # read from a file, saved again
        name, kind, first, second, complete = body
        if kind == "pytree":
            return {"pytree": name, "keys": first, "items": [_to_json(c, where, again, written) for c in second]}
        return {"object": name, "attrs": [[k, _attr_json(v, where, again, written)] for k, v in first.items()],
                "items": None if second is None else [[k, _to_json(v, where, again, written)]
                                                      for k, v in second.items()],
                "complete": complete}
    if tag == "pytree":
        cls, context, children = body
        keys = list(context) if isinstance(context, (list, tuple)) and all(map(_constant_ok, context)) \
            and len(context) == len(children) else None
        return {"pytree": type_name(cls), "keys": keys, "items": [_to_json(c, where, again, written) for c in children]}
    if tag == "object":
        cls, attrs, items = body
        # Attributes holding constants JSON cannot write (a class, a device)
        # are left out; the loaded value is then plain data.
        kept = [[k, saved] for k, saved in ((k, _attr_json(v, where, again, written)) for k, v in attrs.items())
                if saved is not None]
        saved_items = None if items is None else [[k, _to_json(v, where, again, written)] for k, v in items]
        if saved_items is not None and not all(_constant_ok(k) for k, _ in items):
            raise ValueError(f"cannot save {where}: it returns a {cls.__name__} with a key that is not a "
                             "string, number, boolean or None")
        return {"object": type_name(cls), "attrs": kept, "items": saved_items,
                "complete": len(kept) == len(attrs)}
    items = [_to_json(item, where, again, written) for item in body]
    if hasattr(tag, "_fields"):
        return {"namedtuple": tag.__name__, "fields": list(tag._fields), "items": items}
    for kind, cls in _SEQUENCES.items():
        if tag is cls:
            return {kind: items}
    raise ValueError(f"cannot save {where}: it returns a {tag.__name__}, which a saved model cannot rebuild; "
                     "return a tuple, list or dict instead")


def _attr_json(tree, where, again, written):
    """An attribute's JSON form; a device, dtype or class constant (a cache
    object's `device`, the class of its layers) by name; None for another
    constant JSON cannot hold."""
    tag, body = tree
    if tag != "const" or _constant_ok(body):
        return _to_json(tree, where, again, written)
    if isinstance(body, torch.device):
        return {"device": str(body)}
    if isinstance(body, torch.dtype):
        return {"dtype": str(body).removeprefix("torch.")}
    if isinstance(body, type) and "<" not in body.__qualname__:
        return {"class": type_name(body)}
    return None


def from_json(doc, n_fetch, where, max_nodes):
    """The in-memory tree of a JSON form read from a file, checked whole
    first; ModelFormatError names what is wrong."""
    budget = [max_nodes, []]  # (nodes left, the shared nodes read so far)
    return _parse(doc, n_fetch, f"{where}: \"outputs\"", budget, 0)


def _parse(doc, n_fetch, where, budget, depth):
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise ModelFormatError(f"{where}: the output structure is deeper than {MAX_DEPTH} or larger than the "
                               "program's variable limit")
    if not isinstance(doc, dict) or not doc:
        raise ModelFormatError(f"{where}: each node must be an object such as {{\"fetch\": 0}}, got {doc!r:.60}")
    kind = next(iter(doc))
    shared = budget[1]
    if set(doc) == {"shared", "node"}:  # numbered in the order written; read whole before any `same` names it
        if doc["shared"] != len(shared) or type(doc["shared"]) is not int:
            raise ModelFormatError(f"{where}: shared node {doc['shared']!r:.20} is not number {len(shared)}")
        shared.append(None)
        shared[-1] = _parse(doc["node"], n_fetch, where, budget, depth + 1)
        return shared[-1]
    if kind == "same" and len(doc) == 1:
        index = doc["same"]
        if type(index) is not int or not 0 <= index < len(shared) or shared[index] is None:
            raise ModelFormatError(f"{where}: {doc!r:.40} names no shared node read before it")
        return shared[index]
    if kind in ("fetch", "number") and len(doc) == 1:
        index = doc[kind]
        if type(index) is not int or not 0 <= index < n_fetch:
            raise ModelFormatError(f"{where}: fetch index {index!r:.20} is not one of the {n_fetch} fetches")
        return (kind, index)
    if kind == "const" and len(doc) == 1:
        if not _constant_ok(doc["const"]):
            raise ModelFormatError(f"{where}: constant {doc['const']!r:.60} is not a number, string, bool or null")
        return ("const", doc["const"])
    if kind == "dict" and len(doc) == 1 and isinstance(doc["dict"], list):
        body = {}
        for pair in doc["dict"]:
            if not (isinstance(pair, list) and len(pair) == 2 and _constant_ok(pair[0])) or pair[0] in body:
                raise ModelFormatError(f"{where}: dict entries must be [key, node] pairs with distinct "
                                       f"number, string, bool or null keys, got {pair!r:.60}")
            body[pair[0]] = _parse(pair[1], n_fetch, where, budget, depth + 1)
        return (dict, body)
    if kind in _SEQUENCES and len(doc) == 1 and isinstance(doc[kind], list):
        return (_SEQUENCES[kind], [_parse(item, n_fetch, where, budget, depth + 1) for item in doc[kind]])
    if kind == "device" and len(doc) == 1 and isinstance(doc["device"], str) and len(doc["device"]) < 64:
        try:
            return ("const", torch.device(doc["device"]))
        except (RuntimeError, ValueError):
            raise ModelFormatError(f"{where}: {doc['device']!r:.40} is not a device") from None
    if kind == "dtype" and len(doc) == 1 and isinstance(getattr(torch, str(doc["dtype"]), None), torch.dtype):
        return ("const", getattr(torch, doc["dtype"]))
    if kind == "class" and len(doc) == 1:
        _check_type_name(doc["class"], where)
        # The class when its module is imported (naming it runs nothing), else its name.
        return ("const", _loaded_class(doc["class"], "class") or doc["class"])
    if set(doc) == {"pytree", "keys", "items"} and isinstance(doc["items"], list):
        keys = doc["keys"]
        if keys is not None and not (isinstance(keys, list) and len(keys) == len(doc["items"])
                                     and all(map(_constant_ok, keys))):
            raise ModelFormatError(f"{where}: a pytree node's keys must be null or one constant per item")
        _check_type_name(doc["pytree"], where)
        children = [_parse(item, n_fetch, where, budget, depth + 1) for item in doc["items"]]
        return ("plain", (doc["pytree"], "pytree", keys, children, None))
    if set(doc) == {"object", "attrs", "items", "complete"}:
        _check_type_name(doc["object"], where)
        attrs = _parse_pairs(doc["attrs"], n_fetch, where, budget, depth, lambda k: isinstance(k, str))
        items = None if doc["items"] is None else _parse_pairs(doc["items"], n_fetch, where, budget, depth,
                                                               _constant_ok)
        return ("plain", (doc["object"], "object", attrs, items, doc["complete"] is True))
    if set(doc) == {"namedtuple", "fields", "items"}:
        return (_namedtuple(doc, where), [_parse(item, n_fetch, where, budget, depth + 1) for item in doc["items"]])
    raise ModelFormatError(f"{where}: unknown output node {doc!r:.80}")


def _parse_pairs(pairs, n_fetch, where, budget, depth, key_ok):
    if not isinstance(pairs, list):
        raise ModelFormatError(f"{where}: attributes and items must be lists of [key, node] pairs")
    body = {}
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and key_ok(pair[0])) or pair[0] in body:
            raise ModelFormatError(f"{where}: entries must be [key, node] pairs with distinct keys, got {pair!r:.60}")
        body[pair[0]] = _parse(pair[1], n_fetch, where, budget, depth + 1)
    return body


def type_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_type_name(name, where):
    if not (isinstance(name, str) and len(name) < 512 and all(p.isidentifier() for p in name.split("."))):
        raise ModelFormatError(f"{where}: {name!r:.60} is not a dotted class name")


def _loaded_class(name, kind):
    """The class `name` ("module.Qual.Name") from a module this process has
    already imported (never importing one), when it may be rebuilt: a
    class registered with torch.utils._pytree for a `pytree` node; for an
    `object` node a class whose instances are made by object's (or dict's)
    `__new__` and that has no `__del__` (making one runs no code of the
    class). None otherwise: the value is plain data."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            break
    else:
        return None
    cls = module
    for part in parts[i:]:
        cls = getattr(cls, part, None)
    if not isinstance(cls, type):
        return None
    if kind == "class":
        return cls
    if kind == "pytree":
        return cls if cls in pytree.SUPPORTED_NODES else None
    plain_new = cls.__new__ in (object.__new__, dict.__new__, collections.OrderedDict.__new__)
    if not plain_new or inspect.isabstract(cls) or any("__del__" in vars(c) for c in cls.__mro__[:-1]):
        return None
    return cls


def _namedtuple(doc, where):
    name, fields, items = doc["namedtuple"], doc["fields"], doc["items"]
    names = [name] + (fields if isinstance(fields, list) else [None])
    if not (isinstance(items, list) and all(isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n)
                                             and not n.startswith("_") for n in names)
            and len(set(fields)) == len(fields) == len(items)):
        raise ModelFormatError(f"{where}: a namedtuple needs an identifier name and one distinct identifier "
                               f"field per item, got {name!r:.40} with fields {fields!r:.60}")
    return collections.namedtuple(name, fields)


def children(tree):
    """The child trees of a node (none for a leaf)."""
    tag, body = tree
    if tag in ("fetch", "number", "const"):
        return []
    if tag is dict:
        return list(body.values())
    if tag == "pytree":
        return list(body[2])
    if tag == "object":
        return list(body[1].values()) + [v for _, v in body[2] or ()]
    if tag == "plain":
        return list(body[2].values()) + list((body[3] or {}).values()) if body[1] == "object" else list(body[3])
    return list(body)


def _new_object(cls, attrs, items):
    """A new `cls` holding `attrs` (and, for a dict subclass, `items`),
    made as copy.copy makes one: no __init__ or __post_init__ runs again."""
    obj = cls.__new__(cls)
    if items is not None:
        setitem = collections.OrderedDict.__setitem__ if isinstance(obj, collections.OrderedDict) \
            else dict.__setitem__  # not the class's own __setitem__ (ModelOutput's also sets attributes)
        for key, value in items:
            setitem(obj, key, value)
    obj.__dict__.update(attrs)
    return obj


def _rebuild_plain(body, results, memo):
    """A user type read from a file: the class when `_loaded_class`
    allows it, else plain data (see the module docstring)."""
    name, kind, first, second, complete = body
    if kind == "pytree":
        keys, values = first, [rebuild(c, results, memo) for c in second]
        cls = _loaded_class(name, kind) if keys is not None else None
        if cls is not None:
            return pytree.SUPPORTED_NODES[cls].unflatten_fn(values, list(keys))
        return dict(zip(keys, values)) if keys is not None else tuple(values)
    attrs = {k: rebuild(v, results, memo) for k, v in first.items()}
    items = None if second is None else [(k, rebuild(v, results, memo)) for k, v in second.items()]
    cls = _loaded_class(name, kind) if complete else None
    if cls is not None and (items is None or issubclass(cls, dict)):
        return _new_object(cls, attrs, items)
    return dict(items) if items else attrs


def rebuild(tree, results, memo=None):
    """The returned value: `tree` with the fetched `results` in place.
    `memo` (a dict, for trees where one node occurs twice: the same list
    returned twice, d2s/output_types.py) makes such a node one object."""
    tag, body = tree
    if tag == "fetch":
        return results[body]
    if tag == "number":
        return results[body].item()
    if tag == "const":
        return body
    if memo is not None:
        if id(tree) not in memo:
            memo[id(tree)] = _rebuild_node(tag, body, results, memo)
        return memo[id(tree)]
    return _rebuild_node(tag, body, results, memo)


def _rebuild_node(tag, body, results, memo):
    if tag is dict:
        return {key: rebuild(value, results, memo) for key, value in body.items()}
    if tag == "pytree":
        cls, context, trees = body
        return pytree.SUPPORTED_NODES[cls].unflatten_fn([rebuild(t, results, memo) for t in trees], context)
    if tag == "object":
        cls, attrs, items = body
        return _new_object(cls, {k: rebuild(v, results, memo) for k, v in attrs.items()},
                           None if items is None else [(k, rebuild(v, results, memo)) for k, v in items])
    if tag == "plain":
        return _rebuild_plain(body, results, memo)
    items = [rebuild(item, results, memo) for item in body]
    return tag(*items) if hasattr(tag, "_fields") else tag(items)
