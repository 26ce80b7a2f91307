"""torch's process-wide settings read while a program is traced.

`torch.are_deterministic_algorithms_enabled()`, `torch.get_num_threads()`,
`torch.get_default_dtype()` and the like answer once, while the program
is built; the program holds the answer as a constant. After
`torch.use_deterministic_algorithms(True)` between calls, eager code that
asks takes the other branch; the program took the old one. So while a
trace is under way these queries are wrapped (ops/trace_patches.py): a
call from anything but d2s itself (the user's code, a library's, torch's
Python) notes the query and its answer in the tracer's `state_reads`, and
ops/python_values.py's `check_python_values` calls the query again before
each run (a changed answer converts again). Before / after, for
`return x * 2 if torch.are_deterministic_algorithms_enabled() else x`:

    tmp_0 = x                         check_python_values(<python values
                                          torch.are_deterministic_algorithms_enabled()=False>)
                                      tmp_0 = x

Setting them inside a program is refused (ops/torch_ops.py DENYLIST).
"""

import contextlib
import sys

import torch

from .trace_patches import WhileTracing
from .user_frames import INTERNAL_DIRS, TORCH_DIR

# Queries of settings a user or library may change between calls, answered
# by a plain value (d2s/module_watch.is_plain_value).
QUERIES = ("get_default_dtype", "get_default_device", "are_deterministic_algorithms_enabled",
           "is_deterministic_algorithms_warn_only_enabled", "get_deterministic_debug_mode", "get_num_threads",
           "get_num_interop_threads", "get_float32_matmul_precision", "is_anomaly_enabled",
           "is_anomaly_check_nan_enabled", "is_warn_always_enabled")

_D2S_DIRS = tuple(d for d in INTERNAL_DIRS if d != TORCH_DIR)
_tracing = None  # `tracer.active`, given by the tracer
_originals = {}


def _read_by_d2s():
    """Whether the query was asked on d2s's behalf: the first caller outside
    torch is d2s's own code (torch's meta kernels asking for the default
    dtype while d2s infers a factory's result), not the user's or a
    library's decision."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(_D2S_DIRS)


def _noting(name, query):
    def noted(*args, **kwargs):
        value = query(*args, **kwargs)
        trace = _tracing() if _tracing is not None else None
        if trace is not None and not args and not kwargs and not _read_by_d2s():
            trace.state_reads.setdefault(name, (query, value))
        return value

    noted.__wrapped__, noted.__name__, noted.__doc__ = query, query.__name__, query.__doc__
    return noted


def _install():
    for name in QUERIES:
        query = getattr(torch, name, None)
        if query is not None:
            _originals[name] = query
            setattr(torch, name, _noting(name, query))


def _uninstall():
    for name, query in _originals.items():
        setattr(torch, name, query)
    _originals.clear()


_patches = WhileTracing(_install, _uninstall)


@contextlib.contextmanager
def noting_queries(tracing):
    """Wrap the queries for the duration of a trace (`tracing()`: the tracer
    of the calling context, or None)."""
    global _tracing
    _tracing = tracing
    with _patches.held():
        yield

