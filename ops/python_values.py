"""Python values a trace read from outside its arguments' tensors,
checked when the program runs.

A program holds what its code read while it was traced as constants: the
numbers, strings, flags, dtypes and devices, and the functions and objects
it called or read through. Module attributes key the program
(d2s/module_watch.py); other Python state did not, so after `SCALE = 3.0`,
`act = torch.tanh` or `model.config.output_hidden_states = True` between
calls, the program went on computing with the old value, where eager reads
the new one. Now the trace notes what it may have read from

  - the globals and closure cells of the user's converted functions, the
    constants their code reads from the user's classes and other modules
    (`Defaults.SCALE`, `settings.SCALE`), and through `self` of the user's
    modules beyond their plain attributes (a list they hold, their class's
    attributes): ops/python_reads.py, from the code;
  - the attributes of objects of settings (a transformers config, an
    argparse Namespace, a dataclass, the user's own) and the values of an
    optimizer's param groups the code actually read: ops/attribute_reads.py,
    as the trace runs;
  - a parameter's `requires_grad` the user's code or torch's read
    (`if p.requires_grad:`, a fast path's check; noted by ops/capture.py);
  - torch's settings and environment variables read
    (`torch.are_deterministic_algorithms_enabled()`, `os.environ.get("DEBUG")`,
    noted by ops/process_state.py), asked again;

and the program's first op, `check_python_values`, compares them with the
current ones: plain values by value and type, lists, tuples and dicts by
their contents (`Contents`: changed in place, they are not rebound), and
the rest by identity (`by_identity`). A change raises DecisionFailed and
the call converts again (d2s/decisions.py), as a failed guard in
torch.compile recompiles. Before / after, for `def f(x): return x * SCALE`
with SCALE = 2.0:

    tmp_0 = torch.Tensor.__mul__(x, 2.0)      check_python_values(<python values SCALE=2.0>)
                                              tmp_0 = torch.Tensor.__mul__(x, 2.0)

Python modules (`torch`, `F`) are not checked, and tensors are read by the
program itself when it runs (d2s/module_state.py). Libraries' own globals
and closures (transformers' feature flags, a decorator's settings) are
their constants and are not checked. A saved program keeps the values it
was traced with: the check is dropped on save, as a loaded program has no
such source.
"""

import enum
import sys
import types
import weakref

import torch

from runtime.errors import DecisionFailed

from .registry import OpDef, register


MISSING = object()


# How a read is looked up again: in a dict (a module's namespace, an
# object's own __dict__), in a closure cell, by getattr, or by a call.
IN_DICT, IN_CELL, BY_GETATTR, BY_CALL = 0, 1, 2, 3


MAX_ITEMS = 64  # a larger global dict is a table, not settings


def read_by_call(query, value, label):
    """A read to compare by calling `query()` on every call (torch's
    settings, environment variables: noted by ops/process_state.py)."""
    return (BY_CALL, query, None, value, None, label)


def read_by_getattr(obj, name, value, label):
    """A read to compare by getattr on every call (a parameter's
    `requires_grad`, noted by ops/capture.py when the user's code reads it)."""
    return (BY_GETATTR, obj, name, value, None, label)


def noted_value(value, is_plain):
    """What a read of `value` compares: the value (plain, or compared by
    identity), its `Contents`, or MISSING for nothing."""
    if is_plain(value):
        return value
    contents = contents_of(value, is_plain)
    if contents is not None:
        return contents
    return value if by_identity(value) else MISSING


def by_identity(value):
    """Whether a value read that is neither plain nor a list or dict of
    plain values is compared by identity when the program runs: a function,
    class, partial, module or object the trace called or read through
    (`act = torch.tanh` between calls: the program is `act` as it was).
    Not: Python modules (`torch`, `F`), tensors (which the program reads
    itself when it runs: d2s/module_state.py), and bound methods (a new
    object at every read)."""
    if isinstance(value, (types.ModuleType, torch.Tensor, types.MethodType)):
        return False
    if isinstance(value, types.BuiltinMethodType):  # (a C function: `torch.relu`, `len`; or a bound one: `x.append`)
        owner = getattr(value, "__self__", None)
        return owner is None or isinstance(owner, types.ModuleType)
    return True


# How `Contents` compares an item: as a plain value, as "a tensor" (its
# values are the program's to read: d2s/module_state.py), as a nested
# `Contents`, or by identity (a function, a module, an object).
_PLAIN, _TENSOR, _NESTED, _SAME_OBJECT = range(4)


class Contents(tuple):
    """What a list, tuple or dict held when the trace read it (its items, or
    keys and values, in order): compared by content on every call, as
    `SIZES.append(4)` or `self.acts["a"] = F.gelu` changes a container in
    place without rebinding it. Plain items compare by value and type
    (1 == 1.0 == True), lists and dicts in it by their contents, tensors as
    "a tensor", the rest by identity."""

    __slots__ = ()

    def __new__(cls, container, is_plain, depth=0):
        kind = type(container)
        keys = tuple(container) if kind is dict else None
        values = tuple(container.values()) if kind is dict else tuple(container)
        hows, expected = [], []
        for v in values:
            if is_plain(v):
                hows.append(_PLAIN)
                expected.append(v)
            elif isinstance(v, torch.Tensor):
                hows.append(_TENSOR)
                expected.append(None)
            else:
                nested = contents_of(v, is_plain, depth + 1)
                hows.append(_SAME_OBJECT if nested is None else _NESTED)
                expected.append(v if nested is None else nested)
        plain = all(h == _PLAIN for h in hows) and not any(type(v) is tuple for v in values)
        return super().__new__(cls, (kind, keys, tuple(expected), tuple(hows), tuple(map(type, values)), plain))

    def matches(self, now, same):
        kind, keys, expected, hows, types_, plain = self
        if type(now) is not kind or len(now) != len(expected):
            return False
        if kind is dict:
            if tuple(now) != keys:
                return False
            now = tuple(now.values())
        elif kind is not tuple:
            now = tuple(now)
        if plain:  # (all plain, none a tuple: compared in C)
            return now == expected and tuple(map(type, now)) == types_
        for v, e, how in zip(now, expected, hows):
            if how == _PLAIN:
                ok = v is e or same(v, e)
            elif how == _TENSOR:
                ok = isinstance(v, torch.Tensor)
            elif how == _NESTED:
                ok = e.matches(v, same)
            else:
                ok = v is e
            if not ok:
                return False
        return True

    def __repr__(self):
        kind, keys, expected = self[:3]
        shown = ["<tensor>" if how == _TENSOR else e for e, how in zip(expected, self[3])]
        return repr(dict(zip(keys, shown)) if kind is dict else kind(shown))


def contents_of(value, is_plain, depth=0):
    """A `Contents` of `value` when it is a list, tuple or dict (plain
    keys) of at most MAX_ITEMS items, nested at most 3 deep, else None."""
    kind = type(value)
    if kind not in (list, tuple, dict) or len(value) > MAX_ITEMS or depth > 2:
        return None
    if kind is dict and not all(is_plain(k) for k in value):
        return None
    return Contents(value, is_plain, depth)


# Packages whose objects are state of their own, not settings: a logger's
# level cache or a thread's flags change as the program runs.
_NOT_SETTINGS = frozenset({"torch", "d2s", "ops", "runtime", "numpy", "builtins"}) | \
    (frozenset(sys.stdlib_module_names) - {"argparse", "types", "dataclasses"})


def is_data_object(value, is_plain):
    """Whether `value` is an object of settings whose plain attributes the
    code may read: a Python object with a `__dict__` or `__slots__` (a
    config, an `argparse.Namespace`, a dataclass, the user's own class),
    not a module, tensor, function, class, enum member or a standard-library
    or torch object."""
    kind = type(value)
    return not is_plain(value) and has_attributes(value) and not callable(value) and \
        (kind.__module__ or "").split(".")[0] not in _NOT_SETTINGS and \
        not isinstance(value, (torch.nn.Module, torch.Tensor, type, types.ModuleType, enum.Enum))


def has_attributes(value):
    """Whether `value` keeps attributes of its own: a `__dict__` or `__slots__`."""
    return hasattr(value, "__dict__") or bool(_slots(type(value)))


_SLOTS = weakref.WeakKeyDictionary()  # class -> {attribute name: its slot's descriptor}


def _slots(kind):
    """The `__slots__` slots of a class's objects (of every class in its
    MRO, by attribute name: `__x` mangled as Python stores it)."""
    found = _SLOTS.get(kind)
    if found is None:
        found = {name: d for k in reversed(kind.__mro__[:-1]) for name, d in vars(k).items()
                 if type(d) is types.MemberDescriptorType}
        _SLOTS[kind] = found
    return found


def own_attributes(obj):
    """The attributes `obj` holds itself: its `__dict__` (that dict), or, for
    an object of a class with `__slots__`, a new dict of the slots that hold
    a value (and of its `__dict__` where it also has one)."""
    slots = _slots(type(obj))
    own = getattr(obj, "__dict__", None)
    if not slots:
        return own
    attrs = dict(own) if type(own) is dict else {}
    for name, slot in slots.items():
        try:
            attrs[name] = slot.__get__(obj, type(obj))
        except AttributeError:  # a slot never assigned
            pass
    return attrs


# Attribute reads are compared again only after some object of a watched
# class was written (`config.use_cache = True`): a class's `__setattr__` /
# `__delattr__`, wrapped once a trace reads an object of it, moves this
# counter. Looking the attributes up on every call cost ~17 us for a GPT-2
# config (its properties and attribute map are Python); globals and cells
# are dict and cell reads, compared on every call.
_writes = [0]


_watched_classes = set()


def _watch_writes(cls):
    if cls in _watched_classes:
        return
    for method in ("__setattr__", "__delattr__"):
        original = getattr(cls, method)

        def wrapper(self, *args, _original=original):
            _writes[0] += 1
            return _original(self, *args)

        wrapper.__name__, wrapper.__wrapped__ = method, original
        try:
            setattr(cls, method, wrapper)
        except TypeError:  # a builtin or extension type: its objects are compared on every call
            return
    _watched_classes.add(cls)


class PythonValues:
    """What `check_python_values` compares: (how, holder, name, value,
    object or None, how a message names it) of each read (`reads_of`,
    `AttributeReads.found`) and the equality to compare them by, one short
    line in the program text."""

    def __init__(self, reads, same):
        self.reads = tuple(reads)
        self.same = same
        # What every call compares: the reads of globals and cells, and of
        # the objects of classes whose writes cannot be watched.
        every_call = []
        for read in self.reads:
            owner = read[4]
            if owner is not None:
                _watch_writes(type(owner))
            if owner is None or type(owner) not in _watched_classes:
                every_call.append(read)
        self.every_call = tuple(every_call)
        self.attributes_at = None  # the write count when the attribute reads were last compared

    def __repr__(self):
        shown = ", ".join(f"{label}={value!r}" for *_, value, _, label in self.reads[:4])
        more = f", +{len(self.reads) - 4}" if len(self.reads) > 4 else ""
        return f"<python values {shown}{more}>"


def _check_python_values_kernel(values):
    same = values.same
    writes = _writes[0]
    reads = values.every_call if values.attributes_at == writes else values.reads
    for how, holder, name, value, _, label in reads:
        if how == IN_DICT:
            now = holder.get(name, MISSING)
        elif how == IN_CELL:
            try:
                now = holder.cell_contents
            except ValueError:  # emptied
                now = MISSING
        elif how == BY_GETATTR:
            try:
                now = getattr(holder, name)
            except AttributeError:
                now = MISSING
        else:
            now = holder()
        if value.matches(now, same) if type(value) is Contents else (now is value or same(now, value)):
            continue
        shown = "deleted" if now is MISSING else repr(now)
        raise DecisionFailed(f"this program was converted when `{label}` was {value!r}, and its code reads "
                             f"it; it is now {shown}: convert again")
    values.attributes_at = writes  # all equal: until the next write, only the others need comparing


# Dropped on save (training_only): a loaded program keeps the values it was traced with.
register(OpDef("check_python_values", kernel=_check_python_values_kernel, side_effect=True, training_only=True))


def check_first(program, reads, same):
    """Make a `check_python_values` op of `reads` the first op of `program`."""
    block = program.global_block()
    block.append_op("check_python_values", inputs={"X": []}, outputs={"Out": []},
                    attrs={"args": (PythonValues(reads, same),), "kwargs": {}, "out": None})
    block.ops.insert(0, block.ops.pop())
