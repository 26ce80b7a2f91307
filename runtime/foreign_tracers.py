"""PyTorch's own tracers meeting a d2s program: refused, or kept outside.

`torch.jit.trace` (and the TorchScript-based `torch.onnx.export`),
`torch.export.export` (and the dynamo-based `torch.onnx.export`, `make_fx`)
record the tensor operations one call runs. A d2s program run under them
would be recorded as the ops of this one call: one branch of each `cond`,
one trip count of each `while`, sizes frozen as constants. The result gives
wrong values, silently, for inputs that take another path. So every runner
asks `check(what)` first:

  - torch.jit tracing state set (`torch.jit.trace`, TorchScript ONNX export):
    an error naming d2s's own export and save;
  - a fake, proxy or functional dispatch mode active, or fake/functional
    tensors among the inputs (`torch.export.export`, dynamo ONNX export,
    `make_fx`): the same error;
  - Dynamo compiling the caller (`torch.compile`): not an error. The call
    goes through a function Dynamo may not trace (`torch.compiler.disable`),
    so Dynamo breaks its graph there and the program runs in d2s's runtime,
    right on every path; with `fullgraph=True` Dynamo raises, and its message
    carries ours.

`torch.jit.script` compiles source, not calls; the layers refuse it where
TorchScript asks them to prepare for scripting (`SCRIPT_MESSAGE`).
"""

import sys
import threading

import torch

_D2S_WAY = ("d2s holds the whole program (its cond/while ops): export it with "
            "d2s.onnx.export(model, 'model.onnx', input_spec=[d2s.InputSpec(...)]) or save it with "
            "d2s.jit.save(model, path, input_spec=[...]); d2s.onnx.export / d2s.jit.load also take a saved "
            "directory")

SCRIPT_MESSAGE = ("TorchScript (torch.jit.script, torch.jit.trace of a module) cannot compile a d2s program "
                  f"(a declarative function or module, or a loaded TranslatedLayer); {_D2S_WAY}")

NO_CODE_MESSAGE = ("a d2s declarative function has no `__code__` of its own (its code runs as a program; "
                   "`.dygraph_function` is the original), so torch.export cannot trace it; " + _D2S_WAY)

_MODES = tuple(getattr(torch._C._TorchDispatchModeKey, k) for k in ("FAKE", "PROXY", "FUNCTIONAL"))


class ForeignTraceError(RuntimeError):
    """A torch tracer (jit.trace, export, make_fx) is recording a d2s program."""


def _recording(tensors):
    """The tracer recording this call, or None."""
    if torch._C._get_tracing_state() is not None:
        return "torch.jit.trace (or torch.onnx.export with dynamo=False)"
    if torch._C._len_torch_dispatch_stack() and any(torch._C._get_dispatch_mode(k) is not None for k in _MODES):
        return "torch.export.export (or torch.onnx.export, make_fx)"
    for t in tensors:
        # Fake tensors without their mode active, functional wrappers: what
        # export's tracing hands a module; never what a user runs.
        if isinstance(t, torch.Tensor) and (type(t).__name__ == "FakeTensor" or torch._is_functional_tensor(t)):
            return "torch.export.export (or torch.onnx.export, make_fx)"
    return None


def check(what, tensors=()):
    """Raise ForeignTraceError when a torch tracer records this call of
    `what` (a description: "the declarative function 'f'")."""
    tracer = _recording(tensors)
    if tracer is not None:
        raise ForeignTraceError(
            f"{tracer} is recording {what}: it would record only the ops this one call runs (one branch of "
            f"each `if`, one trip count of each loop), which gives wrong results for inputs that take "
            f"another path; {_D2S_WAY}")


_modules, _DYNAMO = sys.modules, "torch._dynamo"
_local = threading.local()  # `passing`: this thread's call was checked (see `call`)
_is_compiling = torch.compiler.is_compiling
_tracing_state = torch._C._get_tracing_state
_dispatch_depth = torch._C._len_torch_dispatch_stack


def active():
    """Whether a call must go through `call`: Dynamo compiling the caller,
    torch.jit tracing, or some dispatch mode on (a few C calls; most modes,
    a FlopCounterMode, are harmless and `call` lets them through)."""
    # First: Dynamo folds is_compiling() to True while tracing, before any
    # call it cannot trace. Only Dynamo (or export, which loads it) compiles.
    if _DYNAMO in _modules and _is_compiling():
        return True
    if _tracing_state() is None and not _dispatch_depth():
        return False
    return not getattr(_local, "passing", False)


def call(fn, args, kwargs, what, tensors=()):
    """`fn(*args, **kwargs)` once `active()` said so: refused under a torch
    tracer (`check`); run outside Dynamo's graph while it compiles; else
    called, with `active()` false inside this thread's call."""
    if _is_compiling():
        return _run_outside_dynamo(_checked, fn, args, kwargs, what, tensors)
    return _checked(fn, args, kwargs, what, tensors)


def _checked(fn, args, kwargs, what, tensors):
    check(what, tensors)
    outer = getattr(_local, "passing", False)
    _local.passing = True
    try:
        return fn(*args, **kwargs)
    finally:
        _local.passing = outer


_outside_dynamo = None


def _run_outside_dynamo(fn, *args):
    """`fn(*args)` in a frame Dynamo does not trace (made on first use:
    Dynamo is loaded then, since it is compiling)."""
    global _outside_dynamo
    if _outside_dynamo is None:
        def outside(fn, args):
            return fn(*args)
        _outside_dynamo = torch.compiler.disable(
            outside, reason=f"a d2s program runs in d2s's runtime, outside torch.compile's graph; {_D2S_WAY}")
    return _outside_dynamo(fn, args)
