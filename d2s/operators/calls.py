"""Which code gets converted: ``convert_call`` and ``convert_method``.

User functions, lambdas, methods and user modules' ``forward`` are converted
(once; conversions are cached); builtins with a tensor meaning map to their
``convert_*`` helper; torch, numpy, the standard library, d2s itself,
classes and C functions are called as they are.
"""

import datetime
import functools
import inspect
import sys
import time
import types
import warnings

import torch
import torch.utils._pytree as pytree

from ops import autograd_function as autograd_function_ops
from ops.autograd_function import is_function_apply, record_apply
from ops import control_flow as cf, framework as fw, tracer
from ops.capture import constant_list, refuse_denied, text_for_a_message
from ops.recording import decide_bools
from ops.user_frames import SYMBOLIC_TYPES, error_at_user_line, is_stdlib_file
from ops.optimizer_ops import record_optimizer_call
from runtime.ir import Variable

from ..module_call import DATA_PARALLEL, data_parallel_message
from ..unwrap import is_wrapper, unwrap
from .py_builtins import BUILTINS, _item, _tolist
from .rng import convert_rng_call
from .state import is_var


def convert_method(obj, name):
    """``getattr(obj, name)`` for tensor methods that read a value: a graph
    tensor's ``item()`` is a 0-d tensor standing for the number (its value
    exists only at run time; see ``_item``), its ``tolist()`` a list of
    them (``_tolist``) unless pure ops compute it from constants (then the
    same Python list on every run, ops/capture.py)."""
    if name == "tolist" and isinstance(obj, Variable) and obj.kind == "tensor":
        listed = constant_list(obj)
        return (lambda: listed) if listed is not None else (lambda: _tolist(obj))
    if name == "item" and (is_var(obj) or isinstance(obj, torch.Tensor) and tracer.active() is not None):
        # A real tensor the traced code reaches (a buffer, a parameter) is
        # read when the program runs, as every other use of it is: its value
        # while tracing may not be its value then (`if self.initialized.item() == 0:`).
        return lambda: _item(obj)
    return convert_call(getattr(obj, name))


# Code from these top-level packages is called as it is, never converted.
_NOT_CONVERTED = frozenset({
    "torch", "numpy", "d2s", "ops", "runtime", "builtins", "gast", "astor", "safetensors",
    "hypothesis", "pytest", "_pytest", "pluggy", "typing_extensions",
})
# ... and so is the standard library (user_frames.is_stdlib_file).


# ... except these parts of torch, plain Python over tensors whose type
# checks (`isinstance(value, torch.Tensor)` in a distribution's argument
# validation) must see a graph tensor as a tensor, as converted code does;
# and the containers, whose `nn.Sequential.forward` calls the user's
# modules (timm's blocks): called as it is, it would run their forwards
# unconverted, where `x.shape` of a graph tensor has no run-time sizes.
# So does the activation-checkpointing wrapper of torch.distributed
# (`checkpoint_wrapper(block)`): its forward's `checkpoint` is then
# `_checkpointed`, the wrapped block converted.
_CONVERTED_TORCH = ("torch.distributions", "torch.nn.modules.container",
                    "torch.distributed.algorithms._checkpoint")


def _is_user_code(obj):
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] not in _NOT_CONVERTED or module.startswith(_CONVERTED_TORCH)


def _conversion():
    """d2s.conversion, imported when first needed. It cannot be imported at
    the top: conversion puts these operators into every function it
    converts, and converting a function this one calls is conversion again
    (the translator's own recursion, not a layering slip)."""
    from .. import conversion  # lazy: see the docstring
    return conversion


def _convertible(fn):
    code = fn.__code__
    return (_is_user_code(fn) and not _conversion().is_converted(fn)
            and not code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR)
            and not code.co_filename.startswith("<") and not is_stdlib_file(code.co_filename))


# Factories taking sizes as varargs: torch's argument parser rejects a
# run-time size (a Variable) in `zeros(n, 3)` before any capture hook runs,
# but accepts it in the tuple form `zeros((n, 3))`.
_SIZE_VARARGS = {torch.zeros, torch.ones, torch.empty, torch.rand, torch.randn}


def _call_with_packed_sizes(fn, *sizes, **kwargs):
    if len(sizes) > 1 and any(isinstance(s, Variable) for s in sizes):
        return fn(tuple(sizes), **kwargs)
    return fn(*sizes, **kwargs)


_OPTIMIZERS = (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
# torch's C tensor class (and its bases): where `torch.Tensor.t` and the
# other C methods are defined.
_TENSOR_CLASSES = tuple(c for c in torch.Tensor.__mro__ if c is not object)
_C_METHODS = (types.MethodDescriptorType, types.WrapperDescriptorType)


def _tensor_method(fn):
    """`torch.Tensor.t(x)`, `map(torch.Tensor.relu, xs)`: a C method of the
    tensor class called unbound. Its descriptor refuses a graph tensor
    (a TypeError naming no user line), so on one it is the bound call
    `x.t()`, which records the same op; on anything else it runs as written."""
    name = fn.__name__

    def call(self, *args, **kwargs):
        if isinstance(self, Variable):
            return getattr(self, name)(*args, **kwargs)
        return fn(self, *args, **kwargs)
    return call




# torch.compile's hints on a tensor (`torch._dynamo.mark_static_address(t)`
# in transformers' cache initialisation, `mark_dynamic`): eager only sets an
# attribute on the tensor that Dynamo reads. A graph tensor is made when the
# program runs, which no Dynamo traces: the hint is dropped (they refuse a
# Variable with a TypeError). Matched by module and name, as referring to
# them would import torch._dynamo.
_COMPILE_HINTS = frozenset({"mark_static_address", "mark_dynamic", "maybe_mark_dynamic", "mark_static",
                            "mark_unbacked"})


def _compile_hint(fn):
    def call(*args, **kwargs):
        if any(isinstance(a, Variable) for a in args):
            return None
        return fn(*args, **kwargs)
    return call


# nn.Module's conversions (`self.classifier = self.classifier.to(self.dtype)`
# in switch_transformers' router, run on every call). Traced, they would
# capture `param.to(...)` as ops and fail in `Module._apply`. Eager converts
# on the first call and finds nothing to do on later ones: a conversion that
# changes nothing is that, the module itself; one that would change the
# parameters while the program is built (ops traced before it already read
# them) is refused at the user's line.
_MODULE_CONVERSIONS = {"to": None, "float": torch.float32, "double": torch.float64, "half": torch.float16,
                       "bfloat16": torch.bfloat16, "cpu": "cpu"}


def _module_conversion(method):
    module, name = method.__self__, method.__func__.__name__

    def call(*args, **kwargs):
        if name == "to":
            if any(isinstance(a, Variable) for a in (*args, *kwargs.values())):
                raise error_at_user_line("`Module.to(tensor)` with a graph tensor: convert the module before the "
                                         "call, or pass the dtype/device (`.to(x.dtype)`)")
            device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        else:
            target = _MODULE_CONVERSIONS[name]
            device, dtype = (torch.device(target), None) if name == "cpu" else (None, target)
        changes = [n for n, t in (*module.named_parameters(), *module.named_buffers())
                   if (dtype is not None and (t.is_floating_point() or t.is_complex()) and t.dtype != dtype)
                   or (device is not None and t.device != torch.device(device))]
        if changes:
            raise error_at_user_line(
                f"`.{name}(...)` converts the module's `{changes[0]}` ({len(changes)} tensors) while the program "
                "is built, after which the program would read them converted where eager read them as they "
                "were: convert the model before calling it (eager's later calls find nothing to convert)")
        return module
    return call


@functools.lru_cache(maxsize=None)
def _takes_bools(fn):
    """Whether `fn` is a torch C function with a `bool` parameter in its ATen schema."""
    if not (getattr(fn, "__module__", None) or "").startswith("torch"):
        return False
    try:
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{fn.__name__}")
    except RuntimeError:
        return False
    return any(str(arg.type) == "bool" for schema in schemas for arg in schema.arguments)


def _deciding_bools(fn):
    """A torch C function whose argument parser refuses a run-time bool
    (`is_causal=q_len > 1`, a SymBool or a 0-d bool graph tensor) before any
    capture hook runs: called again with that bool decided for the inputs
    being traced, and checked when the program runs (ops.recording.decide_bools)."""
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as exc:
            if "must be bool, not" not in str(exc):
                raise
            args, kwargs, changed = decide_bools(args, kwargs, getattr(fn, "__name__", "a torch function"))
            if not changed:
                raise
        return fn(*args, **kwargs)
    return call


_CACHED = type(functools.lru_cache(maxsize=None)(lambda: None))  # functools._lru_cache_wrapper


def _through_cache(fn, cached):
    """A call of `@functools.lru_cache` / `@functools.cache` function or
    method `fn` (`cached`: the cache's wrapper). With arguments that hold
    no graph value (`mask(n)` of a Python int) it is called as eager calls
    it, through the cache, with capture off: the cache then holds what
    eager's first call would put there, and the program reads the result
    as a constant, as eager reads the cached tensor. With graph values the
    function itself is called, converted: through the cache it would keep
    the trace's graph values, which the user's eager calls (and the next
    trace) would then get (BEiT's relative position index, before: every
    eager BEiT failed after one declarative call); the program computes the
    result on every run, which equals the cached one for the pure function
    a cache assumes."""
    inner = convert_call(cached.__wrapped__)
    if cached is not fn:
        inner = types.MethodType(inner, fn.__self__)

    def call(*args, **kwargs):
        if any(isinstance(v, (Variable, *SYMBOLIC_TYPES)) for v in pytree.tree_leaves((args, kwargs))):
            return inner(*args, **kwargs)
        with torch._C.DisableTorchFunction():
            return fn(*args, **kwargs)
    return call


def convert_call(fn):
    """The callable to call in place of ``fn``. Equivalent Python: ``return fn``.

    User functions, lambdas, methods, user modules' ``forward`` and user
    objects' ``__call__`` are converted (once; conversions are cached);
    builtins with a tensor meaning map to their ``convert_*`` helper;
    everything else (torch, numpy, the standard library, d2s itself, classes,
    C functions) is returned as it is.
    """
    refuse_denied(fn)  # torch.save & co.: refused before they run (ops/torch_ops.py DENYLIST)
    rng_call = convert_rng_call(fn)
    if rng_call is not None:  # torch.get_rng_state(), fork_rng(): ops, not build-time calls
        return rng_call
    try:
        mapped = BUILTINS.get(fn) or _CALLS_FUNCTIONS.get(fn)
    except TypeError:  # unhashable callable
        mapped = None
    if mapped is not None:
        return mapped
    if fn in _SIZE_VARARGS:
        return functools.partial(_call_with_packed_sizes, fn)
    if _is_checkpoint(fn):
        return _checkpointed
    if _is_checkpoint(fn, "checkpoint_sequential"):
        # torch's own Python, converted as user code is: its `checkpoint`
        # calls are then `_checkpointed`'s, its modules' calls converted.
        return _conversion().convert_function(fn)
    if getattr(fn, "__module__", None) == "torch._dynamo.decorators" and getattr(fn, "__name__", None) in _COMPILE_HINTS:
        return _compile_hint(fn)
    if isinstance(fn, _C_METHODS) and getattr(fn, "__objclass__", None) in _TENSOR_CLASSES:
        return _tensor_method(fn)
    if isinstance(fn, types.BuiltinFunctionType) and _takes_bools(fn):
        return _deciding_bools(fn)
    cached = fn.__func__ if isinstance(fn, types.MethodType) else fn
    if isinstance(cached, _CACHED) and tracer.active() is not None:
        return _through_cache(fn, cached)
    if isinstance(fn, functools.partial):  # the function it wraps is user code to convert too
        return functools.partial(convert_call(fn.func), *fn.args, **fn.keywords)
    if is_wrapper(fn):  # a declarative function called from converted code: its own function
        return convert_call(fn.dygraph_function)
    source = scripted_source(fn)
    if source is not None:
        return convert_call(source)
    if isinstance(fn, types.FunctionType):
        return _conversion().convert_function(fn) if _convertible(fn) else fn
    if isinstance(fn, DATA_PARALLEL):  # its per-step Python bookkeeping would run once, at build time
        raise error_at_user_line(f"calling a {type(fn).__name__} module inside declarative code: "
                                 + data_parallel_message(fn))
    if is_function_apply(fn):  # one op running the user's forward, and backward (ops/autograd_function.py)
        return record_apply(fn, convert_call)
    if isinstance(fn, types.MethodType) and isinstance(fn.__self__, _OPTIMIZERS):
        return record_optimizer_call(fn)  # opt.step() is an op of the program, not a build-time call
    if isinstance(fn, types.MethodType) and isinstance(fn.__self__, torch.nn.Module) \
            and getattr(torch.nn.Module, getattr(fn.__func__, "__name__", ""), None) is fn.__func__ \
            and fn.__func__.__name__ in _MODULE_CONVERSIONS:
        return _module_conversion(fn)
    if isinstance(fn, types.MethodType):
        func = unwrap(fn.__func__)
        if isinstance(func, types.FunctionType) and _convertible(func):
            return types.MethodType(_conversion().convert_function(func), fn.__self__)
        return fn
    if isinstance(fn, torch.nn.Module) and _is_user_code(type(fn)):
        return _module_forward(fn)
    if isinstance(fn, type) and _post_init_to_convert(fn) is not None:
        return functools.partial(_construct_with_converted_post_init, fn)
    call = None if isinstance(fn, type) else inspect.getattr_static(type(fn), "__call__", None)
    if isinstance(call, types.FunctionType) and _convertible(call):
        # An instance of a user class with `__call__` (an activation object, a
        # cache): called as it is, its body would see graph tensors unconverted.
        return types.MethodType(_conversion().convert_function(call), fn)
    return fn


def scripted_source(fn):
    """The Python function a `@torch.jit.script` function was compiled from
    (torch keeps it; it means the same, and takes graph tensors), or None."""
    source = getattr(fn, "_torchdynamo_inline", None) if isinstance(fn, torch.jit.ScriptFunction) else None
    return source if isinstance(source, types.FunctionType) else None


def _is_checkpoint(fn, name="checkpoint"):
    module = sys.modules.get("torch.utils.checkpoint")
    return module is not None and fn is getattr(module, name)


def _checkpointed(function, *args, use_reentrant=None, context_fn=None, determinism_check="default", debug=False,
                  early_stop=True, preserve_rng_state=True, **kwargs):
    """`torch.utils.checkpoint.checkpoint(function, *args)` in converted
    code: `function` converted, its ops a `checkpoint` op's block that
    torch's checkpoint runs when the program runs (activations freed after
    the forward, computed again in backward; ops/control_flow/checkpoint_op.py).
    Called as it is, torch's checkpoint would run `function` unconverted on
    graph tensors (a tensor `if` refused there, `isinstance(t,
    torch.Tensor)` false). As eagerly, the reentrant variant takes no
    keywords, and its outputs need an input that requires grad (else none
    of its parameters gets a gradient: the block runs without gradients,
    and keeps nothing for backward)."""
    if use_reentrant is None:
        warnings.warn("torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly; "
                      "use_reentrant=False is recommended (torch's warning: without it, torch takes True)",
                      stacklevel=2)
        use_reentrant = True
    converted = convert_call(function)
    if tracer.active() is None:  # converted code running eagerly: torch's checkpoint itself
        return torch.utils.checkpoint.checkpoint(
            converted, *args, use_reentrant=use_reentrant, determinism_check=determinism_check, debug=debug,
            early_stop=early_stop, preserve_rng_state=preserve_rng_state,
            **({} if context_fn is None else {"context_fn": context_fn}), **kwargs)
    if context_fn is torch.utils.checkpoint.noop_context_fn:
        context_fn = None
    if use_reentrant:
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        if not any(isinstance(a, (Variable, torch.Tensor)) and a.requires_grad for a in args):
            with torch.no_grad():
                return converted(*args)
    # A `context_fn` or `debug` asks for torch's machinery around each op:
    # the block's ops run inline then (values eager's, the memory saving lost).
    inline = "a context_fn is given" if context_fn is not None else "debug=True is given" if debug else None
    settings = {"preserve_rng_state": bool(preserve_rng_state)}
    if not use_reentrant:  # (settings of the non-reentrant variant only)
        settings.update(determinism_check=determinism_check, early_stop=bool(early_stop))
    return cf.checkpointed(converted, args, kwargs, bool(use_reentrant), settings, inline)


def _post_init_to_convert(cls):
    """The user `__post_init__` of a dataclass, when constructing one should
    run it converted: the dataclass's `__init__` is generated code (no
    source, never converted), so its `__post_init__` would see graph tensors
    unconverted (transformers' ModelOutput tests `is_tensor(first)` there, is
    told no for a graph tensor and iterates it). None otherwise."""
    import dataclasses
    if not dataclasses.is_dataclass(cls) or type(cls).__call__ is not type.__call__:
        return None
    post_init = inspect.getattr_static(cls, "__post_init__", None)
    if not isinstance(post_init, types.FunctionType) or not _convertible(post_init):
        return None
    return post_init


def _construct_with_converted_post_init(cls, *args, **kwargs):
    """``cls(*args, **kwargs)`` as type.__call__ makes it, with the instance's
    own `__post_init__` (found before the class's) the converted one while
    `__init__` runs; removed afterwards, so the object is eager's."""
    obj = cls.__new__(cls, *args, **kwargs) if cls.__new__ is not object.__new__ else object.__new__(cls)
    if not isinstance(obj, cls):
        return obj
    own = getattr(obj, "__dict__", None)
    if own is None:  # __slots__: no per-instance override possible
        cls.__init__(obj, *args, **kwargs)
        return obj
    own["__post_init__"] = types.MethodType(_conversion().convert_function(_post_init_to_convert(cls)), obj)
    try:
        cls.__init__(obj, *args, **kwargs)
    finally:
        own.pop("__post_init__", None)
    return obj


# Builtins that call a function they are given: the function is converted,
# as a direct call of it would be (`map(double, xs)` ran `double` unconverted,
# where `isinstance(t, torch.Tensor)` is False for a graph tensor).
def _converted_or_none(fn):
    return None if fn is None else convert_call(fn)


def _map(fn, *iterables):
    return map(convert_call(fn), *iterables)


def _filter(fn, iterable):
    return filter(_converted_or_none(fn), iterable)


def _sorted(iterable, /, *, key=None, reverse=False):
    return sorted(iterable, key=_converted_or_none(key), reverse=reverse)


def _reduce(fn, *args):
    return functools.reduce(convert_call(fn), *args)


def _clock(name, original):
    def read():
        return original() if tracer.active() is None else fw.host_clock(name)
    return read


def _wall_time(label, original, given=None):
    """`datetime.now()` & co.: a date or text no program value can hold,
    read while the program is built, which every run would repeat: refused
    at the user's line, unless the line makes a message (a log line's
    timestamp is made while the program is built, as documented). `given`:
    the position of the time argument that, passed, makes the call a pure
    conversion (`time.localtime(secs)`), not a read of the clock."""
    def read(*args, **kwargs):
        reads_clock = given is None or len(args) <= given or args[given] is None
        if reads_clock and tracer.active() is not None and not text_for_a_message((__file__,)):
            raise error_at_user_line(
                f"`{label}` reads the host's clock while the program is built: the program would hold that "
                "time and repeat it on every run, where eager reads it again on every call; read "
                "`time.time()` (converted code reads it when the program runs), or pass the time as an argument")
        return original(*args, **kwargs)
    return read


# function: (label, position of the time argument that makes it a conversion, if any)
_WALL_TIMES = {datetime.datetime.now: ("datetime.now()", None), datetime.datetime.utcnow: ("datetime.utcnow()", None),
               datetime.datetime.today: ("datetime.today()", None), datetime.date.today: ("date.today()", None),
               time.localtime: ("time.localtime()", 0), time.gmtime: ("time.gmtime()", 0),
               time.ctime: ("time.ctime()", 0), time.asctime: ("time.asctime()", 0),
               time.strftime: ("time.strftime()", 1)}

_CALLS_FUNCTIONS = {map: _map, filter: _filter, sorted: _sorted, functools.reduce: _reduce,
                    # `time.perf_counter()`, also imported by name: read when the program runs (ops/framework.py)
                    **{fn: _clock(name, fn) for name, fn in fw.CLOCKS.items()},
                    **{fn: _wall_time(label, fn, given) for fn, (label, given) in _WALL_TIMES.items()}}


def module_call_entry(cls):
    """The `__call__` a user module class defines in place of `forward`
    (nn.Module's `__call__` overridden, `forward` not): the function its
    calls run, which d2s converts as it would `forward`. None otherwise."""
    if cls.forward is not torch.nn.Module.forward:
        return None
    call = inspect.getattr_static(cls, "__call__", None)
    if call is torch.nn.Module.__call__ or not isinstance(call, types.FunctionType) or not _convertible(call):
        return None
    return call


def _module_forward(module):
    """A user module's converted ``forward``, bound; with hooks, a call of the
    module (``Module.__call__`` runs them) whose ``forward`` and hooks are the
    converted ones; the module itself when its forward is not converted."""
    forward = _converted_forward(module)
    if (module._forward_hooks or module._forward_pre_hooks or torch.nn.modules.module._global_forward_hooks
            or torch.nn.modules.module._global_forward_pre_hooks):
        if forward is module or module_call_entry(type(module)) is not None:
            return module
        return functools.partial(_call_with_hooks, module, forward)
    return forward


def _call_with_hooks(module, forward, *args, **kwargs):
    """``module(*args, **kwargs)`` with torch's own hook machinery around the
    converted ``forward`` and hooks (run as they are, the forward and hooks
    would see graph tensors in unconverted code: `isinstance(x, torch.Tensor)`
    False there, a silently different path)."""
    hook_dicts = (module._forward_pre_hooks, module._forward_hooks, torch.nn.modules.module._global_forward_pre_hooks,
                  torch.nn.modules.module._global_forward_hooks)  # (all modules' hooks are run here too)
    saved = [dict(d) for d in hook_dicts]
    own = module.__dict__.get("forward", _MISSING)
    try:
        for d in hook_dicts:
            for key, hook in d.items():
                d[key] = convert_call(hook)
        module.__dict__["forward"] = forward
        return module(*args, **kwargs)
    finally:
        if own is _MISSING:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = own
        for d, original in zip(hook_dicts, saved):
            d.update(original)


_MISSING = object()


def _converted_forward(module):
    """The converted ``forward`` of a user module (bound), or the module
    itself when there is none to convert."""
    forward = module.__dict__.get("forward")
    if is_wrapper(forward):
        forward = unwrap(forward)
    elif forward is None:
        raw = inspect.getattr_static(type(module), "forward", None)
        if isinstance(raw, (staticmethod, classmethod)):
            # `@staticmethod def forward(x)` takes no module; a classmethod the class.
            func = raw.__func__
            if not (isinstance(func, types.FunctionType) and _convertible(func)):
                return module
            converted = _conversion().convert_function(func)
            return converted if isinstance(raw, staticmethod) else types.MethodType(converted, type(module))
        forward = unwrap(module_call_entry(type(module)) or type(module).forward)
    elif isinstance(forward, types.MethodType) or isinstance(forward, types.FunctionType):
        # `self.forward = self._forward` in __init__: what Module.__call__ runs.
        return convert_call(forward)
    else:
        return module
    if isinstance(forward, types.FunctionType) and _convertible(forward):
        return types.MethodType(_conversion().convert_function(forward), module)
    return module


# A Function applied by code d2s does not convert, inlined for a save, has its forward converted too.
autograd_function_ops._convert = convert_call
