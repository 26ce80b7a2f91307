"""FloorDiv's common-factor step, made light while a trace runs.

torch's sympy function `FloorDiv(a, b)` (torch/utils/_sympy/functions.py)
divides both sides by their common factor and rewrites each with
`sympy.simplify`, which tries every simplification strategy it knows. On
the size expressions of an image model traced with free height and width
(timm's MobileViT-v2: `math.ceil(H / 2) * 2 // 2` reshaped into patches),
those calls took minutes: `jit.save` of mobilevitv2_050 with
`InputSpec([None, 3, None, None])` ran past 3 minutes.

While a trace of this thread runs, that module's `sympy.simplify` is
`sympy.cancel`, which puts the quotient in the canonical form p/q a
division of polynomials has:

    FloorDiv(2*s0 + 4, 4)   gcd 2   ->  FloorDiv(cancel(s0 + 2), 2)   (was: simplify(...))

Both forms are the same number for every size, so every guard and every
materialized size keeps its value; only the time changes (the save above
now takes about 20 s). Other threads, and calls outside traces, keep
`sympy.simplify`.
"""

import contextlib
import types

import sympy
from torch.utils._sympy import functions as _functions

from .trace_patches import WhileTracing

_tracing = None  # `tracer.active`, given by the tracer
_original = _functions.sympy


def _simplify(expr, *args, **kwargs):
    if _tracing is not None and _tracing() is not None:
        return sympy.cancel(expr)
    return sympy.simplify(expr, *args, **kwargs)


# The module's `sympy` name, with `simplify` replaced (the rest is sympy's own).
_LIGHT = types.SimpleNamespace(**{**vars(sympy), "simplify": _simplify})


def _install():
    _functions.sympy = _LIGHT


def _uninstall():
    _functions.sympy = _original


_patches = WhileTracing(_install, _uninstall)


@contextlib.contextmanager
def light_floordiv(tracing):
    """FloorDiv's light common-factor step for the duration, in the contexts
    where `tracing()` is not None."""
    global _tracing
    _tracing = tracing
    with _patches.held():
        yield
