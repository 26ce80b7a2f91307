"""Process-wide settings read while a program is traced: torch's and the
environment's.

`torch.are_deterministic_algorithms_enabled()`, `torch.get_num_threads()`,
`torch.get_default_dtype()` and the like, and `os.environ.get("DEBUG")`,
answer once, while the program is built; the program holds the answer as
a constant. After `torch.use_deterministic_algorithms(True)` or
`os.environ["DEBUG"] = "1"` between calls, eager code that asks takes the
other branch; the program took the old one. So while a trace is under way
the queries are wrapped (ops/trace_patches.py): a read by anything but d2s
itself (the user's code, a library's, torch's Python on its own behalf)
notes the query and its answer in the tracer's `state_reads`, and
ops/python_values.py's `check_python_values` asks again before each run (a
changed answer converts again). Before / after, for
`return x * 2 if torch.are_deterministic_algorithms_enabled() else x`:

    tmp_0 = x                         check_python_values(<python values
                                          torch.are_deterministic_algorithms_enabled()=False>)
                                      tmp_0 = x

Setting torch's inside a program is refused (ops/torch_ops.py DENYLIST).
"""

import contextlib
import functools
import os
import sys

import torch

from .python_reads import global_names
from .trace_patches import WhileTracing
from .user_frames import INTERNAL_DIRS, TORCH_DIR, is_stdlib_file

# Queries of settings a user or library may change between calls, answered
# by a plain value (d2s/module_watch.is_plain_value).
QUERIES = ("get_default_dtype", "get_default_device", "are_deterministic_algorithms_enabled",
           "is_deterministic_algorithms_warn_only_enabled", "get_deterministic_debug_mode", "get_num_threads",
           "get_num_interop_threads", "get_float32_matmul_precision", "is_anomaly_enabled",
           "is_anomaly_check_nan_enabled", "is_warn_always_enabled")

# The queries as torch defines them (before a trace wraps them), by identity.
_BY_ID = {id(q): q for q in (getattr(torch, name, None) for name in QUERIES) if q is not None}
_D2S_DIRS = tuple(d for d in INTERNAL_DIRS if d != TORCH_DIR)
_tracing = None  # `tracer.active`, given by the tracer
_originals = {}
_environ_getitem = type(os.environ).__getitem__


def _decides(depth):
    """Whether the read is a decision of the code being traced: the first
    caller outside torch and the standard library (`os.getenv`,
    `Mapping.get`) is not d2s's own code (torch's meta kernels asking for
    the default dtype while d2s infers a factory's result), and no import is
    under way (a package imported while tracing reads its environment once,
    for itself)."""
    frame = sys._getframe(depth + 1)
    while frame is not None and (frame.f_code.co_filename.startswith((TORCH_DIR, "<frozen"))
                                 or is_stdlib_file(frame.f_code.co_filename)):
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith(_D2S_DIRS):
        return False
    outer = frame
    while outer is not None:  # an import under way (its code, and the functions that code calls)
        if outer.f_code.co_filename.startswith("<frozen importlib"):
            return False
        outer = outer.f_back
    return True


def imported_queries(functions):
    """label -> (query, answer) of the queries the code of `functions` calls
    by a global name of its own (`from torch import get_num_threads`): the
    trace wraps `torch.get_num_threads`, which such code does not look up.
    Their answers cannot change during the trace (setting torch's settings
    there is refused), so asking now gives what the code was answered."""
    found = {}
    for fn in functions:
        code, namespace = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
        if code is None or namespace is None:
            continue
        for name in global_names(code):
            value = namespace.get(name)
            query = _BY_ID.get(id(value))
            if query is not None and query is value:
                found[f"{name}()"] = (query, query())
    return found


def _note(label, query, value, depth):
    trace = _tracing() if _tracing is not None else None
    if trace is not None and label not in trace.state_reads and _decides(depth + 1):
        trace.state_reads[label] = (query, value)


def _noting(name, query):
    def noted(*args, **kwargs):
        value = query(*args, **kwargs)
        if not args and not kwargs:
            _note(f"torch.{name}()", query, value, 1)
        return value

    noted.__wrapped__, noted.__name__, noted.__doc__ = query, query.__name__, query.__doc__
    return noted


def _environ_read(self, key):
    """`os.environ[key]` (and so `.get`, `os.getenv`, `in`), noting it. The
    check reads the encoded value in `os.environ`'s own dict (a dict lookup,
    where `os.environ.get` decodes in Python: ~1 us)."""
    if self is os.environ and type(key) is str:
        encoded = self.encodekey(key)
        _note(f"os.environ[{key!r}]", functools.partial(self._data.get, encoded), self._data.get(encoded), 1)
    return _environ_getitem(self, key)


def _install():
    for name in QUERIES:
        query = getattr(torch, name, None)
        if query is not None:
            _originals[name] = query
            setattr(torch, name, _noting(name, query))
    type(os.environ).__getitem__ = _environ_read


def _uninstall():
    for name, query in _originals.items():
        setattr(torch, name, query)
    _originals.clear()
    type(os.environ).__getitem__ = _environ_getitem


_patches = WhileTracing(_install, _uninstall)


@contextlib.contextmanager
def noting_queries(tracing):
    """Wrap the queries for the duration of a trace (`tracing()`: the tracer
    of the calling context, or None)."""
    global _tracing
    _tracing = tracing
    with _patches.held():
        yield
