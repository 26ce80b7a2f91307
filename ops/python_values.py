"""Plain Python values a trace read from outside its arguments and modules,
checked when the program runs.

A program holds the numbers, strings, flags, dtypes and devices its code
read while it was traced as constants. Module attributes key the program
(d2s/module_watch.py); other Python state did not, so after `SCALE = 3.0`,
or `model.config.output_hidden_states = True` between calls, the program
went on computing with the old value, where eager reads the new one. Now
the trace notes the plain values it may have read from

  - the globals of the user's converted functions' modules (every global
    name their code, and the code nested in it, loads: more than the trace
    may have used, never fewer; the plain items of a global dict of
    settings) and their closure cells; the constants their code reads from
    the user's classes and other modules (`Defaults.SCALE`,
    `settings.SCALE`: `chain_reads`);
  - the objects of settings (a transformers config, an argparse
    Namespace, a dataclass, the user's own) that the traced modules, the
    arguments, those globals and cells hold, and those read from them
    (`config.text_config`): the attributes the code actually read, class
    attributes included (AttributeReads);
  - lists, tuples and dicts read from any of these, by content
    (`_Contents`: changed in place, they are not rebound); those a user's
    module holds and its class attributes (`module_reads`);
  - the functions, classes and objects read from globals, cells and
    objects of settings, by identity (`by_identity`: after `act =
    torch.tanh` the program, which called torch.relu, is another's; a
    module's are keyed instead, d2s/module_watch.py `by_identity`);
  - the param groups of the optimizers its arguments and globals hold: the
    values the code actually read (`opt.param_groups[0]["lr"]`, GroupReads);
  - a parameter's `requires_grad` the user's code or torch's read
    (`if p.requires_grad:`, a fast path's check; noted by ops/capture.py);
  - torch's settings and environment variables read
    (`torch.are_deterministic_algorithms_enabled()`, `os.environ.get("DEBUG")`,
    noted by ops/process_state.py), asked again;

and the program's first op, `check_python_values`, compares them with the
current ones. A change raises DecisionFailed and the call converts again
(d2s/decisions.py), as a failed guard in torch.compile recompiles. Before /
after, for `def f(x): return x * SCALE` with SCALE = 2.0:

    tmp_0 = torch.Tensor.__mul__(x, 2.0)      check_python_values(<python values SCALE=2.0>)
                                              tmp_0 = torch.Tensor.__mul__(x, 2.0)

Python modules (`torch`, `F`) are not checked, and tensors are read by the
program itself when it runs (d2s/module_state.py). Libraries' own globals and closures (transformers' feature flags, a
decorator's settings) are their constants and are not checked. A saved
program keeps the values it was traced with: the check is dropped on save,
as a loaded program has no such source.
"""

import dis
import enum
import sys
import types

import torch

from runtime.errors import DecisionFailed

from . import tracer
from .registry import OpDef, register
from .user_frames import error_at_user_line

_MISSING = object()
_names = {}  # code object -> the global names it and the code nested in it load


# Packages whose module globals and closure cells are their own constants
# (feature flags, a decorator's settings), not the user's values.
LIBRARIES = frozenset({"torch", "numpy", "d2s", "ops", "runtime", "functools", "collections", "typing",
                       "transformers", "timm", "torchvision", "accelerate", "einops"})


def _library(fn, code):
    """Whether `fn` is an installed package's (its globals and cells are that
    package's constants) rather than the user's code."""
    if (getattr(fn, "__module__", None) or "").split(".")[0] in LIBRARIES:
        return True
    parts = code.co_filename.replace("\\", "/").split("/")
    return "site-packages" in parts or "dist-packages" in parts


def _library_object(obj):
    """Whether a class or module is an installed package's (its attributes
    are that package's constants)."""
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None) or ""
    if name.split(".")[0] in LIBRARIES or name.split(".")[0] in sys.stdlib_module_names:
        return True  # (`math.pi` is no setting)
    module = sys.modules.get(name) if not isinstance(obj, types.ModuleType) else obj
    path = (getattr(module, "__file__", None) or "").replace("\\", "/").split("/")
    return "site-packages" in path or "dist-packages" in path


def _defining_class(cls, name):
    """The class of `cls`'s MRO whose own namespace holds `name`, or None."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def _chains(code):
    """(global name, attribute, ...) of each `NAME.attr.attr` the code (and
    the code nested in it) reads: a class's or another module's constant
    (`Defaults.SCALE`, `settings.SCALE`)."""
    chains = _chains_of.get(code)
    if chains is None:
        found, chain = [], None
        for ins in dis.get_instructions(code):
            if ins.opname == "LOAD_GLOBAL":
                chain = [ins.argval]
                found.append(chain)
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and chain is not None:
                chain.append(ins.argval)
            else:
                chain = None
        chains = [tuple(c) for c in found if len(c) > 1]
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                chains += _chains(const)
        chains = _chains_of[code] = tuple(dict.fromkeys(chains))
    return chains


_chains_of = {}


def chain_reads(namespace, chains, is_plain, objects):
    """The reads of the constants `chains` reach through the user's classes
    and modules (`Defaults.SCALE`, `settings.SCALE`, `settings.Defaults.SCALE`)
    from `namespace`, looked up in the defining class's or module's
    namespace on every call; objects of settings reached (`settings.OPTIONS`)
    go to `objects`."""
    reads = []
    for name, *attrs in chains:
        value, label = namespace.get(name, _MISSING), name
        for attr in attrs:
            if isinstance(value, types.ModuleType) and not _library_object(value):
                holder = vars(value)
            elif isinstance(value, type) and not _library_object(value) and \
                    _defining_class(value, attr) is not None and not _library_object(_defining_class(value, attr)):
                holder = vars(_defining_class(value, attr))
            else:
                break
            value, label = holder.get(attr, _MISSING), f"{label}.{attr}"
            noted = value if is_plain(value) else contents_of(value, is_plain)
            if noted is not None:
                reads.append((IN_DICT, holder, attr, noted, None, label))
                break
            if is_data_object(value, is_plain):
                objects.append(value)
                break
    return reads


def module_reads(modules, functions, is_plain):
    """What the user's `functions` may read through `self` of the user's
    modules beyond their plain attributes (which key the program,
    d2s/module_watch.py): a list, tuple or dict the module holds
    (`self.sizes`, `self.acts`, changed in place), and a plain class
    attribute (`self.SCALE`), compared on every call. "May read": a name
    their code loads."""
    names = set()
    for fn in functions:
        code = getattr(fn, "__code__", None)
        if code is not None and not _library(fn, code):
            names |= _attribute_names(code)
    reads, seen = [], set()
    for module in modules:
        cls = type(module)
        if _library_object(cls):
            continue
        own = vars(module)
        for name in names:
            contents = contents_of(own[name], is_plain) if name in own and not is_plain(own[name]) else None
            if contents is not None:
                reads.append((IN_DICT, own, name, contents, None, f"{cls.__name__}.{name}"))
            klass = _defining_class(cls, name) if name not in own and name[:2] != "__" else None
            if klass is None or _library_object(klass) or (id(klass), name) in seen:
                continue
            value = vars(klass)[name]
            noted = value if is_plain(value) else contents_of(value, is_plain)
            if noted is not None:
                seen.add((id(klass), name))
                reads.append((IN_DICT, vars(klass), name, noted, None, f"{klass.__name__}.{name}"))
    return reads


def _attribute_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _attribute_names(const)
    return names


# How a read is looked up again: in a dict (a module's namespace, an
# object's own __dict__), in a closure cell, by getattr, or by a call.
IN_DICT, IN_CELL, BY_GETATTR, BY_CALL = 0, 1, 2, 3
_MAX_ITEMS = 64  # a larger global dict is a table, not settings


def read_by_call(query, value, label):
    """A read to compare by calling `query()` on every call (torch's
    settings, environment variables: noted by ops/process_state.py)."""
    return (BY_CALL, query, None, value, None, label)


def read_by_getattr(obj, name, value, label):
    """A read to compare by getattr on every call (a parameter's
    `requires_grad`, noted by ops/capture.py when the user's code reads it)."""
    return (BY_GETATTR, obj, name, value, None, label)


def _bound(cell):
    try:
        cell.cell_contents
    except ValueError:  # an empty cell: a name assigned later in the outer function
        return False
    return True


def _global_names(code):
    names = _names.get(code)
    if names is None:
        found = []
        for ins in dis.get_instructions(code):
            if ins.opname == "LOAD_GLOBAL" and ins.argval not in found:
                found.append(ins.argval)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                found += [n for n in _global_names(const) if n not in found]
        names = _names[code] = tuple(found)
    return names


def reads_of(functions, is_plain):
    """The (how, namespace or cell, name, value, None, label) of every value
    the user's `functions` name: globals of their modules (builtins aside)
    and closure cells, plain (and the plain items of a global dict), lists
    and dicts of plain values by content, and the rest by identity
    (`by_identity`). `is_plain` is d2s.module_watch's."""
    reads, seen = [], set()
    for fn in functions:
        code, namespace = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
        if code is None or namespace is None or _library(fn, code):
            continue
        for name in _global_names(code):
            value = namespace.get(name, _MISSING)
            if value is _MISSING or (id(namespace), name) in seen:
                continue
            noted = _noted(value, is_plain)
            if noted is not _MISSING:
                seen.add((id(namespace), name))
                reads.append((IN_DICT, namespace, name, noted, None, name))
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            if not _bound(cell) or id(cell) in seen:
                continue
            noted = _noted(cell.cell_contents, is_plain)
            if noted is not _MISSING:
                seen.add(id(cell))
                reads.append((IN_CELL, cell, name, noted, None, name))
    return reads


def _noted(value, is_plain):
    """What a read of `value` compares: the value (plain, or compared by
    identity), its `_Contents`, or _MISSING for nothing."""
    if is_plain(value):
        return value
    contents = contents_of(value, is_plain)
    if contents is not None:
        return contents
    return value if by_identity(value) else _MISSING


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


# How `_Contents` compares an item: as a plain value, as "a tensor" (its
# values are the program's to read: d2s/module_state.py), as a nested
# `_Contents`, or by identity (a function, a module, an object).
_PLAIN, _TENSOR, _NESTED, _SAME_OBJECT = range(4)


class _Contents(tuple):
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
    """A `_Contents` of `value` when it is a list, tuple or dict (plain
    keys) of at most _MAX_ITEMS items, nested at most 3 deep, else None."""
    kind = type(value)
    if kind not in (list, tuple, dict) or len(value) > _MAX_ITEMS or depth > 2:
        return None
    if kind is dict and not all(is_plain(k) for k in value):
        return None
    return _Contents(value, is_plain, depth)


# Packages whose objects are state of their own, not settings: a logger's
# level cache or a thread's flags change as the program runs.
_NOT_SETTINGS = frozenset({"torch", "d2s", "ops", "runtime", "numpy", "builtins"}) | \
    (frozenset(sys.stdlib_module_names) - {"argparse", "types", "dataclasses"})


def is_data_object(value, is_plain):
    """Whether `value` is an object of settings whose plain attributes the
    code may read: a Python object with a `__dict__` (a config, an
    `argparse.Namespace`, a dataclass, the user's own class), not a module,
    tensor, function, class, enum member or a standard-library or torch
    object."""
    kind = type(value)
    return not is_plain(value) and hasattr(value, "__dict__") and not callable(value) and \
        (kind.__module__ or "").split(".")[0] not in _NOT_SETTINGS and \
        not isinstance(value, (torch.nn.Module, torch.Tensor, type, types.ModuleType, enum.Enum))


class AttributeReads:
    """`with AttributeReads(objects, is_plain) as reads:` while a trace runs,
    the plain attribute values its code reads from `objects` (the objects of
    settings the traced modules keep, `add`ed ones: those of the call's
    arguments, globals and closure cells, and the objects of settings read
    from these, `config.text_config`), in `reads.found`. The reads are seen
    by a `__getattribute__` put on the objects' classes for the trace only.
    A class that cannot be given one (`types.SimpleNamespace`) has every
    plain attribute of its objects checked instead."""

    def __init__(self, objects, is_plain):
        self._is_plain = is_plain
        self._objects = {}
        self._found = {}
        self._patched = []
        self._classes = set()
        self._unpatched = []  # objects of classes that could not be patched: all their plain attributes
        self._trace = None
        self._pending = list(objects)
        self._functions = set()  # the code of the functions `add_function` took
        self._chain_reads = []

    @property
    def found(self):
        """(how, holder, name, value, object, label) of each read: an attribute the object
        holds itself (the read gave that value) is looked up in its
        `__dict__` again, the rest (properties, names a class maps to
        others) by getattr. A list or dict read is compared on every call
        (its object is None: it changes without a write to the object)."""
        out = []
        for obj, name, value, same_object in self._found.values():
            label = f"{type(obj).__name__}.{name}"
            own = getattr(obj, "__dict__", None)
            owner = None if type(value) is _Contents else obj
            klass = None if type(own) is dict and name in own else _defining_class(type(obj), name)
            if type(own) is dict and same_object(own.get(name, _MISSING)):
                out.append((IN_DICT, own, name, value, owner, label))
            elif klass is not None and not _library_object(klass) and same_object(vars(klass)[name]):
                # A class attribute (`Options.SCALE` read as `options.SCALE`): writing it
                # is no write to the object, so it is compared on every call.
                out.append((IN_DICT, vars(klass), name, value, None, f"{klass.__name__}.{name}"))
            elif self._is_plain(value) or type(value) is _Contents:
                out.append((BY_GETATTR, obj, name, value, owner, label))
            # (else a value compared by identity that a property made: another object at every read)
        out += self._chain_reads
        for obj in self._unpatched:
            own, kind = vars(obj), type(obj).__name__
            for name, value in list(own.items()):
                noted = _noted(value, self._is_plain)
                if noted is not _MISSING and type(name) is str:
                    out.append((IN_DICT, own, name, noted, None, f"{kind}.{name}"))
        return out

    @property
    def objects(self):
        """The objects of settings followed (module_state reads the tensors they hold when the program runs)."""
        return [o for o in self._objects.values() if o is not None]

    def __enter__(self):
        self._trace = tracer.active()
        self._trace.attribute_reads = self
        self.add(self._pending)
        return self

    def add_function(self, fn):
        """Follow the objects of settings `fn`'s globals and closure cells
        hold (a function of the user's the trace calls), and note the
        constants its code reads from the user's classes and modules."""
        code, namespace = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
        if code is None or namespace is None or _library(fn, code) or id(code) in self._functions:
            return
        self._functions.add(id(code))
        objects = [namespace.get(name) for name in _global_names(code)]
        objects += [c.cell_contents for c in fn.__closure__ or () if _bound(c)]
        self._chain_reads += chain_reads(namespace, _chains(code), self._is_plain, objects)
        self.add(objects)

    def ignore(self, objects):
        """Never follow `objects` (the trace's copies of the arguments that
        hold tensors: their other values key the program)."""
        self._objects.update((id(o), None) for o in objects)

    def add(self, values, depth=0):
        """Follow the objects of settings among `values` (and in the lists,
        tuples and dicts among them) from now on."""
        for value in values:
            if type(value) in (list, tuple, dict) and depth < 3:
                items = value.values() if type(value) is dict else value
                if len(items) <= _MAX_ITEMS:
                    self.add(list(items), depth + 1)
            elif id(value) not in self._objects and is_data_object(value, self._is_plain):
                self._objects[id(value)] = value
                if not self._patch(type(value)):
                    self._unpatched.append(value)
                    self.add(list(vars(value).values()), depth + 1)

    def _note(self, obj, name, value):
        noted = _noted(value, self._is_plain)
        if noted is not _MISSING:
            self._found.setdefault((id(obj), name), (obj, name, noted, lambda now, v=value: now is v))
        if noted is value and not self._is_plain(value):
            self.add([value])  # (an object of settings read from one: `config.text_config`)

    def _patch(self, cls):
        """Put the noting `__getattribute__` on `cls`; False when it cannot have one."""
        if cls in self._classes:
            return True
        own, original = cls.__dict__.get("__getattribute__", _MISSING), cls.__getattribute__
        objects, trace, note = self._objects, self._trace, self._note

        def getattribute(obj, name, original=original):
            value = original(obj, name)
            if name[:2] != "__" and objects.get(id(obj)) is obj and tracer.active() is trace:
                note(obj, name, value)
            return value

        try:
            cls.__getattribute__ = getattribute
        except TypeError:  # a builtin or extension type
            return False
        self._classes.add(cls)
        self._patched.append((cls, own))
        return True

    def __exit__(self, *exc):
        self._trace.attribute_reads = None
        for cls, own in reversed(self._patched):
            if own is _MISSING:
                del cls.__getattribute__
            else:
                cls.__getattribute__ = own
        self._patched = []


class _ReadDict(dict):
    """A param group standing in for the optimizer's own while a trace runs:
    the same items, and each plain value read is noted."""

    def __init__(self, items, note):
        super().__init__(items)
        self._note = note

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        self._note(self, key, value)
        return value

    def get(self, key, default=None):
        value = dict.get(self, key, _MISSING)
        if value is _MISSING:
            return default
        self._note(self, key, value)
        return value

    def _refuse(self, *args, **kwargs):
        # The write would happen once, while the program is built, where eager
        # code makes it on every call (a warm-up of the lr, say).
        raise error_at_user_line(
            "writing an optimizer's param group (`param_groups[i][key] = ...`) cannot be part of a program: it "
            "would happen once, while the program is built; change it outside the declarative function, or "
            "use an lr scheduler (d2s.Graph.add_optimizer(opt, lr_scheduler=...))")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _refuse


class GroupReads:
    """`with GroupReads(optimizers, is_plain) as reads:` while a trace runs,
    the plain values its code reads from the optimizers' param groups
    (`opt.param_groups[0]["lr"]`, to log it or scale by it), as reads of the
    optimizer's own group dicts in `reads.found`. A dict's class cannot be
    changed, so each group is replaced in `param_groups` by a `_ReadDict` of
    the same items for the trace, and put back after it. An lr scheduler
    changes `lr` on every step: only a program whose code read it converts
    again (the `optimizer_step` op reads the groups when it runs)."""

    def __init__(self, optimizers, is_plain):
        self._optimizers = list({id(o): o for o in optimizers}.values())
        self._is_plain = is_plain
        self._found = {}
        self._swapped = []  # (param_groups list, index, the optimizer's own dict)

    @property
    def found(self):
        return [(IN_DICT, group, key, value, None, f"param_groups[{index}][{key!r}]")
                for group, index, key, value in self._found.values()]

    def __enter__(self):
        trace, found, is_plain = tracer.active(), self._found, self._is_plain
        for opt in self._optimizers:
            groups = opt.param_groups
            for index, own in enumerate(groups):
                if type(own) is not dict:
                    continue

                def note(_, key, value, own=own, index=index):
                    if tracer.active() is trace and is_plain(value):
                        found.setdefault((id(own), key), (own, index, key, value))

                groups[index] = _ReadDict(own, note)
                self._swapped.append((groups, index, own))
        return self

    def __exit__(self, *exc):
        for groups, index, own in reversed(self._swapped):
            if type(groups[index]) is _ReadDict:  # (the trace could not write it: _ReadDict refuses)
                groups[index] = own
        self._swapped = []


def optimizers_named(function, args, kwargs):
    """The torch.optim optimizers a call reaches directly: its arguments and
    the globals its function's code names."""
    values = [*args, *kwargs.values()]
    code, namespace = getattr(function, "__code__", None), getattr(function, "__globals__", None)
    if code is not None and namespace is not None:
        values += [namespace.get(name) for name in _global_names(code)]
    return [v for v in values if isinstance(v, torch.optim.Optimizer)]


def data_objects(modules, is_plain):
    """The objects of settings `modules` keep as attributes (a config, the
    user's settings object: `is_data_object`)."""
    seen, out = set(), []
    for module in modules:
        for value in vars(module).values():
            if id(value) not in seen and is_data_object(value, is_plain):
                seen.add(id(value))
                out.append(value)
    return out


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
            now = holder.get(name, _MISSING)
        elif how == IN_CELL:
            try:
                now = holder.cell_contents
            except ValueError:  # emptied
                now = _MISSING
        elif how == BY_GETATTR:
            try:
                now = getattr(holder, name)
            except AttributeError:
                now = _MISSING
        else:
            now = holder()
        if value.matches(now, same) if type(value) is _Contents else (now is value or same(now, value)):
            continue
        shown = "deleted" if now is _MISSING else repr(now)
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
