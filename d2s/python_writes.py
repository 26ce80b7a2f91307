"""Python objects that outlive a declarative call, written while it was
traced: the lists, dicts and plain objects of its arguments, and those of
the globals and closure cells its code reads.

A program replays tensor ops, not Python. A write the trace makes to such
an object happens once, while the program is built, and never when it
runs: eager code counting its calls in a global dict counts every call, a
program one; and the lists and dicts of the arguments are copies given to
the trace, so the caller's never change at all. Neither can be replayed
exactly on a later call (the value written may depend on what the object
held then, which the program never sees), so such a write is refused at its
line, naming the object as the user wrote it, and every object is put back
as it was before the trace. (Writes to a module's attributes are
d2s/module_state.py's; objects the function makes itself are its own, and
their writes under tensor control flow are staged by
d2s/operators/effects.py.)

Before:  COUNTS["calls"] += 1          # in a declarative function
After:   ConversionError at that line: `COUNTS['calls']` (a global of the
         function's module) is written ...
"""

import ast
import collections.abc
import contextlib
import inspect
import textwrap
import types
import warnings
import weakref

import torch

from ops import tracer
from ops.python_reads import library_code, names_loaded
from ops.python_values import has_attributes
from runtime.errors import ConversionError

from . import input_trees, module_watch
from .operators.effects import _MISSING, OTHER_CONTAINERS, TORCH_MODULE_ATTRS, Effects, Slot, cell_bound, restore_dict
from .output_types import holds_variable

_LIBRARIES = frozenset({"torch", "numpy", "d2s", "ops", "runtime", "functools", "collections", "builtins",
                        "typing", "transformers", "timm", "torchvision", "logging"})
_MAX_FUNCTIONS = 64  # helpers followed from the function (a walk this large is a library's, not a model's)
_CONTAINERS = (list, dict, tuple)
# What a write may change besides plain objects: these and their subclasses
# (a set, a deque, an OrderedDict; d2s/operators/effects.py "contents").
_WRITABLE = (list, tuple) + OTHER_CONTAINERS


class Watch:
    """What the objects a trace can reach held before it: `roots` are
    (user name, where, object), where is "argument", "global", "closure" or
    "module"; `modules` are (user name, module) for the user's modules,
    whose Python attributes (not tensors: module_state's) are compared.
    While `recording`, it also sees each plain value assigned to a module
    attribute (module_watch), and where: a write the trace made outside
    every tensor branch and loop body, of a plain value, is the same for
    every run of the program and is replayed after each (`refuse_written`).
    `reached`: every value the arguments, globals, cells and modules hold,
    among which `iterators` are found."""

    def __init__(self, roots, functions, modules=(), reached=(), located=None, classes=()):
        self.where = {name: where for name, where, _ in roots}
        # The user's classes the code can reach (its modules' and the globals it
        # names): `type(self).calls += 1` changes what every instance shares.
        self.classes = [(name, cls, (_class_attrs(cls), _class_attrs(cls, seen=True))) for name, cls in classes]
        self.functions = functions
        self.modules = [(name, m, _own_attrs(m)) for name, m in modules]
        for name, m, attrs in self.modules:
            self.where[_root_name(name)] = "module"
            roots = roots + [(f"{name}.{k}", "module", v) for k, v in attrs.items() if _watched(v)]
        self.values = [value for _, _, value in roots]  # (what ops/attribute_reads.py follows reads of)
        # Drawing from them is refused: `next()` and `for` at the user's line
        # (d2s/operators/for_loops.py), any other draw after the trace (`_refuse_drawn`).
        self.iterators = iterators(reached)
        self._positions = {key: position(it) for key, (_, it) in self.iterators.items()}
        # `located`: the arguments' first steps (("arg", i), ("kwarg", k)), so the objects they
        # reach are found again on a later call (`take_argument_writes`).
        self.effects = Effects((), roots=[(name, value) for name, _, value in roots], located=located)
        self.function_attrs = [(fn, dict(vars(fn))) for fn in functions]  # `f.cache = ...`: see `undo`
        self._tracer = tracer.active()
        self._module_ids = {id(m) for _, m, _ in self.modules}
        self._seen, self._branched = {}, set()  # (id(module), name) -> the last value written; those under a branch

    def add_function(self, fn):
        """Watch the globals and closure cells of `fn` too: a function the
        trace converts that the walk before it did not reach (a helper
        passed as an argument or held by an object), saved as they are when
        the trace first calls it. An installed package's functions are left:
        their globals are that package's own (its registries and caches)."""
        if fn in self.functions or library_code(fn, fn.__code__):
            return
        self.functions.append(fn)
        named = list(_names_of(fn))
        roots = [(name, where, value) for name, where, value in named if name not in self.where and _watched(value)]
        self.where.update((_root_name(name), where) for name, where, _ in roots)
        self.effects.add([(name, value) for name, _, value in roots])
        # Its iterators too: a draw from one is refused as from the function's own.
        found = {key: item for key, item in iterators([(name, value) for name, _, value in named]).items()
                 if key not in self.iterators}
        self.iterators.update(found)
        self._positions.update((key, position(it)) for key, (_, it) in found.items())

    @contextlib.contextmanager
    def recording(self):
        module_watch._attribute_writes.append(self._record)
        try:
            yield
        finally:
            module_watch._attribute_writes.remove(self._record)

    def _record(self, module, name, value):
        if tracer.active() is not self._tracer:
            return
        key = (id(module), name)
        self._seen[key] = value
        d = vars(module)
        if not any(name in d.get(registry, ()) for registry in ("_parameters", "_buffers", "_modules")):
            self._tracer.log_write(d, name)  # (a trace rolled back, a rejected `a and b()`, takes it back)
        # Under a tensor `if` or loop (a block of its own) every path is
        # traced: a write that changes the value happens on some paths only.
        if self._tracer.block.idx != 0 and not module_watch.same_plain_value(vars(module).get(name, _MISSING),
                                                                            value):
            self._branched.add(key)

    def constant_ok(self, module, name, value):
        """Whether the trace assigned `value` (a tensor made from no input)
        to `module.name` last, outside tensor `if`s and loops: the same
        constant for every run of the program (d2s/module_state.py stores it)."""
        key = (id(module), name)
        return key in self._seen and self._seen[key] is value and key not in self._branched
    def take_argument_writes(self):
        """(slot, its value after the trace, steps to its object from the
        call's arguments, (file, line) that wrote it) for each slot of an object reached from an
        argument (not through a module: module_state's) that the trace
        wrote; each is put back as it was (the caller's object is written by
        the program's runs: d2s/argument_writes.py)."""
        located = self.effects.located
        taken = [(slot, slot.get(), located[id(slot.obj)], self.write_line(slot.name, slot))
                 for slot in self.effects.written() if id(slot.obj) in located]
        by_steps = {located[id(obj)]: obj for _, obj, _, _ in self.effects.saved if id(obj) in located}
        for slot, _, steps, _ in taken:
            slot.set(self.effects.old_value(slot))
            # Objects of these classes are keyed by their structure from now on (d2s/input_trees.py).
            for i in range(1, len(steps) + 1):
                obj = by_steps.get(steps[:i])
                if obj is not None and type(obj) not in (list, dict) and has_attributes(obj):
                    input_trees.WRITTEN_CLASSES.add(type(obj))
        return taken

    def written(self):
        """Slots the trace wrote: module attributes first, then the objects."""
        slots = []
        for name, m, before in self.modules:
            now = _own_attrs(m)
            slots += [Slot(m, "attr", k, f"{name}.{k}") for k in list(now) + [k for k in before if k not in now]
                      if now.get(k, _MISSING) is not before.get(k, _MISSING)
                      and not holds_variable(vars(m).get(k))]  # (a graph value kept: module_state's)
        for name, cls, (_, before) in self.classes:
            now = _class_attrs(cls, seen=True)
            slots += [Slot(cls, "attr", k, f"{name}.{k}") for k in list(now) + [k for k in before if k not in now]
                      if now.get(k, _MISSING) is not before.get(k, _MISSING)]
        return slots + self.effects.written()

    def restore(self):
        for _, cls, (before, seen) in self.classes:
            now = _class_attrs(cls)
            # (A new attribute holding what the class showed there already changed nothing.)
            for k in [k for k in now if k not in before and seen.get(k, _MISSING) is not now[k]]:
                delattr(cls, k)
            for k, v in before.items():
                if now.get(k, _MISSING) is not v:
                    setattr(cls, k, v)
        for _, m, before in self.modules:
            for k, v in list(_own_attrs(m).items()):
                if before.get(k, _MISSING) is not v and not holds_variable(v):
                    del vars(m)[k]
            vars(m).update({k: v for k, v in before.items() if vars(m).get(k, _MISSING) is not v})
        self.effects.restore()

    def attribute_line(self, name):
        """(file, line) of the statement of the traced functions that assigns
        an attribute `name` (`self.inner.memory = h`), for messages."""
        return _write_line(self.functions, Slot(None, "attr", name, name), "self")

    def write_line(self, name, slot=None):
        """(file, line) of the statement of the traced functions that writes
        `name` (`cache.keys`, the slot's name) or, without a `slot`, any
        part of the object `name` names, for messages."""
        return _write_line(self.functions, slot or Slot(None, "attr", None, name), _root_name(name))

    def undo(self):
        """After a failed conversion: `restore`, and the attributes of the
        user's functions too (`_buffer.buf = x * 3`), so that no graph value
        is left where the next call looks."""
        self.restore()
        for fn, before in self.function_attrs:
            restore_dict(vars(fn), before)

    def refuse_written(self, qualname):
        """Raise ConversionError for the first object the trace wrote that a
        program cannot write again when it runs (after putting every object
        back). Else put the module attributes it wrote back as they were,
        and return those writes, (module, name, value, the value before),
        for the program to replay after each run (`replay`)."""
        slots = self.written()
        replays = [slot for slot in slots if self._replayable(slot)]
        refused = [slot for slot in slots if slot not in replays]
        before = {id(m): b for _, m, b in self.modules}
        writes = [(weakref.ref(slot.obj), slot.key, slot.get(), before.get(id(slot.obj), {}).get(slot.key, _MISSING))
                  for slot in replays]
        self.restore()
        self._refuse_drawn(qualname)
        if refused:
            self._refuse(qualname, refused[0])
        return writes

    def _refuse_drawn(self, qualname):
        """Raise ConversionError when the trace drew from an iterator that
        outlives the call other than by `next()` or `for` (refused where they
        stand): `list(batches)`, `zip(names, batches)`. The program would hold
        what was drawn while it was built."""
        for key, (name, it) in self.iterators.items():
            before = self._positions[key]
            if before is not None and position(it) != before:
                code = self.functions[0].__code__
                raise ConversionError(
                    f"`{qualname}` draws from `{name}`, a {type(it).__name__} that outlives the call: the program "
                    "would hold what it drew while it was built and repeat it on every run, where eager code draws "
                    "again on every call; draw outside the declarative function and pass the values as arguments",
                    code.co_filename, code.co_firstlineno)

    def _replayable(self, slot):
        """A plain value the trace assigned to a module attribute, last
        through `nn.Module.__setattr__` (which `_record` saw), outside every
        tensor branch and loop (or giving the value it already held)."""
        key = (id(slot.obj), slot.key)
        value = slot.get()
        return id(slot.obj) in self._module_ids and slot.kind == "attr" and module_watch.is_plain_value(value) \
            and key in self._seen and module_watch.same_plain_value(self._seen[key], value) \
            and key not in self._branched

    def _refuse(self, qualname, slot):
        root = _root_name(slot.name)
        where = self.where.get(root, "argument")
        filename, lineno = _write_line(self.functions, slot, root)
        if (id(slot.obj), slot.key) in self._branched:
            raise ConversionError(
                f"`{qualname}` assigns `{slot.name}` a Python value or a tensor made from no input inside an "
                "`if` or loop on a tensor (or an operand of `and`/`or` on one): the program runs one path per "
                "call, but every path was traced, so "
                "no one value is right after every run; assign a local name there and "
                f"`{slot.name} = name` after the `if` or loop (the program then carries it)",
                filename, lineno)
        if isinstance(slot.obj, type):
            raise ConversionError(
                f"`{qualname}` writes `{slot.name}`, an attribute of the class `{slot.obj.__qualname__}` (shared by "
                "its instances): "
                "the program would change it once, while it is built, and never when it runs (eager changes it on "
                "every call); keep the state on the instance (`self.calls += 1`: d2s carries a module's "
                "attributes across calls), or change it outside the declarative function", filename, lineno)
        what = {"argument": f"reached from the argument `{root}`", "global": f"reached from the global `{root}`",
                "closure": f"reached from `{root}` of an enclosing function",
                "module": f"a Python value (not a tensor) reached from the module `{root}`"}[where]
        copies = " (the trace wrote into a copy: the caller's object never changed)" \
            if where == "argument" and isinstance(slot.obj, (list, dict)) else ""
        raise ConversionError(
            f"`{qualname}` writes `{slot.name}`, {what}{copies}: a Python object that outlives the call is "
            "changed once, while the program is built, and never when it runs (eager changes it on every "
            "call); return the new value and assign it in the caller, or keep tensor state on the module "
            "(`self.x = ...`, carried across calls)", filename, lineno)


def replay(writes):
    """Assign the module attributes a program's trace wrote ((module
    reference, name, value, value before), `refuse_written`), as each eager
    call does; an attribute already holding its value is left (no needless
    new key)."""
    for ref, name, value, _ in writes:
        module = ref()
        if module is not None and not module_watch.same_plain_value(vars(module).get(name, _MISSING), value):
            setattr(module, name, value)


def refuse_saving(writes, what):
    """ValueError when the trace changed a module's Python value (`writes`,
    `refuse_written`'s): `self.calls += 1`, a flag set on the first call.
    The program was converted for the value before, and the next call
    takes another program; a saved or exported model would repeat this
    call's on every run (its value frozen)."""
    for ref, name, value, old in writes:
        module = ref()
        if module is not None and not module_watch.same_plain_value(old, value):
            raise ValueError(
                f"{what}: the forward changes `{type(module).__name__}.{name}`, a Python value, on the call it was "
                f"converted for ({_shown(old)} to {_shown(value)}), so each such call takes another program, and a "
                "saved or exported model would repeat this one's on every run; keep the value in a tensor (a buffer), "
                "change it outside the forward, or call the model once more first if it settles (a flag set on "
                "the first call)")


def _shown(value):
    if value is _MISSING:
        return "unset"
    if isinstance(value, torch.Tensor):
        return "a tensor"
    return f"{value!r:.40}"


def watch(function, args, kwargs, arg_names, instance=None):
    """A Watch over the arguments the trace gets (`args`, `kwargs`: the
    values passed to the function), the closure cells of `function` and of
    the helpers its code calls, the globals their code reads, and the
    Python attributes of the user's modules among `instance` and the
    arguments (with their submodules)."""
    named = [(arg_names[i] if i < len(arg_names) else f"args[{i}]", v) for i, v in enumerate(args)]
    located = {name: ("arg", i) for i, (name, _) in enumerate(named)}
    located.update((k, ("kwarg", k)) for k in kwargs)
    named += list(kwargs.items())
    roots = [(name, "argument", v) for name, v in named]
    modules = [(f"{name}.{sub}" if sub else name, m) for name, top in [("self", instance)] + named
               if isinstance(top, torch.nn.Module) for sub, m in top.named_modules() if _user_code(type(m))]
    functions = _functions(function, instance)
    classes = {}
    for _, m in modules:
        for cls in type(m).__mro__:
            if _user_code(cls) and cls not in classes:
                classes[cls] = cls.__qualname__
    taken = {name for name, _, _ in roots}
    reached = named + [(f"{name}.{k}", v) for name, m in modules for k, v in _own_attrs(m).items()]
    for fn in functions:
        for name, where, value in _names_of(fn):
            reached.append((name, value))
            if name not in taken and _watched(value):
                taken.add(name)
                roots.append((name, where, value))
            if where == "global" and isinstance(value, type) and _user_code(value):
                classes.setdefault(value, name)
    return Watch(roots, functions, modules, reached, located, [(name, cls) for cls, name in classes.items()])


def _names_of(fn):
    """(user name, "closure" or "global", value) of the bound closure cells
    of `fn` and the globals its code names; for a global that is a class
    of the user's, the containers it keeps as class attributes too
    (`Registry.cache`, filled through the class)."""
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        if cell_bound(cell):
            yield name, "closure", cell.cell_contents
    namespace = fn.__globals__
    for name in names_loaded(code):
        if name not in namespace:
            continue
        value = namespace[name]
        yield name, "global", value
        if isinstance(value, type) and _user_code(value):
            for attr, held in list(vars(value).items()):
                if isinstance(held, _WRITABLE):
                    yield f"{name}.{attr}", "global", held


def iterators(named, depth=0):
    """id -> (user name, iterator) of the iterators among `named` ((user
    name, value) pairs: a Watch's `reached`) and in the lists, tuples and
    dicts among them: objects whose state a draw changes that no walk of
    contents can see."""
    found = {}
    for name, value in named:
        if isinstance(value, collections.abc.Iterator):
            found[id(value)] = (name, value)
        elif type(value) in _CONTAINERS and depth < 2 and len(value) <= 64:
            items = value.items() if type(value) is dict else enumerate(value)
            found.update(iterators([(f"{name}[{k!r}]", v) for k, v in items], depth + 1))
    return found


def position(iterator):
    """What a draw from `iterator` changes, as far as Python shows it: a
    generator's frame (where it stopped, its locals), otherwise the state
    its `__reduce__` gives (a list iterator's index, `count()`'s next
    number); plain values by value, other objects by identity. None when
    neither tells (a draw from such an iterator goes unseen)."""
    if isinstance(iterator, types.GeneratorType):
        frame = iterator.gi_frame
        return "done" if frame is None else (frame.f_lasti, _state(tuple(frame.f_locals.values())))
    try:
        with warnings.catch_warnings():  # itertools' __reduce__ is deprecated from Python 3.12
            warnings.simplefilter("ignore", DeprecationWarning)
            return _state(iterator.__reduce__())
    except Exception:  # noqa: BLE001 - an iterator that cannot say: unseen
        return None


def _state(value, depth=0):
    # `__reduce__` makes new objects on every call (a range, the list of a
    # dict iterator's remaining items): those compare by what they hold.
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value
    if type(value) is range:
        return ("range", value.start, value.stop, value.step)
    if type(value) in (tuple, list) and depth < 3:
        return (type(value).__name__, tuple(_state(v, depth + 1) for v in value))
    return ("id", id(value))


def _class_attrs(cls, seen=False):
    """A class's own attributes that hold data, not behaviour: neither
    dunders nor functions, methods or descriptors (a class's containers
    are watched as globals: `_names_of`); with `seen`, those of its bases
    too, as `cls.name` finds them (a declarative module's class is a
    subclass of the user's, d2s/module_call.py: `type(self).scale =
    type(self).scale` gives it an attribute of its own with the value it
    saw, no change)."""
    classes = reversed(cls.__mro__) if seen else (cls,)
    return {k: v for c in classes if c is cls or _user_code(c) for k, v in vars(c).items()
            if not (k.startswith("__") and k.endswith("__")) and not callable(v) and not hasattr(v, "__get__")}


def _own_attrs(module):
    """A module's own attributes that are neither torch's (`training`,
    `_parameters`, ...) nor modules: what `restore` puts back."""
    return {k: v for k, v in vars(module).items() if k not in TORCH_MODULE_ATTRS and not isinstance(v, torch.nn.Module)}


def _watched(value):
    """Values whose contents the walk compares: containers and the user's plain objects."""
    if isinstance(value, _WRITABLE):
        return True
    package = (type(value).__module__ or "").split(".")[0]
    return has_attributes(value) and not callable(value) and package not in _LIBRARIES \
        and not isinstance(value, (types.ModuleType, torch.nn.Module, torch.Tensor, type))


def _functions(function, instance):
    """`function` and the user's functions it reaches: globals its code
    names, functions it closes over, methods of the instance's class."""
    todo = [getattr(function, "__func__", function)]
    if instance is not None:
        for cls in type(instance).__mro__:
            if _user_code(cls):
                todo += [v.__func__ if isinstance(v, (staticmethod, classmethod)) else v for v in vars(cls).values()]
    found, seen = [], set()
    while todo and len(found) < _MAX_FUNCTIONS:
        fn = todo.pop(0)  # (a decorator's wrapper reaches what it wraps through its closure)
        fn = getattr(fn, "__func__", fn) if isinstance(fn, types.MethodType) else fn
        if not isinstance(fn, types.FunctionType) or id(fn) in seen or not _user_code(fn):
            continue
        seen.add(id(fn))
        found.append(fn)
        todo += [fn.__globals__.get(n) for n in names_loaded(fn.__code__)]
        todo += [c.cell_contents for c in fn.__closure__ or () if cell_bound(c)]
    return found


def _user_code(obj):
    return (getattr(obj, "__module__", None) or "").split(".")[0] not in _LIBRARIES


def _root_name(name):
    for i, ch in enumerate(name):
        if ch in ".[":
            return name[:i]
    return name


_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "sort",
                       "reverse", "popitem", "__setitem__", "__delitem__", "__setattr__",
                       # sets, deques, OrderedDicts
                       "add", "discard", "difference_update", "intersection_update",
                       "symmetric_difference_update", "appendleft", "extendleft", "popleft", "rotate",
                       "move_to_end"})


def _write_line(functions, slot, root):
    """(file, line) of the first statement of `functions` that may make the
    write of `slot`: one under `root` that writes the slot's attribute;
    else (a helper's parameter names the object otherwise: `self.keys = k`
    for `cache.layers[0].keys`) an assignment to an attribute of the slot's
    name; else an assignment to an attribute or item under `root`, or a
    mutating method call on it; the first function's own line when none is
    found."""
    trees = []
    for fn in functions:
        try:
            lines, first = inspect.getsourcelines(fn)
            trees.append((fn, first, ast.parse(textwrap.dedent("".join(lines)))))
        except (OSError, TypeError, SyntaxError):
            continue
    # A constructor's assignments (`self.c = 0`) are not the trace's: searched after the rest.
    for group in ([t for t in trees if t[0].__name__ != "__init__"], [t for t in trees if t[0].__name__ == "__init__"]):
        for test in (lambda node: _writes(node, root) and _writes_attr(node, slot, True),
                     lambda node: _writes_attr(node, slot), lambda node: _writes(node, root)):
            for fn, first, tree in group:
                for node in ast.walk(tree):
                    if test(node):
                        return fn.__code__.co_filename, first + node.lineno - 1
    code = getattr(functions[0], "__code__", None) if functions else None
    return (code.co_filename, code.co_firstlineno) if code else (None, None)


def _targets(node):
    if isinstance(node, (ast.Assign, ast.Delete)):
        return node.targets
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def _writes(node, root):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
        return _root_of(node.func.value) == root
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
        return bool(node.args) and _root_of(node.args[0]) == root
    return any(isinstance(sub, (ast.Attribute, ast.Subscript)) and isinstance(sub.ctx, (ast.Store, ast.Del))
               and _root_of(sub) == root for target in _targets(node) for sub in ast.walk(target))


def _writes_attr(node, slot, calls=False):
    if calls and isinstance(node, ast.Call):  # a mutating call on the slot's own value (`self.hist.append`)
        return isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Attribute) and \
            node.func.value.attr == _last_part(slot.name)
    return slot.kind == "attr" and any(
        isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del)) and sub.attr == slot.key
        for target in _targets(node) for sub in ast.walk(target))


def _last_part(name):
    return name.rsplit(".", 1)[-1]


def _root_of(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None
