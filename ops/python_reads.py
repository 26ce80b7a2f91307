"""What the user's code may read, found from the code itself, for
ops/python_values.py's check: the globals and closure cells of the user's
converted functions (`reads_of`), the constants their code reads from the
user's classes and other modules through `NAME.attr` (`chain_reads`:
`Defaults.SCALE`, `settings.SCALE`), and what they may read through `self`
of the user's modules beyond its plain attributes (`module_reads`: a list
it holds, its class's attributes). "May read": every name the code, and
the code nested in it, loads; more than a trace may have used, never fewer.
Libraries' globals, closures and class attributes are their constants and
are left out (`LIBRARIES`, site-packages).
"""

import dis
import sys
import types

from .python_values import IN_CELL, IN_DICT, MISSING, contents_of, is_data_object, noted_value


_names = {}  # code object -> the global names it and the code nested in it load


# Packages whose module globals and closure cells are their own constants
# (feature flags, a decorator's settings), not the user's values.
LIBRARIES = frozenset({"torch", "numpy", "d2s", "ops", "runtime", "functools", "collections", "typing",
                       "transformers", "timm", "torchvision", "accelerate", "einops"})


def library_code(fn, code):
    """Whether `fn` is an installed package's (its globals and cells are that
    package's constants) rather than the user's code."""
    if (getattr(fn, "__module__", None) or "").split(".")[0] in LIBRARIES:
        return True
    parts = code.co_filename.replace("\\", "/").split("/")
    return "site-packages" in parts or "dist-packages" in parts


def library_object(obj):
    """Whether a class or module is an installed package's (its attributes
    are that package's constants)."""
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None) or ""
    if name.split(".")[0] in LIBRARIES or name.split(".")[0] in sys.stdlib_module_names:
        return True  # (`math.pi` is no setting)
    module = sys.modules.get(name) if not isinstance(obj, types.ModuleType) else obj
    path = (getattr(module, "__file__", None) or "").replace("\\", "/").split("/")
    return "site-packages" in path or "dist-packages" in path


def defining_class(cls, name):
    """The class of `cls`'s MRO whose own namespace holds `name`, or None."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def bound_cell(cell):
    try:
        cell.cell_contents
    except ValueError:  # an empty cell: a name assigned later in the outer function
        return False
    return True


def global_names(code):
    names = _names.get(code)
    if names is None:
        found = []
        for ins in dis.get_instructions(code):
            if ins.opname == "LOAD_GLOBAL" and ins.argval not in found:
                found.append(ins.argval)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                found += [n for n in global_names(const) if n not in found]
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
        if code is None or namespace is None or library_code(fn, code):
            continue
        for name in global_names(code):
            value = namespace.get(name, MISSING)
            if value is MISSING or (id(namespace), name) in seen:
                continue
            noted = noted_value(value, is_plain)
            if noted is not MISSING:
                seen.add((id(namespace), name))
                reads.append((IN_DICT, namespace, name, noted, None, name))
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            if not bound_cell(cell) or id(cell) in seen:
                continue
            noted = noted_value(cell.cell_contents, is_plain)
            if noted is not MISSING:
                seen.add(id(cell))
                reads.append((IN_CELL, cell, name, noted, None, name))
    return reads


def attribute_chains(code):
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
                chains += attribute_chains(const)
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
        value, label = namespace.get(name, MISSING), name
        for attr in attrs:
            holder = _namespace_holding(value, attr)
            if holder is None:
                break
            value, label = holder.get(attr, MISSING), f"{label}.{attr}"
            noted = value if is_plain(value) else contents_of(value, is_plain)
            if noted is not None:
                reads.append((IN_DICT, holder, attr, noted, None, label))
                break
            if is_data_object(value, is_plain):
                objects.append(value)
                break
    return reads


def _namespace_holding(value, attr):
    """The namespace `value.attr` is read from when `value` is one of the
    user's modules or classes (the class of its MRO defining `attr`), else None."""
    if isinstance(value, types.ModuleType):
        return None if library_object(value) else vars(value)
    if isinstance(value, type) and not library_object(value):
        klass = defining_class(value, attr)
        if klass is not None and not library_object(klass):
            return vars(klass)
    return None


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
        if code is not None and not library_code(fn, code):
            names |= names_loaded(code)
    reads, seen = [], set()
    for module in modules:
        cls = type(module)
        if library_object(cls):
            continue
        own = vars(module)
        for name in names:
            contents = contents_of(own[name], is_plain) if name in own and not is_plain(own[name]) else None
            if contents is not None:
                reads.append((IN_DICT, own, name, contents, None, f"{cls.__name__}.{name}"))
            klass = defining_class(cls, name) if name not in own and name[:2] != "__" else None
            if klass is None or library_object(klass) or (id(klass), name) in seen:
                continue
            value = vars(klass)[name]
            noted = value if is_plain(value) else contents_of(value, is_plain)
            if noted is not None:
                seen.add((id(klass), name))
                reads.append((IN_DICT, vars(klass), name, noted, None, f"{klass.__name__}.{name}"))
    return reads


def names_loaded(code):
    """The names `code` and the code nested in it (comprehensions, inner
    functions) load: globals, attributes, methods."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= names_loaded(const)
    return names
