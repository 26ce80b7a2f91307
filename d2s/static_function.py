"""`declarative`, `StaticFunction`, `InputSpec` and `ProgramTranslator`.

A StaticFunction wraps a function or method. A call looks up a
`ConcreteProgram` by a cache key built from the arguments (tensor
shape/dtype/device or the `InputSpec`, non-tensor values, the `training`
flags of the modules involved). On a miss it converts the source (see
`conversion.py`), runs the converted function on feed Variables under a fresh
Program with op capture on, and compiles the result. On a hit it only calls
the compiled program: no Python-level model code runs at all.
"""

import collections
import copyreg
import functools
import inspect
import re
import sys
import threading
import warnings
import weakref

import torch

from ops.capture import CaptureMode
from ops import tracer
from ops.framework import check_dims as fw_check_dims, check_strides as fw_check_strides
from ops.tracer import Tracer
from runtime import _debug, foreign_tracers
from runtime import runner
from runtime.executor import Executor
from runtime.errors import ConversionError, DecisionFailed
from runtime.ir import Program, Variable, dtype_name, program_guard, torch_dtype
from runtime.output_tree import rebuild
from runtime.passes import check_level

from . import decisions, input_trees, module_watch
from .output_types import holds_variable, output_tree as _output_tree

from . import module_state
from .operators.calls import module_call_entry

MANY_PROGRAMS = 8
# Programs one StaticFunction keeps (per bound instance) before evicting the
# least recently used; `fn.program_cache.max_size = n` changes one cache.
PROGRAM_CACHE_SIZE = 64


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

    def __init__(self, main_program, startup_program, inputs, outputs, fetch_vars, out_tree, optimize="default",
                 state=None, layout=None):
        self.main_program = main_program
        # The feeds' strides the trace read (`x.stride()`, `is_contiguous()`,
        # strides of views of them): None when it read none; else per feed its
        # strides, or None for "contiguous" (a feed whose sizes vary). A call
        # whose feeds differ gets a program of its own (_layout_matches).
        self.layout = layout
        self.startup_program = startup_program
        self.inputs = inputs
        self.outputs = outputs
        self.fetch_vars = fetch_vars
        self.out_tree = out_tree
        self.optimize = optimize
        # Module state (d2s/module_state.py): extra fetches written back to
        # module attributes after each run, attributes read at the start.
        self.state_writes, self.state_reads, self.state_fetch = state or ([], [], [])
        self.state_attrs, self.state_assumed = [], ()  # set by StaticFunction._build
        self.compiled = Executor().compiled(main_program, [v.name for v in inputs],
                                            [v.name for v in fetch_vars + self.state_fetch], optimize)
        self._inference = None  # the CompiledBlock for calls with grad mode off, made on the first one
        self._transposed_version = self._transposed_state = None
        self._transposed_sources, self._transposed = [], []
        self._params_version = None
        self._params = ()
        # A single returned tensor (the common case) needs no tree rebuild.
        self._single = out_tree == ("fetch", 0) and not self.state_writes
        # Nothing to do around the call but pass the parameters (the hit
        # path in StaticFunction.__call__ then calls the function itself).
        self._plain = not self.state_reads and not self.state_writes and layout is None
        self.decisions = None  # the decisions.Group of the programs sharing its cache key, once there are more

    def run(self, tensors):
        program = self.main_program
        if self.state_reads:
            # The previous call's state is what the module attributes hold now.
            module_state.refresh_reads(self.state_reads, program.bound)
            self._params_version = None
        if self._params_version != program._version:
            # Bound tensors change only through Program.bind, which bumps the version.
            self._params = [program.bound[n] for n in self.compiled.param_names]
            self._params_version = program._version
        entry = self.compiled if _grad_enabled() else (self._inference or self._compile_inference())
        try:
            if entry.derived:
                results = entry.fn(*tensors, *self._params, *self._transposes(entry))
            else:
                results = entry.fn(*tensors, *self._params)
        except DecisionFailed:
            raise  # as it is: the declarative call converts again (d2s/decisions.py)
        except Exception as exc:  # noqa: BLE001 - re-raised naming the failing op
            runner.reraise(entry, exc)
        if self.state_writes:
            module_state.apply_writes(self.state_writes, results[len(self.fetch_vars):], rebuild)
        return results[0] if self._single else rebuild(self.out_tree, results)


    def _transposes(self, entry):
        """The transposed weights `entry` takes after the parameters
        (runtime/passes/pretranspose.py, fast level). They are views made
        once and remade whenever a weight's tensor, storage, version or
        `requires_grad`, or the grad/inference mode changed: a view made
        under no_grad carries no gradient, one made from a swapped `.data`
        reads the old storage."""
        version = (entry, self.main_program._version)
        if version != self._transposed_version:  # which tensors: new only through Program.bind
            self._transposed_version = version
            self._transposed_sources = [self.main_program.bound[n] for n in entry.derived]
            self._transposed_state = None
        sources = self._transposed_sources
        # `_version`: after an in-place update of a weight (an optimizer
        # step) autograd would rebuild the old view's gradient function as a
        # slow generic `as_strided` one; a fresh `t()` costs less.
        state = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                 [t.data_ptr() for t in sources], [t.requires_grad for t in sources],
                 [t._version for t in sources])
        if state != self._transposed_state:
            self._transposed_state = state
            self._transposed = [t.t() for t in sources]
        return self._transposed

    def _compile_inference(self):
        """The variant run when grad mode is off: the same passes, then
        in-place reuse of dead temporaries (runtime/passes/inplace.py)."""
        entry = Executor().compiled(self.main_program, self.compiled.feed_names, self.compiled.fetch_names,
                                    self.optimize, inference=True)
        # Same parameters in the same order (the passes never change them).
        self._inference = entry if entry.param_names == self.compiled.param_names else self.compiled
        return self._inference


_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor
_generation = module_watch._generation


class ProgramCache:
    """Concrete programs of one StaticFunction, by cache key, least recently
    used first; past `max_size` programs (default `PROGRAM_CACHE_SIZE`) the
    least recently used one is dropped."""

    def __init__(self, max_size=None):
        self._programs = collections.OrderedDict()
        self.max_size = PROGRAM_CACHE_SIZE if max_size is None else max_size
        self.last = None
        self._recent = None  # the program at the end of `_programs`
        self.state_attrs = []  # (module weakref, name) of module attributes the programs store

    def __len__(self):
        return len(self._distinct())

    def __iter__(self):
        return iter(self._distinct())

    def _distinct(self):
        # A program may be cached under two keys (StaticFunction._build: the
        # key before and after module state joined the key).
        return list({id(c): c for c in self._programs.values()}.values())

    def get(self, key):
        concrete = self._programs.get(key)
        if concrete is not None and concrete is not self._recent:
            # Already the most recently used: the common hit moves nothing.
            self._programs.move_to_end(key)
            self._recent = concrete
        return concrete

    def put(self, key, concrete):
        self._programs[key] = concrete
        self._recent = concrete
        while len(self._programs) > max(1, self.max_size):
            self._programs.popitem(last=False)

    def clear(self):
        """Drop every program (the next call builds anew)."""
        self._programs.clear()
        self.last = self._recent = None


class _Identities:
    """Objects (modules, parameters, buffers) as a key part. It holds them
    weakly, so a cached key neither keeps a module alive nor matches a new
    object that reuses a dead one's id. A StaticFunction interns these (one
    object per set of identical objects, `StaticFunction._intern_tree`), so
    the key hashes and compares it by identity, in C: no Python `__hash__`
    or `__eq__` call on the hit path."""

    __slots__ = ("_refs", "__weakref__")

    def __init__(self, objects):
        self._refs = tuple(map(_weak, objects))

    def same(self, other):
        """Whether both hold the same live objects, in the same order."""
        if len(self._refs) != len(other._refs):
            return False
        for a, b in zip(self._refs, other._refs):
            obj = a()
            if obj is None or obj is not b():
                return False
        return True


def _weak(obj):
    try:
        return weakref.ref(obj)
    except TypeError:  # an object that takes no weak reference: held strongly
        return lambda: obj


class _SymbolicArguments(Exception):
    """A Variable among the arguments: the caller is building a program."""


# -- argument flattening --------------------------------------------------------------

def _flatten_args(value, specs, tensors, depth=0):
    """A hashable key for `value`, collecting its tensors (in order) into
    `tensors`. (`specs` is unused: InputSpecs apply to whole arguments, see
    `StaticFunction._spec_key`.) This runs on every call: it builds nothing
    but the key."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        # torch.Size hashes and compares as the tuple of its sizes.
        return ("tensor", value.shape, value.dtype, value.device, value.requires_grad)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_flatten_args(v, specs, tensors, depth + 1) for v in value)
    if type(value) is dict:
        return ("dict",) + tuple((k, _flatten_args(v, specs, tensors, depth + 1)) for k, v in value.items())
    if isinstance(value, torch.nn.Module):
        return ("module", id(value))
    if isinstance(value, Variable):
        raise _SymbolicArguments
    n = input_trees.node(value, depth)  # a ModelOutput, a dataclass, a cache holding tensors
    if n is not None:
        return ("node", n.cls, n.structure) + tuple(_flatten_args(v, specs, tensors, depth + 1)
                                                    for _, v in n.children)
    if isinstance(value, dict):  # a dict subclass holding no tensor
        return ("dict", type(value)) + tuple((k, _flatten_args(v, specs, tensors, depth + 1))
                                             for k, v in value.items())
    try:
        hash(value)
        return ("value", type(value).__name__, value)
    except TypeError:
        return ("object", id(value))


def _tensor_leaves(value, path, depth=0):
    """(where, tensor) for each tensor of `value` ("args[0]", "kwargs['h']"),
    in the order `_flatten_args` collects them; used to name feeds."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensor_leaves(v, f"{path}[{i}]", depth + 1)
    elif type(value) is dict:
        for k, v in value.items():
            yield from _tensor_leaves(v, f"{path}[{k!r}]", depth + 1)
    elif not isinstance(value, (torch.nn.Module, Variable)):
        n = input_trees.node(value, depth)
        for label, v in n.children if n is not None else ():
            yield from _tensor_leaves(v, path + label, depth + 1)


def _replace_tensors(value, feeds, path="", made=None, depth=0):
    """`value` with its tensors replaced by `feeds` (in `_tensor_leaves`
    order); a user type holding tensors becomes a copy holding them
    (d2s/input_trees.py), recorded in `made`."""
    if isinstance(value, torch.Tensor):
        return feeds.pop(0)
    if isinstance(value, (list, tuple)):
        items = [_replace_tensors(v, feeds, f"{path}[{i}]", made, depth + 1) for i, v in enumerate(value)]
        return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
    if type(value) is dict:
        return {k: _replace_tensors(v, feeds, f"{path}[{k!r}]", made, depth + 1) for k, v in value.items()}
    if isinstance(value, (torch.nn.Module, Variable)):
        return value
    n = input_trees.node(value, depth)
    if n is None:
        return value
    children = [_replace_tensors(v, feeds, path + label, made, depth + 1) for label, v in n.children]
    return input_trees.copy_with(n, children, path, made if made is not None else [])


def _mode_of(instance, args, kwargs):
    """The `training` mode a program is traced in: that of the module it is
    the forward of, else of the first module passed in; None without one."""
    module = next((v for v in (instance, *args, *kwargs.values()) if isinstance(v, torch.nn.Module)), None)
    return None if module is None else "train" if module.training else "eval"


def _python_object(value):
    """An argument the trace may have written graph values into (an empty
    cache it filled): not a tensor, a module, a number or a string."""
    return not isinstance(value, (torch.Tensor, torch.nn.Module, Variable, int, float, str, type(None)))


def _layout_guard(feeds, tensors, origin):
    """ConcreteProgram.layout for a trace that read strides (first at
    `origin`, the user's (file, line, text) or None); refused when the trace
    could not know the layout it read (a non-contiguous feed whose sizes
    vary: tracing takes such feeds as contiguous)."""
    layout = tuple(getattr(v, "strides", None) for v in feeds)  # none set: sizes vary (see _build)
    if not _layout_matches(layout, tensors):
        name = next(v.name for v, s, t in zip(feeds, layout, tensors) if s is None and not t.is_contiguous())
        message = (f"this reads strides (`x.stride()`, `is_contiguous()`, of its inputs or of tensors made from "
                   f"them), and the input '{name}' is not contiguous while its sizes vary (InputSpec None "
                   "dimensions): pass it contiguous (`.contiguous()`), or give it static sizes")
        if origin is None:
            raise ConversionError(message)
        filename, lineno, line = origin
        raise ConversionError(f"{message}\n    {line}" if line else message, filename, lineno)
    return layout


def _layout_matches(layout, tensors):
    for strides, t in zip(layout, tensors):
        if strides is None:
            if not t.is_contiguous():
                return False
        elif t.stride() != strides:
            return False
    return True


def _with_state_part(key, state_part):
    """A cache key (`StaticFunction.cache_key`: ..., training flags, module
    state part, optimize level) with another module state part."""
    return key[:-2] + (state_part, key[-1])


# -- StaticFunction -------------------------------------------------------------------

def _converted(fn):
    from . import conversion
    return conversion.convert_function(fn)


class StaticFunction:
    """A function or method whose calls run as static programs."""

    def __init__(self, function, input_spec=None, instance=None, optimize=None):
        self._function = function
        # None: the translator's level (ProgramTranslator().optimize).
        self._optimize = None if optimize is None else check_level(optimize)
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
        self._flags_generation = None
        self._flags = ()
        self._trees = []  # weak references to the interned _Identities of cached keys
        self._lock = threading.RLock()
        functools.update_wrapper(self, function)
        try:
            self._signature = inspect.signature(function)
        except (TypeError, ValueError):
            self._signature = None
        if instance is not None and self._signature is not None and self._signature.parameters:
            # What `inspect.signature(module.forward)` says (torch.export binds inputs by it): no `self`.
            self.__signature__ = self._signature.replace(parameters=list(self._signature.parameters.values())[1:])
        positional = [p for p in (self._signature.parameters.values() if self._signature else ())
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._n_positional = len(positional) - (1 if instance is not None else 0)

    def __reduce__(self):
        # copy.deepcopy / pickle of a module whose forward is declarative: the
        # copy's forward is declarative on the copy (the memo gives the copied
        # instance), with no programs: those bind the original's tensors.
        return (StaticFunction, (self._function, self._input_spec, self._instance, self._optimize))

    # methods: one program cache per instance, held weakly so that a deleted
    # module (and everything its programs bind) is garbage-collected.
    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        try:
            bound = self._bound.get(instance)
        except TypeError:  # an unhashable or non-weakrefable instance: no caching
            return StaticFunction(self._function, self._input_spec, instance, self._optimize)
        if bound is None:
            bound = StaticFunction(self._function, self._input_spec, instance, self._optimize)
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

    def _normalize(self, args, kwargs):
        """Arguments as (positional, keyword) with defaults filled in, so that
        `f(x)` and `f(x, 2)` with a default of 2 share one program."""
        if self._signature is None or (not kwargs and len(args) == self._n_positional):
            return args, kwargs
        bound = self._signature.bind(*self._full_args(args), **kwargs)
        bound.apply_defaults()
        full = bound.args[1:] if self._instance is not None else bound.args
        return tuple(full), dict(bound.kwargs)

    def _as_called(self, args, kwargs, form):
        """Normalized arguments (`_normalize`) handed over as the caller
        passed them: `form` is (number of positional arguments, keyword
        names) of the call; defaults the caller left out stay out. Wrappers
        read their arguments by how they came (transformers'
        `merge_with_config_defaults` adds `use_cache=` unless it came as a
        keyword: bound positionally, the function got it twice)."""
        if form is None or self._signature is None:
            return args, kwargs
        n, keys = form
        names = self._feed_names()
        params = self._signature.parameters
        named = dict(kwargs)
        for i in range(n, len(args)):
            if i >= len(names) or params[names[i]].kind is inspect.Parameter.VAR_POSITIONAL:
                return args, kwargs  # *args: only positions can carry them
            named[names[i]] = args[i]
        return tuple(args[:n]), {k: named[k] for k in keys}

    def cache_key(self, args, kwargs, translator=None):
        """(key, tensors): runs on every call, so it builds nothing but the
        key: one flat tuple (hashed and compared without nesting), whose
        last item is the optimisation level."""
        stale = self._flags_generation != module_watch._generation[0]
        parts = []
        if self._specs is None:
            # The common case: a top-level tensor adds its shape, dtype,
            # device and requires_grad. Other arguments add one tuple that
            # starts with a tag string, so no two layouts give equal keys.
            tensors = args  # the feeds, while every argument is a tensor
            for i, v in enumerate(args):
                if isinstance(v, torch.Tensor):
                    parts += (v.shape, v.dtype, v.device, v.requires_grad)
                    if tensors is not args:
                        tensors.append(v)
                else:
                    if tensors is args:
                        tensors = list(args[:i])
                    stale = stale or isinstance(v, torch.nn.Module)
                    parts.append(_flatten_args(v, None, tensors))
        else:
            tensors = []
            stale = stale or any(isinstance(v, torch.nn.Module) for v in args)
            for i, v in enumerate(args):
                spec = self._specs.get(i)
                if spec is None:
                    parts.append(_flatten_args(v, None, tensors))
                else:  # already checked and converted by _spec_args
                    tensors.append(v)
                    parts.append(spec.key() + (v.device.type,))
        if kwargs:
            stale = stale or any(isinstance(v, torch.nn.Module) for v in kwargs.values())
            tensors = list(tensors)
            parts.append(_flatten_args(kwargs, None, tensors))
        if stale:
            self._refresh_training_flags(args, kwargs)
        state_attrs = self.program_cache.state_attrs
        parts += (len(args), self._flags, module_state.key(state_attrs) if state_attrs else (),
                  self._optimize or (translator or ProgramTranslator._instance or ProgramTranslator())._optimize)
        return tuple(parts), tensors

    def _spec_args(self, args):
        """The positional arguments with each one that has an InputSpec
        checked and converted by the one input policy (runtime.runner): a
        tensor or array of the spec's rank and static sizes, its dtype cast
        only when safe; errors name the parameter."""
        if not self._specs or any(isinstance(v, Variable) for v in args):
            return args
        names = self._feed_names()
        out = list(args)
        for i, spec in self._specs.items():
            if i >= len(out):
                break
            name = names[i] if i < len(names) else f"args[{i}]"
            try:
                out[i] = runner.convert_input(out[i], name, torch_dtype(spec.dtype), spec.shape, "argument")
            except ValueError as exc:
                raise ValueError(f"{exc}, which does not match {spec}") from None
        return tuple(out)

    def _refresh_training_flags(self, args, kwargs):
        """Re-read the `training` flag of every module involved (the
        instance's tree, then modules passed as arguments) and which modules,
        parameters and buffers they are. Between refreshes this is cached:
        `module_watch` says when some module's flag, submodules, parameters
        or buffers changed."""
        self._flags_generation = module_watch._generation[0]
        modules = [m for v in (self._instance, *args, *kwargs.values())
                   if isinstance(v, torch.nn.Module) for m in v.modules()]
        tree = _Identities(modules + [t for m in modules for d in (m._parameters, m._buffers)
                                      for t in d.values() if t is not None])
        tree = self._intern_tree(tree)
        # (count, bit mask, identities): the flags hashed and compared in
        # constant time on every call.
        self._flags = (len(modules), sum(1 << i for i, m in enumerate(modules) if m.training), tree)

    def _intern_tree(self, tree):
        """The interned `_Identities` holding the same objects as `tree`
        (then a cached key built with it matches again), else `tree`, now
        interned. Runs only on a refresh, never on a hit."""
        live = []
        for r in self._trees:
            old = r()
            if old is not None:
                if old.same(tree):
                    return old
                live.append(r)
        live.append(weakref.ref(tree))
        self._trees = live
        return tree

    def _lookup(self, args, kwargs):
        """(the concrete program for these arguments, their tensors), built on a miss."""
        form = (len(args), tuple(kwargs))
        args, kwargs = self._normalize(args, kwargs)
        args = self._spec_args(args)
        key, tensors = self.cache_key(args, kwargs)
        concrete = self.program_cache.get(key)
        if concrete is None:
            concrete = self._build(key, args, kwargs, form=form)
        if concrete.layout is not None:
            concrete = self._for_layout(concrete, key, args, kwargs, tensors, form)
        return concrete, tensors

    def _for_layout(self, concrete, key, args, kwargs, tensors, form=None):
        """`concrete`, a program that read its feeds' strides, when these
        feeds have them; else the program for these strides, cached under
        `key` with the strides added."""
        if _layout_matches(concrete.layout, tensors):
            return concrete
        key = (("layout",) + tuple(tuple(t.stride()) for t in tensors),) + key  # the last two parts stay last
        return self.program_cache.get(key) or self._build(key, args, kwargs, form=form)

    def __call__(self, *args, **kwargs):
        if foreign_tracers.active():  # torch.jit.trace, torch.export, torch.compile (runtime/foreign_tracers.py)
            return foreign_tracers.call(self, args, kwargs, f"the declarative function {self.__qualname__!r}",
                                        [t for _, t in _tensor_leaves((args, kwargs), "args")])
        translator = ProgramTranslator._instance or ProgramTranslator()
        if not translator.enable_to_static:
            return self.dygraph_function(*args, **kwargs)
        cache = self.program_cache
        if (not kwargs and len(args) == self._n_positional and self._specs is None
                and self._flags_generation == _generation[0] and not cache.state_attrs):
            # The hit path for plain tensor arguments: `cache_key` and
            # `ConcreteProgram.run` inlined (the key built here is the one
            # `cache_key` builds for these arguments); any other argument,
            # a miss or a program that needs more than a call falls through.
            if len(args) == 1:  # the most common signature, without the loop
                v = args[0]
                key = ((v.shape, v.dtype, v.device, v.requires_grad, 1, self._flags, (),
                        self._optimize or translator._optimize) if type(v) is _Tensor else None)
            else:
                parts = []
                for v in args:
                    if type(v) is not _Tensor:
                        parts = None
                        break
                    parts += (v.shape, v.dtype, v.device, v.requires_grad)
                else:
                    parts += (len(args), self._flags, (), self._optimize or translator._optimize)
                key = parts and tuple(parts)
            if key is not None:
                concrete = cache._programs.get(key)
                if concrete is not None and concrete is cache._recent:
                    translator._last = cache.last = concrete
                    # ConcreteProgram.run's choice of function, when it needs nothing more than a call
                    # (with grad mode off: the in-place variant, once compiled, without transposes).
                    entry = concrete.compiled if _grad_enabled() else concrete._inference
                    if concrete._plain and concrete._params_version == concrete.main_program._version \
                            and entry is not None and not entry.derived:
                        try:
                            results = entry.fn(*args, *concrete._params)
                        except DecisionFailed as exc:
                            return decisions.rerun(self, key, concrete, args, kwargs, args, exc)
                        except Exception as exc:  # noqa: BLE001 - re-raised naming the failing op
                            runner.reraise(entry, exc)
                        return results[0] if concrete._single else rebuild(concrete.out_tree, results)
                    if concrete.layout is None:
                        try:
                            return concrete.run(args)
                        except DecisionFailed as exc:
                            return decisions.rerun(self, key, concrete, args, kwargs, args, exc)
        called, form = (args, kwargs), (len(args), tuple(kwargs))
        if kwargs or len(args) != self._n_positional:
            args, kwargs = self._normalize(args, kwargs)
        if self._specs:
            args = self._spec_args(args)
        try:
            key, tensors = self.cache_key(args, kwargs, translator)
        except _SymbolicArguments:
            return self._inline(*called)
        concrete = cache._programs.get(key)  # ProgramCache.get, inlined on the hit path
        if concrete is None or concrete is not cache._recent:
            concrete = cache.get(key) or self._build(key, args, kwargs, form=form)
        if concrete.layout is not None:
            concrete = self._for_layout(concrete, key, args, kwargs, tensors, form)
        translator._last = cache.last = concrete
        try:
            return concrete.run(tensors)
        except DecisionFailed as exc:
            return decisions.rerun(self, key, concrete, args, kwargs, tensors, exc, form)

    def _inline(self, args, kwargs):
        """Called on Variables (static code inside program_guard): run the
        converted function on them, so its ops join the current program."""
        hints = tracer.current().name_hints
        for tensor_id, name in self._name_hints(args).items():
            hints.setdefault(tensor_id, name)
        with CaptureMode(), torch.enable_grad():
            return _converted(self._function)(*self._full_args(args), **kwargs)

    # torch.jit.script: it asks a function to prepare for scripting, and
    # reads `_torchscript_modifier` of a module's forward before compiling it.
    def __prepare_scriptable__(self):
        raise foreign_tracers.ForeignTraceError(foreign_tracers.SCRIPT_MESSAGE)

    @property
    def _torchscript_modifier(self):
        raise foreign_tracers.ForeignTraceError(foreign_tracers.SCRIPT_MESSAGE)

    @property
    def __code__(self):
        # An AttributeError as before (`getattr(f, "__code__", None)` is None),
        # with a message for torch.export, which reads a forward's `__code__` first.
        raise AttributeError(foreign_tracers.NO_CODE_MESSAGE)

    def __repr__(self):
        owner = f" of {type(self._instance).__name__}" if self._instance is not None else ""
        specs = f", input_spec={self._input_spec}" if self._input_spec else ""
        n = len(self.program_cache)
        return (f"<d2s.StaticFunction {self._function.__qualname__}{owner}{specs}, "
                f"{n} program{'' if n == 1 else 's'} cached>")

    def get_concrete_program(self, *args, **kwargs):
        return self._lookup(args, kwargs)[0]

    @property
    def concrete_program(self):
        return self.program_cache.last

    def _feed_names(self):
        """The parameter names, without `self` for a method."""
        params = list(self._signature.parameters) if self._signature is not None else []
        if self._instance is not None:
            params = params[1:]
        return params

    def _build(self, key, args, kwargs, exact=False, form=None):
        """The program for these arguments, cached under `key`. `exact`
        (converting again after a failed decision, d2s/decisions.py): a
        dynamic dimension of size 0 or 1 is traced as that size, not as 2,
        and checked when the program runs. `form`: how the caller passed
        the arguments (`_as_called`)."""
        with self._lock:
            converted = _converted(self._function)
            main, startup = Program(), Program()
            arg_leaves = list(_tensor_leaves(tuple(args), "args"))
            leaves = arg_leaves + list(_tensor_leaves(kwargs, "kwargs"))
            if leaves:
                main.device = leaves[0][1].device
            main.mode = _mode_of(self._instance, args, kwargs)
            specs = self._input_spec or []
            arg_names = self._feed_names()
            feeds = []
            before = module_state.snapshot(
                m for v in (self._instance, *args, *kwargs.values()) if isinstance(v, torch.nn.Module)
                for m in v.modules())
            with program_guard(main, startup), Tracer(main, self._name_hints(args)) as tr:
                for i, (path, t) in enumerate(leaves):
                    m = re.match(r"args\[(\d+)\]$", path)
                    spec = specs[int(m.group(1))] if m and int(m.group(1)) < len(specs) else None
                    name = spec.name if spec is not None and spec.name else _feed_name(path, arg_names)
                    name = name if name not in main.global_block().vars else main.unique_name(name)
                    shape = spec.shape if spec is not None else tuple(t.shape)
                    fixed = [(i, n) for i, (d, n) in enumerate(zip(shape, t.shape)) if exact and d == -1 and n < 2]
                    shape = tuple(n if (i, n) in fixed else d for i, (d, n) in enumerate(zip(shape, t.shape)))
                    var = main.global_block().create_var(name=name, shape=shape, dtype=t.dtype, is_data=True,
                                                         stop_gradient=not t.requires_grad)
                    tr.symbolize(var, hints=tuple(t.shape))  # example sizes decide what tracing assumes
                    if all(type(d) is int for d in var.dims):
                        var.strides = tuple(t.stride())  # and its layout (ops/capture.py _strides)
                    tr.examples[name] = t  # and example values the numbers read from it (int(t))
                    feeds.append(var)
                    if fixed:
                        fw_check_dims(var, fixed)
                state = input_trees.record_state([v for v in (*args, *kwargs.values()) if _python_object(v)])
                made, remaining = [], list(feeds)  # taken in `leaves` order: the arguments, then kwargs
                sym_args = tuple(_replace_tensors(v, remaining, arg_names[i] if i < len(arg_names) else
                                                  f"args[{i}]", made) for i, v in enumerate(args))
                sym_kwargs = {k: _replace_tensors(v, remaining, k, made) for k, v in kwargs.items()}
                # Trace with autograd on whatever the caller's mode: only a
                # `no_grad` block inside the function marks ops gradient-free.
                sym_args, sym_kwargs = self._as_called(sym_args, sym_kwargs, form)
                with CaptureMode(), torch.enable_grad():
                    out = converted(*self._full_args(sym_args), **sym_kwargs)
                changed = input_trees.changed_argument(made) or next(
                    ((name, type(v).__name__) for name, v in zip(arg_names + [f"args[{i}]" for i in range(
                        len(arg_names), len(args))], args) if _python_object(v) and holds_variable(v)), None) \
                    or next(((k, type(v).__name__) for k, v in kwargs.items()
                             if _python_object(v) and holds_variable(v)), None)
                if changed is not None:
                    input_trees.restore(state)
                    raise ConversionError(
                        f"{self._function.__qualname__} changes its argument `{changed[0]}` (a {changed[1]}) in "
                        "place: a program cannot change the caller's object when it runs, and d2s gives the "
                        "trace a copy; return the changed value instead (a cache passed in and updated in "
                        "place, transformers' past_key_values, is not carried yet)")
                fetch = []
                out_tree = _output_tree(out, fetch, numbers=True)
                state_fetch = []
                writes, reads = module_state.collect(before, tr.lifted, _output_tree, state_fetch)
                reads += module_state.global_reads(self._converted_functions(), tr.lifted,
                                                   {r.var_name for r in reads})
                self._refuse_global_state(main)
                layout = _layout_guard(feeds, [t for _, t in leaves], tr.layout_read_at) if tr.reads_layout \
                    else None
                if layout is not None:
                    # Checks at the program's start, which travel with a saved program.
                    block = main.global_block()
                    n = len(block.ops)
                    for var, strides in zip(feeds, layout):
                        fw_check_strides(var, strides)
                    block.ops[:] = block.ops[n:] + block.ops[:n]
            noted = self._note_state(writes, reads)
            main.verify()
            concrete = ConcreteProgram(main, startup, feeds, out, fetch, out_tree, key[-1],
                                       (writes, reads, state_fetch) if writes or reads else None, layout)
            # The kinds of the module state this trace started from (jit.save checks them).
            concrete.state_attrs = list(self.program_cache.state_attrs)
            concrete.state_assumed = module_state.key(concrete.state_attrs)
            self.program_cache.put(key, concrete)
            if noted:
                # The key of the next call with the module state as it is now
                # (what this trace assumed) holds the state's kinds: the same program.
                self.program_cache.put(_with_state_part(key, module_state.key(self.program_cache.state_attrs)),
                                       concrete)
            if len(self.program_cache) == MANY_PROGRAMS:
                warnings.warn(
                    f"{self._function.__qualname__} has built {MANY_PROGRAMS} programs: its arguments change "
                    "shape or value between calls; use d2s.InputSpec with None dimensions, or pass changing "
                    "Python values as tensors", stacklevel=3)
            if _debug.level() >= 2:
                print(f"[d2s] program of {self._function.__qualname__}:\n{main.to_string()}", file=sys.stderr)
            return concrete

    def _converted_functions(self):
        from . import conversion
        return [self._function, *conversion._converted.keys()]

    def _refuse_global_state(self, main):
        escaped = module_state.escaped_to_globals(self._converted_functions(), main)
        if escaped:
            name, module = escaped[0]
            code = getattr(self._function, "__code__", None)
            raise ConversionError(
                f"`{name}` (a global of {module}) holds a tensor that {self._function.__qualname__} computed "
                "while it was converted: state kept in Python between calls (a global, a function attribute, "
                "a dict or list the code fills) cannot be part of a program, which would recompute it on "
                "every call instead of reading it back; keep such state on the module (`self.x = ...`, "
                "carried across calls) or compute it outside the declarative function",
                code.co_filename if code else None, code.co_firstlineno if code else None)

    def _note_state(self, writes, reads):
        """Add the module attributes the program writes or reads as state to
        those whose kinds key the programs; True when there are new ones."""
        state_attrs = self.program_cache.state_attrs
        known, before = {(ref(), name) for ref, name in state_attrs}, len(state_attrs)
        for ref, name in [(w.module, w.name) for w in writes] + [(r.module, r.name) for r in reads]:
            if (ref(), name) not in known:
                known.add((ref(), name))
                state_attrs.append((ref, name))
        return len(state_attrs) > before

    def _name_hints(self, args):
        hints = {}
        for obj in (self._instance,) + tuple(args):
            if isinstance(obj, torch.nn.Module):
                for name, t in obj.named_parameters():
                    hints.setdefault(id(t), name)
                for name, t in obj.named_buffers():
                    hints.setdefault(id(t), name)
                for prefix, module in obj.named_modules():
                    for name, t in module_state.plain_tensors(module):
                        hints.setdefault(id(t), f"{prefix}.{name}" if prefix else name)
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


DATA_PARALLEL = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)


def data_parallel_message(wrapper):
    name = type(wrapper).__name__
    return (f"the {name} wrapper prepares each step's gradient synchronisation in Python around `forward`, "
            f"which a program cannot repeat; wrap the other way round, {name}(d2s.declarative(model)), and "
            "call it outside declarative code (see docs/distributed.md)")


_CALLING_FORWARD = weakref.WeakKeyDictionary()
_module_hooks = torch.nn.modules.module
# torch mutates these dicts in place (register_module_forward_hook & co.) and
# never rebinds them, so holding them is as good as reading the module's globals.
_GLOBAL_HOOKS = (_module_hooks._global_forward_pre_hooks, _module_hooks._global_forward_hooks,
                 _module_hooks._global_backward_pre_hooks, _module_hooks._global_backward_hooks)
_tracing_state = torch._C._get_tracing_state


def _declarative_module_call(self, *args, **kwargs):
    """`module(x)` for a module whose `forward` is declarative: what
    `nn.Module.__call__` does when there is nothing around `forward` to run
    (no hook of the module's or global, no `module.compile()`, no
    `torch.jit.trace` in progress), in one frame instead of three; anything
    else goes through `nn.Module.__call__` itself. This is most of what a
    cache hit costs on top of the program (~0.6 us saved per call)."""
    d = self.__dict__
    try:
        forward = d["forward"]
        if (d["_forward_pre_hooks"] or d["_forward_hooks"] or d["_backward_pre_hooks"] or d["_backward_hooks"]
                or "_compiled_call_impl" in d):
            forward = None
    except KeyError:  # a module whose __init__ did not run nn.Module's
        forward = None
    g0, g1, g2, g3 = _GLOBAL_HOOKS
    if forward is None or g0 or g1 or g2 or g3 or _tracing_state():
        return torch.nn.Module.__call__(self, *args, **kwargs)
    return forward(*args, **kwargs)


def _calling_forward(cls):
    """A subclass of `cls` (same name and module) whose __call__ is
    nn.Module's (hooks, then `forward`), taking the short way when nothing
    surrounds `forward` (`_declarative_module_call`)."""
    sub = _CALLING_FORWARD.get(cls)
    if sub is None:
        sub = type(cls.__name__, (cls,), {"__call__": _declarative_module_call, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                                          "__reduce_ex__": _reduce_declarative_instance})
        _CALLING_FORWARD[cls] = sub
    return sub


def _reduce_declarative_instance(module, protocol):
    """Pickle / deepcopy a module of a `_calling_forward` class by its own
    class, which pickle can find by name (the subclass has the same name, so
    pickle refused it: "not the same object as M"); the copy gets the
    subclass back when it is made."""
    reduced = object.__reduce_ex__(module, protocol)
    if isinstance(reduced, tuple) and reduced[0] is copyreg.__newobj__ and reduced[1][0] is type(module):
        base = next(c for c in type(module).__mro__[1:] if _CALLING_FORWARD.get(c) is type(module))
        return (_new_calling_forward, (base,) + tuple(reduced[1][1:])) + tuple(reduced[2:])
    return reduced  # the class reduces itself its own way


def _new_calling_forward(cls, *args):
    return cls.__new__(_calling_forward(cls), *args)


def _call_forward_directly(module):
    """Give `module` (whose `forward` was just made declarative) the short
    call path, when its class calls `forward` the way nn.Module does.

    The instance's class becomes a same-named subclass: `isinstance`,
    `repr`, `state_dict` and hooks are unchanged, but `type(module) is Cls`
    is False (docs/user_guide.md). torch's own classes (`nn.Linear`, ...)
    keep theirs: torch looks some of them up by exact type (quantization
    mappings, fx), and one leaf module's hit is not worth that."""
    cls = type(module)
    if inspect.getattr_static(cls, "__call__", None) is not torch.nn.Module.__call__:
        return  # already done, or a class with a __call__ of its own: that is what module(x) runs
    if cls.__module__.partition(".")[0] == "torch":
        return
    try:
        module.__class__ = _calling_forward(cls)
    except TypeError:  # a layout __class__ assignment refuses: keep the ordinary call
        pass


def declarative(function=None, input_spec=None, optimize=None):
    """Run `function` as a static program (a decorator; also takes a method,
    or an `nn.Module` instance whose `forward` it converts in place).

    `optimize`: "default" (results bit-identical to eager on CPU) or "fast"
    (fused RNN loops and other rewrites exact up to floating-point rounding;
    see docs/performance.md); None follows `ProgramTranslator().optimize`."""
    if optimize is not None:
        check_level(optimize)
    if function is None:
        return lambda f: declarative(f, input_spec=input_spec, optimize=optimize)
    if isinstance(function, StaticFunction):
        return function
    if isinstance(function, DATA_PARALLEL):
        raise ConversionError(f"d2s.declarative({type(function).__name__}(model)): "
                              + data_parallel_message(function))
    if isinstance(function, torch.nn.Module):
        module = function
        forward = type(module).forward
        if isinstance(forward, StaticFunction):
            return module
        raw = inspect.getattr_static(type(module), "forward", None)
        entry = module_call_entry(type(module))
        if entry is not None:
            # No forward, its own __call__: that is what `module(x)` runs, so
            # it becomes the converted forward, and the module's class one
            # whose __call__ is nn.Module's again (which calls forward).
            object.__setattr__(module, "forward", StaticFunction(entry, input_spec, instance=module,
                                                                 optimize=optimize))
            module.__class__ = _calling_forward(type(module))
            return module
        own = module.__dict__.get("forward")  # `self.forward = self._forward` in __init__
        if isinstance(own, StaticFunction):
            return module
        if own is not None:
            if inspect.ismethod(own):
                static = StaticFunction(own.__func__, input_spec, instance=own.__self__, optimize=optimize)
            else:
                static = StaticFunction(own, input_spec, optimize=optimize)
        elif isinstance(raw, staticmethod):
            static = StaticFunction(raw.__func__, input_spec, optimize=optimize)
        elif isinstance(raw, classmethod):
            static = StaticFunction(raw.__func__, input_spec, instance=type(module), optimize=optimize)
        else:
            static = StaticFunction(forward, input_spec, instance=module, optimize=optimize)
        object.__setattr__(module, "forward", static)
        _call_forward_directly(module)
        return module
    if inspect.ismethod(function):
        return StaticFunction(function.__func__, input_spec, instance=function.__self__, optimize=optimize)
    if not callable(function):
        raise TypeError(f"declarative expects a function, a method or an nn.Module, got {type(function).__name__}")
    return StaticFunction(function, input_spec, optimize=optimize)


to_static = declarative


class ProgramTranslator:
    """The process-wide switch and inspection entry points."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            self = super().__new__(cls)
            self.enable_to_static = True
            self._optimize = "default"
            self._last = None
            cls._instance = self
        return cls._instance

    def enable(self, enable_to_static=True):
        """False: every declarative function runs eagerly, as plain PyTorch."""
        if not isinstance(enable_to_static, bool):
            raise TypeError("enable() takes a bool")
        self.enable_to_static = enable_to_static

    @property
    def optimize(self):
        """The optimisation level of declarative functions that do not name
        one: "default" or "fast" (settable)."""
        return self._optimize

    @optimize.setter
    def optimize(self, level):
        self._optimize = check_level(level)

    @staticmethod
    def _static(fn):
        """The StaticFunction of `fn`: itself, the forward of a module (what
        `declarative(module)` returns, or any module: converted without
        changing it), or a new one for a plain function."""
        if isinstance(fn, StaticFunction):
            return fn
        if isinstance(fn, torch.nn.Module):
            forward = fn.forward
            if isinstance(forward, StaticFunction):
                return forward
            return StaticFunction(type(fn).forward, instance=fn)
        return declarative(fn)

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
        outputs = concrete.outputs
        if any(isinstance(leaf, _SYMBOLIC) for leaf in torch.utils._pytree.tree_leaves(outputs)):
            # A returned size (`y.shape[0]` after a growing loop) is a SymInt
            # while tracing; the program computes it into a fetched variable.
            try:
                outputs = _fetchable(concrete.out_tree, concrete.fetch_vars)
            except _Unknown:
                pass
        return concrete.main_program, concrete.startup_program, concrete.inputs, outputs

    def save_inference_model(self, dirname, feed=None, fetch=None):
        """Save the program of the latest declarative call; `feed`/`fetch`
        select inputs/outputs by index (default: all)."""
        concrete = self._last
        if concrete is None:
            raise ValueError("no declarative function has run yet: call it once before saving")
        from runtime.io import save_inference_model
        inputs = select_by_index(concrete.inputs, feed, "feed", "the latest call has {n} input(s)")
        outputs = select_by_index(concrete.fetch_vars, fetch, "fetch", "the latest call has {n} output(s)")
        save_inference_model(dirname, [v.name for v in inputs], outputs, Executor(),
                             main_program=concrete.main_program)


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _fetchable(tree, fetch):
    """The returned structure `tree` (see `_output_tree`) with the fetched
    variables in place; _Unknown for a structure this does not know."""
    tag, body = tree
    if tag in ("fetch", "number"):
        return fetch[body]
    if tag == "const":
        return body
    if tag is dict:
        return {key: _fetchable(value, fetch) for key, value in body.items()}
    if tag in (list, tuple) or isinstance(tag, type) and issubclass(tag, tuple) and hasattr(tag, "_fields"):
        items = [_fetchable(item, fetch) for item in body]
        return tag(*items) if hasattr(tag, "_fields") else tag(items)
    raise _Unknown


class _Unknown(Exception):
    """A returned structure `_fetchable` does not know."""


def select_by_index(items, indices, what, count):
    """`[items[i] for i in indices]` (all of `items` when `indices` is None),
    with an error naming `what` for an index that is not a position."""
    if indices is None:
        return list(items)
    if isinstance(indices, int) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
        raise TypeError(f"{what} must be a list of positions (ints), got {indices!r}")
    for i in indices:
        if not -len(items) <= i < len(items):
            valid = f"0..{len(items) - 1}" if items else "none"
            raise ValueError(f"{what} index {i} is out of range: {count.format(n=len(items))} "
                             f"(valid positions: {valid})")
    return [items[i] for i in indices]
