"""Recording: a torch call on graph values becomes an Operator of the
current block (`record`), real tensors it reads become persistable Variables
bound to the very same tensor objects (`lift`), and sizes known only at run
time become Variables where a value is needed (`graph_condition`,
`graph_tensor`, `size`).

The op families (framework, control_flow, numpy_ufuncs, optimizer_ops, ...)
build on this module; `capture.py`, above them, routes torch calls here.
Recording needs a few of framework's ops (a cast for eager's number
promotion, check_bool and check_sizes for what tracing decided, the startup
copy of a lifted tensor, fill_constant), and framework builds those ops on
this module's `lift` and `graph_condition`: a mutual recursion of two
layers, so this module imports framework when it first needs it.
"""

import inspect
import re

import numpy as np
import torch

from runtime.attrs import InputRef, OutputRef, ReturnType
from runtime.errors import ConversionError
from runtime.ir import SCALAR, TENSOR, Variable
from runtime.optable import WRITES, writing_variant
from runtime import run_modes

from . import number_paths, tracer, wrapped_numbers
from .infer import Meta, infer, substitute
from .registry import OpDef, register
from .user_frames import SYMBOLIC_TYPES, _user_names, error_at_user_line, user_name, user_origin

# torch's own function: while a trace is under way `torch.is_grad_enabled`
# is a wrapper that answers the user's code (ops/ambient_modes.py); every
# recorded op asks for the trace's real mode.
_grad_enabled = torch._C.is_grad_enabled


# -- lifting real tensors --------------------------------------------------------

def lift(tensor):
    """The persistable Variable bound to `tensor` in the traced program (created once)."""
    tr = tracer.current()
    program = tr.program
    name = tr.lifted.get(id(tensor))
    if name is not None and program.bound.get(name) is tensor:
        return program.global_block().vars[name]
    hint = tr.name_hints.get(id(tensor))
    if isinstance(tensor, torch.nn.parameter.UninitializedTensorMixin):
        # A lazy module (nn.LazyLinear, ...) sizes its parameters on its first
        # eager call; inside a trace that call would record them as ops.
        raise error_at_user_line(
            f"{hint or 'a parameter'} of a lazy module (nn.LazyLinear, nn.LazyConv2d, ...) is not initialized "
            "yet: call the model once eagerly first (before d2s.declarative, or under "
            "d2s.ProgramTranslator().enable(False)), the dry run torch asks for before building an optimizer")
    if hint is None or any(hint in b.vars for b in program.blocks):
        hint = program.unique_name("param" if isinstance(tensor, torch.nn.Parameter) else "const")
    var = program.global_block().create_var(
        name=hint, shape=tuple(tensor.shape), dtype=tensor.dtype, persistable=True,
        stop_gradient=not tensor.requires_grad)
    program.bind(hint, tensor)
    tr.lifted[id(tensor)] = hint
    from .framework import init_in_startup  # lazy: framework is built on this module (see the top)
    init_in_startup(hint, tensor, program)
    return var


# -- recording ---------------------------------------------------------------------

def _contains(tree, cls):
    """Whether an argument tree holds an instance of `cls` (Variable or Tensor)."""
    if isinstance(tree, cls):
        return True
    if isinstance(tree, (list, tuple)):
        return any(_contains(t, cls) for t in tree)
    if isinstance(tree, dict):
        return any(_contains(t, cls) for t in tree.values())
    if isinstance(tree, slice):
        return any(_contains(t, cls) for t in (tree.start, tree.stop, tree.step))
    return False


def python_constant(value):
    """A value the program can hold and save, for one an op argument carries:
    a NumPy scalar becomes the Python number it stands for (torch treats
    NumPy scalars as Python scalars), a NumPy array a tensor (lifted into a
    persistable constant), a range a list."""
    if isinstance(value, np.generic) and not isinstance(value, np.object_):
        return value.item()
    if isinstance(value, np.ndarray):
        # reshape: ascontiguousarray makes a 0-d array 1-d
        return torch.from_numpy(np.ascontiguousarray(value).reshape(value.shape))
    if isinstance(value, range):
        return list(value)
    return value


def check_own(var):
    """Refuse a Variable of another program: one an earlier trace left in
    Python state (a global, a function attribute, a container the code
    keeps between calls). Its name may stand for another value in this
    program, so using it would silently read the wrong tensor."""
    if var.block.program is not tracer.current().program:
        raise error_at_user_line(
            f"{user_name(var)} was made by an earlier conversion of this code and kept in Python state "
            "between calls (a global, a function attribute, a dict or list the code keeps); a program "
            "cannot read another program's values: keep such state on the module (`self.x = ...`, "
            "carried across calls) or pass it as an argument")


class _Refs:
    """Turns an argument tree into one with InputRef leaves, collecting the
    input Variables (each once)."""

    def __init__(self):
        self.inputs = []
        self._index = {}

    def ref(self, value):
        value = python_constant(value)
        if isinstance(value, torch.Tensor):
            value = lift(value)
        if isinstance(value, Variable):
            i = self._index.get(id(value))
            if i is None:
                check_own(value)
                i = self._index[id(value)] = len(self.inputs)
                self.inputs.append(value)
            return InputRef(i)
        if isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat)):
            return self.ref(_materialize(value))
        if isinstance(value, torch.Size) and all(isinstance(d, int) for d in value):
            return value  # a Size, not a tuple: `x.new(x.shape)` is sizes, `x.new((2, 3))` data
        if isinstance(value, list):
            return [self.ref(v) for v in value]
        if isinstance(value, tuple) and (not hasattr(value, "_fields") or isinstance(value, torch.Size)):
            return tuple(self.ref(v) for v in value)
        if isinstance(value, dict):
            return {k: self.ref(v) for k, v in value.items()}
        if isinstance(value, slice):
            return slice(self.ref(value.start), self.ref(value.stop), self.ref(value.step))
        return value


def _stop_gradient(inputs):
    return all(v.stop_gradient for v in inputs)


def _build_outputs(meta, block, opdef, inputs, outs, stop_gradient):
    """The user-facing result and the attr tree with OutputRef leaves."""
    if isinstance(meta, Meta):
        if meta.requires_grad is not None:  # autograd's own answer (infer.note_requires_grad)
            stop_gradient = not meta.requires_grad
        var = block.create_var(name=block.program.unique_name("tmp"), shape=meta.shape,
                               dtype=meta.dtype, stop_gradient=stop_gradient
                               or not (meta.dtype.is_floating_point or meta.dtype.is_complex))
        var.strides = meta.strides
        var.layout_unknown = meta.layout_unknown
        if meta.grad_leaf:
            var.grad_leaf = True
        outs.append(var)
        return var, OutputRef(len(outs) - 1)
    if isinstance(meta, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return meta, None  # a value known by its symbol: computed from sizes where it is used
    if isinstance(meta, (list, tuple)):
        pairs = [_build_outputs(m, block, opdef, inputs, outs, stop_gradient) for m in meta]
        values = [p[0] for p in pairs]
        trees = [p[1] for p in pairs]
        if type(meta).__module__ == "torch.return_types":
            return type(meta)(values), ReturnType(type(meta).__name__, trees)
        if isinstance(meta, tuple):
            return tuple(values), tuple(trees)
        return values, trees
    return meta, meta


def stands_for_number(value):
    """True for a Python number, and for a 0-d Variable that stands for one
    while tracing: a number a graph loop or branch carries, ``int(t)``,
    ``t.item()``, and arithmetic on nothing but such values. Eager Python
    would have a number there, so it is never updated in place
    (``j = i; i += 1`` leaves ``j`` alone) and ``isinstance`` sees a number."""
    if isinstance(value, Variable):
        return value.kind == SCALAR or value.python_number
    return isinstance(value, (int, float, bool) + SYMBOLIC_TYPES)


def number_or_tensor(value):
    """The user's name (quoted) for a 0-d Variable that eager Python has as a
    number on some paths and as a tensor on others, else None: a number a
    tensor loop makes a tensor (a number until the first trip, a tensor
    after), a name an `if` on a tensor makes a tensor in one branch only, and
    arithmetic on such values and numbers. Its `isinstance`/`type` has no
    one answer (d2s/operators/py_builtins.py)."""
    return value.number_or_tensor if isinstance(value, Variable) else None


def _has_python_number(meta):
    if isinstance(meta, (bool, int, float, complex)):
        return True
    if isinstance(meta, (list, tuple)) and not isinstance(meta, torch.Size):
        return any(_has_python_number(m) for m in meta)
    return False


# Ops that read an int argument as a size but a tensor argument as data
# (`x.new(5)` is 5 uninitialized values, `x.new(t)` a copy of `t`).
_SIZE_OR_DATA = {"torch.Tensor.new"}


def decide_bools(args, kwargs, what):
    """(args, kwargs, changed): each SymBool (a comparison of run-time sizes)
    and each 0-d bool Variable standing for a Python bool among the
    arguments replaced by the Python bool it is for the inputs being traced.
    For a torch function whose argument parser takes only a Python bool
    there (`is_causal=q_len > 1`): the program is converted for that value
    and checks it when it runs (a SymBool through a size guard, a Variable
    through `check_bool`); a run that breaks it converts again
    (d2s/decisions.py). A value the trace cannot tell is refused by name."""
    from .framework import check_bool  # lazy: framework is built on this module (see the top)
    changed = []

    def decide(v):
        if isinstance(v, torch.SymBool):
            changed.append(v)
            return bool(v)  # torch's guard on the size hints: a check_sizes op
        if isinstance(v, Variable) and v.shape == () and v.dtype == torch.bool and stands_for_number(v):
            value = tracer.current().example_int(v, None)
            if value is None:
                raise error_at_user_line(
                    f"`{what}` takes a Python bool, and {user_name(v, 'value')} is computed from tensor values "
                    "d2s cannot tell while converting; pass a bool that does not depend on tensor values")
            check_bool(v, bool(value), f"a bool argument of `{what}`")
            changed.append(v)
            return bool(value)
        if type(v) in (list, tuple):
            return type(v)(decide(x) for x in v)
        return v

    args = tuple(decide(a) for a in args)
    kwargs = {k: decide(v) for k, v in kwargs.items()}
    return args, kwargs, bool(changed)


def _as_python_ints(args, tr):
    """`args` with each 0-d integer Variable that stands for a Python int
    (`int(t)`) replaced by that int, computed when the program runs: what
    eager code passes there."""
    def number(v):
        if isinstance(v, Variable) and v.kind != SCALAR and v.shape == () and stands_for_number(v) \
                and not (v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool):
            return tr.shapes.python_int(v)
        return v
    return tuple(args[:1]) + tuple(number(a) for a in args[1:])


_TAKES_INPLACE = {}


def _takes_inplace(fn):
    """Whether `fn` has an `inplace` parameter (`F.relu`, `F.dropout`); cached
    per callable, as every recorded call asks."""
    try:
        return _TAKES_INPLACE[fn]
    except KeyError:
        pass
    except TypeError:  # unhashable
        return False
    try:
        takes = "inplace" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: torch's C functions have no `inplace`
        takes = False
    _TAKES_INPLACE[fn] = takes
    return takes


def _written_argument(opdef, fn, args, kwargs):
    """The tensor argument that `fn(*args, **kwargs)` writes in place
    although its op type does not (`out=t`, `inplace=True`), or None."""
    out = kwargs.get("out")
    if out is not None:
        if not isinstance(out, (torch.Tensor, Variable)):
            raise error_at_user_line(f"`{opdef.type}(..., out=...)` writes several tensors; assign its results "
                                     "instead (`values, indices = torch.sort(x)`)")
        return out
    if not _takes_inplace(fn):
        return None
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:  # arguments the call itself refuses: its own error comes when it runs
        return None
    if "inplace" in bound.arguments:
        inplace = bound.arguments["inplace"]
        if isinstance(inplace, (torch.Tensor, Variable)):
            raise error_at_user_line(f"`{opdef.type}`: `inplace` must be a Python value here (the functional "
                                     "tests its truth in Python), got a tensor")
        if inplace and isinstance(args[0], (torch.Tensor, Variable)):
            return args[0]
    return None


def record(opdef, fn, args, kwargs):
    """Append one call-style op running `fn(*args, **kwargs)`; return its
    result with Variables in place of tensors."""
    tr = tracer.current()
    emit_guards(tr)  # assumptions taken outside an op's inference (torch's own Python code)
    block = tr.block
    if opdef.type in _SIZE_OR_DATA:
        args = _as_python_ints(args, tr)
    refs = _Refs()
    written = None if opdef.mutates else _written_argument(opdef, fn, args, kwargs)
    if written is not None:
        # The op writes `written`: recorded as the type's writing variant,
        # with `written` as its first input (what `mutates` means).
        opdef = writing_variant(opdef)
        refs.ref(written)
    args_tree = refs.ref(tuple(args))
    kwargs_tree = refs.ref(dict(kwargs))
    try:
        # Infer with the kernel the executor will run (`torch.equal` runs as
        # a bool tensor; see ops/torch_ops.py), not the Python-level callable.
        meta = opdef.infer(refs.inputs, args_tree, kwargs_tree, tr) if opdef.infer is not None else None
        if meta is None:
            # Whether results require grad is autograd's to say, for torch's own kernels.
            meta = infer(opdef.kernel or fn, args_tree, kwargs_tree, refs.inputs, tr, factory=opdef.factory,
                         autograd=_grad_enabled() and opdef.kernel in (None, fn))
    except ConversionError as exc:
        if exc.filename is None:
            raise error_at_user_line(f"`{opdef.type}`: {exc.message}") from None
        raise
    except Exception as exc:  # noqa: BLE001 - the kernel's own complaint, at the user's line
        if isinstance(exc, TypeError) and "must be bool, not" in str(exc):
            # A Python bool in eager (`is_causal=bool(flag.any())`) that d2s
            # carries as a 0-d tensor: decided for these inputs and checked.
            args, kwargs, changed = decide_bools(args, kwargs, opdef.type)
            if changed:
                return record(opdef, fn, args, kwargs)
        raise _kernel_failed(exc, opdef, refs, block) from None
    numbers = wrapped_numbers.number_inputs(refs.inputs, stands_for_number)
    if numbers and wrapped_numbers.can_differ(refs.inputs, numbers):
        meta = _as_eager_numbers(opdef, fn, args_tree, kwargs_tree, refs, numbers, meta, tr)
    if _has_python_number(meta):
        # Computed from tensor values (metadata is answered before ops are
        # recorded): the value of one stand-in run must not be frozen.
        raise error_at_user_line(
            f"`{opdef.type}` returns a Python number computed from tensor values, which are known only when "
            "the program runs; keep the result a tensor")
    result, outs, out_tree = _results(opdef, meta, block, refs)
    if any(number_paths.pending(v) is not None for v in refs.inputs):
        _pending_numbers(opdef, fn, args_tree, kwargs_tree, refs, meta, result, tr)
    attrs = {"args": args_tree, "kwargs": kwargs_tree, "out": out_tree}
    if not _grad_enabled():
        # Recorded inside `with torch.no_grad():` in the user's code: the
        # op must run without autograd when the program runs, too.
        attrs["no_grad"] = True
    if tr.autocast_start is not None:
        # Recorded inside `with torch.autocast(...)` in the user's code: the
        # kernel computed in its dtypes, and must when the program runs.
        changes = run_modes.autocast_changes(run_modes.full_autocast_state(), tr.autocast_start)
        if changes:
            attrs["autocast"] = changes
    block.append_op(opdef.type, inputs={"X": refs.inputs}, outputs={"Out": outs}, attrs=attrs,
                    origin=user_origin())
    if opdef.mutates and isinstance(meta, Meta) and (
            opdef.type.rpartition(".")[2] in _NEW_SIZES_IN_PLACE or _new_sizes(refs.inputs[0], meta)):
        _follow_new_sizes(opdef, refs.inputs[0], meta, block)
    # Checks of what inference assumed about run-time sizes; after the op,
    # so an input that breaks the op's own preconditions gets the op's error.
    emit_guards(tr)
    return result


# Ops that give a pending number's value as it is (ops/number_paths.py `carry`).
_KEEPS_VALUE = {"torch.Tensor.detach", "torch.Tensor.clone", "cast", "torch.Tensor.reshape", "identity",
                "torch.Tensor.to", "torch.Tensor.cpu", "torch.Tensor.cuda", "torch.Tensor.__pos__"}


def _pending_numbers(opdef, fn, args_tree, kwargs_tree, refs, meta, result, tr):
    """Inputs that are a Python number on one path and a tensor on another,
    not decided yet (ops/number_paths.py): a 0-d result of numbers and such
    values alone is pending too (`v * 2`); any other op is compared with
    eager's, the pending inputs as Python numbers of their type, and a
    difference in dtype (or a number the tensor's dtype rounds) decides."""
    inputs = refs.inputs
    if isinstance(result, Variable) and result.shape == () and \
            all(stands_for_number(v) or number_or_tensor(v) for v in inputs):
        number_paths.carry(result, inputs, computed=opdef.type not in _KEEPS_VALUE)
        return
    pending = [i for i, v in enumerate(inputs) if number_paths.pending(v) is not None]
    values = [wrapped_numbers.python_value_of(number_paths.pending(v).number_dtype) if i in pending
              else InputRef(i) for i, v in enumerate(inputs)]
    call, call_args = wrapped_numbers.eager_call(opdef.type, fn, substitute(args_tree, values))
    try:
        expected = wrapped_numbers.dtypes(infer(call, call_args, substitute(kwargs_tree, values), inputs, tr,
                                                factory=opdef.factory))
    except Exception:  # noqa: BLE001 - eager's dtypes cannot be told: decided
        expected = None
    number_paths.observe_in_op([inputs[i] for i in pending], expected, wrapped_numbers.dtypes(meta))


def _kernel_failed(exc, opdef, refs, block):
    """The ConversionError, at the user's line, for a kernel that failed on
    the op's inferred inputs."""
    shapes = ", ".join(f"{name}: {v.dtype_name}[{', '.join(map(str, v.dims))}]"
                       for name, v in zip(_user_names(refs.inputs), refs.inputs))
    # Eager never runs a branch or loop body these inputs skip; d2s traces them all.
    where = "" if block.parent_idx < 0 else (
        " (d2s traces every branch and loop body, also one that these inputs never run)")
    error = error_at_user_line(f"`{opdef.type}` fails on inputs ({shapes}): {exc}{where}")
    error.kernel_failed = True  # on a side of a tensor `if` these inputs skip: see control_flow.decide_failed_side
    return error


def _results(opdef, meta, block, refs):
    """The op's result for the user (Variables in place of tensors), its
    output Variables and its `out` tree."""
    if opdef.mutates:
        # An in-place op writes its first input; `out` names it so the
        # executor knows the op's result is that same tensor.
        returns_tensor = isinstance(meta, Meta)
        written = refs.inputs[0]
        if returns_tensor and meta.requires_grad is not None and written.stop_gradient == meta.requires_grad \
                and written.block is block:
            # `y.detach_()`, `t.copy_(x)`, `t.requires_grad_()`: autograd's new answer for the
            # tensor (logged: a rolled-back trial trace puts it back). Not for a tensor from
            # outside this branch or loop body, which other paths leave as it was.
            tracer.current().log_write(written.__dict__, "stop_gradient")
            tracer.current().log_write(written.__dict__, "grad_leaf")
            written.stop_gradient, written.grad_leaf = not meta.requires_grad, meta.grad_leaf
        return (refs.inputs[0] if returns_tensor else None), [refs.inputs[0]], (
            OutputRef(0) if returns_tensor else None)
    outs = []
    stop_gradient = _stop_gradient(refs.inputs) or not _grad_enabled()
    result, out_tree = _build_outputs(meta, block, opdef, refs.inputs, outs, stop_gradient)
    if isinstance(result, Variable) and result.shape == () and refs.inputs:
        if all(stands_for_number(v) for v in refs.inputs):
            result.python_number = True
        varying = [number_or_tensor(v) for v in refs.inputs if number_or_tensor(v)]
        if varying and all(stands_for_number(v) or number_or_tensor(v) for v in refs.inputs):
            result.number_or_tensor = varying[0]  # `s * 2`: a number where `s` is one
    return result, outs, out_tree


# In-place ops that may give their tensor new sizes or strides.
_NEW_SIZES_IN_PLACE = {"t_", "transpose_", "swapdims_", "swapaxes_", "unsqueeze_", "squeeze_", "as_strided_",
                       "resize_", "resize_as_"}


def _new_sizes(var, meta):
    """Whether any other op writing `var` gave it other sizes: a kernel
    resizes an `out=` tensor of another shape (`torch.mul(a, 2, out=t)`
    of an empty `t`). Known ranks and static sizes only (a run-time size's
    text may differ from the same size's)."""
    return var.kind == TENSOR and (len(var.dims) != len(meta.shape) or any(
        type(a) is int and type(b) is int and a != b for a, b in zip(var.dims, meta.shape)))


def _same_tensor(x):
    return x


# The tensor an in-place op just gave new sizes (`y.unsqueeze_(1)`): the
# same object under a new name, declared with the new sizes.
register(OpDef("rebind", kernel=_same_tensor))


def _follow_new_sizes(opdef, var, meta, block):
    """After `y.unsqueeze_(1)` or `y.t_()` changed `y`'s sizes or strides:
    eagerly the same tensor object has the new ones from there on, while a
    program declares one shape per value (later ops, and Python's own
    `y.shape`, `len(y)`, `for row in y`, read it). So the value before keeps
    its name and declaration, and the user's Variable becomes a new name
    with the new sizes, bound by a `rebind` op to the very tensor the
    in-place op wrote (the same object when the program runs, as eagerly).
    Refused where the old name must keep meaning the user's value: a
    tensor from outside this branch or loop body, an input, module state."""
    known = getattr(var, "strides", None)
    if known is None and all(type(d) is int for d in var.dims):
        known = torch.empty(var.dims, device="meta").stride()
    same_strides = meta.strides is None or known is None or tuple(meta.strides) == tuple(known)
    if tuple(meta.shape) == tuple(var.dims) and same_strides:
        return
    method = opdef.type.rpartition(".")[2]
    if var.block is not block or var.persistable or var.is_data or var.kind != TENSOR:
        fix = (f"use the out-of-place form and assign it: `y = y.{method[:-1]}(...)`" if method.endswith("_")
               else f"assign the result (`y = {opdef.type.rstrip(WRITES)}(...)`) instead of writing it into a "
                    "tensor of another shape")
        raise error_at_user_line(
            f"`{method.rstrip(WRITES)}` changes the sizes or strides of {user_name(var)} in place "
            f"({var.dtype_name}[{', '.join(map(str, var.dims))}] -> [{', '.join(map(str, meta.shape))}]), "
            f"which d2s follows only for a tensor made in the same branch or loop body (not an input or "
            f"module state); {fix}")
    tr = tracer.current()
    before = object.__new__(Variable)  # not copy.copy: Variables refuse pickling protocols
    before.__dict__.update(var.__dict__)
    # Each write logged: a trial trace rolled back puts the Variable back.
    tr.log_write(block.vars, var.name)
    block.vars[before.name] = before
    if tr._shapes is not None:
        tr._shapes.follow(var, before)
    for key in ("name", "_shape", "strides", "layout_unknown"):
        tr.log_write(var.__dict__, key)
    var.name = block.program.unique_name(re.sub(r"(_\d+)+$", "", var.name))
    var.shape = meta.shape
    var.strides, var.layout_unknown = meta.strides, meta.layout_unknown
    block.vars[var.name] = var
    block.append_op("rebind", inputs={"X": [before]}, outputs={"Out": [var]},
                    attrs={"args": (InputRef(0),), "kwargs": {}, "out": OutputRef(0)}, origin=user_origin())


def _as_eager_numbers(opdef, fn, args_tree, kwargs_tree, refs, numbers, meta, tr):
    """The op's inferred result once the inputs standing for Python numbers
    are cast where eager's wrapped-number promotion computes in another
    dtype (ops/wrapped_numbers.py); refused where no cast reaches eager's."""
    wn = wrapped_numbers
    # Python numbers in place of the numbers' InputRefs; the other inputs stay references.
    values = [wn.python_value(v) if i in numbers else InputRef(i) for i, v in enumerate(refs.inputs)]
    call, call_args = wn.eager_call(opdef.type, fn, substitute(args_tree, values))
    factory = opdef.factory
    try:
        expected = wn.dtypes(infer(call, call_args, substitute(kwargs_tree, values), refs.inputs, tr,
                                   factory=factory))
    except Exception:  # noqa: BLE001 - eager fails on a number here too: the op's own error comes when it runs
        return meta
    actual = wn.dtypes(meta)
    mixed = not wn.all_numbers(refs.inputs, numbers)
    if mixed and wn.rounds_differently(refs.inputs, numbers):
        raise _number_error(opdef, refs, numbers, "float16/bfloat16 rounding")
    compares = mixed and actual and all(d == torch.bool for d in actual) and \
        wn.computation_dtype(refs.inputs, numbers, True) != wn.computation_dtype(refs.inputs, numbers, False)
    if expected == actual and not compares:
        return meta
    target = wn.cast_target(refs.inputs, numbers, expected)
    if target is not None:
        from .framework import cast  # lazy: framework is built on this module (see the top)
        for i in numbers:
            number = refs.inputs[i]
            if number.dtype != target:
                refs.inputs[i] = cast(number, target)
                refs.inputs[i].python_number = True
                if number_or_tensor(number):
                    refs.inputs[i].number_or_tensor = number_or_tensor(number)
                # (eager's cast of the number; whether its path's type shows is asked below)
                refs.inputs[i].pending_number = number.pending_number
        meta = infer(opdef.kernel or fn, args_tree, kwargs_tree, refs.inputs, tr, factory=factory)
        if wn.dtypes(meta) == expected:
            return meta
    raise _number_error(opdef, refs, numbers, "dtype and rounding")


def _number_error(opdef, refs, numbers, what):
    every = _user_names(refs.inputs)
    names = ", ".join(f"`{every[i]}`" for i in numbers)
    return error_at_user_line(
        f"`{opdef.type}` of {names}, a Python number in eager code (from .item(), float(), int(), bool() or a "
        f"number a tensor loop or branch carries): d2s cannot reproduce the {what} eager gives this op with a "
        "Python number here; make the number a tensor with the dtype of the tensor it meets "
        "(`torch.tensor(s, dtype=t.dtype)`) or keep the arithmetic in tensors (`t * x.max()`)")


# -- sizes known only at run time --------------------------------------------------

def emit_guards(tr):
    """A `check_sizes` op for each size assumption the trace `tr` made
    since the last call (torch's decisions on symbolic sizes)."""
    guards = tr.new_guards()
    if guards:
        from .framework import check_sizes  # lazy: framework is built on this module (see the top)
        for check, message in guards:
            check_sizes(check, message)


_TO_PYTHON = {
    "__bool__": "bool(x)", "__int__": "int(x)", "__float__": "float(x)", "__index__": "an index",
    "__complex__": "complex(x)", "item": "x.item()", "tolist": "x.tolist()",
    "numpy": "x.numpy()", "__array__": "numpy.asarray(x)",
    "__reduce_ex__": "a Python object to pickle (torch.save, pickle, copy)",
}


def _to_python_error(var, how):
    return error_at_user_line(
        f"the value of {user_name(var)} is known only when the program runs, so it cannot be used "
        f"as {how} here; @declarative converts `if`/`while`/`int()`/`float()` on tensors for you, "
        "otherwise keep the value a tensor (torch.where, d2s.cond, .to(dtype))")


def size(var, dim=None):
    """`x.size()`: Python ints for static dimensions, `torch.SymInt`s (the
    dimension's symbol) for the ones known only at run time; no op is
    recorded until a size is used (see ops/symbolic.py)."""
    dims = var.dims
    if not any(isinstance(d, str) or d == -1 for d in dims):
        return dims[dim] if dim is not None else torch.Size(dims)
    shapes = tracer.current().shapes
    sizes = []
    for i, d in enumerate(dims):
        s = shapes.symint(d, var, i)
        if not isinstance(s, int):
            shapes.note_source(s, var, i)
        sizes.append(s)
    return sizes[dim] if dim is not None else torch.Size(sizes)


def is_symbolic_value(value):
    """A size known only at run time (SymInt), or a comparison of sizes
    (SymBool) that tracing cannot decide."""
    if not isinstance(value, SYMBOLIC_TYPES):
        return False
    node = value.node
    constant = node.maybe_as_bool() if isinstance(value, torch.SymBool) else node.maybe_as_int() \
        if isinstance(value, torch.SymInt) else node.maybe_as_float()
    return constant is None


def graph_condition(value):
    """A SymBool condition as the run-time Python bool Variable computing
    it (a decided one as a Python bool); anything else unchanged."""
    if isinstance(value, SYMBOLIC_TYPES):
        return _materialize(value)
    return value


def graph_tensor(value):
    """A SymInt/SymBool as a 0-d tensor Variable holding its run-time value,
    for tensor-valued contexts (logical ops, branch and loop values)."""
    if not isinstance(value, SYMBOLIC_TYPES):
        return value
    from . import framework  # lazy: framework is built on this module (see the top)
    dtype = torch.bool if isinstance(value, torch.SymBool) else \
        torch.int64 if isinstance(value, torch.SymInt) else torch.float64  # a Python float: a double
    return framework.fill_constant(_materialize(value), dtype)


def _materialize(value):
    """A run-time Variable (or constant) for a SymInt/SymBool."""
    out = tracer.current().shapes.materialize(value)
    if out is None:
        raise error_at_user_line(
            f"the size `{value}` is known only when the program runs, and d2s cannot tell which tensor "
            "it is read from here")
    return out
