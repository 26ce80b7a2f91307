"""Shape inference without importing torch._dynamo.

Many of torch's Python meta kernels (the type-promotion wrapper of
`torch._refs`, `addmm`'s decomposition behind `nn.Linear`, ...) are wrapped
in `torch._disable_dynamo`, whose wrapper imports `torch._dynamo` on its
first call, just to exclude the function from Dynamo's tracing. That import
is most of the first conversion in a process (about half a second on a quiet
machine, several times that under load), and d2s never runs Dynamo.

Excluding a function from Dynamo's tracing means nothing while Dynamo is not
loaded: nothing can be tracing, and `torch._dynamo.disable(fn)` then only
calls `fn`. So while a trace or a shape inference runs, each such wrapper
finds a "disabled" version cached on its function (`fn.__dynamo_disable`)
that calls `fn` directly, deciding on every call: once `torch._dynamo` is
loaded (another thread compiling meanwhile) it calls torch's own disabled
version. The cache is removed afterwards, so torch is left as it was:

    with dynamo_free():       # torch._dynamo not in sys.modules
        infer(...)            # _disable_dynamo wrappers call their function directly
    # the wrappers are as torch made them

When the wrappers are not what this module expects (another torch
version), nothing is changed: inference is then only slower. The same for
wrappers it cannot find: they are found as the referrers of their shared
code object, and `gc.get_referrers` does not look at objects frozen by
`gc.freeze()` (an application that froze its heap after importing torch
gets torch's wrappers unchanged, and torch._dynamo imported).

While a trace has symbolic shapes, ShapeEnv notes where each symbol and
guard came from (for its messages), skipping the frames of the files that
`symbolic_shapes.uninteresting_files()` lists; torch makes that list by
importing its compiler modules. Inside `dynamo_free()` the list is made
from the same module names without importing them (`_listed_files`): the
same answer for every frame that can be on the stack, since the files it
leaves out are Dynamo's own. Only for the `uninteresting_files` this module
knows (checked by the names its code uses); otherwise torch's runs.

`ShapeEnv()` asks `torch.fx.experimental.validator` whether translation
validation (a Z3-based debugging mode, off unless
`torch.fx.experimental._config.translation_validation` is set) is on; that
module imports `torch._dynamo` too. With the option off the answer is
False, so `shape_env()` answers it without loading the module.
"""

import gc
import os
import sys
import threading
import types

_ATTR = "__dynamo_disable"
_wrapped = None  # (function, recursive) behind each of torch's _disable_dynamo wrappers, found once
_later = []      # the same for wrappers made after that (`add_wrapper`)


def _wrapper_code():
    try:
        from torch._compile import _disable_dynamo
    except ImportError:
        return None
    code = _disable_dynamo(lambda: None).__code__
    expected = _ATTR in code.co_consts and {"fn", "recursive"} <= set(code.co_freevars)
    return code if expected else None


def _wrapped_fn(wrapper, code):
    # The wrapper's closure holds the function it wraps and `recursive`.
    cells = dict(zip(code.co_freevars, wrapper.__closure__))
    return cells["fn"].cell_contents, cells["recursive"].cell_contents


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


class _Direct:
    """`fn`'s "disabled" version while d2s holds the patch: `fn` itself
    while torch._dynamo is not loaded, else what torch's wrapper would
    have made and cached (`torch._dynamo.disable(fn, recursive, wrapping=False)`)."""

    __slots__ = ("fn", "recursive", "disabled")

    def __init__(self, fn, recursive):
        self.fn, self.recursive, self.disabled = fn, recursive, None

    def __call__(self, *args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return self.fn(*args, **kwargs)
        if self.disabled is None:
            import torch._dynamo
            self.disabled = torch._dynamo.disable(self.fn, self.recursive, wrapping=False)
        return self.disabled(*args, **kwargs)


class dynamo_free:  # noqa: N801 - used as a context manager, like contextlib's
    """Torch's `_disable_dynamo` wrappers call their function directly
    inside the `with` while torch._dynamo is not loaded, and ShapeEnv's file
    list is made without importing it.

    Entries nest and may overlap between threads: the first entry patches,
    the last exit restores (a trace holds one for its whole length, and
    each inference inside it enters again at no cost). `refresh()` extends
    the patch to what was loaded since (the symbolic-shape modules,
    imported on the first dynamic dimension)."""

    def __enter__(self):
        global _depth
        with _lock:
            _depth += 1
            if _depth == 1:
                _refresh()
        return self

    def __exit__(self, *exc):
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0:
                _restore()


_lock = threading.Lock()
_depth = 0           # entries of dynamo_free now active, all threads together
_patched = []        # (function, its _Direct) given by this activation
_listed = None       # (symbolic_shapes module, torch's uninteresting_files) while replaced


def refresh():
    """Inside `dynamo_free()`: cover what was imported since it began."""
    with _lock:
        if _depth:
            _refresh()


def _refresh():
    global _wrapped, _listed, _torch_listing
    if "torch._dynamo" in sys.modules:
        return  # torch's own wrappers and list cost nothing more now
    if _wrapped is None:
        _wrapped = _find_wrapped()
    for fn, recursive in _wrapped + _later:
        attrs = getattr(fn, "__dict__", None)
        if attrs is not None and _ATTR not in attrs:
            attrs[_ATTR] = direct = _Direct(fn, recursive)
            _patched.append((fn, direct))
    module = sys.modules.get("torch.fx.experimental.symbolic_shapes")
    listed = getattr(module, "uninteresting_files", None)
    # Only torch's own cached function, not computed yet (else it costs nothing more).
    if _listed is None and getattr(listed, "cache_info", None) is not None and not listed.cache_info().currsize \
            and _known_listing(listed):
        _torch_listing = listed
        module.uninteresting_files = _uninteresting_files
        _listed = (module, listed)


def _restore():
    global _listed
    for fn, direct in _patched:
        # Only our own entry: Dynamo loaded meanwhile may have set its own.
        if fn.__dict__.get(_ATTR) is direct:
            del fn.__dict__[_ATTR]
    _patched.clear()
    if _listed is not None:
        module, listed = _listed
        if module.uninteresting_files is _uninteresting_files:
            module.uninteresting_files = listed
        _listed = None


# The modules whose files torch's `symbolic_shapes.uninteresting_files()`
# (torch 2.13) lists, except Dynamo's own (torch._dynamo.eval_frame, and
# torch._dynamo.guards.uninteresting_files(): external_utils and the
# polyfills): a frame of Dynamo's cannot be on the stack while Dynamo is not
# loaded. Besides these it lists torch/_higher_order_ops/*.py and "<string>".
_LISTED_MODULES = (
    "torch", "torch.fx.experimental.symbolic_shapes", "torch.export._trace", "torch.fx.experimental.recording",
    "torch.fx.experimental.sym_node", "torch.fx.interpreter", "torch.fx._symbolic_trace", "torch._compile",
    "torch._inductor.sizevars", "torch._library.custom_ops", "torch._library.fake_impl",
    "torch._subclasses.meta_utils", "torch._subclasses.fake_tensor", "torch._logging._internal",
    "torch._logging.structured",
)
# The names the code of that version's function uses: another version's is left to run.
_LISTING_NAMES = frozenset((
    "torch._compile", "torch._dynamo.eval_frame", "torch._higher_order_ops", "torch._inductor.sizevars",
    "torch._library.custom_ops", "torch._library.fake_impl", "torch._logging", "torch._subclasses.fake_tensor",
    "torch._subclasses.meta_utils", "torch.export._trace", "sys", "modules", "__name__", "export", "_trace", "fx",
    "experimental", "recording", "sym_node", "interpreter", "_symbolic_trace", "_compile", "_dynamo",
    "eval_frame", "_inductor", "sizevars", "_library", "custom_ops", "fake_impl", "_subclasses", "meta_utils",
    "fake_tensor", "_logging", "_internal", "structured", "torch._dynamo.guards", "os", "path", "dirname",
    "_higher_order_ops", "__file__", "glob", "join", "set", "guards", "uninteresting_files", "inspect", "getfile",
))


def _known_listing(listed):
    code = getattr(getattr(listed, "__wrapped__", None), "__code__", None)
    return code is not None and _names(code) == _LISTING_NAMES


def _names(code):
    # With the comprehensions' own (a code object of their own before Python 3.12, inlined since).
    return frozenset(code.co_names).union(*(_names(c) for c in code.co_consts if isinstance(c, types.CodeType)))


_torch_listing = None  # torch's uninteresting_files, once replaced


def _uninteresting_files():
    if "torch._dynamo" in sys.modules:
        return _torch_listing()  # loaded meanwhile (another thread): torch's own list
    return _listed_files()


_files = None


def _listed_files():
    """`uninteresting_files()` less Dynamo's files, importing nothing: a
    loaded module's file, else where the import system would find it."""
    global _files
    if _files is None:
        import glob

        import torch
        root = os.path.dirname(torch.__file__)
        files = {"<string>"} | set(glob.glob(os.path.join(root, "_higher_order_ops", "*.py")))
        for name in _LISTED_MODULES:
            module = sys.modules.get(name)
            if module is not None:
                files.add(module.__file__)
            else:
                path = os.path.join(root, *name.split(".")[1:])
                files.add(path + ".py" if os.path.isfile(path + ".py") else os.path.join(path, "__init__.py"))
        _files = frozenset(files)
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
