"""Python's and numpy's global random numbers while a program is traced.

A draw from the global state of `random` or `numpy.random` made while a
program is built happens once, at build time: the program holds the drawn
value as a constant and every run repeats it, where eager code draws again
on every call (transformers' wav2vec2/HuBERT draw their training masks with
`np.random`). That is a silent difference, so a trace refuses such a call at
the user's line; torch's own random ops are staged and draw on every run.

    with refuse_global_draws():    # one per trace (ops/tracer.py)
        np.random.rand(3)          # ConversionError at this line
    random.random()                # outside a trace: the original, unchanged

While some thread traces, the functions bound to the two global generators
(`random._inst`, `numpy.random.mtrand._rand`: drawing, seeding, reading or
setting the state) are wrapped. A wrapper refuses only in a context that is
tracing (`tracer.active()`) and calls the original everywhere else, so other
threads run as before; the last trace to finish puts the originals back. A
call the wrappers cannot see (a function bound before the trace, `from
random import random`) still moves the state: the state is compared before
and after, and a change is refused too.
"""

import contextlib
import random
import sys

from runtime.errors import ConversionError

from .trace_patches import WhileTracing
from .user_frames import error_at_user_line

_originals = []   # (module, name, function) replaced while a trace is under way
_tracing = None   # `tracer.active`, given by the tracer (ops/tracer.py imports this module)

_WHAT_INSTEAD = ("draw with torch instead (torch.rand, torch.randn, torch.randint, torch.randperm, "
                 "torch.bernoulli, torch.multinomial, with an optional torch.Generator): the program "
                 "draws those again on every run")


def _generators():
    """(module, its global generator, how messages name it) for `random`, and
    for `numpy.random` when numpy is loaded (never imported here)."""
    out = [(random, random._inst, "random", "Python's `random`")]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        out.append((numpy.random, numpy.random.mtrand._rand, "np.random", "numpy's `np.random`"))
    return out


# numpy's module-level functions on the global state that are not methods of
# its generator; `default_rng()` without a seed draws from the OS.
_NUMPY_FUNCTIONS = ("ranf", "sample", "seed", "get_bit_generator", "set_bit_generator")


def _unseeded(seed=None, *args, **kwargs):
    return seed is None


def _guard(function, label, owner, when=None):
    def guarded(*args, **kwargs):
        if _tracing is not None and _tracing() is not None and (when is None or when(*args, **kwargs)):
            raise error_at_user_line(
                f"`{label}` uses the global random state of {owner} while the program is built: the "
                f"program would hold what it drew (or set) as a constant and repeat it on every run, "
                f"where eager code draws again on every call; {_WHAT_INSTEAD}")
        return function(*args, **kwargs)
    guarded.__wrapped__ = function
    guarded.__name__ = getattr(function, "__name__", "guarded")
    return guarded


def _install():
    for module, generator, prefix, owner in _generators():
        for name in dir(module):
            function = getattr(module, name, None)
            if callable(function) and (getattr(function, "__self__", None) is generator or (
                    prefix == "np.random" and name in _NUMPY_FUNCTIONS)):
                _originals.append((module, name, function))
                setattr(module, name, _guard(function, f"{prefix}.{name}", owner))
        if prefix == "np.random":
            _originals.append((module, "default_rng", module.default_rng))
            module.default_rng = _guard(module.default_rng, "np.random.default_rng()", "the operating system",
                                        when=_unseeded)


def _uninstall():
    for module, name, function in reversed(_originals):
        setattr(module, name, function)
    _originals.clear()


def _states():
    """The global generators' states, compared as they are (numpy's holds an
    array: its bytes)."""
    out = []
    for _, generator, _, _ in _generators():
        state = generator.getstate() if hasattr(generator, "getstate") else generator.get_state()
        out.append(tuple(s.tobytes() if hasattr(s, "tobytes") else s for s in state)
                   if isinstance(state, tuple) and not isinstance(state[0], int) else state)
    return out


_patches = WhileTracing(_install, _uninstall)


@contextlib.contextmanager
def refuse_global_draws(tracing):
    """Refuse global-state draws in the tracing context for the duration;
    `tracing()` says whether the calling context traces."""
    global _tracing
    _tracing = tracing
    with _patches.held():
        before = _states()
        yield
        changed = _states() != before
    if changed:
        # No user line to name: the call went through a name the wrappers
        # never saw (or another thread drew meanwhile).
        raise ConversionError(
            "the global random state of Python's `random` or numpy's `np.random` changed while the "
            "program was built (a draw through a name bound before the conversion, such as `from random "
            f"import random`?): the program would repeat that draw on every run; {_WHAT_INSTEAD}")
