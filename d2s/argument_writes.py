"""Objects passed as arguments that a declarative function changes in
place: a key/value cache (`self.keys = torch.cat([self.keys, k], -2)` in
transformers' `DynamicLayer.update`), a state object (`state.h = h`), a
list of outputs (`history.append(y)`). After each run the program writes
the caller's objects as eager's call leaves them.

The trace works on the arguments' copies (d2s/input_trees.py) or, for an
object holding no tensor, on the caller's own object. The Watch
(d2s/python_writes.py) finds the places it wrote (slots) and where each
object sits among the arguments (steps such as `args[1].layers[0]`), and
puts every slot back. Each written slot becomes an `ArgumentWrite`: the
steps to its object, the slot, and the value the trace left there as an
output tree (d2s/output_types.py) whose graph values are extra fetches of
the program, whose argument objects are found again among the call's
arguments (`("argument", steps)`), and whose other objects are made anew on
every run. After a run every object a write names is looked up first, then
the slots are written, so no write moves an object another one names.

Before:  def forward(self, x, cache): cache.keys = torch.cat([cache.keys, x]); return ...
         -> ConversionError: "changes its argument `cache` in place"
After:   the program fetches the new keys; after each run `cache.keys` holds
         them, and a returned `cache` is the caller's object.

The cache key pins every Python value of a copied argument (its structure
and plain values), and an argument holding no tensor is keyed by its
identity with the attributes the trace read checked before each run
(ops/attribute_reads.py), so a Python value the trace wrote (`is_initialized
= True`) is the one eager writes on every call the program serves.
"""

from typing import NamedTuple

import torch

from runtime.output_tree import children, rebuild

from .operators.effects import Slot
from .output_types import output_tree


class ArgumentWrite(NamedTuple):
    steps: tuple  # from the call's arguments to the written object: (("arg", 1), ("attr", "layers"), ("item", 0))
    kind: str  # Slot's: "attr", "dict" or "list" (the whole list)
    key: object
    tree: tuple  # the value written, with ("argument", steps) and ("fresh", tensor) leaves
    name: str  # as the user writes it, for messages: `cache.layers[0].keys`
    line: tuple = (None, None)  # (file, line) of the user's statement that writes it, for messages


def collect(taken, known, fetch, args, kwargs, shared):
    """(the ArgumentWrites of the Watch's `take_argument_writes()`
    (`taken`), their graph values appended to `fetch`; whether the program
    may serve one call only). `known`: `knower`'s, of the objects the
    Watch walked; `args`, `kwargs`: the caller's.

    A written object the trace got as it is (one keyed by its identity: a
    set, an object holding no tensor) may be the caller's on the next call
    too, holding what this run wrote, which the key does not show and the
    trace may have read (`s.add(len(s))`): such a program serves this call
    only (`ConcreteProgram.single_use`). Copies are keyed by structure.
    `known`, `shared`, `fetch`: output_types.output_tree's, shared with the
    returned value's tree (built first: its fetches come first)."""
    writes = [ArgumentWrite(steps, slot.kind, slot.key, output_tree(value, fetch, numbers=True, known=known,
                                                                    shared=shared, again=True),
                            slot.name, line) for slot, value, steps, line in taken]
    return writes, any(_is_callers(slot.obj, steps, args, kwargs) for slot, _, steps, _ in taken)


def _is_callers(obj, steps, args, kwargs):
    try:
        return locate(steps, args, kwargs) is obj
    except (LookupError, AttributeError, TypeError):
        return True  # (not found the way the trace found it: served once, to be safe)


def knower(located):
    """The `known` leaf function of d2s/output_types.py for trees that name
    the caller's objects: an argument object is found again by its steps,
    and a tensor made from no input (a constant of the program) is copied
    on every run, as eager makes a new one (a Parameter stays itself)."""
    fresh = {}

    def known(value):
        steps = located.get(id(value))
        if steps is not None:
            return ("argument", steps)
        if type(value) is torch.Tensor:  # one leaf per tensor: held twice, it is one copy (`resolved`)
            return fresh.setdefault(id(value), (value, ("fresh", value)))[1]
        return None
    return known


def names_arguments(tree):
    """Whether `tree` holds an ("argument", steps) or ("fresh", t) leaf."""
    tag, body = tree
    if tag in ("argument", "fresh"):
        return True
    return any(names_arguments(c) for c in _children(tree))


def _children(tree):
    return [] if tree[0] in ("argument", "fresh") else children(tree)


def locate(steps, args, kwargs):
    """The caller's object at `steps` among this call's arguments."""
    (kind, key), rest = steps[0], steps[1:]
    obj = args[key] if kind == "arg" else kwargs[key]
    for kind, key in rest:
        obj = getattr(obj, key) if kind == "attr" else obj[key]
    return obj


def resolved(tree, objects, memo):
    """`tree` with its ("argument", steps) leaves the objects `objects`
    (steps -> object) found, and its ("fresh", t) leaves copies of t: a
    tree runtime/output_tree.py rebuilds. `memo` (id -> node) keeps a node
    that occurs twice one node (one object after the rebuild)."""
    tag, body = tree
    if tag == "argument":
        return ("const", objects[body])
    if tag in ("fetch", "number", "const"):
        return tree
    if id(tree) not in memo:
        memo[id(tree)] = (tree, _resolved_node(tag, body, objects, memo))  # (the tree too: its id stays its own)
    return memo[id(tree)][1]


def _resolved_node(tag, body, objects, memo):
    if tag == "fresh":
        return ("const", body.clone())
    if tag is dict:
        return (dict, {k: resolved(v, objects, memo) for k, v in body.items()})
    if tag == "pytree":
        cls, context, children = body
        return ("pytree", (cls, context, [resolved(c, objects, memo) for c in children]))
    if tag == "object":
        cls, attrs, items = body
        return ("object", (cls, {k: resolved(v, objects, memo) for k, v in attrs.items()},
                           None if items is None else [(k, resolved(v, objects, memo)) for k, v in items]))
    return (tag, [resolved(c, objects, memo) for c in body])


def _steps_in(tree, out):
    tag, body = tree
    if tag == "argument":
        out.append(body)
    for child in _children(tree):
        _steps_in(child, out)
    return out


def steps_named(writes, trees):
    """The steps of every object `writes` write or name in their values,
    and that `trees` (the returned value's) name, each once: what
    `objects_of` looks up (worked out once per program)."""
    wanted = [w.steps for w in writes]
    for tree in [w.tree for w in writes] + list(trees):
        _steps_in(tree, wanted)
    return tuple(dict.fromkeys(wanted))


def objects_of(steps, args, kwargs):
    """steps -> the caller's object, for each of `steps` (`steps_named`),
    looked up before anything is written."""
    return {s: locate(s, args, kwargs) for s in steps}


def apply(writes, results, objects, resolving, rebuilding):
    """Write each slot of `writes` with its value for this run's `results`
    (all of the program's fetches, which the trees index).
    `resolving`, `rebuilding`: the memos of `resolved` and `rebuild`, shared
    with the returned value's, so an object new in this run that several
    places hold is one object in all of them, as eager's."""
    values = [rebuild(resolved(w.tree, objects, resolving), results, rebuilding) for w in writes]
    for w, value in zip(writes, values):
        Slot(objects[w.steps], w.kind, w.key, w.name).set(value)


def refuse_saving(concrete, what):
    """ValueError when `concrete` writes the caller's objects: a saved or
    exported program gives back its outputs only, and would silently leave
    those objects as they were."""
    if concrete.argument_writes:
        first = concrete.argument_writes[0]
        filename, lineno = first.line
        where = f'File "{filename}", line {lineno}: ' if filename else ""
        raise ValueError(
            f"{where}{what}: the program changes its argument `{first.name}` in place (written into the caller's "
            "object after each run), which a saved or exported program cannot do; save a function that returns "
            "the new value instead (for transformers, call the model with use_cache=False)")
