"""What branches and loops carry: the named variables of the generated branch
and loop functions, read and written through their closure cells.

The transformers turn a branch or loop body into a function that declares
the names it carries ``nonlocal``; ``State`` reads and writes those names
through the function's closure cells, so a name that has no value yet reads
as ``Undefined(name)`` instead of failing. ``convert_load`` turns such a
value back into Python's own ``UnboundLocalError`` where the code reads it.
"""

import sys

import torch

from ops import control_flow as cf
from ops import framework as fw
from ops import tracer
from ops.recording import is_symbolic_value, lift
from ops.user_frames import INTERNAL_DIRS, error_at_user_line, user_origin
from runtime.ir import TENSOR_ARRAY, Variable

from .. import input_trees

Undefined = cf.Undefined


class LoopFirst(Undefined):
    """A name a graph loop's body first assigns, before the body's first
    trace assigned it: an `if` on a tensor in the body that assigns it on
    one path gives the other path a placeholder and a False "bound" flag
    (`convert_ifelse`), as later trips do with the value of earlier ones."""


def tested(value):
    """A real tensor that an `if`, `while`, `not`, `and` or `or` of converted
    code tests while a program is traced (a module's buffer: `if
    self.initted:`), as the program's Variable for it: the test reads what
    the tensor holds when the program runs, as eager reads it then (its
    value at build time is frozen nowhere); any other value as it is."""
    if isinstance(value, torch.Tensor) and not isinstance(value, Variable) and tracer.active() is not None:
        return lift(value)
    if is_array(value):
        return array_truth(value)
    return value


def is_array(value):
    """Whether `value` is a list that a graph loop fills (a tensor array)."""
    return isinstance(value, Variable) and value.kind == TENSOR_ARRAY


def array_truth(array):
    """Python's truth of a list a graph loop fills (`if ys:`, `bool(ys)`):
    whether it holds an element, a bool known when the program runs."""
    out = fw.array_length(array) > 0
    out.python_number = True  # a Python bool in eager code
    return out


def is_var(value):
    # A SymInt/SymBool is a size (or a comparison of sizes) known only at run time.
    return isinstance(value, Variable) or is_symbolic_value(value)


class State:
    """The named variables a branch or loop carries, as closure cells of the
    generated functions that declare them ``nonlocal``."""

    def __init__(self, functions, names):
        cells = {}
        for fn in functions:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
                cells.setdefault(name, cell)
        self.names = tuple(names)
        self.cells = [cells[n] for n in self.names]

    def get(self, names=None):
        names = self.names if names is None else names
        return tuple(self._read(self.cells[self.names.index(n)], n) for n in names)

    @staticmethod
    def _read(cell, name):
        try:
            return cell.cell_contents
        except ValueError:  # empty cell: the name is not bound yet
            return Undefined(name)

    def set(self, values, names=None):
        names = self.names if names is None else names
        for n, v in zip(names, values):
            self.cells[self.names.index(n)].cell_contents = v

    def snapshot(self):
        """A restorable copy: the values, and the contents of every Python list
        and dict they hold (nested ones too), which keep their identity."""
        values, saved, seen = self.get(), [], set()
        for v in values:
            _containers(v, saved, seen)
        return values, saved

    def restore(self, snapshot):
        values, saved = snapshot
        for obj, contents in saved:
            if type(obj) is list:
                obj[:] = contents
            else:
                obj.clear()
                obj.update(contents)
        for cell, value in zip(self.cells, values):
            cell.cell_contents = value


def _containers(value, saved, seen):
    """(container, copy of its contents) for each list and dict reachable from `value`."""
    if id(value) in seen or type(value) not in (list, dict, tuple):
        return
    seen.add(id(value))
    if type(value) is list:
        saved.append((value, list(value)))
    elif type(value) is dict:
        saved.append((value, dict(value)))
    for item in (value.values() if type(value) is dict else value):
        _containers(item, saved, seen)


def flatten(value, lists=True, deep=(), path=()):
    """(leaves, spec) of nested tuples, dicts and (with `lists`) lists; spec
    None for a single value. Dict specs keep the keys, in order. A user
    object holding tensors (`carried_node`: a dataclass or ModelOutput, a
    registered pytree class, a named tuple, a cache object) is taken apart
    too where its `path` (the names, keys, indices and attribute labels
    leading to it from the top) is in `deep`: a `NodeSpec`. Elsewhere it is
    one value, kept by identity (see `changed_objects`)."""
    if type(value) is dict:
        leaves, specs = [], []
        for k, v in value.items():
            flat, spec = flatten(v, lists, deep, path + (k,))
            leaves += flat
            specs.append((k, spec))
        return leaves, (dict, tuple(specs))
    if deep and path in deep:
        n = carried_node(value)
        if n is not None:
            leaves, specs = [], []
            for label, v in n.children:
                # (A list in an object, as a cache's layers, is one of its parts: a fixed length.)
                flat, spec = flatten(v, True, deep, path + (label,))
                leaves += flat
                specs.append(spec)
            return leaves, NodeSpec(n, tuple(specs))
    if isinstance(value, tuple) or (lists and isinstance(value, list)):
        leaves, specs = [], []
        for i, v in enumerate(value):
            flat, spec = flatten(v, lists, deep, path + (i,))
            leaves += flat
            specs.append(spec)
        return leaves, (type(value), tuple(specs))
    return [value], None


def unflatten(leaves, spec):
    """The value `flatten` took apart, from an iterator of its leaves."""
    if spec is None:
        return next(leaves)
    if isinstance(spec, NodeSpec):
        return spec.node.rebuild([unflatten(leaves, s) for s in spec.children])
    kind, specs = spec
    if kind is dict:
        return {k: unflatten(leaves, s) for k, s in specs}
    items = (unflatten(leaves, s) for s in specs)
    return kind(*items) if hasattr(kind, "_fields") else kind(items)  # a named tuple takes its fields


class NodeSpec:
    """The spec of a user object `flatten` took apart: its class and
    structure (keys, attribute names, pytree context) and its children's
    specs; equal specs rebuild the same kind of object. `node` (an
    input_trees.Node of one such object) rebuilds it."""

    __slots__ = ("node", "children", "_key")

    def __init__(self, node, children):
        self.node, self.children = node, children
        self._key = (node.cls, node.structure, children)

    def __eq__(self, other):
        return isinstance(other, NodeSpec) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return f"NodeSpec({self.node.cls.__name__})"


def carried_node(value):
    """The input_trees.Node of a user object a branch or loop can carry as
    its parts (a dataclass or ModelOutput, a class registered with
    torch.utils._pytree, a named tuple, a plain object holding tensors or
    graph values), else None."""
    if isinstance(value, Undefined):
        return None  # (a name with no value yet: asking it anything raises UnboundLocalError)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        cls = type(value)
        return input_trees.Node(cls, ("namedtuple", tuple(value._fields)),
                                [(f".{f}", v) for f, v in zip(value._fields, value)], lambda new: cls(*new))
    return input_trees.node(value)


def changed_objects(old, new, deep=(), path=(), lists=True):
    """The paths (as `flatten` gives them, with the same `lists`) at which
    `old` holds a user object (`carried_node`) that `flatten` keeps whole
    and `new` holds another object of the same class: a branch or loop that
    rebinds a name to a new object (`out = model(x)` in a loop body)
    carries it as its parts, so the op can merge them (`flatten(...,
    deep=...)`). The same object on both sides stays one value: its
    in-place changes are d2s/operators/effects.py's."""
    if old is new or type(old) is not type(new):
        return []
    if type(old) is dict:
        if list(old) != list(new):
            return []
        return [p for k in old for p in changed_objects(old[k], new[k], deep, path + (k,), lists)]
    if path not in deep:
        if carried_node(old) is not None and carried_node(new) is not None:
            return [path]
        if (isinstance(old, tuple) or (lists and isinstance(old, list))) and len(old) == len(new):
            return [p for i, (a, b) in enumerate(zip(old, new))
                    for p in changed_objects(a, b, deep, path + (i,), lists)]
        return []
    a, b = carried_node(old), carried_node(new)
    if a is None or b is None or len(a.children) != len(b.children):
        return []
    return [p for (label, x), (_, y) in zip(a.children, b.children)
            for p in changed_objects(x, y, deep, path + (label,), True)]


def local_object_paths(value, visible, path=(), lists=True):
    """The paths (as `flatten` gives them) of the user objects in `value`
    that hold a graph value of a block outside `visible` (block indexes:
    the block of a branch op and the blocks around it), and of the objects
    holding those: a branch's own values, which leave it only as the op's
    outputs. (An object the only live side of a tensor `if` binds, the
    other side raising on every path, is taken apart for that reason.)"""
    if type(value) is dict:
        return [p for k, v in value.items() for p in local_object_paths(v, visible, path + (k,), lists)]
    n = carried_node(value)
    if n is not None:
        inner = [p for label, v in n.children for p in local_object_paths(v, visible, path + (label,), True)]
        local = any(isinstance(v, Variable) and v.block.idx not in visible for _, v in n.children)
        return [path] + inner if inner or local else []
    if isinstance(value, tuple) or (lists and isinstance(value, list)):
        return [p for i, v in enumerate(value) for p in local_object_paths(v, visible, path + (i,), lists)]
    return []


class Deeper(Exception):
    """Trace the construct again taking apart the objects at these paths
    (`changed_objects`)."""

    def __init__(self, paths):
        super().__init__(paths)
        self.paths = paths


def describe(spec):
    if spec is None:
        return "single value"
    if isinstance(spec, NodeSpec):
        kind, *parts = spec.node.structure
        what = f"{spec.node.cls.__name__} object"
        if kind == "object":
            return f"{what} with attributes {list(parts[0])}" + (f" and keys {list(parts[1])}" if parts[1] else "")
        if kind == "namedtuple":
            return f"{what} with fields {list(parts[0])}"
        return f"{what} ({parts[0]!r:.60})"
    if spec[0] is dict:
        return f"dict with keys {[k for k, _ in spec[1]]}"
    return f"{spec[0].__name__} of {len(spec[1])}"


def refill(old, new):
    """`new` (a value `unflatten` made) put into the lists and dicts of `old`
    where both have one, so those keep their identity as in eager code (a
    name bound to the same list sees its change); `old` itself when it is one."""
    if type(old) is list and type(new) is list:
        old[:] = [refill(o, n) for o, n in zip(old, new)] + new[len(old):]
        return old
    if type(old) is dict and type(new) is dict:
        for k in [k for k in old if k not in new]:
            del old[k]
        for k, v in new.items():
            old[k] = refill(old[k], v) if k in old else v
        return old
    if type(old) is tuple and type(new) is tuple and len(old) == len(new):
        return tuple(refill(o, n) for o, n in zip(old, new))
    return new


def maybe_unbound(value):
    """Whether `value` is a name's value first assigned in a graph loop (its
    flag says whether a run bound it)."""
    # (vars(): a tensor array's attribute lookup refuses names it does not know)
    return isinstance(value, Variable) and vars(value).get("unbound_unless") is not None


def convert_load(value):
    """A read of a variable that may be unbound. Equivalent Python: ``return
    value`` (Python itself raises for a truly unbound name); a value the
    helpers left ``Undefined`` raises the same ``UnboundLocalError``."""
    if isinstance(value, Undefined):
        value.unbound()
    if maybe_unbound(value):
        ran = value.unbound_unless
        # First assigned in a graph loop: unbound after a run of zero trips.
        name = value.unbound_unless_name
        def unbound():
            fw.raise_(UnboundLocalError(f"cannot access local variable '{name}' where it is not associated "
                                        "with a value"), origin=user_origin())
            return cf.Unreachable(name)
        cf.cond(ran, lambda: (), unbound)
    return value


def constant(value):
    """A 0-d graph tensor for a Python number (a float is a float64: a double)."""
    return fw.fill_constant(value, fw.python_number_dtype(value))


def as_bool_var(value):
    return value if is_var(value) or isinstance(value, torch.Tensor) else constant(bool(value))


def other_names(named):
    """(other, name, where) for each name of the user's frames that holds a
    value of `named` (id -> the user's name for it) under another name: in
    the function running now (`alias = ys`, where ""), in a caller (a helper
    changing its argument, where " in caller()") or outside the converted
    code (a value passed in). In the converted function's own frames (the
    one running and the generated branch/loop functions around it, each
    nested in the next one's code) a name is the one variable: the generated
    functions declare the user's names nonlocal."""
    frame, inner, own = sys._getframe(1), None, True
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(INTERNAL_DIRS) or code.co_filename.startswith("<frozen"):
            frame = frame.f_back
            continue
        own = own and (inner is None or inner in code.co_consts)
        for other, value in frame.f_locals.items():
            name = named.get(id(value))
            if name is not None and not (own and other == name):
                yield other, name, "" if own else f" in {code.co_name}()"
        frame, inner = frame.f_back, code


def refuse_list_aliases(names, values):
    """Refuse, at the user's line, a list a graph loop or branch carries (and
    so makes a tensor array) that another name also holds (`other_names`):
    the op's result is bound to the list's own name only; the other name would
    keep the Python list as it was before the loop, where eager sees every
    append."""
    lists = {id(v): n for n, v in zip(names, values) if type(v) is list}
    for other, name, where in other_names(lists) if lists else ():
        raise error_at_user_line(
            f"{other!r}{where} is another name for the list {name!r}, which this tensor loop or `if` "
            f"changes: the program holds the list as a tensor array bound to {name!r} only, "
            "so the other name would not see the change; use one name for the list (a helper "
            "builds and returns its own list)")
    # The caller's own list (an argument, or one reached from it): the trace
    # holds a copy of it (d2s/input_trees.py), which no frame names, and the
    # caller's list would keep its items where eager's grows.
    for key, name in lists.items():
        if _callers(key):
            raise error_at_user_line(
                f"{name!r} is the caller's list (an argument, or a list reached from one), which this tensor "
                f"loop or `if` changes: the program holds the list as a tensor array bound to {name!r} "
                "only, so the caller's list would not see the change; build a list of your own and "
                f"return it (`{name} = list({name})` before the loop or `if`)")


def _callers(key):
    """Whether the object of id `key` is the caller's: an argument, or an
    object reached from one (d2s/python_writes.py Watch, `located`)."""
    trace = tracer.active()
    return trace is not None and trace.watch is not None and key in trace.watch.effects.located


def refuse_dropped(name, value):
    """Refuse, at the user's line, the list or dict `value` that a tensor
    `if` leaves a different length or keys on each side, which the program
    drops since its name `name` is not read after the `if`, where something
    else sees it: another name (`other_names`) or the caller (an argument:
    `del d[k]` on one side)."""
    kind = type(value).__name__
    for other, _, where in other_names({id(value): name}):
        raise error_at_user_line(
            f"{other!r}{where} is another name for the {kind} {name!r}, which this tensor `if` leaves with "
            "another length or other keys on each side: a program cannot change a Python list's or dict's "
            "length or keys under a tensor condition; build it the same way on both sides")
    if _callers(id(value)):
        raise error_at_user_line(
            f"{name!r} is the caller's {kind} (an argument, or one reached from it), which this tensor `if` "
            "leaves with another length or other keys on each side: a program cannot change a Python list's "
            "or dict's length or keys under a tensor condition; set every key on both sides (a tensor value "
            "each side computes), or return a new one")


def refuse_object_aliases(named, effects):
    """Refuse, at the user's line, an object that a graph loop or branch
    takes apart (`flatten` with `deep`: the name is bound to a rebuilt object
    after the op) when it existed before the construct and another name
    (`other_names`) or a container the construct reaches (`effects`, an
    `Effects`) also holds it: eager keeps that object under the name on the
    paths that do not rebind it, so a change made through one name would
    show through the other. `named`: (name, object) pairs."""
    message = object_alias(named, effects)
    if message is not None:
        raise error_at_user_line(message)


def object_alias(named, effects):
    """The message `refuse_object_aliases` raises, or None."""
    objects = {id(obj): name for name, obj in named}
    if not objects:
        return None
    for other, name, where in other_names(objects):
        return _alias_message(f"{other!r}{where} is another name for", name)
    for kind, holder, contents, holder_name in effects.saved:
        for value in contents if kind in ("list", "contents") else contents.values():
            if id(value) in objects:
                return _alias_message(f"{holder_name!r} holds", objects[id(value)])
    return None


def _alias_message(held, name):
    return (f"{held} the object {name!r}, which this tensor loop or `if` may bind to another object: the "
            f"program carries {name!r} as its parts and rebuilds it after the op, so on the paths where eager "
            f"keeps the object a change made through one would not show through the other; use one name "
            "for it (or copy it: `copy.copy(obj)`)")


def loop_init(value):
    """A graph loop's initial value: Python numbers become 0-d tensors of
    the numbers' own dtypes (a float: float64), Python lists tensor arrays."""
    if isinstance(value, (bool, int, float)):
        var = constant(value)
        var.python_literal = True  # its dtype is weak, as the number's (ops/control_flow/while_op.py _Spec)
        return var
    if type(value) is list:
        return fw.array_from_list(value) if value else fw.array_create()
    return value
