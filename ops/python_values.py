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
    settings) and their closure cells;
  - the plain objects the traced modules keep (a transformers config, a
    settings object): the attributes the code actually read (AttributeReads);
  - the param groups of the optimizers its arguments and globals hold: the
    values the code actually read (`opt.param_groups[0]["lr"]`, GroupReads);
  - a parameter's `requires_grad` the user's code or torch's read
    (`if p.requires_grad:`, a fast path's check; noted by ops/capture.py);

and the program's first op, `check_python_values`, compares them with the
current ones. A change raises DecisionFailed and the call converts again
(d2s/decisions.py), as a failed guard in torch.compile recompiles. Before /
after, for `def f(x): return x * SCALE` with SCALE = 2.0:

    tmp_0 = torch.Tensor.__mul__(x, 2.0)      check_python_values(<python values SCALE=2.0>)
                                              tmp_0 = torch.Tensor.__mul__(x, 2.0)

Only plain values (`d2s.module_watch.is_plain_value`) are checked: modules,
functions and classes are looked up afresh by the code that names them,
and tensors are read by the program itself (d2s/module_state.py).
Libraries' own globals and closures (transformers' feature flags, a
decorator's settings) are their constants and are not checked. A saved
program keeps the values it was traced with: the check is dropped on save,
as a loaded program has no such source.
"""

import dis
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


# How a read is looked up again: in a dict (a module's namespace, an
# object's own __dict__), in a closure cell, or by getattr.
IN_DICT, IN_CELL, BY_GETATTR = 0, 1, 2
_MAX_ITEMS = 64  # a larger global dict is a table, not settings


def read_by_getattr(obj, name, value, label):
    """A read to compare by getattr on every call (a parameter's
    `requires_grad`, noted by ops/capture.py when the user's code reads it)."""
    return (BY_GETATTR, obj, name, value, None, label)


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
    """The (how, namespace or cell, name, value, None, label) of every plain
    value the user's `functions` name: globals of their modules (builtins
    aside), the plain items of a global dict, and closure cells. `is_plain`
    is d2s.module_watch's."""
    reads, seen = [], set()
    for fn in functions:
        code, namespace = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
        if code is None or namespace is None or _library(fn, code):
            continue
        for name in _global_names(code):
            value = namespace.get(name, _MISSING)
            if value is not _MISSING and is_plain(value) and (id(namespace), name) not in seen:
                seen.add((id(namespace), name))
                reads.append((IN_DICT, namespace, name, value, None, name))
            elif type(value) is dict and len(value) <= _MAX_ITEMS and (id(value), None) not in seen:
                # A global dict of settings (`CFG["scale"]`): its plain items.
                seen.add((id(value), None))
                reads += [(IN_DICT, value, k, v, None, f"{name}[{k!r}]") for k, v in list(value.items())
                          if type(k) is str and is_plain(v)]
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell: a name assigned later in the outer function
                continue
            if is_plain(value) and id(cell) not in seen:
                seen.add(id(cell))
                reads.append((IN_CELL, cell, name, value, None, name))
    return reads


class AttributeReads:
    """`with AttributeReads(objects, is_plain) as reads:` while a trace runs,
    the plain attribute values its code reads from `objects` (the plain
    objects the traced modules keep: a transformers config, the user's own
    settings object), as (object, name, value) in `reads.found`. The reads
    are seen by a `__getattribute__` put on the objects' classes for the
    trace only (Python classes: a builtin's cannot be given one), which
    notes reads of these objects by this trace and nothing else."""

    def __init__(self, objects, is_plain):
        self._objects = {id(o): o for o in objects}
        self._is_plain = is_plain
        self._found = {}
        self._patched = []

    @property
    def found(self):
        """(how, holder, name, value, object, label) of each read: an attribute the object
        holds itself (the read gave that value) is looked up in its
        `__dict__` again, the rest (properties, names a class maps to
        others) by getattr."""
        out = []
        for obj, name, value in self._found.values():
            own = getattr(obj, "__dict__", None)
            if type(own) is dict and own.get(name, _MISSING) is value:
                out.append((IN_DICT, own, name, value, obj, f"{type(obj).__name__}.{name}"))
            else:
                out.append((BY_GETATTR, obj, name, value, obj, f"{type(obj).__name__}.{name}"))
        return out

    def __enter__(self):
        trace, objects, found, is_plain = tracer.active(), self._objects, self._found, self._is_plain
        classes = []
        for obj in objects.values():
            if type(obj) not in classes:
                classes.append(type(obj))
        for cls in classes:
            own, original = cls.__dict__.get("__getattribute__", _MISSING), cls.__getattribute__

            def getattribute(obj, name, original=original):
                value = original(obj, name)
                if id(obj) in objects and name[:2] != "__" and tracer.active() is trace and is_plain(value):
                    found.setdefault((id(obj), name), (obj, name, value))
                return value

            try:
                cls.__getattribute__ = getattribute
            except TypeError:  # a builtin or extension type
                continue
            self._patched.append((cls, own))
        return self

    def __exit__(self, *exc):
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
    """The plain objects `modules` keep as attributes (a config, a settings
    object), whose plain attribute values the code may read: objects of
    Python classes outside torch and d2s, not modules, tensors, functions,
    classes or containers."""
    seen, out = set(), []
    for module in modules:
        for value in vars(module).values():
            kind = type(value)
            package = (kind.__module__ or "").split(".")[0]
            if id(value) in seen or is_plain(value) or not hasattr(value, "__dict__") or callable(value) or \
                    package in ("torch", "d2s", "ops", "runtime", "numpy", "builtins") or \
                    isinstance(value, (torch.nn.Module, torch.Tensor, type, types.ModuleType)):
                continue
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
        else:
            try:
                now = getattr(holder, name)
            except AttributeError:
                now = _MISSING
        if now is not value and not same(now, value):
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
