"""`declarative`, `StaticFunction`, `InputSpec` and `ProgramTranslator`.

A StaticFunction wraps a function or method. A call looks up a
`ConcreteProgram` by a cache key built from the arguments (tensor
shape/dtype/device or the `InputSpec`, non-tensor values, the `training`
flags of the modules involved). On a miss it converts the source (see
`conversion.py`), runs the converted function on feed Variables under a fresh
Program with op capture on, and compiles the result. On a hit it only calls
the compiled program: no Python-level model code runs at all.
"""

import functools
import inspect
import re
import sys
import threading
import warnings
import weakref

import torch

from ops.capture import CaptureMode, lift
from ops.tracer import Tracer
from runtime import _debug
from runtime.executor import Executor, run_compiled
from runtime.ir import Program, Variable, dtype_name, program_guard

from . import module_state

MANY_PROGRAMS = 8


class InputSpec:
    """The shape/dtype of one tensor argument; `None` (or -1) dimensions stay
    dynamic in the program, so one program serves every size there."""

    def __init__(self, shape, dtype="float32", name=None):
        self.shape = tuple(-1 if d is None else int(d) for d in shape)
        self.dtype = dtype_name(dtype)
        self.name = name

    @classmethod
    def from_tensor(cls, tensor, name=None):
        return cls(tuple(tensor.shape), tensor.dtype, name)

    def key(self):
        return ("spec", self.shape, self.dtype)

    def matches(self, tensor):
        return (tensor.dim() == len(self.shape) and dtype_name(tensor.dtype) == self.dtype
                and all(d in (-1, s) for d, s in zip(self.shape, tensor.shape)))

    def __repr__(self):
        return f"InputSpec(shape={list(self.shape)}, dtype={self.dtype!r}, name={self.name!r})"

    def __eq__(self, other):
        return isinstance(other, InputSpec) and (self.shape, self.dtype, self.name) == (other.shape, other.dtype, other.name)

    __hash__ = None


class ConcreteProgram:
    """One traced program: its feeds (in argument order), its outputs (the
    returned structure with Variables in it), and the compiled function."""

    def __init__(self, main_program, startup_program, inputs, outputs, fetch_vars, out_tree, state=None):
        self.main_program = main_program
        self.startup_program = startup_program
        self.inputs = inputs
        self.outputs = outputs
        self.fetch_vars = fetch_vars
        self.out_tree = out_tree
        # Module state (d2s/module_state.py): extra fetches written back to
        # module attributes after each run, attributes read at the start.
        self.state_writes, self.state_reads, state_fetch = state or ([], [], [])
        self.compiled = Executor().compiled(main_program, [v.name for v in inputs],
                                            [v.name for v in fetch_vars + state_fetch])
        self._bound = main_program.bound

    def run(self, tensors):
        if self.state_reads:
            module_state.refresh_reads(self.state_reads, self._bound)
        params = [self._bound[n] for n in self.compiled.param_names]
        results = run_compiled(self.compiled, list(tensors) + params)
        if self.state_writes:
            module_state.apply_writes(self.state_writes, results[len(self.fetch_vars):], _rebuild)
        return _rebuild(self.out_tree, results)


class ProgramCache:
    """Concrete programs of one StaticFunction, by cache key."""

    def __init__(self):
        self._programs = {}
        self.last = None
        self.state_attrs = []  # (module weakref, name) of module attributes the programs store

    def __len__(self):
        return len(self._programs)

    def __iter__(self):
        return iter(self._programs.values())

    def get(self, key):
        return self._programs.get(key)

    def put(self, key, concrete):
        self._programs[key] = concrete

    def clear(self):
        self._programs.clear()


# -- argument flattening --------------------------------------------------------------

def _flatten_args(value, specs, tensors):
    """A hashable key for `value`, collecting its tensors (in order) into
    `tensors`. `specs` maps a position in the tensor list to an InputSpec.
    This runs on every call: it builds nothing but the key."""
    if isinstance(value, torch.Tensor):
        spec = specs.get(len(tensors)) if specs else None
        tensors.append(value)
        if spec is not None:
            if not spec.matches(value):
                raise ValueError(f"tensor argument {len(tensors) - 1} has shape {list(value.shape)} and dtype "
                                 f"{dtype_name(value.dtype)}, which does not match {spec}")
            return spec.key() + (value.device.type,)
        return ("tensor", tuple(value.shape), value.dtype, value.device.type, value.requires_grad)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_flatten_args(v, specs, tensors) for v in value)
    if isinstance(value, dict):
        return ("dict",) + tuple((k, _flatten_args(v, specs, tensors)) for k, v in value.items())
    if isinstance(value, torch.nn.Module):
        return ("module", id(value))
    try:
        hash(value)
        return ("value", type(value).__name__, value)
    except TypeError:
        return ("object", id(value))


def _tensor_leaves(value, path):
    """(where, tensor) for each tensor of `value` ("args[0]", "kwargs['h']"),
    in the order `_flatten_args` collects them; used to name feeds."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensor_leaves(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensor_leaves(v, f"{path}[{k!r}]")


def _replace_tensors(value, feeds):
    if isinstance(value, torch.Tensor):
        return feeds.pop(0)
    if isinstance(value, (list, tuple)):
        items = [_replace_tensors(v, feeds) for v in value]
        return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
    if isinstance(value, dict):
        return {k: _replace_tensors(v, feeds) for k, v in value.items()}
    return value


def _output_tree(value, fetch):
    """The returned structure with ('fetch', i) for each Variable."""
    if isinstance(value, Variable):
        fetch.append(value)
        return ("fetch", len(fetch) - 1)
    if isinstance(value, torch.Tensor):
        fetch.append(lift(value))
        return ("fetch", len(fetch) - 1)
    if isinstance(value, (list, tuple)):
        return (type(value), [_output_tree(v, fetch) for v in value])
    if isinstance(value, dict):
        return (dict, {k: _output_tree(v, fetch) for k, v in value.items()})
    return ("const", value)


def _rebuild(tree, results):
    tag, body = tree
    if tag == "fetch":
        return results[body]
    if tag == "const":
        return body
    if tag is dict:
        return {k: _rebuild(v, results) for k, v in body.items()}
    items = [_rebuild(v, results) for v in body]
    return tag(*items) if hasattr(tag, "_fields") else tag(items)


# -- StaticFunction -------------------------------------------------------------------

def _converted(fn):
    from . import conversion
    return conversion.convert_function(fn)


class StaticFunction:
    """A function or method whose calls run as static programs."""

    def __init__(self, function, input_spec=None, instance=None):
        self._function = function
        self._instance = instance
        self._input_spec = list(input_spec) if input_spec is not None else None
        self._specs = dict(enumerate(self._input_spec)) if self._input_spec else None
        self.program_cache = ProgramCache()
        # instance -> its bound StaticFunction, which holds the instance; the
        # value is kept only weakly so the pair dies with the last outside
        # reference. The program caches live on in `_caches` (keyed weakly,
        # they never refer back to the instance) while the instance does.
        self._bound = weakref.WeakValueDictionary() if instance is None else {}
        self._caches = weakref.WeakKeyDictionary() if instance is None else None
        self._lock = threading.RLock()
        functools.update_wrapper(self, function)
        try:
            self._signature = inspect.signature(function)
        except (TypeError, ValueError):
            self._signature = None
        positional = [p for p in (self._signature.parameters.values() if self._signature else ())
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._n_positional = len(positional) - (1 if instance is not None else 0)

    # methods: one program cache per instance, held weakly so that a deleted
    # module (and everything its programs bind) is garbage-collected.
    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        try:
            bound = self._bound.get(instance)
        except TypeError:  # an unhashable or non-weakrefable instance: no caching
            return StaticFunction(self._function, self._input_spec, instance)
        if bound is None:
            bound = StaticFunction(self._function, self._input_spec, instance)
            caches = self._caches.setdefault(instance, ProgramCache()) if self._caches is not None else None
            if caches is not None:
                bound.program_cache = caches
            self._bound[instance] = bound
        return bound

    @property
    def dygraph_function(self):
        """The original Python function (bound when this is a method)."""
        if self._instance is not None:
            return self._function.__get__(self._instance)
        return self._function

    def _full_args(self, args):
        return ((self._instance,) + tuple(args)) if self._instance is not None else tuple(args)

    def _modules(self, args):
        for v in (self._instance,) + tuple(args):
            if isinstance(v, torch.nn.Module):
                yield from v.modules()

    def _normalize(self, args, kwargs):
        """Arguments as (positional, keyword) with defaults filled in, so that
        `f(x)` and `f(x, 2)` with a default of 2 share one program."""
        if self._signature is None or (not kwargs and len(args) == self._n_positional):
            return args, kwargs
        bound = self._signature.bind(*self._full_args(args), **kwargs)
        bound.apply_defaults()
        full = bound.args[1:] if self._instance is not None else bound.args
        return tuple(full), dict(bound.kwargs)

    def cache_key(self, args, kwargs):
        tensors = []
        key = (_flatten_args(tuple(args), self._specs, tensors),
               _flatten_args(kwargs, None, tensors) if kwargs else (),
               tuple(m.training for m in self._modules(args)))
        if self.program_cache.state_attrs:
            key += (module_state.key(self.program_cache.state_attrs),)
        return key, tensors

    def _lookup(self, args, kwargs):
        """(the concrete program for these arguments, their tensors), built on a miss."""
        args, kwargs = self._normalize(args, kwargs)
        key, tensors = self.cache_key(args, kwargs)
        concrete = self.program_cache.get(key)
        if concrete is None:
            concrete = self._build(key, args, kwargs)
        return concrete, tensors

    def __call__(self, *args, **kwargs):
        translator = ProgramTranslator()
        if not translator.enable_to_static:
            return self.dygraph_function(*args, **kwargs)
        concrete, tensors = self._lookup(args, kwargs)
        translator._last = self.program_cache.last = concrete
        return concrete.run(tensors)

    def get_concrete_program(self, *args, **kwargs):
        return self._lookup(args, kwargs)[0]

    @property
    def concrete_program(self):
        return self.program_cache.last

    def _feed_names(self):
        try:
            params = list(inspect.signature(self._function).parameters)
        except (TypeError, ValueError):
            params = []
        if self._instance is not None:
            params = params[1:]
        return params

    def _build(self, key, args, kwargs):
        with self._lock:
            converted = _converted(self._function)
            main, startup = Program(), Program()
            arg_leaves = list(_tensor_leaves(tuple(args), "args"))
            leaves = arg_leaves + list(_tensor_leaves(kwargs, "kwargs"))
            if leaves:
                main.device = leaves[0][1].device
            specs = self._input_spec or []
            arg_names = self._feed_names()
            feeds = []
            before = module_state.snapshot(self._modules(args))
            with program_guard(main, startup), Tracer(main, self._name_hints(args)) as tracer:
                for i, (path, t) in enumerate(leaves):
                    spec = specs[i] if i < len(specs) else None
                    name = spec.name if spec is not None and spec.name else _feed_name(path, arg_names)
                    name = name if name not in main.global_block().vars else main.unique_name(name)
                    shape = spec.shape if spec is not None else tuple(t.shape)
                    var = main.global_block().create_var(name=name, shape=shape, dtype=t.dtype, is_data=True,
                                                         stop_gradient=not t.requires_grad)
                    feeds.append(var)
                sym_args = _replace_tensors(tuple(args), list(feeds))
                sym_kwargs = _replace_tensors(dict(kwargs), list(feeds[len(arg_leaves):]))
                # Trace with autograd on whatever the caller's mode: only a
                # `no_grad` block inside the function marks ops gradient-free.
                with CaptureMode(), torch.enable_grad():
                    out = converted(*self._full_args(sym_args), **sym_kwargs)
                fetch = []
                out_tree = _output_tree(out, fetch)
                state_fetch = []
                writes, reads = module_state.collect(before, tracer.lifted, _output_tree, state_fetch)
            self._note_state(writes)
            main.verify()
            concrete = ConcreteProgram(main, startup, feeds, out, fetch, out_tree,
                                       (writes, reads, state_fetch) if writes else None)
            self.program_cache.put(key, concrete)
            if len(self.program_cache) == MANY_PROGRAMS:
                warnings.warn(
                    f"{self._function.__qualname__} has built {MANY_PROGRAMS} programs: its arguments change "
                    "shape or value between calls; use d2s.InputSpec with None dimensions, or pass changing "
                    "Python values as tensors", stacklevel=3)
            if _debug.level() >= 2:
                print(f"[d2s] program of {self._function.__qualname__}:\n{main.to_string()}", file=sys.stderr)
            return concrete

    def _note_state(self, writes):
        known = {(ref(), name) for ref, name in self.program_cache.state_attrs}
        for w in writes:
            if (w.module(), w.name) not in known:
                self.program_cache.state_attrs.append((w.module, w.name))

    def _name_hints(self, args):
        hints = {}
        for obj in (self._instance,) + tuple(args):
            if isinstance(obj, torch.nn.Module):
                for name, t in obj.named_parameters():
                    hints.setdefault(id(t), name)
                for name, t in obj.named_buffers():
                    hints.setdefault(id(t), name)
        return hints


def _feed_name(path, arg_names):
    """'x' for the first positional argument named x, 'args_2_0' otherwise."""
    m = re.match(r"args\[(\d+)\]$", path)
    if m and int(m.group(1)) < len(arg_names):
        return arg_names[int(m.group(1))]
    m = re.match(r"kwargs\['(\w+)'\]$", path)
    if m:
        return m.group(1)
    return re.sub(r"\W+", "_", path).strip("_")


def declarative(function=None, input_spec=None):
    """Run `function` as a static program (a decorator; also takes a method,
    or an `nn.Module` instance whose `forward` it converts in place)."""
    if function is None:
        return lambda f: declarative(f, input_spec=input_spec)
    if isinstance(function, StaticFunction):
        return function
    if isinstance(function, torch.nn.Module):
        module = function
        forward = type(module).forward
        if isinstance(forward, StaticFunction):
            return module
        raw = inspect.getattr_static(type(module), "forward", None)
        if isinstance(raw, staticmethod):
            static = StaticFunction(raw.__func__, input_spec)
        elif isinstance(raw, classmethod):
            static = StaticFunction(raw.__func__, input_spec, instance=type(module))
        else:
            static = StaticFunction(forward, input_spec, instance=module)
        object.__setattr__(module, "forward", static)
        return module
    if inspect.ismethod(function):
        return StaticFunction(function.__func__, input_spec, instance=function.__self__)
    if not callable(function):
        raise TypeError(f"declarative expects a function, a method or an nn.Module, got {type(function).__name__}")
    return StaticFunction(function, input_spec)


to_static = declarative


class ProgramTranslator:
    """The process-wide switch and inspection entry points."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            self = super().__new__(cls)
            self.enable_to_static = True
            self._last = None
            cls._instance = self
        return cls._instance

    def enable(self, enable_to_static=True):
        """False: every declarative function runs eagerly, as plain PyTorch."""
        if not isinstance(enable_to_static, bool):
            raise TypeError("enable() takes a bool")
        self.enable_to_static = enable_to_static

    @staticmethod
    def _static(fn):
        return fn if isinstance(fn, StaticFunction) else declarative(fn)

    def get_output(self, fn, *args, **kwargs):
        """Run `fn` as a static program (even when translation is disabled)."""
        static = self._static(fn)
        saved, self.enable_to_static = self.enable_to_static, True
        try:
            return static(*args, **kwargs)
        finally:
            self.enable_to_static = saved

    def get_func(self, fn):
        """The converted Python function."""
        static = self._static(fn)
        converted = _converted(static._function)
        return converted.__get__(static._instance) if static._instance is not None else converted

    def get_code(self, fn):
        """The converted source code, as a string."""
        from . import conversion
        return conversion.get_code(self._static(fn)._function)

    def get_program(self, fn, *args, **kwargs):
        """(main_program, startup_program, inputs, outputs) for these arguments."""
        concrete = self._static(fn).get_concrete_program(*args, **kwargs)
        self._last = concrete
        return concrete.main_program, concrete.startup_program, concrete.inputs, concrete.outputs

    def save_inference_model(self, dirname, feed=None, fetch=None):
        """Save the program of the latest declarative call; `feed`/`fetch`
        select inputs/outputs by index (default: all)."""
        concrete = self._last
        if concrete is None:
            raise ValueError("no declarative function has run yet: call it once before saving")
        from runtime.io import save_inference_model
        inputs = concrete.inputs if feed is None else [concrete.inputs[i] for i in feed]
        outputs = concrete.fetch_vars if fetch is None else [concrete.fetch_vars[i] for i in fetch]
        save_inference_model(dirname, [v.name for v in inputs], outputs, Executor(),
                             main_program=concrete.main_program)

