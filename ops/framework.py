"""Framework ops: the ones that are not a single torch function.

`fill_constant`, `cast`, `shape`, `print`, `assert`, `raise` and the tensor-array ops
(`array_create`, `array_append`, `array_length`, `array_read`,
`array_from_list`). Each is defined once here: kernel, inference and the
user-facing builder side by side. They are call-style ops (an `args`
attribute and X/Out slots) so the executor and the printer treat them like
captured torch calls.
"""

import builtins
import math
import operator
import string
import time

import torch

from runtime.attrs import InputRef, OutputRef
from runtime.errors import ConversionError, DecisionFailed
from runtime.ir import (TENSOR_ARRAY, Variable, contiguous_strides, default_main_program, default_startup_program,
                        torch_dtype)

from . import tracer
from .recording import graph_condition, lift, record
from .user_frames import SYMBOLIC_TYPES, error_at_user_line, exception_origin, user_origin
from .registry import OpDef, op_for_callable, register
from .wrapped_numbers import python_number_dtype  # also read as fw.python_number_dtype


def _append(op_type, inputs, args, kwargs, out_vars, out_tree, origin=None):
    block = tracer.current().block
    block.append_op(op_type, inputs={"X": inputs}, outputs={"Out": out_vars},
                    attrs={"args": args, "kwargs": kwargs, "out": out_tree}, origin=origin or user_origin())


def _new_var(shape, dtype, kind="tensor", stop_gradient=True):
    block = tracer.current().block
    return block.create_var(name=block.program.unique_name("tmp" if kind == "tensor" else "array"),
                            shape=shape, dtype=dtype, kind=kind, stop_gradient=stop_gradient)


def _as_var(value):
    if isinstance(value, SYMBOLIC_TYPES):
        value = graph_condition(value)  # a run-time size: a Python number Variable
    if isinstance(value, Variable):
        return value
    if isinstance(value, torch.Tensor):
        return lift(value)
    return fill_constant(value)


# -- fill_constant -------------------------------------------------------------

def _fill_constant_kernel(value, dtype):
    return torch.tensor(value, dtype=dtype)


register(OpDef("fill_constant", kernel=_fill_constant_kernel))


def fill_constant(value, dtype=None):
    """A 0-d tensor holding the Python number `value` (dtype as
    `torch.tensor(value)`), or the run-time number of a SCALAR Variable."""
    if dtype is None:
        dtype = python_number_dtype(value)
    out = _new_var((), dtype)
    out.python_number = True  # see ops.recording.stands_for_number
    if isinstance(value, Variable):
        _append("fill_constant", [value], (InputRef(0), dtype), {}, [out], OutputRef(0))
        return out
    _append("fill_constant", [], (value, dtype), {}, [out], OutputRef(0))
    return out


# -- cast ------------------------------------------------------------------------

def _cast_kernel(x, dtype):
    return x.to(dtype)


register(OpDef("cast", kernel=_cast_kernel))


def cast(x, dtype):
    x = _as_var(x)
    dtype = torch_dtype(dtype)
    out = _new_var(x.shape, dtype, stop_gradient=x.stop_gradient or not dtype.is_floating_point)
    _append("cast", [x], (InputRef(0), dtype), {}, [out], OutputRef(0))
    return out


# -- scope initialisation ------------------------------------------------------------

def _scope_copy_kernel(value):
    """A fresh leaf holding `value`'s data (trainable if `value` is)."""
    return value.detach().clone().requires_grad_(value.requires_grad)


register(OpDef("scope_copy", kernel=_scope_copy_kernel, scope_init=True))


def init_in_startup(name, tensor, program):
    """Make the startup program paired with `program` initialise the
    persistable `name` from `tensor` in the scope it runs in, so one program
    run with several scopes keeps one set of values per scope (run without a
    scope, the executor keeps no copy: programs then read `tensor` itself):

        startup: fc.weight = scope_copy(fc.weight@INIT)   # fc.weight@INIT: the module's tensor
    """
    startup = default_startup_program()
    if program is not default_main_program() or startup is program:
        return
    block = startup.global_block()
    if name in block.vars:
        # The name was freed by a rolled-back trial trace and reused: the
        # initial value comes from the tensor it names now.
        for op in block.ops:
            if op.type == "scope_copy" and op.output("Out") == [name]:
                for var_name in (op.input("X")[0], name):
                    block.vars[var_name].shape, block.vars[var_name].dtype = tuple(tensor.shape), tensor.dtype
                startup.bind(op.input("X")[0], tensor)
        return
    source = startup.unique_name(name + "@INIT")
    init = block.create_var(name=source, shape=tuple(tensor.shape), dtype=tensor.dtype, persistable=True,
                            stop_gradient=True)
    startup.bind(source, tensor)
    out = block.create_var(name=name, shape=tuple(tensor.shape), dtype=tensor.dtype, persistable=True,
                           stop_gradient=not tensor.requires_grad)
    block.append_op("scope_copy", inputs={"X": [init]}, outputs={"Out": [out]},
                    attrs={"args": (InputRef(0),), "kwargs": {}, "out": OutputRef(0)})


# -- shape -------------------------------------------------------------------------

def _shape_kernel(x):
    return torch.tensor(x.shape, dtype=torch.int64)


register(OpDef("shape", kernel=_shape_kernel))


def shape(x):
    """The run-time shape of `x` as a 1-D int64 tensor."""
    out = _new_var((len(x.shape),), torch.int64)
    _append("shape", [x], (InputRef(0),), {}, [out], OutputRef(0))
    return out


# -- sizes: Python numbers at run time ----------------------------------------------
# A run-time size and arithmetic/comparisons on sizes (ops/symbolic.py
# materializes SymInts into these ops); each output is a SCALAR Variable.

def _size_kernel(x, dim):
    return x.size(dim)


register(OpDef("size", kernel=_size_kernel))


def scalar_op_type(fn):
    """'operator.add' for operator.add, 'builtins.max' for max."""
    module = "operator" if fn.__module__ == "_operator" else fn.__module__
    return f"{module}.{fn.__name__}"


SCALAR_FUNCTIONS = (operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.pow,
                    operator.neg, operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
                    operator.and_, operator.or_, operator.not_, operator.pos, max, min,
                    operator.truediv, math.ceil, math.floor)  # `math.ceil(h / 2)` of a size
for _fn in SCALAR_FUNCTIONS:
    register(OpDef(scalar_op_type(_fn), kernel=_fn))
# The Python int a 0-d integer tensor stands for (`int(t)` given where eager passes an int).
register(OpDef(scalar_op_type(int), kernel=int))


def scalar_copy(var):
    """A new SCALAR Variable with `var`'s run-time number (a second name for it)."""
    out = _new_var((), var.dtype)
    out.kind = var.kind
    _append(scalar_op_type(operator.pos), [var], (InputRef(0),), {}, [out], OutputRef(0))
    return out


# -- clocks ------------------------------------------------------------------------

# `time.perf_counter()` & co. in converted code: read when the program runs,
# so `self.elapsed = time.perf_counter() - t0` and `if time.time() > deadline:`
# hold each run's time as eager's call does, not the time the program was
# built (a constant every run would repeat). The value is a 0-d float64
# (int64 for the *_ns clocks) standing for the Python number, whose
# arithmetic is IEEE double as Python's. Not pure: two reads are two reads
# (never merged or hoisted out of a loop).
CLOCKS = {name: getattr(time, name) for name in (
    "time", "perf_counter", "monotonic", "process_time", "thread_time",
    "time_ns", "perf_counter_ns", "monotonic_ns", "process_time_ns", "thread_time_ns")}


def _clock_dtype(name):
    return torch.int64 if name.endswith("_ns") else torch.float64  # time.*_ns() give ints


def _host_clock_kernel(name):
    return torch.tensor(CLOCKS[name](), dtype=_clock_dtype(name))


def _known_clock(args, kwargs):
    if kwargs or len(args) != 1 or args[0] not in CLOCKS:
        return f"host_clock reads one of the clocks {sorted(CLOCKS)}, got {args!r:.60} {kwargs!r:.60}"
    return None


register(OpDef("host_clock", kernel=_host_clock_kernel, side_effect=True, check_args=_known_clock))


def host_clock(name):
    """The clock `time.<name>()` read when the program runs."""
    out = _new_var((), _clock_dtype(name))
    out.python_number = True  # see ops.recording.stands_for_number
    _append("host_clock", [], (name,), {}, [out], OutputRef(0))
    return out


# -- print / assert ------------------------------------------------------------------

def _print_kernel(*values, sep=" ", end="\n"):
    print(*values, sep=sep, end=end, flush=True)


register(OpDef("print", kernel=_print_kernel, side_effect=True))


def print_(*values, sep=" ", end="\n"):
    """`print` that runs when the program runs, printing tensors as eager does."""
    inputs, args = [], []
    for v in values:
        if isinstance(v, (Variable, torch.Tensor)):
            inputs.append(_as_var(v))
            args.append(InputRef(len(inputs) - 1))
        else:
            args.append(v if isinstance(v, (int, float, bool, str, type(None))) else str(v))
    _append("print", inputs, tuple(args), {"sep": sep, "end": end}, [], None)


def _assert_kernel(cond, message, numbers=None, *values):
    if isinstance(cond, torch.Tensor) and cond.numel() != 1:
        cond = cond.all()
    if not bool(cond):
        raise AssertionError(run_time_text(message, numbers, values))


def run_time_text(message, numbers, values):
    """The text of a message holding values the run computed (`numbers` not
    None: `message` a `str.format` template, d2s/operators/fstrings.py
    RunTimeMessage), as eager formats them: a value eager has as a Python
    number (`numbers[i] == "n"`) as that number, a tensor as the tensor."""
    if numbers is None:
        return message
    return message.format(*[v.item() if kind == "n" and isinstance(v, torch.Tensor) else v
                            for kind, v in zip(numbers, values)])


def _message_parts(message):
    """(the op's args after its message, its value inputs) for a message
    (`RunTimeMessage`: values the run formats) given to `assert_`/`raise_`."""
    values = getattr(message, "values", None)
    if not values:
        return (str(message),), []
    return (message.template, message.numbers), [_as_var(v) for v in values]


def _message_values_ok(message, rest):
    """Whether `rest` (the args after `message`) is empty, or a message's
    kinds ("n"/"t" per value, `run_time_text`) and one input per kind, with
    `message` a template whose fields name those values by position only:
    a loaded program's `{0.__class__...}` would read attributes of the
    run's values into the error's text."""
    if not rest:
        return True
    numbers, refs = rest[0], rest[1:]
    if not (isinstance(numbers, str) and set(numbers) <= {"n", "t"} and len(numbers) == len(refs)
            and all(isinstance(r, InputRef) for r in refs)):
        return False
    try:
        fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(message) if name is not None]
    except ValueError:
        return False
    return all(name.isdigit() and int(name) < len(refs) and "{" not in spec for name, spec in fields)


def _message_check(args, kwargs):
    """`check_args` of `assert`: (condition, message[, kinds, value inputs])."""
    if kwargs or len(args) < 2 or not isinstance(args[0], InputRef) or not isinstance(args[1], str) \
            or not _message_values_ok(args[1], args[2:]):
        return f"assert takes a condition, a message and the message's values, got {args!r:.80} {kwargs!r:.40}"
    return None


register(OpDef("assert", kernel=_assert_kernel, side_effect=True, check_args=_message_check))


def _refuse_under_try(what, origin=None):
    """A run-time `raise`/`assert` inside a user `try` with handlers (the
    trace counts them: d2s/operators/raising.try_scope): the program has no
    `except`, so the handler would never run for the inputs that raise."""
    if tracer.current().try_depth == 0:
        return
    message = (f"this `{what}` happens only when the program runs (a tensor decides it), inside a `try` "
               "whose `except` the program cannot run: the call would fail where eager runs the handler; "
               "compute the handler's value on the tensor instead (torch.where, or an `if` on the tensor "
               "condition)")
    if origin is None:
        raise error_at_user_line(message)
    filename, lineno, line = origin
    raise ConversionError(f"{message}\n    {line}" if line else message, filename, lineno)


def assert_(cond, message=""):
    """`assert cond, message` checked when the program runs."""
    _refuse_under_try("assert")
    cond = _as_var(cond)
    (text, *numbers), values = _message_parts("" if message is None else message)
    _append("assert", [cond, *values], (InputRef(0), text, *numbers, *map(InputRef, range(1, len(values) + 1))),
            {}, [], None)


def _check_all_true_kernel(valid, message):
    if not bool(valid.all()):
        raise ValueError(message)


register(OpDef("check_all_true", kernel=_check_all_true_kernel, side_effect=True))


_INT64_LIMIT = 9.2e18  # below 2**63 by more than float64's rounding there


def _check_int64_kernel(result, a, b, kind, message):
    if not isinstance(result, torch.Tensor):
        return  # the scalars pass ran it as a Python int: exact, as eager (a tensor made of it refuses past int64)
    if kind == "mul":
        fits = (b == 0) | (result // (torch.where(b == 0, 1, b) if isinstance(b, torch.Tensor) else b or 1) == a)
    elif kind == "pow":
        fits = abs(torch.as_tensor(a, dtype=torch.float64) ** torch.as_tensor(b, dtype=torch.float64)) < _INT64_LIMIT
    else:  # a << b
        fits = (torch.as_tensor(b) < 63) & ((result >> b) == a)
    if not bool(fits):
        raise OverflowError(message)


register(OpDef("check_int64", kernel=_check_int64_kernel, side_effect=True, takes_python_ints=True))


def check_int64(result, a, b, kind):
    """An OverflowError when the program runs where `result = a <kind> b`
    (kind "mul", "pow" or "lshift") of Python ints, which eager computes
    exactly (`n * 10**12`), left the int64 a program holds them in (torch
    wraps around silently). Where the scalars pass runs them as Python ints
    the value is exact and the check does nothing."""
    message = ("a Python int here exceeds 64 bits: eager Python computes it exactly, a program holds it as "
               "int64; keep such values as Python ints outside the program, or as float tensors")
    values = [_as_var(v) if isinstance(v, SYMBOLIC_TYPES + (Variable, torch.Tensor)) else v for v in (result, a, b)]
    inputs = [v for v in values if isinstance(v, Variable)]
    refs = [InputRef(next(i for i, u in enumerate(inputs) if u is v)) if isinstance(v, Variable) else v
            for v in values]
    _append("check_int64", inputs, (*refs, kind, message), {}, [], None)


def check_all_true(valid):
    """`torch._is_all_true(valid)` on a graph tensor: torch calls it only to
    validate arguments (`if not torch._is_all_true(valid): raise ValueError`
    in torch.distributions), so it is a check when the program runs, raising
    ValueError as that code does, and True while tracing: the traced path is
    the one every run that gets past the check takes."""
    message = ("torch's argument validation failed (torch._is_all_true is false: values outside the "
               "distribution's constraint)")
    _append("check_all_true", [_as_var(valid)], (InputRef(0), message), {}, [], None)
    return True


# -- size checks: what tracing assumed about run-time sizes ----------------------
# An assert op of its own type, so that saving a program pruned to some
# fetches can drop the checks of sizes of inputs it no longer feeds.

def _check_sizes_kernel(cond, message):
    if not bool(cond):
        raise DecisionFailed(message)


register(OpDef("check_sizes", kernel=_check_sizes_kernel, side_effect=True, size_check=True))


def check_sizes(cond, message):
    """Raise `AssertionError(message)` when the program runs and the
    run-time Python bool `cond` is false."""
    _append("check_sizes", [cond], (InputRef(0), message), {}, [], None)


def _decision_failed_kernel(message):
    raise DecisionFailed(message)


# The first op of a branch d2s converted only as "not taken": its inputs
# could not be merged with the other branch's, or tracing it failed, for
# the inputs the program was converted from (ops/control_flow/sides.py).
register(OpDef("decision_failed", kernel=_decision_failed_kernel, side_effect=True))


def decision_failed(message, origin=None):
    """Raise `DecisionFailed(message)` when the program reaches this op."""
    _append("decision_failed", [], (message,), {}, [], None, origin=origin)


def _check_bool_kernel(x, expected, what):
    if bool(x) != expected:
        raise DecisionFailed(f"this program was converted for inputs where {what} is {expected}; these "
                             f"inputs make it {not expected}: convert again for such inputs")


# A Python bool a kernel argument needs, decided while tracing (ops/capture.py
# _decide_bools).
register(OpDef("check_bool", kernel=_check_bool_kernel, side_effect=True))


def check_bool(x, expected, what):
    """Raise DecisionFailed when the program runs and `bool(x) != expected`."""
    _append("check_bool", [_as_var(x)], (InputRef(0), bool(expected), what), {}, [], None)


def _check_dims_kernel(x, dims, name):
    for i, size in dims:
        if x.shape[i] != size:
            raise DecisionFailed(
                f"this program was converted for '{name}' of size {size} in dimension {i} (a size of 0 or 1 "
                f"makes torch decide differently); got {x.shape[i]}: convert again for such inputs")


# Sizes of 0 or 1 a conversion took as they are (d2s/decisions.py converts
# again with the example's sizes when a run breaks what tracing assumed at
# another size). Pruned like the size checks.
register(OpDef("check_dims", kernel=_check_dims_kernel, side_effect=True, size_check=True))


def check_dims(x, dims):
    """Raise DecisionFailed when the program runs and `x.shape[i] != size`
    for one of the (i, size) of `dims`."""
    _append("check_dims", [x], (InputRef(0), tuple(tuple(d) for d in dims), x.name), {}, [], None)


def _layout_wanted(x, strides):
    """The strides `x` must have (None: those of a new tensor of its sizes)
    and whether it has them."""
    want = contiguous_strides(x.shape) if strides is None else tuple(strides)
    return want, x.stride() == want


def _check_strides_kernel(x, strides, name):
    want, ok = _layout_wanted(x, strides)
    if ok:
        return
    raise ValueError(f"this program reads strides and was traced for {name} strides {want}; got strides "
                     f"{x.stride()}: give it that layout (`.contiguous()` for contiguous) before its strides are "
                     "read, or trace it again")


# What tracing assumed about a feed's layout when the program read strides
# (d2s/static_function.py: in memory, another layout gets its own program;
# this check travels with a saved program). Pruned like the size checks.
register(OpDef("check_strides", kernel=_check_strides_kernel, side_effect=True, size_check=True))


def check_strides(x, strides, name=None):
    """Raise ValueError when the program runs and `x` does not have
    `strides` (None: those of a new tensor of its sizes); `name`: how the
    message calls it (a feed: its name, quoted)."""
    _append("check_strides", [x], (InputRef(0), None if strides is None else tuple(strides), name or f"'{x.name}'"),
            {}, [], None)


def _check_layout_kernel(x, strides, name):
    want, ok = _layout_wanted(x, strides)
    if ok:
        return
    failure = DecisionFailed(
        f"this program was converted for {name} with strides {want} where its strides are read (its layout "
        f"depends on the path a run takes); this run gives it strides {x.stride()}: convert again for such inputs")
    failure.answer = x.stride()  # (what the program converted again answers: ops/path_reads.py)
    raise failure


# The strides a read answered for a value whose layout tracing does not
# know (one a tensor `if` merges from two layouts, one made from such a
# value): a decision, as a size of 1 is, so a run that breaks it converts
# again answering the strides that run had at that read (ops/path_reads.py).
register(OpDef("check_layout", kernel=_check_layout_kernel, side_effect=True, size_check=True))


def check_layout(x, strides, name, origin):
    """Raise DecisionFailed when the program runs and `x` does not have
    `strides` (None: those of a new tensor of its sizes); `origin`: the
    read's user line, with its site (the key a conversion again forces)."""
    _append("check_layout", [x], (InputRef(0), None if strides is None else tuple(strides), name), {}, [], None,
            origin=origin)


def _check_requires_grad_kernel(x, expected, name):
    if x.requires_grad == expected:
        return
    failure = DecisionFailed(
        f"this program was converted for {name} with requires_grad {expected} where the flag is read (it depends "
        f"on the path a run takes); this run gives it {x.requires_grad}: convert again for such inputs")
    failure.answer = x.requires_grad
    raise failure


# `t.requires_grad` read of a value an op made, answered True by the
# trace, which a side made under `no_grad` or a `.detach()` on one path
# makes False: a decision, as the strides of such a value are.
register(OpDef("check_requires_grad", kernel=_check_requires_grad_kernel, side_effect=True))


def check_requires_grad(x, expected, name, origin):
    """Raise DecisionFailed when the program runs and `x.requires_grad != expected`."""
    _append("check_requires_grad", [x], (InputRef(0), bool(expected), name), {}, [], None, origin=origin)


def _exception_kind(exc_type):
    """The builtin exception class a saved program may name for ``exc_type``:
    itself, or its nearest builtin base (a loaded program can name nothing else)."""
    for kind in exc_type.__mro__:
        if getattr(builtins, kind.__name__, None) is kind and issubclass(kind, BaseException):
            return kind
    return Exception


def _raise_kernel(kind, message, numbers=None, *values):
    raise _exception_kind(getattr(builtins, kind, Exception))(run_time_text(message, numbers, values))


def _builtin_exception(args, kwargs):
    kind = args[0] if len(args) >= 2 and not kwargs else None
    value = getattr(builtins, kind, None) if isinstance(kind, str) else None
    if not (isinstance(value, type) and issubclass(value, BaseException)) or not isinstance(args[1], str) \
            or not _message_values_ok(args[1], args[2:]):
        return f"raise takes the name of a builtin exception class and a message, got {args!r:.80} {kwargs!r:.40}"
    return None


register(OpDef("raise", kernel=_raise_kernel, side_effect=True, check_args=_builtin_exception))


def raise_(exc, origin=None):
    """``raise exc`` when the program runs (and reaches this op): the same
    builtin exception type and message. A user-defined exception class is
    raised as its nearest builtin base, its name leading the message.
    `origin`: the user line to report, when ``exc`` was not raised there."""
    kind = _exception_kind(type(exc))
    message = str(exc) if kind is type(exc) else f"{type(exc).__name__}: {exc}"
    _refuse_under_try("raise", origin or exception_origin(exc))
    # `raise ValueError(f"bad {n}")`: the message holds values the run formats (`run_time_text`).
    held = exc.args[0] if len(exc.args) == 1 and getattr(exc.args[0], "values", None) else None
    parts, values = ((message,), [])
    if held is not None:
        (template, numbers), values = _message_parts(held)
        prefix = "" if kind is type(exc) else f"{type(exc).__name__}: ".replace("{", "{{").replace("}", "}}")
        parts = (prefix + template, numbers)
    _append("raise", values, (kind.__name__, *parts, *map(InputRef, range(len(values)))), {}, [], None,
            origin=origin or exception_origin(exc))


# -- tensor arrays -----------------------------------------------------------------------
# A tensor array is a Python list at run time. Its Variable's shape/dtype are
# those of its elements (-1 where elements differ); `elem_known` says whether
# an element has been seen yet.

def _array_create_kernel():
    return []


def _array_append_kernel(array, x):
    array.append(x)
    return array


def _array_length_kernel(array):
    return torch.tensor(len(array), dtype=torch.int64)


def _array_read_kernel(array, i):
    return array[int(i)]


def _array_from_list_kernel(*items):
    return list(items)


# A tensor array's list is appended to in place, so each one made is an object
# of its own: two `[]` are two lists (`new_object`: no pass merges or reuses one).
register(OpDef("array_create", kernel=_array_create_kernel, new_object=True))
register(OpDef("array_append", kernel=_array_append_kernel, mutates=True))
register(OpDef("array_length", kernel=_array_length_kernel))
register(OpDef("array_read", kernel=_array_read_kernel))
register(OpDef("array_from_list", kernel=_array_from_list_kernel, new_object=True))


def _note_element(array, x):
    if not getattr(array, "elem_known", False):
        array.shape, array.dtype, array.elem_known = x.dims, x.dtype, True
        return
    if len(x.shape) != len(array.shape) or x.dtype != array.dtype:
        raise error_at_user_line(
            f"this list, appended in a loop over a tensor condition, holds {array.dtype_name}"
            f"{list(array.shape)} elements; cannot append {x.dtype_name}{list(x.shape)}: append tensors "
            "of one rank and dtype")
    array.shape = tuple(a if a == b else -1 for a, b in zip(array.dims, x.dims))


def array_create(dtype="float32"):
    out = _new_var((), dtype, kind=TENSOR_ARRAY)
    out.elem_known = False
    out.items_known = 0  # its length (ops/control_flow/array_lengths.py)
    _append("array_create", [], (), {}, [out], OutputRef(0))
    return out


def array_from_list(items):
    out = array_create() if not items else _new_var((), "float32", kind=TENSOR_ARRAY)
    if not items:
        return out
    out.elem_known = False
    inputs = [_as_var(v) for v in items]
    for x in inputs:
        _note_element(out, x)
    _append("array_from_list", inputs, tuple(InputRef(i) for i in range(len(inputs))), {}, [out],
            OutputRef(0))
    out.items_known = len(inputs)
    return out


def array_append(array, x):
    """`array.append(x)`, in place like `list.append`."""
    x = _as_var(x)
    _note_element(array, x)
    _append("array_append", [array, x], (InputRef(0), InputRef(1)), {}, [array], OutputRef(0))
    from .control_flow import array_lengths  # lazy: control_flow is built on this module
    array_lengths.appended(array)
    return None


def array_length(array):
    out = _new_var((), torch.int64)
    out.python_number = True  # `len(ys)`: a Python int in eager code (ops.recording.stands_for_number)
    _append("array_length", [array], (InputRef(0),), {}, [out], OutputRef(0))
    return out


def array_read(array, i):
    i = _as_var(i)
    # `dims`, not `shape`: an item's symbolic sizes are the array's (`outs[-1] @ w + x[:, t]` lines up).
    out = _new_var(array.dims, array.dtype, stop_gradient=False)
    _append("array_read", [array, i], (InputRef(0), InputRef(1)), {}, [out], OutputRef(0))
    return out



# -- placeholders ------------------------------------------------------------------------

def zeros_of(shape, dtype, kind="tensor"):
    """Zeros standing in for a value that is never read (a return value on a
    path that did not return); -1 dimensions get size 1."""
    if kind == TENSOR_ARRAY:
        return array_create(dtype)
    return record(op_for_callable(torch.zeros), torch.zeros, (tuple(1 if d == -1 else d for d in shape),),
                  {"dtype": torch_dtype(dtype)})


def zeros_placeholder(like):
    """Zeros standing in for `like` on a path where it is never read: a
    number where `like` stands for one (a `return 0` on one path of a
    lowered `return` is a number on every path that reads it)."""
    out = zeros_of(like.shape, like.dtype, like.kind)
    if like.kind != TENSOR_ARRAY and not like.shape and getattr(like, "python_number", False):
        out.python_number = True
    return out
