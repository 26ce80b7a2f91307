"""Op capture: torch calls on Variables reach `recording.record`.

Two entry points route here:
  - `Variable.__torch_function__` and the Variable's tensor methods and Python
    operators (installed below), which is all that static-graph code built
    under `program_guard` needs;
  - `CaptureMode`, a torch function mode active while a declarative function
    is traced, which also sees calls that have no Variable argument: factory
    and random ops (`torch.zeros`, `torch.randn`) must run at run time, not
    once at build time, and ops on parameters (`self.weight.t()`) must see the
    parameter's value at run time.

This module is the top of ops: `dispatch` decides what a call is (an op of
the table, tensor metadata answered at once, a Python-level torch function
run under capture, or a refusal), and the tensor methods of Variables
(`_method`) answer or dispatch; both reach the op families and
`recording.py` below them.
"""

import functools
import inspect
import linecache
import os
import re
import sys
import threading

import torch
from torch.overrides import TorchFunctionMode

from runtime import ir
from runtime.ir import TENSOR_ARRAY, Variable, contiguous_strides

from . import framework, numpy_ufuncs, optimizer_ops, path_reads, python_values, torch_ops, tracer
from .examples import constant_value
from .infer import known_contiguous
from .recording import _TO_PYTHON, _contains, _to_python_error, is_symbolic_value, record, size, stands_for_number
from .registry import op_for_callable
from .storage_address import StorageAddress
from .user_frames import (INTERNAL_DIRS, SYMBOLIC_TYPES, TORCH_DIR, called_from_torch, error_at_user_line,
                          is_stdlib_file, user_name, user_origin, user_origin_at_site)


# -- dispatch ----------------------------------------------------------------------

def _name(fn):
    if isinstance(fn, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        # `torch.ops.quantized.linear_dynamic` (its __qualname__ is pybind11's record name)
        namespace, _, op = (fn._qualified_op_name if isinstance(fn, torch._ops.OpOverloadPacket)
                            else fn.name()).partition("::")
        return f"torch.ops.{namespace}.{op}"
    if isinstance(fn, _SCRIPTED):
        return f"TorchScript {type(fn).__name__} `{getattr(fn, 'name', None) or getattr(fn, '__name__', '?')}`"
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    if qual == "__get__" and getattr(fn, "__self__", None) is not None:  # a property getter
        return f"Tensor.{fn.__self__.__name__}"
    module = getattr(fn, "__module__", None)
    if module and module.startswith("torch") and not qual.startswith("Tensor."):
        return f"{module}.{qual}" if module != "torch._C._VariableFunctions" else f"torch.{qual}"
    return f"torch.{qual}" if qual.startswith("Tensor.") else qual


def refuse_denied(fn, args=()):
    """Raise at the user's line, before anything runs, when `fn` is on the denylist."""
    hit = torch_ops.denied(fn)
    if hit is None:
        return
    name, why = hit
    if why == torch_ops.TO_PYTHON and args and isinstance(args[0], torch.Tensor):
        # A parameter, buffer or other tensor the traced code reaches: its
        # value at build time is not its value when the program runs.
        raise error_at_user_line(
            f"`{name}` turns a tensor the program reads (a parameter, buffer or module tensor, "
            f"{list(args[0].shape)}) into a Python value; that value is known only when the program runs "
            "(it may change between calls or be updated in place by the program), so it cannot be frozen "
            "here; keep it a tensor")
    raise error_at_user_line(f"`{name}` cannot be part of a program ({why}); call it outside the "
                             "declarative function")


def _metadata_name(fn):
    """'numel' for torch.numel / Tensor.numel etc.; None for other functions."""
    name = getattr(fn, "__name__", None)
    if name in torch_ops.METADATA_NAMES and (fn is getattr(torch, name, None) or fn is getattr(torch.Tensor, name)):
        return name
    return None


# `t.grad` (and its alias `t._grad`): written by backward, so read by an op (optimizer_ops.read_grad).
_GRAD, _GRAD_ALIAS = torch.Tensor.grad, torch.Tensor._grad


def _is_metadata_getter(fn):
    """The getter of a tensor property that is not a tensor (`x.shape`, `x.dtype`, `x.requires_grad`)."""
    return getattr(fn, "__name__", None) == "__get__" and isinstance(getattr(fn, "__self__", None), object) \
        and op_for_callable(fn) is None


def dispatch(fn, args, kwargs):
    """Handle one torch call seen while capturing.

    A denylisted function is refused before it runs; a function of the op
    table becomes an op when a tensor (Variable, parameter, buffer or any
    other real tensor) takes part, or when it is a factory; tensor metadata
    is answered at once; a Python-level torch function outside the table runs
    its body under capture. Anything else touching a tensor is refused: run
    now, its value would be frozen into the program.
    """
    refuse_denied(fn, args)
    if _is_type_query(fn, args, kwargs):
        return _type_name(args[0])
    if fn is torch._is_all_true and args and isinstance(args[0], Variable):
        return framework.check_all_true(args[0])
    opdef = op_for_callable(fn)
    has_var = _contains((args, kwargs), Variable)
    has_tensor = has_var or _contains((args, kwargs), torch.Tensor)
    if fn in _BYTE_MASKS and has_var:
        args, kwargs = _byte_masks_as_bool(fn, args, kwargs)
    if opdef is not None and (has_tensor or opdef.factory or _contains((args, kwargs), SYMBOLIC_TYPES)):
        # (`torch.div(x.size(1), 4)` at run-time sizes: run now, torch would fix the size to its example's)
        return record(opdef, fn, args, kwargs)
    if not has_tensor:
        return fn(*args, **kwargs)
    meta_name = _metadata_name(fn)
    if meta_name is not None:
        if isinstance(args[0], Variable):
            return _method(args[0], meta_name)(*args[1:], **kwargs)
        if not has_var:
            return fn(*args, **kwargs)
    owner = getattr(fn, "__self__", None)
    if (owner is _GRAD or owner is _GRAD_ALIAS) and args:
        return optimizer_ops.read_grad(args[0])  # state the program's backward may write, not metadata
    if not has_var and _is_metadata_getter(fn):
        value = fn(*args, **kwargs)
        if getattr(fn, "__self__", None) is torch.Tensor.requires_grad and isinstance(args[0], torch.nn.Parameter) \
                and not _read_by_d2s():
            # A flag the user may flip between calls (freezing layers): checked when the program runs.
            tr = tracer.current()
            name = tr.name_hints.get(id(args[0]), "a parameter")
            tr.flag_reads.setdefault(id(args[0]), python_values.read_by_getattr(args[0], "requires_grad", value,
                                                                                f"{name}.requires_grad"))
        return _followed_device(value) if getattr(fn, "__self__", None) is torch.Tensor.device else value
    expanding = tracer.current().expanding
    if inspect.isfunction(fn) and fn not in expanding:
        # A Python-level torch function outside the table: run its body,
        # whose primitive calls are captured one by one. Its own
        # has_torch_function preamble dispatches here again; that re-entry
        # must not expand it a second time.
        expanding.add(fn)
        try:
            with CaptureMode():
                return fn(*args, **kwargs)
        finally:
            expanding.discard(fn)
    if isinstance(fn, _SCRIPTED):
        raise error_at_user_line(
            f"{_name(fn)} cannot be captured into a program: TorchScript (torch.jit.script, torch.jit.trace) "
            "runs its compiled code on real tensors, where d2s traces the Python code; call the Python module or "
            "function itself (the one given to torch.jit.script or torch.jit.trace)")
    raise error_at_user_line(
        f"torch function `{_name(fn)}` cannot be captured into a program: it is not in d2s's op table "
        "(ops/torch_ops.py), and running it now would freeze its result into the program"
        + _WHY_NOT.get(getattr(fn, "__name__", None), ""))


_D2S_DIRS = tuple(d for d in INTERNAL_DIRS if d != TORCH_DIR)


def _read_by_d2s():
    """Whether the code that read a tensor attribute (the frame below this
    module's, past torch's function-mode machinery) is d2s's own: its reads
    of a parameter's flags while recording are not the user's decisions."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename == __file__ or
                                 frame.f_code.co_filename.endswith(os.path.join("torch", "overrides.py"))):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(_D2S_DIRS)


def _followed_device(device):
    """The `.device` of a tensor the program reads (a parameter, buffer,
    constant): on the program's device, the program's own device object, as
    a traced value's `.device` is, so that an attribute made from it
    (`torch.zeros(n, device=self.weight.device)`) follows the program to
    another device as the module's tensors do (runtime/ir.py `Program.device`)."""
    own = tracer.current().program.device
    return own if device == own else device


# What TorchScript calls with a traced value: a scripted module's method, a scripted function.
_SCRIPTED = (torch._C.ScriptMethod, torch._C.ScriptFunction)

# Why some torch functions are not ops, and what to do instead.
_WHY_NOT = {"_nested_tensor_from_mask": (
    ". nn.TransformerEncoder in eval mode, called without gradients and with a src_key_padding_mask, runs its "
    "layers on a nested tensor, which a program cannot hold: call it with gradients on, or build it with "
    "enable_nested_tensor=False (then eager and the program take the unnested path)")}


# Where torch takes a uint8 tensor as the bool mask `m != 0` (deprecated
# byte masks, still in older code): the argument's position and name.
_BYTE_MASKS = {torch.Tensor.__getitem__: (1, None), torch.where: (0, "condition"),
               torch.Tensor.where: (1, "condition")}


def _byte_masks_as_bool(fn, args, kwargs):
    """`x[m]`, `torch.where(m, a, b)` with a uint8 tensor `m`: eager uses
    the mask `m != 0`, but the meta kernels shape inference runs refuse
    uint8 there; the program passes `m.bool()`, the same mask, so values
    and gradients are eager's."""
    position, name = _BYTE_MASKS[fn]
    if len(args) > position:
        args = args[:position] + (_as_bool(args[position]),) + args[position + 1:]
    elif name in kwargs:
        kwargs = {**kwargs, name: _as_bool(kwargs[name])}
    return args, kwargs


def _as_bool(mask):
    if isinstance(mask, tuple):  # `x[m, 1:]`
        return tuple(_as_bool(m) for m in mask)
    if isinstance(mask, (Variable, torch.Tensor)) and mask.dtype == torch.uint8:
        return dispatch(torch.Tensor.bool, (mask,), {}) if isinstance(mask, Variable) else mask.bool()
    return mask


class CaptureMode(TorchFunctionMode):
    """Active while a declarative function is traced: every torch call goes
    through `dispatch`. It also lets torch's own Python helpers that accept
    only real tensors take graph tensors (`_HELPERS`) while it is active."""

    d2s_capture = True  # not a user's mode (ops/ambient_modes.py `has_torch_function`)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return dispatch(func, args, kwargs or {})

    def __enter__(self):
        with _helpers_lock:
            if _helpers_depth[0] == 0:
                for owner, name, make in _HELPERS:
                    setattr(owner, name, make(getattr(owner, name)))
            _helpers_depth[0] += 1
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            with _helpers_lock:
                _helpers_depth[0] -= 1
                if _helpers_depth[0] == 0:
                    for owner, name, make in _HELPERS:
                        setattr(owner, name, getattr(owner, name).__wrapped__)


def _none_or_dtype(original):
    # `isinstance(mask, torch.Tensor)` or a RuntimeError: nn.MultiheadAttention
    # with an `attn_mask` or `key_padding_mask` asks it of its masks.
    @functools.wraps(original)
    def none_or_dtype(input):
        return input.dtype if isinstance(input, Variable) else original(input)
    return none_or_dtype


def _grouped_by_device_and_dtype(original):
    # torch's grouping of tensor lists by device and dtype (C++, real tensors
    # only): `clip_grad_norm_` groups the `.grad`s it read, graph tensors
    # after the program's backward. Empty real tensors of each Variable's
    # device and dtype stand in, so the groups come in torch's own order (a
    # total norm sums them in that order).
    @functools.wraps(original)
    def grouped(tensorlistlist, with_indices=False):
        if not any(isinstance(t, Variable) for tensors in tensorlistlist for t in tensors):
            return original(tensorlistlist, with_indices)
        with torch._C.DisableTorchFunction():
            stand_ins = [[torch.empty(0, dtype=t.dtype, device=t.device) if isinstance(t, Variable) else t
                          for t in tensors] for tensors in tensorlistlist]
            groups = original(stand_ins, True)
        return {key: ([[tensors[i] for i in indices] for tensors in tensorlistlist], indices if with_indices else [])
                for key, (_, indices) in groups.items()}
    return grouped


# torch helpers (owner, name, wrapper) that check `isinstance(x, torch.Tensor)`
# or take real tensors only where a graph tensor must pass; the wrappers
# answer as for a real tensor of the Variable's dtype and call the original
# for anything else.
_HELPERS = [(torch.nn.functional, "_none_or_dtype", _none_or_dtype)] + [
    (owner, "_group_tensors_by_device_and_dtype", _grouped_by_device_and_dtype)
    for owner in (torch.utils._foreach_utils, torch.nn.utils.clip_grad)]
_helpers_lock = threading.RLock()
_helpers_depth = [0]


def _torch_function(func, args, kwargs):
    return dispatch(func, args, kwargs)


# -- tensor methods on Variables -----------------------------------------------------

def _known_shape(var, what):
    if -1 in var.shape:
        raise _to_python_error(var, f"a Python value ({what}, which depends on a size known only at run time)")
    return var.shape


def _numel(var):
    n = 1
    for d in size(var):  # SymInts for the dimensions known only at run time
        n *= d
    return n


def _strides(var):
    """The strides eager would give: those the meta kernel produced for this
    output from its inputs' strides (see `record`; a feed has its example's,
    a constant its own), symbolic where the sizes are. The trace then
    depends on the feeds' layout: the program is kept for feeds of these
    strides only (ConcreteProgram.layout). Where tracing does not know them
    (a value a tensor `if` or loop merges, one of a data-dependent size), a
    contiguous layout is assumed and checked when the program runs: a run
    that breaks it converts again, answering the strides it had there
    (ops/path_reads.py), and never computes with strides it does not have."""
    tr = tracer.current()
    if not tr.reads_layout:
        tr.reads_layout, tr.layout_read_at = True, user_origin()
    known = var.strides
    if known is None and any(d == -1 or isinstance(d, str) for d in var.dims):
        if not known_contiguous(var, tr):  # (a feed is: checked contiguous where strides are read)
            # Neither eager's strides nor a layout the program could check
            # alone (a view of a transpose at run-time sizes, a value a
            # tensor `if` merges from two layouts): an automatic conversion
            # at run-time sizes is made again at the call's exact sizes.
            raise error_at_user_line(
                f"the strides of {user_name(var)} depend on its layout, which tracing does not know at sizes "
                "known only at run time; give the inputs static sizes (InputSpec without None), or make "
                "it `.contiguous()` before reading them")
        # Contiguous (a feed, checked so when its strides are read; a value
        # of contiguous sides): the strides of its sizes, as expressions of
        # their symbols (torch's own, from a stand-in), checked when the program runs.
        strides = tuple(tr.shapes.fake(var).stride())
        framework.check_layout(var, None, user_name(var), user_origin_at_site(tr.entry_frame))
        return strides
    if known is None:
        # Checked at each read (each may be on a path of its own), as a
        # decision: a run with other strides converts again, answering
        # those (ops/path_reads.py).
        origin = user_origin_at_site(tr.entry_frame)
        strides = path_reads.answer("strides", origin, lambda s: len(s) == len(var.shape))
        if strides is None:
            strides = contiguous_strides(var.shape)
            bound = tr.program.bound.get(var.name) if var.persistable else None
            if isinstance(bound, torch.Tensor) and tuple(bound.shape) == tuple(var.dims):
                strides = tuple(bound.stride())  # a constant or parameter: its own (a saved one loads contiguous)
        framework.check_layout(var, strides, user_name(var), origin)
        return strides
    if all(type(s) is int for s in known):
        return tuple(known)
    return tuple(s if type(s) is int else tr.shapes.symint(s) for s in known)


def _stride(var, dim=None):
    strides = _strides(var)
    return strides if dim is None else strides[dim]


def _is_contiguous(var, memory_format=torch.contiguous_format):
    if memory_format != torch.contiguous_format:
        raise error_at_user_line(f"`is_contiguous(memory_format={memory_format})` of {user_name(var)}")
    return all(a == b for a, b, d in zip(_strides(var), contiguous_strides(var.shape), var.shape) if d != 1)


def _is_same_size(var, other):
    return tuple(_known_shape(var, "is_same_size")) == tuple(_known_shape(other, "is_same_size"))


def _is_inference(var):
    # Not metadata of the value alone: an argument made under inference mode
    # is an inference tensor, and so is every value of a call made under it;
    # the cache key holds neither, so an answer would be a constant of the program.
    raise error_at_user_line(
        "`.is_inference()` of a program value is not known while the program is built: it depends on the mode "
        "the caller made the tensor in and calls in; read `torch.is_inference_mode_enabled()` instead (checked "
        "on every call)")


# Tensor metadata, known while tracing (ops/torch_ops.py METADATA): the
# answer eager gives for a tensor of this Variable's shape, dtype and device.
_METADATA = {
    "size": lambda var, dim=None: size(var, dim),
    "dim": lambda var: len(var.shape),
    "ndimension": lambda var: len(var.shape),
    "numel": _numel,
    "nelement": _numel,
    "stride": _stride,
    "is_contiguous": _is_contiguous,
    "is_same_size": _is_same_size,
    "is_complex": lambda var: var.dtype.is_complex,
    "is_floating_point": lambda var: var.dtype.is_floating_point,
    "is_signed": lambda var: var.dtype.is_signed,
    "element_size": lambda var: var.dtype.itemsize,
    "get_device": lambda var: -1 if var.device.type == "cpu" else var.device.index or 0,
    "is_inference": _is_inference,
    "is_conj": lambda var: False,
    "is_neg": lambda var: False,
    "dim_order": lambda var: tuple(sorted(range(len(var.shape)), key=lambda i: -_strides(var)[i])),
}


# `x.type()` with no dtype answers the legacy type name ('torch.FloatTensor'):
# metadata, like `.dtype`; `x.type(dtype)` is a cast and stays an op.
_TYPE_NAMES = {dt: torch.empty(0, dtype=dt).type() for dt in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128)}


def _type_name(tensor):
    name = _TYPE_NAMES.get(tensor.dtype)
    if name is None:
        raise error_at_user_line(f"`.type()` of a {tensor.dtype} tensor has no legacy type name")
    device = torch.device(tensor.device).type
    return name if device == "cpu" else name.replace("torch.", f"torch.{device}.", 1)


def _is_type_query(fn, args, kwargs):
    """`x.type()` / `x.type(dtype=None)`: asks for the name, casts nothing."""
    return fn is torch.Tensor.type and len(args) == 1 and kwargs.get("dtype") is None


_TO_INT = {"__round__": torch.round, "__floor__": torch.floor, "__ceil__": torch.ceil, "__trunc__": torch.trunc}


def _number_to_int(var, name, ndigits):
    """`round(s)`, `math.floor(s)`, ... of a Variable standing for a Python
    number: the Python int, as a 0-d int64 number (torch rounds half to
    even, as Python's round does)."""
    if not stands_for_number(var):
        raise TypeError(f"type Tensor doesn't define {name} method")
    if ndigits and ndigits[0] is not None:
        raise error_at_user_line(
            f"round() with ndigits of {user_name(var, 'value')}, a Python number read from a tensor: Python rounds "
            "the decimal value exactly, which tensor ops cannot reproduce; round the tensor instead "
            "(`torch.round(t, decimals=2)`)")
    if var.dtype == torch.int64:
        return var  # an int rounds to itself
    out = framework.cast(_TO_INT[name](var) if var.dtype.is_floating_point else var, torch.int64)
    out.python_number = True
    return out


# When a Python list is a tensor array (d2s/operators/while_loops.py `_fixed_lists`).
_ARRAY_WHY = "(a list whose length a tensor loop or `if` changes, or that one indexes by a tensor)"


def _integer_scalar(var):
    return var.kind == "tensor" and all(d == 1 for d in var.dims) and not (
        var.dtype.is_floating_point or var.dtype.is_complex or var.dtype == torch.bool)


def _decided(var, name):
    """`int(t)` / `operator.index(t)` in code d2s does not convert (torch's
    own Python: nn.GRU's check of the hidden state reads `int(batch_sizes[0])`),
    and `bool(t)` of a one-element bool tensor in torch's own Python
    (nn.TransformerEncoder's `if not torch._nested_tensor_from_mask_left_aligned(...)`),
    which must return a Python int or bool: that of the call being converted
    (ops/examples.py), checked when the program runs. A run that breaks it
    converts again (d2s/decisions.py), as for a Python bool a kernel takes
    (recording.decide_bools). Refused where the example cannot tell it."""
    value = tracer.current().example_int(var, None)
    if value is None:
        raise _to_python_error(var, _TO_PYTHON[name])
    if name in ("__bool__", "__nonzero__"):
        value = bool(value)  # Python requires a bool of __bool__ (the example's int raised TypeError)
    same = dispatch(torch.eq, (var, value), {})
    framework.check_bool(same, True, f"the Python {type(value).__name__} {value} that {user_name(var)} held "
                         "while converting")
    return value


def constant_list(var):
    """`var.tolist()` where pure ops compute `var` from constants alone
    (`torch.tensor(x.shape[2:]).tolist()` of static sizes): the same list on
    every run, read while tracing; else None."""
    value = constant_value(tracer.current(), var)
    if value is None:
        return None
    with torch._C.DisableTorchFunction():
        return value.tolist()


def _refuse_python_value(var, name):
    raise _to_python_error(var, _TO_PYTHON[name])


def _method(var, name):
    if name == "__format__":
        return lambda: refuse_text_in_user_code(var)
    if name == "type":
        return lambda *args, **kwargs: (_type_name(var) if _is_type_query(torch.Tensor.type, (var,) + args, kwargs)
                                        else dispatch(torch.Tensor.type, (var,) + args, kwargs))
    if name in _TO_PYTHON:
        if name == "tolist":
            listed = constant_list(var)
            if listed is not None:
                return lambda: listed
        if name in ("__int__", "__index__") and _integer_scalar(var):
            return lambda: _decided(var, name)
        # In the user's code bool(t) stays refused at the line (a tensor `if`
        # there is converted; `match t:` against a value is not).
        if name in ("__bool__", "__nonzero__") and var.kind == "tensor" and var.dtype == torch.bool \
                and all(d == 1 for d in var.dims):
            return lambda: _decided(var, name) if called_from_torch() else _refuse_python_value(var, name)
        if name == "__float__" and stands_for_number(var):
            # `math.log10(n)`, `math.sqrt(n)`, `np.float64(n)` of `n = t.item()`: C code asks for a
            # double now. libm's and torch's results may differ in the last bit: not staged.
            raise error_at_user_line(
                f"{user_name(var, 'number')} is a Python number read from a tensor (`t.item()`, "
                "`float(t)`), known only when the program runs; a function that needs it as a double now "
                "(`math.log10`, `math.sqrt`, numpy) cannot take it: compute on the tensor with torch instead "
                "(`torch.log10(t)`), or return the tensor and convert it outside the declarative function")
        raise _to_python_error(var, _TO_PYTHON[name])
    if name == "data_ptr":  # compared for identity, never read (ops/storage_address.py)
        return lambda: StorageAddress(var)
    if name == "__array_ufunc__":
        return lambda *args, **kwargs: numpy_ufuncs.array_ufunc(var, *args, **kwargs)
    if name in _METADATA:
        return lambda *args, **kwargs: _METADATA[name](var, *args, **kwargs)
    if name == "__len__":
        def length():
            if not var.shape:
                raise error_at_user_line(f"len() of a 0-d tensor: {user_name(var)}")
            if var.shape[0] == -1:
                raise _to_python_error(var, "a Python int (len)")
            return var.shape[0]
        return length
    if name in _TO_INT:
        return lambda *ndigits: _number_to_int(var, name, ndigits)
    if name == "__iter__":
        def iterate():
            if not var.shape or var.shape[0] == -1:
                raise _to_python_error(var, "a Python iterable")
            return iter(dispatch(torch.Tensor.unbind, (var, 0), {}))
        return iterate
    if name in ("grad", "_grad"):
        return optimizer_ops.read_grad(var)
    if name == "backward":  # appends the backward ops (ops/optimizer_ops.py)
        return lambda *args, **kwargs: optimizer_ops.record_backward(var, *args, **kwargs)
    if var.kind == TENSOR_ARRAY:
        if name == "append":
            return lambda x: framework.array_append(var, x)
        if name == "__getitem__":
            def read(i):
                # Python's list indexing when the program runs (negative indices, IndexError).
                if isinstance(i, bool) or not (isinstance(i, int) or (
                        isinstance(i, Variable) and i.shape == () and not i.dtype.is_floating_point
                        and not i.dtype.is_complex and i.dtype != torch.bool)):
                    raise error_at_user_line(
                        f"{user_name(var, 'list')} is a tensor array {_ARRAY_WHY}: "
                        "it can be indexed by an int only, not by a slice or other value")
                return framework.array_read(var, i)
            return read
        raise error_at_user_line(
            f"{user_name(var, 'list')} is a tensor array {_ARRAY_WHY}: it has no "
            f"method `{name}`; it supports append, len(), indexing by an int, `for` loops, torch.stack and torch.cat")
    attr = getattr(torch.Tensor, name, None)
    if attr is None:
        raise AttributeError(f"'Tensor' object has no attribute {name!r}")
    refuse_denied(attr)
    if isinstance(attr, property) or type(attr).__name__ == "getset_descriptor":
        getter = attr.__get__
        if op_for_callable(getter) is None:
            raise error_at_user_line(f"tensor attribute `.{name}` is not supported on program variables")
        return dispatch(getter, (var,), {})
    if name.startswith("__"):
        return lambda *args, **kwargs: _operator(var, name, attr, args, kwargs)
    if op_for_callable(attr) is None:
        raise error_at_user_line(
            f"tensor method `.{name}()` cannot be captured into a program: it is not in d2s's "
            "op table (ops/torch_ops.py)")
    return lambda *args, **kwargs: dispatch(attr, (var,) + args, kwargs)


def refuse_text_in_user_code(var, skip=()):
    """`f"{x}"` / `format(x)` / `str(x)` / `repr(x)` of a graph tensor in the user's code
    while tracing: eager's text holds the values (a key `f"expert_{i}"`, a
    message), which exist only when the program runs. Who formatted is
    the first frame outside this module, runtime/ir.py (`Variable.__str__`
    calls `__format__`) and the files in `skip` (converted f-strings format
    in d2s/operators/fstrings.py)."""
    if text_for_a_message(skip + (__file__, ir.__file__)):
        return
    raise _to_python_error(var, "text (an f-string, str(), repr(), format()); print(x) prints it when the program runs")


def _refusing_size_text(original):
    """`original` (SymInt's, SymFloat's or SymBool's `__str__`/`__repr__`),
    refusing while a trace runs to give a size known only when the
    program runs as text to the user's code: its text is the symbol's
    (`s0`), where eager's holds the number (`str(x.shape[0])` keying a dict,
    `len(str(n))`), a silent wrong value. A message keeps the symbol, as a
    graph tensor's keeps its repr (`text_for_a_message`)."""
    @functools.wraps(original)
    def text(self):
        if tracer.active() is not None and is_symbolic_value(self) and not text_for_a_message((__file__,)):
            raise error_at_user_line(
                f"the size `{original(self)}` is known only when the program runs, so it cannot be used as text "
                "(an f-string, str(), repr(), format()) here: eager's text holds the number; keep it a number, "
                "or give the dimension a fixed size (input_spec)")
        return original(self)
    return text


def _wrap_size_text():
    for kind in (torch.SymInt, torch.SymFloat, torch.SymBool):
        for method in ("__str__", "__repr__"):
            if method in vars(kind):  # (once per process: the originals are wrapped, never rewrapped)
                setattr(kind, method, _refusing_size_text(vars(kind)[method]))


_wrap_size_text()


def text_for_a_message(skip):
    """Whether text made now, by the first frame outside the files in
    `skip`, may hold a graph tensor's repr: no trace is under way, d2s or
    the standard library makes it (`logging`'s lazy "%s", `pdb`,
    `traceback`), or the user's line makes a message (`raise
    ValueError(f"bad {x}")`, a warning, a log line), which is made while the
    program is built and keeps the repr, as documented. Text the code
    computes with (a key, a name) may not."""
    if tracer.active() is None:
        return True
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in skip:
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith(INTERNAL_DIRS) or is_stdlib_file(frame.f_code.co_filename):
        return True
    return bool(_MESSAGE_LINE.search(_statement_text(frame.f_code.co_filename, frame.f_lineno)))


def _statement_text(filename, lineno, most=12):
    """Line `lineno` with the lines above it whose brackets it sits in: a
    message on a line of its own (`raise ValueError(\n    f"... {n}")`,
    `assert ok, (\n    f"...")`) is part of the statement that raises."""
    text, first = linecache.getline(filename, lineno), lineno
    balance = 0
    for above in range(lineno - 1, max(0, lineno - most) - 1, -1):
        line = linecache.getline(filename, above)
        balance += sum(map(line.count, "([{")) - sum(map(line.count, ")]}"))
        if balance > 0:  # a bracket opened above is still open at `first`: the same statement
            text = "".join(linecache.getline(filename, n) for n in range(above, first)) + text
            first, balance = above, 0
    return text


_MESSAGE_LINE = re.compile(r"\b(raise|assert|print|warn\w*|log\w*|debug|info|warning|error|\w*Error|\w*Exception"
                           r"|msg\w*|\w*_msg|message\w*|\w*_message)\b")  # `msg = f"mean {x.mean()}"`, logged after


def _operator(var, name, attr, args, kwargs):
    """`var <op> other`: torch's operator, except with an ndarray operand, for
    which torch's operator returns NotImplemented and eager Python ends in
    NumPy's reflected operator (ops/numpy_ufuncs.py)."""
    ufunc = numpy_ufuncs.ufunc_for_operator(name, args[0]) if len(args) == 1 and not kwargs else None
    if ufunc is not None:
        return numpy_ufuncs.record_ufunc(ufunc, (var, args[0]))
    if op_for_callable(attr) is None:
        raise error_at_user_line(f"tensor operator `{name}` cannot be captured into a program: it is not in "
                                 "d2s's op table (ops/torch_ops.py)")
    result = dispatch(attr, (var,) + args, kwargs)
    if name in _OVERFLOWING and len(args) == 1 and isinstance(result, Variable) and result.dtype == torch.int64 \
            and stands_for_number(result):
        _check_int_overflow(name, var, args[0], result)
    return result


# Python int arithmetic that leaves int64 long before a loop counter could:
# eager's ints have no bound (`n * 10**12`), a program's are int64, where
# torch wraps around silently. Sums and differences are left unchecked.
_OVERFLOWING = {"__mul__", "__rmul__", "__pow__", "__rpow__", "__lshift__"}


def _check_int_overflow(name, var, other, result):
    """An OverflowError when the program runs, where `result` (a Python int
    eagerly) left int64 (framework.check_int64); the operands in Python's
    order."""
    a, b = (other, var) if name.startswith("__r") else (var, other)
    kind = "mul" if name.endswith("mul__") else "pow" if name.endswith("pow__") else "lshift"
    framework.check_int64(result, a, b, kind)


def _number_hash(var):
    """`n in {3: ...}`, `set(ns)`, `Counter(ns)` in the user's code (a frame
    outside d2s and torch hashing it) of a Variable standing for a Python
    number: refused, since its hash is its identity's, not its value's."""
    frame = sys._getframe(2)  # the caller of Variable.__hash__ (C code such as a dict lookup has no frame)
    while frame is not None and is_stdlib_file(frame.f_code.co_filename):
        frame = frame.f_back  # `Counter(ns)`: the user's line that called the standard library
    if frame is None or frame.f_code.co_filename.startswith(INTERNAL_DIRS):
        return
    raise error_at_user_line(
        f"{user_name(var, 'value')} is a Python number read from a tensor (`int(t)`, `t.item()`, `t.tolist()`), "
        "which exists only when the program runs: as a dict key or set member (`in` a dict or set, `set()`, "
        "`Counter`) it would be found by identity, not by value; compare with `==` (a tensor `if` is "
        "converted), or keep the values a tensor (`torch.isin`, `torch.unique`)", frame)


Variable._number_hash_hook = staticmethod(_number_hash)
Variable._torch_function_hook = staticmethod(_torch_function)
Variable._method_hook = staticmethod(_method)
