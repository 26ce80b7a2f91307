"""What the user's code reads while a trace runs, seen as it happens, for
ops/python_values.py's check: the attributes of objects of settings (a
transformers config, an argparse Namespace, a dataclass, the user's own;
`AttributeReads`) and the values of an optimizer's param groups
(`GroupReads`). The objects followed are those the traced modules, the
call's arguments, and the globals and closure cells of the user's functions
hold, and the objects of settings read from those.
"""

import types

import torch

from . import tracer
from .python_reads import (attribute_chains, bound_cell, chain_reads, defining_class, global_names, library_code,
                           library_object)
from .python_values import (BY_GETATTR, IN_DICT, MAX_ITEMS, MISSING, Contents, is_data_object, noted_value,
                            own_attributes)
from .user_frames import error_at_user_line


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
            owner = None if type(value) is Contents else obj
            klass = None if type(own) is dict and name in own else defining_class(type(obj), name)
            if type(own) is dict and same_object(own.get(name, MISSING)):
                out.append((IN_DICT, own, name, value, owner, label))
            elif klass is not None and not library_object(klass) and same_object(vars(klass)[name]):
                # A class attribute (`Options.SCALE` read as `options.SCALE`): writing it
                # is no write to the object, so it is compared on every call.
                out.append((IN_DICT, vars(klass), name, value, None, f"{klass.__name__}.{name}"))
            elif self._is_plain(value) or type(value) is Contents or (
                    klass is not None and type(vars(klass)[name]) is types.MemberDescriptorType):
                out.append((BY_GETATTR, obj, name, value, owner, label))
            # (else a value compared by identity that a property made: another object at every read;
            # one a `__slots__` slot holds is the object's own, as in a `__dict__`)
        out += self._chain_reads
        for obj in self._unpatched:
            own, kind = own_attributes(obj), type(obj).__name__
            for name, value in list(own.items()):
                noted = noted_value(value, self._is_plain)
                if noted is not MISSING and type(name) is str:
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
        if code is None or namespace is None or library_code(fn, code) or id(code) in self._functions:
            return
        self._functions.add(id(code))
        objects = [namespace.get(name) for name in global_names(code)]
        objects += [c.cell_contents for c in fn.__closure__ or () if bound_cell(c)]
        self._chain_reads += chain_reads(namespace, attribute_chains(code), self._is_plain, objects)
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
                if len(items) <= MAX_ITEMS:
                    self.add(list(items), depth + 1)
            elif id(value) not in self._objects and is_data_object(value, self._is_plain):
                self._objects[id(value)] = value
                if not self._patch(type(value)):
                    self._unpatched.append(value)
                    self.add(list(own_attributes(value).values()), depth + 1)

    def _note(self, obj, name, value):
        noted = noted_value(value, self._is_plain)
        if noted is not MISSING:
            self._found.setdefault((id(obj), name), (obj, name, noted, lambda now, v=value: now is v))
        if noted is value and not self._is_plain(value):
            self.add([value])  # (an object of settings read from one: `config.text_config`)

    def _patch(self, cls):
        """Put the noting `__getattribute__` on `cls`; False when it cannot have one."""
        if cls in self._classes:
            return True
        own, original = cls.__dict__.get("__getattribute__", MISSING), cls.__getattribute__
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
            if own is MISSING:
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
        value = dict.get(self, key, MISSING)
        if value is MISSING:
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
        values += [namespace.get(name) for name in global_names(code)]
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
