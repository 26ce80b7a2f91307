"""What a saved function returns, as plain data: the structure around the
fetched tensors (tuples, lists, dicts, named tuples, `torch.Size`) and the
Python constants in it, so a loaded model returns what the function
returned (`return y, 3` gives `(y, 3)`, `return {"logits": y}` a dict)
rather than only its tensors.

In memory a tree is what `d2s` builds when it traces a function:
``("fetch", i)`` for the i-th fetched tensor, ``("number", i)`` for one
that stands for a Python number (`t.item()`: given back as `.item()`),
``("const", value)``,
``(tuple | list | torch.Size | a namedtuple class, [trees])`` and
``(dict, {key: tree})``. In program.json:

    {"fetch": 0}   {"number": 1}   {"const": 3}   {"tuple": [...]}   {"list": [...]}
    {"size": [...]}   {"dict": [[key, tree], ...]}
    {"namedtuple": "Out", "fields": ["a", "b"], "items": [...]}

A loaded file is untrusted: `from_json` checks every node (known kinds,
constants that JSON holds exactly, keys that Python can hash, fetch
indexes in range, bounded depth and size) before anything is built, and a
named tuple is rebuilt as a fresh class of that name and those fields,
never by importing the original.
"""

import collections
import keyword
import math

import torch

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
    returned value a saved program cannot give back."""
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
        return {"dict": [[key, to_json(value, where)] for key, value in body.items()]}
    items = [to_json(item, where) for item in body]
    if hasattr(tag, "_fields"):
        return {"namedtuple": tag.__name__, "fields": list(tag._fields), "items": items}
    for kind, cls in _SEQUENCES.items():
        if tag is cls:
            return {kind: items}
    raise ValueError(f"cannot save {where}: it returns a {tag.__name__}, which a saved model cannot rebuild; "
                     "return a tuple, list or dict instead")


def from_json(doc, n_fetch, where, max_nodes):
    """The in-memory tree of a JSON form read from a file, checked whole
    first; ModelFormatError names what is wrong."""
    budget = [max_nodes]
    return _parse(doc, n_fetch, f"{where}: \"outputs\"", budget, 0)


def _parse(doc, n_fetch, where, budget, depth):
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise ModelFormatError(f"{where}: the output structure is deeper than {MAX_DEPTH} or larger than the "
                               "program's variable limit")
    if not isinstance(doc, dict) or not doc:
        raise ModelFormatError(f"{where}: each node must be an object such as {{\"fetch\": 0}}, got {doc!r:.60}")
    kind = next(iter(doc))
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
    if set(doc) == {"namedtuple", "fields", "items"}:
        return (_namedtuple(doc, where), [_parse(item, n_fetch, where, budget, depth + 1) for item in doc["items"]])
    raise ModelFormatError(f"{where}: unknown output node {doc!r:.80}")


def _namedtuple(doc, where):
    name, fields, items = doc["namedtuple"], doc["fields"], doc["items"]
    names = [name] + (fields if isinstance(fields, list) else [None])
    if not (isinstance(items, list) and all(isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n)
                                             and not n.startswith("_") for n in names)
            and len(set(fields)) == len(fields) == len(items)):
        raise ModelFormatError(f"{where}: a namedtuple needs an identifier name and one distinct identifier "
                               f"field per item, got {name!r:.40} with fields {fields!r:.60}")
    return collections.namedtuple(name, fields)


def rebuild(tree, results):
    """The returned value: `tree` with the fetched `results` in place."""
    tag, body = tree
    if tag == "fetch":
        return results[body]
    if tag == "number":
        return results[body].item()
    if tag == "const":
        return body
    if tag is dict:
        return {key: rebuild(value, results) for key, value in body.items()}
    items = [rebuild(item, results) for item in body]
    return tag(*items) if hasattr(tag, "_fields") else tag(items)
