"""Python objects a tensor-dependent branch or loop body writes in place.

Under a tensor condition both branches are traced, and a loop body is
traced for every trip at once, but a run takes one path. A write the body
makes to a Python object it reaches (an item of a list or dict, an
attribute of a local object, in containers of containers) happens while
tracing, on every path. ``Effects`` remembers what the objects the
generated functions reach held before the construct, finds the places
(*slots*) a trace wrote, and puts the objects back; the helpers then carry
each written slot as one more output of the ``cond`` op (or one more loop
variable of the ``while`` op) and store the op's result in it afterwards,
so that the object holds what eager code would leave in it, per path.
Values the op cannot merge (a Python string differing per path) are refused
by ``cond``/``while_loop`` naming the slot (``res['a'][0]``, ``foo.c``).

Before (traced): ``res = {"a": [1]}; if t: res["a"][0] = 2 else: res["a"][0] = 3``
                 -> ``{"a": [3]}`` on every path (both writes ran)
After:           ``res["a"][0]`` is the ``cond``'s output: 2 or 3 per run.

Lists and dicts that the construct carries by name (``State.snapshot``)
are left to the helpers' own merge; modules' attributes to
``d2s/module_state.py``.
"""

import collections
import types
import weakref

import torch

from ops import tracer
from ops.python_values import has_attributes, own_attributes
from runtime.ir import Variable

_MISSING = object()
_MAX_OBJECTS = 2000  # a walk this large is a model's whole state, not a container the code builds
_MAX_DEPTH = 6
_OPAQUE = (type, types.ModuleType, types.BuiltinFunctionType, types.MethodType,
           torch.Tensor, Variable, str, bytes, int, float, complex, bool, range, type(None))
# Of an nn.Module, the user's attributes (`self.cache`, `self._step`) and
# these dicts of torch's are walked (a buffer `self.stat`, a submodule
# `self.block.h`); its parameters, hooks and flags are not places a forward
# writes tensors to.
_MODULE_DICTS = ("_buffers", "_modules")
# nn.Module's own attributes (_parameters, _buffers, _forward_hooks, training, ...).
TORCH_MODULE_ATTRS = frozenset(vars(torch.nn.Module()))


class EffectsChanged(Exception):
    """Trace the construct again carrying these slots (found written by the
    last trace), and taking apart the objects at `paths` (found replaced by
    it: d2s/operators/state.py `Deeper`)."""

    def __init__(self, slots, paths=()):
        super().__init__(len(slots))
        self.slots = slots
        self.paths = paths


class Slot:
    """One place of a Python object: ``obj[key]`` of a dict, ``obj.key`` of an
    object, the whole contents of a list (``key`` None; a list written by
    index or grown is one value), or of another container ("contents": a
    set, a deque, a dict subclass such as OrderedDict, whose order is part
    of its value), as a list (a mapping's keys and values in turn)."""

    def __init__(self, obj, kind, key, name):
        self.obj, self.kind, self.key, self.name = obj, kind, key, name

    @property
    def ident(self):
        return (id(self.obj), self.kind, self.key)

    def get(self):
        if self.kind == "list":
            return list(self.obj)
        if self.kind == "contents":
            return contents_of(self.obj)
        if self.kind == "dict":
            return self.obj.get(self.key, _MISSING)
        return own_attributes(self.obj).get(self.key, _MISSING)

    def set(self, value):
        if self.kind == "list":
            self.obj[:] = value
        elif self.kind == "contents":
            fill(self.obj, value)
        elif value is _MISSING:
            if self.kind == "dict":
                self.obj.pop(self.key, None)
            elif self.key in own_attributes(self.obj):
                delattr(self.obj, self.key)
        elif self.kind == "dict":
            self.obj[self.key] = value
        else:
            setattr(self.obj, self.key, value)


class Effects:
    """The contents, before a branch or loop, of the lists, dicts and plain
    objects reachable from the closure cells of its generated ``functions``
    (the user's names they read or write) and from ``roots`` ((user name,
    object) pairs: d2s/python_writes.py); ``covered`` holds the ids of the
    containers the caller restores itself. `located` ({root name: first
    step}): for the objects those roots reach (not through a module or a
    function), `located` maps id(object) -> its steps from the root,
    (("arg", 0), ("attr", "layers"), ("item", 1)): where d2s/argument_writes.py
    finds the caller's object on a later call."""

    def __init__(self, functions, covered=(), roots=(), located=None):
        self.saved = []  # (kind, object, copy of its contents, user name)
        self._seen = set(covered)
        self.located = {}
        firsts = located or {}
        # (object, user name, depth, steps from an argument or None)
        todo = collections.deque((value, name, 0, (firsts[name],) if name in firsts else None)
                                 for name, value in roots)
        for fn in functions:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
                try:
                    todo.append((cell.cell_contents, name, 0, None))
                except ValueError:  # an unbound name
                    pass
        self._walk(todo)

    def add(self, roots):
        """Save the contents of what `roots` ((user name, object) pairs)
        reach as they are now, beside the rest."""
        self._walk(collections.deque((value, name, 0, None) for name, value in roots))

    def _walk(self, todo):
        seen = self._seen
        while todo and len(self.saved) < _MAX_OBJECTS:
            value, name, depth, steps = todo.popleft()
            if id(value) in seen or depth > _MAX_DEPTH or isinstance(value, _OPAQUE):
                continue
            seen.add(id(value))
            if steps is not None:
                self.located[id(value)] = steps
            if type(value) is list:
                self.saved.append(("list", value, list(value), name))
                todo += [(v, f"{name}[{i}]", depth + 1, _step(steps, "item", i)) for i, v in enumerate(value)]
            elif isinstance(value, OTHER_CONTAINERS) and type(value) is not dict and not _plain_object(value):
                items = contents_of(value)
                self.saved.append(("contents", value, items, name))
                if isinstance(value, dict):
                    todo += [(v, f"{name}[{k!r}]", depth + 1, _step(steps, "item", k)) for k, v in value.items()]
                else:  # (a set's or deque's items are not found again by a step)
                    todo += [(v, f"{name}[...]", depth + 1, None) for v in items]
            elif type(value) is dict:
                self.saved.append(("dict", value, dict(value), name))
                todo += [(v, f"{name}[{k!r}]", depth + 1, _step(steps, "item", k)) for k, v in value.items()]
            elif type(value) is tuple:
                todo += [(v, f"{name}[{i}]", depth + 1, _step(steps, "item", i)) for i, v in enumerate(value)]
            elif isinstance(value, types.FunctionType):
                # A helper closure the body calls may write what it closes over.
                todo += [(c.cell_contents, n, depth + 1, None)
                         for n, c in zip(value.__code__.co_freevars, value.__closure__ or ()) if cell_bound(c)]
            elif isinstance(value, torch.nn.Module):
                # (A module's attributes are d2s/module_state.py's: never located.)
                attrs = {k: v for k, v in vars(value).items() if k not in TORCH_MODULE_ATTRS}
                self.saved.append(("attr", value, attrs, name))
                todo += [(v, f"{name}.{k}", depth + 1, None) for k, v in attrs.items()]
                for own in _MODULE_DICTS:
                    entries = vars(value)[own]
                    self.saved.append(("module dict", entries, dict(entries), name))
                    todo += [(v, f"{name}.{k}", depth + 1, None) for k, v in entries.items()]
            elif _plain_object(value):
                attrs = own_attributes(value)
                self.saved.append(("attr", value, dict(attrs), name))
                todo += [(v, f"{name}.{k}", depth + 1, _step(steps, "attr", k)) for k, v in attrs.items()]

    def old_value(self, slot):
        """What `slot` held when its object was saved."""
        for kind, obj, old, _ in self.saved:
            if obj is slot.obj:
                return list(old) if kind in ("list", "contents") else old.get(slot.key, _MISSING)
        raise KeyError(slot.name)

    def written(self):
        """The slots whose value differs from before (by identity)."""
        slots = []
        for kind, obj, old, name in self.saved:
            if kind in ("list", "contents"):
                now = obj if kind == "list" else contents_of(obj)
                if len(now) != len(old) or any(a is not b for a, b in zip(now, old)):
                    slots.append(Slot(obj, kind, None, name))
                continue
            now = _contents(kind, obj, old)
            for key in list(now) + [k for k in old if k not in now]:
                if now.get(key, _MISSING) is not old.get(key, _MISSING):
                    # A buffer or submodule is named as the user writes it: `self.stat`.
                    slots.append(Slot(obj, "attr" if kind == "attr" else "dict", key,
                                      f"{name}[{key!r}]" if kind == "dict" else f"{name}.{key}"))
        return slots

    def restore(self):
        """Put every object back as it was (only what changed is touched)."""
        for kind, obj, old, _ in self.saved:
            if kind in ("list", "contents"):
                now = obj if kind == "list" else contents_of(obj)
                if len(now) != len(old) or any(a is not b for a, b in zip(now, old)):
                    Slot(obj, kind, None, "").set(list(old))
                continue
            now = _contents(kind, obj, old)
            if now.keys() == old.keys() and all(now[k] is v for k, v in old.items()):
                continue
            if kind != "attr":
                obj.clear()
                obj.update(old)
            else:
                for key in [k for k in now if k not in old]:
                    delattr(obj, key)
                for key, value in old.items():
                    if now.get(key, _MISSING) is not value:
                        setattr(obj, key, value)


# Containers other than list and dict whose contents a write changes: a
# set, a deque, a dict subclass (OrderedDict, defaultdict, Counter).
OTHER_CONTAINERS = (set, collections.deque, dict)


def contents_of(container):
    """A container's contents as one list: a mapping's keys and values in
    turn (a new list; its items are the container's own objects)."""
    if isinstance(container, dict):
        return [x for item in container.items() for x in item]
    return list(container)


def fill(container, items):
    """Make `container` hold `items` (a list in `contents_of`'s form)."""
    container.clear()
    if isinstance(container, dict):
        container.update(zip(items[::2], items[1::2]))
    elif isinstance(container, collections.deque):
        container.extend(items)
    else:
        container.update(items)


def _step(steps, kind, key):
    return None if steps is None else steps + ((kind, key),)


def restore_dict(now, before):
    """Make the dict `now` hold what `before` (its earlier copy) holds,
    touching only the keys that differ (by identity)."""
    for key in [k for k in now if k not in before]:
        del now[key]
    now.update({k: v for k, v in before.items() if now.get(k, _MISSING) is not v})


def _contents(kind, obj, old):
    """What a saved object holds now, as its saved copy `old` has it: a
    dict's items, a plain object's attributes, a module's user attributes
    (those in `old`, and new ones)."""
    if kind != "attr":
        return obj
    now = own_attributes(obj)
    if isinstance(obj, torch.nn.Module):
        return {k: v for k, v in now.items() if k in old or k not in TORCH_MODULE_ATTRS}
    return now


# The slots each construct (by its generated function's code) wrote when it was
# last traced, per trace: an enclosing branch or loop traces it again (each side,
# each retry), and starting from them spares it a retry of its own each time
# (nested `if`s writing one attribute would otherwise be traced 2**depth times).
_KNOWN = weakref.WeakKeyDictionary()


def known_slots(effects, code):
    """The slots the construct of `code` wrote last time in this trace that
    the objects of `effects` still hold (an unwritten slot carried is its
    own value on every path: harmless)."""
    reachable = {id(obj) for _, obj, _, _ in effects.saved}
    slots = _KNOWN.get(tracer.current(), {}).get(code, ())
    return [s for s in slots if id(s.obj) in reachable and not is_missing(s.get())]


def remember_slots(code, slots):
    if slots:
        _KNOWN.setdefault(tracer.current(), {})[code] = slots


# The paths of user objects each construct carried as their parts when it was
# last traced (d2s/operators/state.py `changed_objects`), per trace, for the
# same reason: an enclosing loop's retrace starts from them.
_DEEP = weakref.WeakKeyDictionary()


def known_deep(code):
    return set(_DEEP.get(tracer.current(), {}).get(code, ()))


def remember_deep(code, deep):
    if deep:
        _DEEP.setdefault(tracer.current(), {})[code] = frozenset(deep)


def is_missing(value):
    """Whether a slot's value is "no such item or attribute"."""
    return value is _MISSING


def merge_slots(known, found):
    """``known`` plus the slots of ``found`` it lacks, in a stable order."""
    idents = {s.ident for s in known}
    return list(known) + [s for s in found if s.ident not in idents and not idents.add(s.ident)]


def cell_bound(cell):
    """Whether a closure cell holds a value (an unassigned one raises)."""
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _plain_object(value):
    """An instance of a user's class whose attributes live in its ``__dict__``
    or ``__slots__`` (not a module, function, tensor or object of a library)."""
    package = (type(value).__module__ or "").split(".")[0]
    return has_attributes(value) and not callable(value) and package not in _LIBRARIES


# (`logging`: a logger caches which levels are enabled in itself as the code logs.)
_LIBRARIES = frozenset({"builtins", "torch", "numpy", "d2s", "ops", "runtime", "functools", "collections",
                        "logging"})
