"""A custom `torch.autograd.Function` as one program op.

`MyFn.apply(x, w)` in converted code becomes one op whose kernel is
`MyFn.apply` itself, so when the program runs torch runs the user's forward
under autograd and the user's backward computes the gradients, exactly as in
eager code:

    y = Quat.apply(x, self.r, None)     ->  tmp_3 = autograd_function(<Quat>, x, r, None)

Traced inline instead, the forward's torch calls would become ops with
torch's own derivatives, and the user's backward would be lost: a silently
different gradient (a straight-through estimator's, say), and
`ctx.save_for_backward` would get graph Variables. The op's output shapes
and dtypes come from running the apply on meta or fake tensors, as for every
captured op (a forward that needs tensor values to decide its output is a
`ConversionError` at the user's line).

Converted code reaches `apply` through d2s's call conversion. Code d2s
does not convert can call it too: a user function torch calls back (the
block of `torch.utils.checkpoint`, a hook, a user layer inside a torch
module), or torch's own Functions (`CheckpointFunction`). There torch's
`apply` would run the forward on graph tensors with gradients off, and the
user's backward would be lost without a word; so while a trace is under way
`Function.apply` itself is wrapped, and a call with graph tensors (or real
ones, while ops are captured) becomes the same op.

The op holds a Python class, which a saved program cannot name (the loader
refuses the op type, so a file can never name code to run). `jit.save`
traces the function again under `inline_for_save()`: there the Function's
forward, converted as any user function is (`isinstance(y, torch.Tensor)`
holds for a graph tensor, an `if` on a tensor becomes a cond), runs inline on
graph tensors (its torch calls become ops, good for serving) and each output passes through a `forward_only` op whose backward
raises, naming the Function: a loaded program computes the same values, and
training it through that part is an error, never autograd's derivative of the
forward silently standing in for the user's backward.
"""

import contextlib
import contextvars
import types

import torch

from runtime.ir import Variable

from . import capture, recording
from .registry import OpDef, register
from .trace_patches import WhileTracing


class FunctionRef:
    """The Function class as an op attribute: `<Quat>` in the program text."""

    def __init__(self, function):
        self.function = function

    def __repr__(self):
        return f"<{self.function.__qualname__}>"


def _apply_kernel(ref, *args, **kwargs):
    apply = ref.function.apply
    if getattr(apply, "__func__", None) is _apply_while_tracing:  # torch's own apply: not recorded again
        apply = types.MethodType(_ORIGINAL_APPLY.__func__, ref.function)
    return apply(*args, **kwargs)


OPDEF = register(OpDef("autograd_function", kernel=_apply_kernel,
                       live_object="a custom torch.autograd.Function"))


def is_function_apply(fn):
    """Whether `fn` is `SomeFunction.apply` of a torch.autograd.Function subclass."""
    owner = getattr(fn, "__self__", None)
    return (getattr(fn, "__name__", None) == "apply" and isinstance(owner, type)
            and issubclass(owner, torch.autograd.Function) and owner is not torch.autograd.Function)


def _capturing():
    return any(isinstance(m, capture.CaptureMode) for m in torch.overrides._get_current_function_mode_stack())


class _ForwardOnly(torch.autograd.Function):
    """Identity forward; a backward that refuses (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, name):
        ctx.name = name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(f"this saved program computes the forward of the custom torch.autograd.Function "
                           f"{ctx.name} inline; its backward was not saved, so gradients cannot flow through it "
                           "(train the declarative model in memory instead)")


def _forward_only_kernel(x, name):
    return _ForwardOnly.apply(x, name) if x.requires_grad else x


FORWARD_ONLY = register(OpDef("forward_only", kernel=_forward_only_kernel))

_INLINE = contextvars.ContextVar("d2s_inline_autograd_functions", default=False)


@contextlib.contextmanager
def inline_for_save():
    """Trace custom Functions' forwards inline (for a program to save)."""
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)


class _SaveCtx:
    """The `ctx` a forward gets when traced inline: what it saves for a
    backward that will not run is dropped."""

    needs_input_grad = ()
    saved_tensors = ()

    def save_for_backward(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


def _inline(function, args, kwargs, convert):
    name = function.__qualname__
    out = convert(function.forward)(_SaveCtx(), *args, **kwargs)

    def guard(value):
        if isinstance(value, Variable):
            return recording.record(FORWARD_ONLY, _forward_only_kernel, (value, name), {})
        if isinstance(value, (tuple, list)):
            return type(value)(guard(v) for v in value)
        return value
    return guard(out)


def record_apply(fn, convert):
    """What converted code calls in place of `SomeFunction.apply`. `convert`
    (d2s's `convert_call`) gives the forward as converted code, for a save."""
    function = fn.__self__

    def apply(*args, **kwargs):
        tree = (args, kwargs)
        if not (recording._contains(tree, Variable) or (_capturing() and recording._contains(tree, torch.Tensor))):
            return fn(*args, **kwargs)
        if _INLINE.get():
            return _inline(function, args, kwargs, convert)
        return recording.record(OPDEF, _apply_kernel, (FunctionRef(function),) + args, kwargs)
    return apply


def has_live_ops(program):
    return any(op.type == OPDEF.type for block in program.blocks for op in block.ops)


# -- Function.apply reached from code d2s does not convert ----------------------------------

_ORIGINAL_APPLY = torch.autograd.Function.__dict__["apply"]  # a classmethod
_convert = None  # d2s's call conversion (the forward of a Function inlined for a save), given by d2s


def _apply_while_tracing(cls, *args, **kwargs):
    fn = types.MethodType(_ORIGINAL_APPLY.__func__, cls)
    if _patches.tracer() is None or cls is _ForwardOnly:
        return fn(*args, **kwargs)
    return record_apply(fn, _convert or (lambda f: f))(*args, **kwargs)


def _install():
    torch.autograd.Function.apply = classmethod(_apply_while_tracing)


def _uninstall():
    torch.autograd.Function.apply = _ORIGINAL_APPLY


_patches = WhileTracing(_install, _uninstall)


def recording_every_apply(tracing):
    """Wrap `Function.apply` for the duration of a trace (`tracing()`: the
    tracer of the calling context, or None)."""
    return _patches.held_for(tracing)
