"""The op table: every op type a program may contain, defined once.

`runtime` owns the structure and reads it (the executor compiles ops from it,
`verify` and the loader check op types against it, `io` prunes by its
effects); `ops` fills it when imported. So `runtime` never imports `ops`.

An `OpDef` holds, side by side, what the rest of the system needs to know
about one op type:
  - `kernel`: the PyTorch callable that runs it;
  - `emit`: how the executor lowers it to Python (`emit(op, ctx)` returns
    `ast` statements); call-style ops share one emitter;
  - `infer`: the outputs' shapes for a kernel whose output sizes depend on
    its inputs' values (`infer(inputs, args, kwargs, tracer)`, returning
    ops.infer.Meta, or None for the forms the stand-in run infers: see
    ops/packed_sequences.py); None: the kernel runs on stand-in tensors;
  - `aten`: the canonical ATen operator the op calls, by the name of its
    overload packet (`torch.ops.aten.<aten>`): the op's arguments are that
    operator's, read as torch's Python binding reads them. `torch.add`,
    `x.add` and `x + y` are all "add". Backend tables (native segments,
    the `inplace` pass, runtime/aten.py's facts) are keyed by it, so an op
    reaches a backend by what it computes, not by how it was spelled. None
    when no one ATen operator takes the same arguments (`x.__rpow__(2)`,
    `F.embedding`, whose padding_idx means something else);
  - `wrapper`: for a Python function that forwards to `aten` (`F.relu`,
    `F.softmax`): its own parameters, and the values of those the ATen
    operator does not take under which the call is exactly the operator's
    (see `Wrapper`);
  - `inputs`/`outputs`/`attrs`: the slot and attribute schema;
    `var_attrs`: the attributes that name variables (a name or a list of
    names: a cond's `true_outs`, a while's `loop_vars`), which passes
    rename and read as uses (runtime/effects.py); no other attribute string
    is ever taken for a name;
  - effects, read through `pure` / `writes_tensor` and, for one op in a
    program, runtime/effects.py by every pass, by pruning and by the
    translator (never spelled out again elsewhere):
      `mutates`: writes its first input in place (`x.add_(1)`, `x[i] = v`,
        an optimizer update, an append to a tensor array);
      `random`: draws from the global generator (read it as a truth value:
        it may be a `FirstUse`);
      `side_effect`: acts on something no output holds (prints, checks,
        `.grad`, running statistics torch writes without saying so);
      `new_object`: each call returns a new mutable object (a tensor
        array's list): two calls are never interchangeable, so no pass
        merges, hoists or reuses one;
      `training_only`: backward and optimizer ops, dropped by
        `Program.clone(for_test=True)` and by saving;
  - what else passes and the loader need to know:
      `factory`: makes a tensor from sizes alone (`torch.zeros`): recorded
        even with no Variable argument;
      `size_check`: checks assumed input sizes (pruning keeps it with the
        feeds it reads);
      `scope_init`: copies a module's tensor into the scope at startup;
      `takes_python_ints`: its kernel takes the Python ints the `scalars`
        pass makes;
      `live_object`: names the live Python object it runs (a custom
        autograd Function), which a saved program cannot hold;
      `internal`: made by passes, never traced or saved; such ops live in a
        table of their own that the loader's allowlist does not include.

The table is the allowlist: a loaded program may only name op types in it,
so nothing outside this table can ever be called.
"""

from dataclasses import dataclass, replace
from typing import Callable, Optional


ANY = object()  # `Wrapper.fixed`: any value of this parameter gives the ATen call


@dataclass(frozen=True)
class Wrapper:
    """A Python function's call as its ATen operator's (`OpDef.aten`):
    `params`/`defaults` bind the call's arguments by the function's own
    signature; each parameter in `fixed` must hold that value (or any, for
    ANY) and is then dropped; the rest are the operator's, by name."""

    params: tuple
    defaults: tuple = ()
    fixed: tuple = ()  # (name, value) pairs


class FirstUse:
    """A flag computed when first asked (`bool(flag)`): for what costs a
    lookup per op to know (whether torch's native schemas of an op take a
    generator: ~40 ms of CPU for the whole table at import) but is asked
    only of the ops a program contains."""

    __slots__ = ("_compute", "_args", "_value")

    def __init__(self, compute, *args):
        self._compute, self._args, self._value = compute, args, None

    def __bool__(self):
        if self._value is None:
            self._value = bool(self._compute(*self._args))
            self._args = ()
        return self._value

    def __repr__(self):
        return repr(bool(self))


@dataclass
class OpDef:
    type: str
    kernel: Optional[Callable] = None
    emit: Optional[Callable] = None
    infer: Optional[Callable] = None
    aten: Optional[str] = None
    wrapper: Optional[Wrapper] = None
    inputs: tuple = ("X",)
    outputs: tuple = ("Out",)
    attrs: tuple = ()
    var_attrs: tuple = ()
    mutates: bool = False
    random: bool = False  # or a FirstUse
    side_effect: bool = False
    new_object: bool = False
    training_only: bool = False
    factory: bool = False
    size_check: bool = False
    scope_init: bool = False
    takes_python_ints: bool = False
    live_object: Optional[str] = None
    internal: bool = False
    # (args, kwargs) -> a complaint or None: the values of a call the kernel
    # takes from a closed set (a clock's name), checked when a file is loaded
    # so that a bad one is refused before anything runs.
    check_args: Optional[Callable] = None

    @property
    def canonical(self):
        """The key backend tables use: the ATen operator, or for an op that
        calls none with the same arguments, its own type."""
        return self.aten or self.type

    @property
    def pure(self):
        """Nothing observes it but its outputs: it may be dropped when they
        are unused, merged with an equal op, or run once for many."""
        return not (self.mutates or self.random or self.side_effect or self.training_only)

    @property
    def writes_tensor(self):
        """It writes a tensor in place, which a view of it may share (an
        append to a tensor array writes a Python list, which no view shares)."""
        return self.mutates and self.type != "array_append"


_OPS = {}
_INTERNAL = {}  # ops made by passes: compiled like the others, never named by a loaded program
_BY_CALLABLE = {}


def register(opdef, *callables):
    """Add `opdef`; `callables` are the Python objects (e.g. `torch.add`)
    whose calls on Variables are recorded as this op type."""
    if opdef.type in _OPS or opdef.type in _INTERNAL:
        raise ValueError(f"op type {opdef.type!r} is registered twice")
    if opdef.internal:
        if callables:
            raise ValueError(f"internal op type {opdef.type!r} records no calls")
        _INTERNAL[opdef.type] = opdef
        return opdef
    _OPS[opdef.type] = opdef
    for fn in callables:
        _BY_CALLABLE.setdefault(callable_key(fn), opdef)
    return opdef


def callable_key(fn):
    """Callables compare by value (a property's `__get__` is a new object on
    each access, equal to the others); unhashable ones by identity."""
    try:
        hash(fn)
        return fn
    except TypeError:
        return id(fn)


# The suffix of an op type called so that it writes a tensor argument in
# place (`torch.mul(a, b, out=t)`, `F.relu(x, inplace=True)`): the same
# kernel, but an op that `mutates` its first input (capture puts the written
# tensor first), so no pass or pruning takes it for a pure op.
WRITES = "!"


def writing_variant(opdef):
    """The OpDef of `opdef`'s type called with arguments that make it write
    a tensor argument in place (type + WRITES, made on first use)."""
    op_type = opdef.type + WRITES
    variant = _OPS.get(op_type)
    if variant is None:
        # Not its ATen operator's call any more (it writes an argument), so
        # no backend takes it for one.
        variant = _OPS[op_type] = replace(opdef, type=op_type, mutates=True, aten=None, wrapper=None)
    return variant


def get_op_def(op_type):
    try:
        return _OPS[op_type]
    except KeyError:
        if op_type in _INTERNAL:
            return _INTERNAL[op_type]
        if op_type.endswith(WRITES) and op_type[:-len(WRITES)] in _OPS:
            return writing_variant(_OPS[op_type[:-len(WRITES)]])  # a loaded program names it first
        if not _OPS:
            raise KeyError(f"unknown op type {op_type!r}: the op table is empty (import ops to fill it)") from None
        raise KeyError(f"unknown op type {op_type!r}") from None


def is_registered(op_type):
    """Whether a program may name `op_type`: the loader's allowlist (no internal op)."""
    return op_type in _OPS or op_type.endswith(WRITES) and op_type[:-len(WRITES)] in _OPS


def is_internal(op_type):
    """Whether `op_type` is an op the passes make (see `OpDef.internal`)."""
    return op_type in _INTERNAL


def op_for_callable(fn):
    """The OpDef recording calls to `fn`, or None if `fn` is not in the table."""
    try:
        return _BY_CALLABLE.get(callable_key(fn))
    except TypeError:
        return None


def empty_table_hint():
    """A note for errors about unknown op types when nothing has filled the table."""
    return "" if _OPS else " (the op table is empty: `import d2s` or `import ops` fills it)"


def registered_types():
    return sorted(_OPS)
