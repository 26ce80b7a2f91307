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

The op holds a Python class: a program with one can run and train, but not
be saved (`jit.save` says so), and the loader refuses the op type, so a file
can never name code to run.
"""

import torch

from runtime.ir import Variable

from . import capture
from .registry import OpDef, register


class FunctionRef:
    """The Function class as an op attribute: `<Quat>` in the program text."""

    def __init__(self, function):
        self.function = function

    def __repr__(self):
        return f"<{self.function.__qualname__}>"


def _apply_kernel(ref, *args, **kwargs):
    return ref.function.apply(*args, **kwargs)


OPDEF = register(OpDef("autograd_function", kernel=_apply_kernel,
                       extra={"live_object": "a custom torch.autograd.Function"}))


def is_function_apply(fn):
    """Whether `fn` is `SomeFunction.apply` of a torch.autograd.Function subclass."""
    owner = getattr(fn, "__self__", None)
    return (getattr(fn, "__name__", None) == "apply" and isinstance(owner, type)
            and issubclass(owner, torch.autograd.Function) and owner is not torch.autograd.Function)


def _capturing():
    return any(isinstance(m, capture.CaptureMode) for m in torch.overrides._get_current_function_mode_stack())


def record_apply(fn):
    """What converted code calls in place of `SomeFunction.apply`."""
    function = fn.__self__

    def apply(*args, **kwargs):
        tree = (args, kwargs)
        if not (capture._contains(tree, Variable) or (_capturing() and capture._contains(tree, torch.Tensor))):
            return fn(*args, **kwargs)
        return capture.record(OPDEF, _apply_kernel, (FunctionRef(function),) + args, kwargs)
    return apply
