"""Tensors a forward stores on its modules are program state.

Eager code may keep a tensor on a module between calls (`self.last = y`, a
cached RNN state `self.hidden = (h, c)`, attention weights kept for
plotting). While tracing, such a store puts a Variable there; left in
place, it would outlive its program. Instead, after the trace:

  - the stored value becomes an extra output of the program, and after
    every run the module attribute is set to its real tensor, as eager
    leaves it (`writes`);
  - the attribute gets its pre-trace value back until the first run;
  - a tensor the forward read from such an attribute (the previous call's
    state), or from any plain attribute of a module (`self.pe = torch.zeros(...)`
    set in `__init__`, a list of tensors), of a global (`global_reads`) or of
    an object of settings (`object_reads`), is read from the attribute at the
    start of every run, not from the object seen while tracing (`reads`):
    `net.pe = other` between calls is seen as eager sees it;
  - the attribute's kind (None, or a tensor's shape/dtype) is part of the
    cache key (`key`), so `if self.hidden is None:` takes the right path.

Before:   self.hidden = h           (a Variable left on the module)
After:    module.hidden = <tensor of this run>   after each run
"""

import contextlib
import sys
import types
import weakref

import torch

from ops.python_values import own_attributes
from runtime import output_tree
from runtime.errors import ConversionError, DecisionFailed
from runtime.ir import Variable

from .operators.effects import TORCH_MODULE_ATTRS, restore_dict


_BASES = ((dict, dict.values), (list, list.__iter__), (tuple, tuple.__iter__), (set, set.__iter__),
          (frozenset, frozenset.__iter__))


def _items(value):
    """The items (a dict's values) of a list, tuple, set or dict, or None.
    A subclass is read through its base class: its own methods are user
    code, which a walk of module state must not run (transformers' lazy
    mappings import modules in `values()`)."""
    for base, items in _BASES:
        if isinstance(value, base):
            return list(items(value))
    return None


def _variables(value):
    """The Variables in `value` (nested lists, tuples and dicts)."""
    if isinstance(value, Variable):
        yield value
    elif isinstance(value, (list, tuple, dict)):
        for item in _items(value):
            yield from _variables(item)


def _holds_variable(value):
    return next(_variables(value), None) is not None


def _holds_symbolic(value):
    """Whether `value` is a run-time size (torch.SymInt, ...) or a tuple holding one."""
    if isinstance(value, tuple):
        return any(_holds_symbolic(v) for v in value)
    return isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat))


def _made_in_a_block(value):
    """Whether a Variable in `value` was made in a branch or loop body."""
    return any(v.block.idx != 0 for v in _variables(value))


def _slots(module):
    """(dict, name, value) for the module's plain attributes and buffers."""
    for name, value in list(vars(module).items()):
        yield vars(module), name, value
    for name, value in list(module._buffers.items()):
        yield module._buffers, name, value


def snapshot(modules):
    # A TorchScript module's state lives in C++, where no graph value can go
    # (calling it with one is refused): nothing to put back.
    return [(m, dict(vars(m)), dict(m._buffers)) for m in modules if not isinstance(m, torch.jit.ScriptModule)]


@contextlib.contextmanager
def restored_on_error(before):
    """Around a trace: if it fails, `restore(before)`, after the restores
    the trace added to the list this yields (the Python objects it watched)."""
    undo = []
    try:
        yield undo
    except BaseException:
        for restore_more in reversed(undo):
            restore_more()
        restore(before)
        raise


def restore(before):
    """Put the modules' attributes and buffers back as `snapshot` found
    them: a conversion that fails leaves no graph value on a module."""
    for module, attrs, buffers in before:
        restore_dict(vars(module), attrs)
        restore_dict(module._buffers, buffers)


class StateWrite:
    def __init__(self, module, name, tree):
        self.module = weakref.ref(module)
        self.name = name
        self.tree = tree


def _ref(owner):
    """A weak reference to `owner`, or a strong one where it takes none
    (`types.SimpleNamespace`: a global's object lives as long as its module)."""
    try:
        return weakref.ref(owner)
    except TypeError:
        return lambda: owner


class StateRead:
    def __init__(self, module, name, index, var_name):
        self.module = _ref(module)
        self.name = name
        self.index = index  # which tensor of the attribute's value (`(h, c)`)
        self.var_name = var_name
        # Its tensor was a parameter or buffer of a module (`self.ws = [self.lin.weight]`),
        # which the program binds as that (`pin`): a run needs the attribute to hold it still.
        self.pinned = False


def collect(before, lifted, output_tree, fetch, constant_ok, locate=lambda name: (None, None)):
    """After a trace: the stores of Variables on modules (each store's value
    appended to `fetch` through `output_tree`), with the attributes restored,
    and the state reads among the `lifted` tensors (id -> var name): those of
    the stored attributes and of every plain attribute. A tensor made from
    no input, or a run-time size, is stored too when `constant_ok(module,
    name, value)` (the trace assigned it outside tensor `if`s and loops);
    else it is left for d2s/python_writes.py to refuse. `locate(name)`:
    (file, line) of the user's assignment of an attribute, for messages."""
    writes, reads = [], []
    for module, attrs, buffers in before:
        for where, name, value in _slots(module):
            old = (buffers if where is module._buffers else attrs).get(name, _MISSING)
            # A tensor made while tracing from no input (`torch.from_numpy(kernel)`,
            # kept by the first call) is a constant of the program, stored after
            # each run as eager stores it.
            # So is a size known only when the program runs (`self.n = x.shape[0]`
            # under an InputSpec): stored as the Python int eager stores.
            if not _holds_variable(value) and not ((type(value) is torch.Tensor or _holds_symbolic(value))
                                                   and value is not old and constant_ok(module, name, value)):
                continue
            if _made_in_a_block(value):
                # Made in a branch or loop body, it exists only there: the
                # program could not read it after the `if` or loop.
                if isinstance(value, dict) and name.startswith("_"):  # `_buffers`: name the buffer
                    name = next(k for k, v in value.items() if _made_in_a_block(v))
                raise ConversionError(
                    f"`{name}` of {type(module).__name__} is assigned inside an `if` or loop on a tensor, "
                    "through objects d2s does not walk (over 6 deep, or past the first 2000 the branch reaches): "
                    f"assign a local name there and `self.{name} = ...` after the `if` or loop", *locate(name))
            # A value eager has as a Python number (`c` after a tensor `if` that
            # set it to 1 or 2, `int(t)`, a size) is given back as one.
            writes.append(StateWrite(module, name, output_tree(value, fetch, numbers=True)))
            if old is _MISSING:
                del where[name]
            else:
                where[name] = old
                reads += _reads_of(module, name, old, lifted)
        written = {w.name for w in writes if w.module() is module}
        for name, value in attrs.items():
            if name not in written and name not in TORCH_MODULE_ATTRS:
                reads += _reads_of(module, name, value, lifted)
    return writes, reads


def global_reads(functions, lifted):
    """State reads of the tensors the trace lifted from globals of the
    `functions`' Python modules (`MEAN = torch.tensor(...)` at module
    level), so that `MEAN = other` between calls is seen as eager sees it
    (also where a module attribute holds the same tensor: `aliased`)."""
    reads = []
    for namespace in _namespaces(functions):
        module = sys.modules.get(namespace.get("__name__"))
        if getattr(module, "__dict__", None) is not namespace:  # not an imported module's globals
            continue
        reads += _tensor_reads(module, namespace, lifted)
    return reads


def object_reads(objects, lifted):
    """State reads of the tensors the trace lifted from attributes of the
    objects of settings it read (ops/attribute_reads.py AttributeReads: a
    global's object, a config a module keeps), so that `OBJ.t = other`
    between calls is seen as eager sees it."""
    reads = []
    for obj in objects:
        own = own_attributes(obj)
        if type(own) is not dict:
            continue
        reads += _tensor_reads(obj, own, lifted)
    return reads


def _tensor_reads(owner, attrs, lifted):
    """The state reads of `owner`'s attributes `attrs` (its namespace) that
    hold lifted tensors (a tensor, or a short list, tuple or dict of them)."""
    reads = []
    for name, value in list(attrs.items()):
        items = _items(value) if isinstance(value, (list, tuple, dict)) else None
        if isinstance(value, torch.Tensor) or (items is not None and len(items) <= 64):
            reads += _reads_of(owner, name, value, lifted)
    return reads


def plain_tensors(module):
    """(name, tensor) for the tensors the module keeps in its plain
    attributes: `pe` for `self.pe`, `table.1` for the second tensor of a
    list or dict `self.table`. The names the program gives them."""
    for name, value in list(vars(module).items()):
        if name in TORCH_MODULE_ATTRS:
            continue
        if isinstance(value, torch.Tensor):
            yield name, value
        else:
            for i, t in enumerate(_tensors(value)):
                yield f"{name}.{i}", t


def _reads_of(module, name, value, lifted):
    return [StateRead(module, name, i, lifted[id(t)]) for i, t in enumerate(_tensors(value)) if id(t) in lifted]


_MISSING = object()


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple, dict)):
        return [t for v in _items(value) for t in _tensors(v)]
    return []


def value_key(value):
    """What of a state attribute's value selects a program."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(value_key(v) for v in _items(value))
    if isinstance(value, dict):
        return ("dict",) + tuple((k, value_key(v)) for k, v in dict.items(value))
    return ("value", type(value).__name__)


def key(state_attrs):
    """The cache-key part for the (module ref, name) pairs known to hold state."""
    out = []
    for module_ref, name in state_attrs:
        module = module_ref()
        if module is not None:
            out.append((name, value_key(getattr(module, name, None))))
    return tuple(out)


def pin(reads, modules, lifted):
    """Mark the reads of a tensor that is a parameter or buffer of one of
    `modules` (lifted as `lifted[id(t)]`) held by another attribute (a
    list of weights, a plain attribute): the program binds that variable
    as the parameter, whose identity keys it. A buffer a forward writes is
    read from its own slot, and such a read binds it (`aliased` then)."""
    slots = {(id(m), name): lifted[id(t)] for m in modules for d in (m._parameters, m._buffers)
             for name, t in d.items() if t is not None and id(t) in lifted}
    own = {r.var_name for r in reads if slots.get((id(r.module()), r.name)) == r.var_name}
    registered = set(slots.values()) - own
    for read in reads:
        read.pinned = read.var_name in registered


def aliased(reads):
    """{var name: pinned} for the state reads a run checks: those of a
    variable several attributes give (they held one tensor when the trace
    read them, `self.b = self.a`, which the trace cannot tell apart, so the
    program has one variable for both), and the `pinned` ones."""
    seen, checked = set(), {}
    for read in reads:
        if read.pinned or read.var_name in seen:
            checked[read.var_name] = checked.get(read.var_name, False) or read.pinned
        seen.add(read.var_name)
    return checked


def refresh_reads(reads, bound, aliases=None):
    """Bind each state read to the tensor the attribute holds now. Reads
    `aliased` checks (its `aliases`) must still give one tensor (a pinned
    one: the parameter bound now): where they do not, the program would
    read one tensor for two, so the run fails its decision (DecisionFailed,
    before anything runs) and the call converts again (d2s/decisions.py)."""
    first = {}
    for read in reads:
        module = read.module()
        if module is None:
            continue
        values = _tensors(getattr(module, read.name, None))
        if read.index < len(values):
            value = values[read.index]
            pinned = aliases.get(read.var_name) if aliases else None
            if pinned is not None:
                held = first.setdefault(read.var_name, (read, bound[read.var_name] if pinned else value))
                if held[1] is not value:
                    was = f"the parameter or buffer `{read.var_name}`" if pinned else \
                        f"the tensor `{_label(held[0])}` holds"
                    raise DecisionFailed(f"module state `{_label(read)}` held {was} when the program was converted, "
                                         "and holds another tensor now", before_run=True)
            bound[read.var_name] = value


def aliases_hold(concrete):
    """Whether the attributes `concrete` reads as one variable hold one
    tensor now (`refresh_reads` would bind them), binding nothing."""
    try:
        refresh_reads(concrete.state_reads, dict(concrete.main_program.bound), concrete.state_aliases)
    except DecisionFailed:
        return False
    return True


def _label(read):
    owner = read.module()
    whole = isinstance(getattr(owner, read.name, None), torch.Tensor)
    kind = owner.__name__ if isinstance(owner, types.ModuleType) else type(owner).__name__
    return f"{kind}.{read.name}" + ("" if whole else f"[{read.index}]")


def carried(reads, writes):
    """(read var name, write tree leaf) for each state read that a write of
    the same attribute replaces after the run: the i-th tensor the attribute
    held before is the i-th tensor it holds after (as `refresh_reads` pairs
    them on the next call). The leaf is ("fetch", k), k into all of the
    program's fetches (the returned value's first: `return h` too)."""
    pairs = []
    for read in reads:
        write = _write_of(read, writes)
        if write is not None:
            leaves = _fetch_leaves(write.tree)
            if read.index < len(leaves):
                pairs.append((read.var_name, leaves[read.index]))
    return pairs


def _write_of(read, writes):
    """The write of the attribute `read` reads, or None."""
    return next((w for w in writes if w.name == read.name and w.module() is read.module()), None)


def refuse_carried(names, what, error=ValueError):
    """`error` when `names` (attributes, or a saved model's state updates)
    name state a program carries from one call to the next: `what` (an
    exported or inference model) keeps none between runs, so each run
    would start from the state at export."""
    if names:
        raise error(
            f"the program carries module state from one call to the next (`{names[0]}`: each call reads what "
            f"the previous one stored), which {what} does not keep between runs, so its later runs would differ "
            "from the model's later calls; save it with d2s.jit.save (which carries the state), or export a "
            "forward that takes the state as an input and returns the new state")


def carried_attributes(concrete):
    """`Class.name` of each module attribute whose state `concrete` carries
    from one call to the next (read at the start of a run, written after it)."""
    return [f"{type(r.module()).__name__}.{r.name}" for r in concrete.state_reads
            if _write_of(r, concrete.state_writes) is not None]


def _fetch_leaves(tree):
    tag, body = tree
    if tag == "fetch":
        return [tree]
    if tag in ("const", "number", "argument", "fresh"):  # (a saved program has no "argument" or "fresh")
        return []
    return [leaf for item in output_tree.children(tree) for leaf in _fetch_leaves(item)]


def apply_writes(writes, value_of):
    """Store each write's value, `value_of(tree)` (the tree rebuilt from a
    run's results)."""
    for write in writes:
        value = value_of(write.tree)  # (rebuilt even for a module gone: its memo may serve the returned value)
        module = write.module()
        if module is not None:
            setattr(module, write.name, value)


# -- Python state outside modules ----------------------------------------------------

def escaped_to_globals(functions, program):
    """(global name, module name) for each global of the converted
    `functions`' modules that holds a Variable of `program` after its trace:
    a tensor the code keeps in Python state between calls (`CACHE[k] = y`,
    `helper.buf = y`). A cached program cannot keep such state (a later call
    would recompute what eager reads back), and a later trace would read a
    Variable of this program as if it were its own."""
    found = []
    for namespace in _namespaces(functions):
        for name, value in list(namespace.items()):
            if _holds_own_variable(value, program, 3):
                found.append((name, namespace.get("__name__", "?")))
    return found


def _namespaces(functions):
    """The globals dicts of `functions`, each once."""
    seen = set()
    for fn in functions:
        namespace = getattr(fn, "__globals__", None)
        if namespace is not None and id(namespace) not in seen:
            seen.add(id(namespace))
            yield namespace


def _holds_own_variable(value, program, depth):
    if isinstance(value, Variable):
        return value.block.program is program
    if depth == 0:
        return False
    items = _items(value)
    if items is not None:
        return any(_holds_own_variable(v, program, depth - 1) for v in items)
    if isinstance(value, types.FunctionType):  # function attributes: `helper.buf = y`
        return any(_holds_own_variable(v, program, depth - 1) for v in list(vars(value).values()))
    return False
