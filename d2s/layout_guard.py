"""Programs that read their feeds' strides (`x.stride()`, `is_contiguous()`):
the layout a trace assumed, and whether a call's tensors have it."""

import torch

from runtime.errors import ConversionError
from runtime.ir import contiguous_strides


def layout_guard(feeds, tensors, origin):
    """ConcreteProgram.layout for a trace that read strides (first at
    `origin`, the user's (file, line, text) or None); refused when the trace
    could not know the layout it read (a non-contiguous feed whose sizes
    vary: tracing takes such feeds as contiguous)."""
    layout = tuple(getattr(v, "strides", None) for v in feeds)  # none set: sizes vary (see _build)
    if not layout_matches(layout, tensors):
        name, t = next((v.name, t) for v, s, t in zip(feeds, layout, tensors) if s is None and not _standard(t))
        how = ("`.clone(memory_format=torch.contiguous_format)`: its strides are not a new tensor's in a dimension "
               "of size 1, which `.contiguous()` keeps" if t.is_contiguous() else "`.contiguous()`")
        message = (f"this reads strides (`x.stride()`, `is_contiguous()`, of its inputs or of tensors made from "
                   f"them), and the input '{name}' is not contiguous while its sizes vary (InputSpec None "
                   f"dimensions): pass it contiguous ({how}), or give it static sizes")
        if origin is None:
            raise ConversionError(message)
        filename, lineno, line = origin
        raise ConversionError(f"{message}\n    {line}" if line else message, filename, lineno)
    return layout


def layout_matches(layout, tensors):
    for strides, t in zip(layout, tensors):
        if not isinstance(t, torch.Tensor):
            continue  # a generator feed has no layout
        if strides is None:
            if not _standard(t):
                return False
        elif t.stride() != strides:
            return False
    return True


def _standard(t):
    """Whether `t` has the strides of a new tensor of its sizes: the
    strides a trace at varying sizes answers (`is_contiguous()` also holds
    for another stride of a dimension of size 1, which a read would see)."""
    return t.stride() == contiguous_strides(t.shape)
