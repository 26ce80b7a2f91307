"""Shape inference without importing torch._dynamo.

Many of torch's Python meta kernels (the type-promotion wrapper of
`torch._refs`, `addmm`'s decomposition behind `nn.Linear`, ...) are wrapped
in `torch._disable_dynamo`, whose wrapper imports `torch._dynamo` on its
first call, just to exclude the function from Dynamo's tracing. That import
is most of the first conversion in a process (about half a second on a quiet
machine, several times that under load), and d2s never runs Dynamo.

Excluding a function from Dynamo's tracing means nothing while Dynamo is not
loaded: nothing can be tracing. So while a shape inference runs and
`torch._dynamo` is not imported, each such wrapper is given its own function
as the "disabled" version it caches (`fn.__dynamo_disable = fn`), and the
cache is removed afterwards, so code that later loads Dynamo gets torch's
behaviour unchanged:

    with dynamo_free():       # torch._dynamo not in sys.modules
        infer(...)            # _disable_dynamo wrappers call their function directly
    # the wrappers are as torch made them

When the wrappers are not what this module expects (another torch
version), nothing is changed: inference is then only slower.

While a trace has symbolic shapes, ShapeEnv notes where each symbol and
guard came from, skipping the frames of "uninteresting" files; torch lists
them by importing its compiler modules (`torch._dynamo`, `torch.export`,
`torch._inductor`) on the first note. Inside `dynamo_free()` that list is
torch's own source files already loaded, found without importing anything:
the notes are torch's debugging aids, which d2s does not read.

`ShapeEnv()` asks `torch.fx.experimental.validator` whether translation
validation (a Z3-based debugging mode, off unless
`torch.fx.experimental._config.translation_validation` is set) is on; that
module imports `torch._dynamo` too. With the option off the answer is
False, so `shape_env()` answers it without loading the module.
"""

import gc
import sys
import types

_ATTR = "__dynamo_disable"
_wrapped = None  # the functions behind torch's _disable_dynamo wrappers, found once


_later = []      # the functions behind wrappers made after that (`add_wrapper`)


def _wrapper_code():
    try:
        from torch._compile import _disable_dynamo
    except ImportError:
        return None
    code = _disable_dynamo(lambda: None).__code__
    return code if _ATTR in code.co_consts and "fn" in code.co_freevars else None


def _wrapped_fn(wrapper, code):
    # The wrapper's closure holds the function it wraps.
    return wrapper.__closure__[code.co_freevars.index("fn")].cell_contents


def _find_wrapped():
    code = _wrapper_code()
    if code is None:
        return []
    # Every wrapper shares one code object.
    return [_wrapped_fn(f, code) for f in gc.get_referrers(code)
            if getattr(f, "__code__", None) is code and f.__closure__ is not None]


def add_wrapper(wrapper):
    """Also call `wrapper`'s function directly inside `dynamo_free()` (a
    `_disable_dynamo` wrapper made after the first `dynamo_free()`, such as
    torch's wrapping of a TorchDispatchMode subclass's `__torch_dispatch__`)."""
    code = _wrapper_code()
    if code is not None and getattr(wrapper, "__code__", None) is code:
        _later.append(_wrapped_fn(wrapper, code))


class dynamo_free:  # noqa: N801 - used as a context manager, like contextlib's
    """Torch's `_disable_dynamo` wrappers call their function directly
    inside the `with` (only while torch._dynamo is not imported), and
    ShapeEnv's file list is `_torch_files()`. `refresh()` extends that to
    what was loaded since the `with` began (the symbolic-shape modules,
    imported on a trace's first dynamic dimension)."""

    def __enter__(self):
        self.patched, self.listed, self.module = [], None, None
        self.refresh()
        return self

    def refresh(self):
        global _wrapped
        if "torch._dynamo" in sys.modules:
            return
        if _wrapped is None:
            _wrapped = _find_wrapped()
        for fn in _wrapped + _later:
            attrs = getattr(fn, "__dict__", None)
            if attrs is not None and _ATTR not in attrs:
                attrs[_ATTR] = fn
                self.patched.append(fn)
        module = sys.modules.get("torch.fx.experimental.symbolic_shapes")
        listed = getattr(module, "uninteresting_files", None)
        # Only torch's own cached function, not computed yet (else it costs nothing more).
        if self.module is None and getattr(listed, "cache_info", None) is not None and not listed.cache_info().currsize:
            module.uninteresting_files = _torch_files
            self.module, self.listed = module, listed

    def __exit__(self, *exc):
        for fn in self.patched:
            # Only our own entry: Dynamo imported inside the `with` may have set its own.
            if fn.__dict__.get(_ATTR) is fn:
                del fn.__dict__[_ATTR]
        if self.module is not None and self.module.uninteresting_files is _torch_files:
            self.module.uninteresting_files = self.listed


_files = None


def _torch_files():
    global _files
    if _files is None:
        _files = {getattr(m, "__file__", None) for name, m in list(sys.modules.items())
                  if name == "torch" or name.startswith("torch.")} - {None}
    return _files


def shape_env(**kwargs):
    """A `ShapeEnv(**kwargs)`, made without importing torch._dynamo when
    translation validation is off (it is unless asked for)."""
    from torch.fx.experimental import _config
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    name = "torch.fx.experimental.validator"
    if name in sys.modules or _config.translation_validation:
        return ShapeEnv(**kwargs)
    stub = types.ModuleType(name)
    stub.translation_validation_enabled = lambda: False
    sys.modules[name] = stub
    try:
        return ShapeEnv(**kwargs)
    finally:
        # Later imports get the real module.
        if sys.modules.get(name) is stub:
            del sys.modules[name]


def drop_idle_trace_handler():
    """Remove torch's structured-trace log handler when it is idle, as torch
    itself does on the first trace event: torch installs it at import and,
    outside Meta's infrastructure and without TORCH_TRACE, it removes itself
    when the first event comes. Until then every event is built in full (a
    symbolized stack for each new symbol), and that first build imports
    torch's compiler stack."""
    import os

    import torch
    from torch._logging import _internal
    for handler in list(_internal.trace_log.handlers):
        idle = type(handler).__name__ == "LazyTraceHandler" and getattr(handler, "root_dir", 0) is None \
            and getattr(handler, "stream", 0) is None
        if idle and hasattr(torch.version, "git_version") and os.getenv("MAST_HPC_JOB_NAME") is None:
            _internal.trace_log.removeHandler(handler)
