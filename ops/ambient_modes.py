"""`torch.is_grad_enabled()` and `torch.is_inference_mode_enabled()` read by
the user's code while a program is traced.

A declarative call traces with autograd on whatever the caller's mode
(d2s/static_function.py), so one program serves calls with and without
gradients. Code that asks for the mode must still see the caller's, as it
does eagerly, and the program may then only serve calls made in that mode:

    def forward(self, x):
        if torch.is_grad_enabled():   # the caller's mode, not the trace's
            return checkpoint(self.block, x)
        return self.block(x)

While a trace is under way the two functions are wrapped. A call made
directly from the user's code (not from the rest of torch, which gets the
real mode: `no_grad.__enter__` saves and restores it) answers the caller's
mode: the real one where the trace runs in it, and under a caller's
`no_grad` the caller's False, unless the user's code itself turned
gradients back on inside the trace, where the answer is not known and the
read is refused. The trace notes each mode read; the program then starts
with a `check_modes` op (ops/framework.py) that raises DecisionFailed in
another mode, and the call converts again for that mode (d2s/decisions.py),
keeping both programs. A saved model holds the program of each mode
(d2s/save_paths.py).

torch's own modules that pick a fused inference kernel by the caller's
mode (`nn.MultiheadAttention` and `nn.TransformerEncoderLayer` in eval
mode call `torch._native_multi_head_attention` /
`torch._transformer_encoder_layer_fwd` when gradients are off: FAST_PATHS)
are answered as the user's code is, and their check that no argument
overrides torch functions (`torch.overrides.has_torch_function`) answers
as for the plain tensors the program's values stand for. So a call without
gradients runs the kernel eager runs, with eager's bits; where the caller's
mode is not known (the user's code turned gradients on inside the trace)
they get the trace's mode, and the slow path.
"""

import contextlib
import os
import sys

import torch

from runtime.errors import DecisionFailed
from runtime.ir import Variable

from .registry import OpDef, register
from .trace_patches import WhileTracing
from .user_frames import INTERNAL_DIRS, TORCH_DIR, error_at_user_line

_real_grad = torch._C.is_grad_enabled
_real_inference = torch._C.is_inference_mode_enabled
_real_set_grad = torch._C._set_grad_enabled

_tracing = None  # `tracer.active`, given by the tracer


# torch's modules whose forward picks a fused inference kernel by the mode,
# and those kernels (which exporters have no translation for).
FAST_PATHS = frozenset(os.path.join(TORCH_DIR, "nn", "modules", f) for f in ("activation.py", "transformer.py"))
FAST_KERNELS = frozenset({"torch._native_multi_head_attention", "torch._transformer_encoder_layer_fwd"})
_fast_paths_off = [0]


@contextlib.contextmanager
def without_fast_paths():
    """Traces for an exporter (ONNX, torch.export): FAST_PATHS get the
    trace's own answers, so they take the path of ops exporters translate,
    as torch's exporters make them do eagerly."""
    _fast_paths_off[0] += 1
    try:
        yield
    finally:
        _fast_paths_off[0] -= 1


def _from_user(depth):
    """Whether the frame `depth` levels above the wrapper's caller is the
    user's code (not torch's, not d2s's)."""
    frame = sys._getframe(depth + 1)
    return frame is not None and not frame.f_code.co_filename.startswith(INTERNAL_DIRS)


def _from_fast_path(depth):
    frame = sys._getframe(depth + 1)
    return frame is not None and frame.f_code.co_filename in FAST_PATHS and not _fast_paths_off[0]


def _answers_caller(depth, tracer):
    """Whether a read `depth` frames above the caller gets the caller's
    mode: the user's code, or a FAST_PATHS module where that mode is known."""
    return _from_user(depth + 1) or _from_fast_path(depth + 1) and not tracer.user_enabled_grad


def is_grad_enabled():
    tracer = _tracing() if _tracing is not None else None
    real = _real_grad()
    if tracer is None or tracer.caller_modes is None or not _answers_caller(1, tracer):
        return real
    caller = tracer.caller_modes[0]
    tracer.modes_read["grad"] = caller
    if caller or not real:
        return real  # the trace runs in the caller's mode here (or the user's own no_grad)
    if tracer.user_enabled_grad:
        raise error_at_user_line(
            "torch.is_grad_enabled() is read inside a block where this function turns gradients on, in a "
            "call made without gradients: d2s traces with gradients on and cannot tell which mode eager "
            "would see here; call it with gradients on, or read the mode before turning it on")
    return False


def requires_grad(var):
    """`t.requires_grad` of a program variable, read by the user's code
    while tracing: where the caller records no gradients, eager's answer
    for a tensor an op made is False, though the trace (with autograd on)
    marks it as requiring grad; reading it makes the program one of the
    caller's mode (the `check_modes` op), as reading the mode itself does.
    Inputs, module state and leaves flagged to require grad
    (`requires_grad_()`, `requires_grad=True`) keep their flags in every mode;
    a True of any other value is checked when the program runs, since a
    path may make it without gradients (ops/path_reads.py)."""
    flag = not var.stop_gradient
    tracer = _tracing() if _tracing is not None else None
    if not flag or var.persistable or var.is_data or var.grad_leaf or tracer is None \
            or not _answers_caller(2, tracer):
        return flag
    if tracer.caller_modes is None:
        return _checked(var, tracer)
    caller = tracer.caller_modes[0]
    tracer.modes_read["grad"] = caller
    if caller:
        return _checked(var, tracer)
    if tracer.user_enabled_grad:
        raise error_at_user_line(
            "`.requires_grad` of a tensor is read in a call made without gradients, where this function "
            "turns gradients on: d2s traces with gradients on and cannot tell what eager would see here; "
            "call it with gradients on, or read the flag outside the block that turns them on")
    return False


def _checked(var, tracer):
    # True for a value an op made, unless a side of an `if` made it without
    # gradients: checked where it is read (ops/path_reads.py).
    from . import path_reads  # lazy: it imports the control-flow ops, which import this module
    return path_reads.requires_grad(var, tracer)


def is_inference_mode_enabled():
    tracer = _tracing() if _tracing is not None else None
    real = _real_inference()
    if tracer is not None and tracer.caller_modes is not None and _from_user(1):
        tracer.modes_read["inference"] = tracer.caller_modes[1]
    return real


def _set_grad_enabled(mode):
    # `with torch.enable_grad():` / `torch.set_grad_enabled(True)` in the
    # user's code: torch's grad_mode.py is the caller, the user's code its.
    tracer = _tracing() if _tracing is not None else None
    if mode and tracer is not None and _from_user(2):
        tracer.user_enabled_grad = True
    return _real_set_grad(mode)


_real_has_torch_function = torch.overrides.has_torch_function
_PLAIN = (torch.Tensor.__torch_function__.__func__, torch._C._disabled_torch_function_impl)


def _overrides(value):
    method = getattr(type(value), "__torch_function__", None)
    return method is not None and getattr(method, "__func__", method) not in _PLAIN and not isinstance(value, Variable)


def has_torch_function(args):
    """`torch.overrides.has_torch_function`, as FAST_PATHS ask it of their
    arguments: what eager answers, without the trace's own capture mode (a
    user's mode or tensor subclass still answers True)."""
    if not _from_fast_path(1):
        return _real_has_torch_function(args)
    modes = torch.overrides._get_current_function_mode_stack()
    return any(not getattr(m, "d2s_capture", False) for m in modes) or any(_overrides(a) for a in args)


def _check_modes_kernel(grad, inference):
    for what, expected, now in (("gradients enabled", grad, _real_grad()),
                                ("inference mode", inference, _real_inference())):
        if expected is not None and now != expected:
            raise DecisionFailed(f"this program was converted for calls with {what} {expected}, and its code "
                                 f"reads that mode; this call has {now}: convert again for such calls")


register(OpDef("check_modes", kernel=_check_modes_kernel, side_effect=True))


def check_modes_first(program, read):
    """Make a `check_modes` op the first op of `program`: `read` maps "grad"
    / "inference" to the caller's mode the trace answered with, so nothing
    runs before a call in another mode is sent to convert again."""
    block = program.global_block()
    block.append_op("check_modes", inputs={"X": []}, outputs={"Out": []},
                    attrs={"args": (read.get("grad"), read.get("inference")), "kwargs": {}, "out": None})
    block.ops.insert(0, block.ops.pop())


def caller_modes():
    """(grad enabled, inference mode) of the caller, read before the trace."""
    return (_real_grad(), _real_inference())


def _install():
    torch.is_grad_enabled = is_grad_enabled
    torch.is_inference_mode_enabled = is_inference_mode_enabled
    torch._C._set_grad_enabled = _set_grad_enabled
    torch.overrides.has_torch_function = has_torch_function


def _uninstall():
    torch.is_grad_enabled = _real_grad
    torch.is_inference_mode_enabled = _real_inference
    torch._C._set_grad_enabled = _real_set_grad
    torch.overrides.has_torch_function = _real_has_torch_function


_patches = WhileTracing(_install, _uninstall)


@contextlib.contextmanager
def answer_caller_modes(tracing):
    """Wrap the mode queries for the duration of a trace (`tracing()`: the
    tracer of the calling context, or None)."""
    global _tracing
    _tracing = tracing
    with _patches.held():
        yield


Variable._requires_grad_hook = staticmethod(requires_grad)
