"""`StaticFunction`: a function or method whose calls run as static programs.

A call looks up a `ConcreteProgram` (d2s/concrete_program.py) by a cache
key built from the arguments (tensor shape/dtype/device or the `InputSpec`,
non-tensor values, the `training` flags of the modules involved; see
d2s/argument_trees.py and d2s/program_cache.py). On a miss it converts the
source (see `conversion.py`), runs the converted function on feed
Variables under a fresh Program with op capture on, and compiles the
result. On a hit it only calls the compiled program: no Python-level model
code runs at all. `declarative` (d2s/decorator.py) makes them.
"""

import copy
import functools
import inspect
import sys
import warnings
import weakref

import torch

from ops.autograd_function import has_live_ops
from ops.capture import CaptureMode
from ops import attribute_reads, number_paths, process_state, python_reads, python_values, tracer
from ops.control_flow import Unreachable, settle as settle_checkpoints
from ops.framework import check_dims as fw_check_dims, check_strides as fw_check_strides
from ops.tracer import Tracer
from runtime import _debug, foreign_tracers
from runtime import runner
from runtime.errors import ConversionError, DecisionFailed
from runtime.ir import GENERATOR, Program, Variable, program_guard, torch_dtype
from runtime.output_tree import rebuild
from runtime.passes import check_level
from runtime.run_modes import autocast_state

from . import (argument_writes, conversion, decisions, input_trees, module_state, module_watch, python_writes,
               varying_sizes)
from .argument_trees import (SymbolicArguments, feed_leaves, feed_name, flatten_args, is_generator, mode_of,
                             python_object, replace_tensors, same_tensors, tensor_leaves)
from .concrete_program import ConcreteProgram
from .input_spec import InputSpec
from .layout_guard import layout_guard, layout_matches
from .operators.effects import TORCH_MODULE_ATTRS
from .operators.raising import raising_after_raise_ops
from .output_types import holds_variable, output_tree as _output_tree
from .program_cache import Identities, ProgramCache, with_flags, with_state_part
from .translator_state import STATE

MANY_PROGRAMS = 8
# Traces of one program at most, each deciding one more number/tensor `if` (ops/number_paths.py).
_MAX_NUMBER_DECISIONS = 16

_grad_enabled = torch.is_grad_enabled
# The default dtype keys every call: a traced factory (`torch.zeros(n)`) or
# constant (`torch.tensor([0.5])`) took its dtype from it, and
# `torch.set_default_dtype` between calls gives eager code other dtypes.
_default_dtype = torch.get_default_dtype
# torch's bookkeeping of a module and d2s's own `forward`: not the user's functions and objects.
_OWN_ATTRS = TORCH_MODULE_ATTRS | {"forward"}
_Tensor = torch.Tensor
_generation = module_watch._generation


# Where a normalized argument comes from (StaticFunction._binding).
_ARG, _KEYWORD, _DEFAULT = "arg", "keyword", "default"


class _StandIn:
    """A placeholder argument, told apart by identity."""

    __slots__ = ()


class StaticFunction:
    """A function or method whose calls run as static programs."""

    def __init__(self, function, input_spec=None, instance=None, optimize=None):
        self._function = function
        # None: the translator's level (ProgramTranslator().optimize).
        self._optimize = None if optimize is None else check_level(optimize)
        self._instance = instance
        self._input_spec = list(input_spec) if input_spec is not None else None
        # The InputSpecs by position (an example `torch.Generator` in the list
        # stands for a generator argument: a feed with no spec).
        self._specs = {i: s for i, s in enumerate(self._input_spec) if isinstance(s, InputSpec)} \
            if self._input_spec else None
        self.program_cache = ProgramCache()
        # instance -> its program cache (`__get__`), for a class-level method.
        self._caches = weakref.WeakKeyDictionary() if instance is None else None
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

    # methods: like a bound method, a bound StaticFunction is made on each
    # access and holds its instance; what lasts is the instance's program
    # cache (with the key state that must match again: ProgramCache), held
    # in `_caches` weakly by instance, so a deleted module (and everything
    # its programs bind) is garbage-collected.
    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        try:
            cache = self._caches.get(instance)
        except TypeError:  # an unhashable or non-weakrefable instance: no caching
            return StaticFunction(self._function, self._input_spec, instance, self._optimize)
        if cache is None:
            cache = self._caches[instance] = ProgramCache()
        return self._bind(instance, cache)

    def _bind(self, instance, cache):
        """This function bound to `instance`, with its program `cache`. Made
        on most calls (`__get__`), so the fields that do not depend on the
        instance (signature, wrapper attributes) are computed once and copied."""
        template = self.__dict__.get("_bound_template")
        if template is None:
            first = StaticFunction(self._function, self._input_spec, instance, self._optimize)
            template = {k: v for k, v in first.__dict__.items() if k not in ("_instance", "program_cache")}
            self._bound_template = template
        bound = object.__new__(StaticFunction)
        bound.__dict__.update(template)
        bound._instance = instance
        bound.program_cache = cache
        return bound

    def __d2s_unwrap__(self):
        """The function this wraps (d2s/unwrap.py)."""
        return self._function

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
        form = (len(args), tuple(kwargs))
        plan = self.program_cache.forms.get(form)
        if plan is None:
            plan = self.program_cache.forms[form] = self._binding(form)
        positional, keywords = plan
        return (tuple(args[i] if kind is _ARG else kwargs[i] if kind is _KEYWORD else i for kind, i in positional),
                {k: args[i] if kind is _ARG else kwargs[i] if kind is _KEYWORD else i
                 for k, (kind, i) in keywords.items()})

    def _binding(self, form):
        """Where `_normalize` takes each value from for calls of `form`
        (number of positional arguments, keyword names): `inspect`'s binding
        of such a call, worked out once on stand-ins, as (kind, index)
        pairs: a positional argument, a keyword or a default value (which
        `apply_defaults` gives as the same object on every call).
        `Signature.bind` cost ~75 us on every call of a transformers forward."""
        n, names = form
        positional_ins, keyword_ins = [_StandIn() for _ in range(n)], {k: _StandIn() for k in names}
        stand_ins = {id(v): (_ARG, i) for i, v in enumerate(positional_ins)}
        stand_ins.update((id(v), (_KEYWORD, k)) for k, v in keyword_ins.items())
        bound = self._signature.bind(*self._full_args(positional_ins), **keyword_ins)  # TypeError as eager's
        bound.apply_defaults()
        full = bound.args[1:] if self._instance is not None else bound.args
        return ([stand_ins.get(id(v), (_DEFAULT, v)) for v in full],
                {k: stand_ins.get(id(v), (_DEFAULT, v)) for k, v in bound.kwargs.items()})

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

    def cache_key(self, args, kwargs):
        """(key, tensors): runs on every call, so it builds nothing but the
        key: one flat tuple (hashed and compared without nesting), whose
        last item is the optimisation level."""
        stale = self.program_cache.flags_generation != module_watch._generation[0]
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
                    parts.append(flatten_args(v, None, tensors))
        else:
            tensors = []
            stale = stale or any(isinstance(v, torch.nn.Module) for v in args)
            for i, v in enumerate(args):
                spec = self._specs.get(i)
                if spec is None:
                    parts.append(flatten_args(v, None, tensors))
                else:  # already checked and converted by _spec_args
                    tensors.append(v)
                    parts.append(spec.key() + (v.device.type,))
        if kwargs:
            stale = stale or any(isinstance(v, torch.nn.Module) for v in kwargs.values())
            tensors = list(tensors)
            parts.append(flatten_args(kwargs, None, tensors))
        if stale:
            self._refresh_training_flags(args, kwargs)
        same = same_tensors(tensors)
        if same:
            parts.append(("same",) + same)
        state_attrs = self.program_cache.state_attrs
        parts += (len(args), self.program_cache.flags, autocast_state(), _default_dtype(),
                  module_state.key(state_attrs) if state_attrs else (), self._optimize or STATE.optimize)
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
        cache = self.program_cache
        cache.flags_generation = module_watch._generation[0]
        modules = [m for v in (self._instance, *args, *kwargs.values())
                   if isinstance(v, torch.nn.Module) for m in v.modules()]
        # The modules' plain attribute values and hooks join the identities, and
        # the functions and objects they hold: a program that read `self.k` as a
        # constant must not serve `self.k = 5`, nor one traced without a forward
        # hook a module has now, nor one that called `self.act` another function.
        # A buffer the programs write as state (`self.h = h` of a registered buffer:
        # a new tensor every call) is keyed by its kind (module_state.key), not its identity.
        state = {(id(ref()), name) for ref, name in cache.state_attrs}
        tree = Identities(modules + [t for m in modules for d in (m._parameters, m._buffers)
                                      for name, t in d.items() if t is not None and (id(m), name) not in state] +
                          module_watch.by_identity(modules, _OWN_ATTRS),
                          module_watch.plain_values(modules) + module_watch.hooks(modules))
        tree = self._intern_tree(tree)
        # (count, bit mask, identities): the flags hashed and compared in
        # constant time on every call.
        cache.flags = (len(modules), sum(1 << i for i, m in enumerate(modules) if m.training), tree)

    def _intern_tree(self, tree):
        """The interned `_Identities` holding the same objects as `tree`
        (then a cached key built with it matches again), else `tree`, now
        interned. Runs only on a refresh, never on a hit."""
        live = []
        for r in self.program_cache.trees:
            old = r()
            if old is not None:
                if old.same(tree):
                    return old
                live.append(r)
        live.append(weakref.ref(tree))
        self.program_cache.trees = live
        return tree

    def _lookup(self, args, kwargs):
        """(the concrete program for these arguments, their tensors), built on a miss."""
        form = (len(args), tuple(kwargs))
        args, kwargs = self._normalize(args, kwargs)
        args = self._spec_args(args)
        key, tensors = self.cache_key(args, kwargs)
        concrete = self.program_cache.get(key)
        if concrete is None:
            key, concrete = self._miss(key, args, kwargs, form)
        if concrete.layout is not None:
            concrete = self._for_layout(concrete, key, args, kwargs, tensors, form)
        return concrete, tensors

    def _for_layout(self, concrete, key, args, kwargs, tensors, form=None):
        """`concrete`, a program that read its feeds' strides, when these
        feeds have them; else the program for these strides, cached under
        `key` with the strides added."""
        if layout_matches(concrete.layout, tensors):
            return concrete
        key = (("layout",) + tuple(tuple(t.stride()) for t in tensors),) + key  # the last two parts stay last
        return self.program_cache.get(key) or self._build(key, args, kwargs, form=form, varying=concrete.varying)

    def __call__(self, *args, **kwargs):
        if foreign_tracers.active():  # torch.jit.trace, torch.export, torch.compile (runtime/foreign_tracers.py)
            return foreign_tracers.call(self, args, kwargs, f"the declarative function {self.__qualname__!r}",
                                        [t for _, t in tensor_leaves((args, kwargs), "args")])
        translator = STATE
        if not translator.enable_to_static:
            return self.dygraph_function(*args, **kwargs)
        cache = self.program_cache
        if (not kwargs and len(args) == self._n_positional and self._specs is None
                and cache.flags_generation == _generation[0] and not cache.state_attrs):
            # The hit path for plain tensor arguments: `cache_key` and
            # `ConcreteProgram.run` inlined (the key built here is the one
            # `cache_key` builds for these arguments); any other argument,
            # a miss or a program that needs more than a call falls through.
            if len(args) == 1:  # the most common signature, without the loop
                v = args[0]
                key = ((v.shape, v.dtype, v.device, v.requires_grad, 1, cache.flags, autocast_state(),
                        _default_dtype(), (), self._optimize or translator.optimize) if type(v) is _Tensor else None)
            else:
                parts = []
                for v in args:
                    if type(v) is not _Tensor:
                        parts = None
                        break
                    parts += (v.shape, v.dtype, v.device, v.requires_grad)
                else:
                    parts += (len(args), cache.flags, autocast_state(), _default_dtype(), (),
                              self._optimize or translator.optimize)
                # One tensor passed twice keys another program (`same_tensors`): the full path.
                # (Two arguments, the common case, are compared without building a set.)
                distinct = args[0] is not args[1] if len(args) == 2 else len(set(map(id, args))) == len(args)
                key = tuple(parts) if parts and distinct else None
            if key is not None:
                # (Sizes met before by a program with run-time sizes: `exact`, d2s/varying_sizes.py.)
                concrete = cache._programs.get(key) or cache.exact.get(key)
                if concrete is not None and concrete is cache._recent:
                    translator.last = cache.last = concrete
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
                        return results[0] if concrete._single else rebuild(concrete.out_tree, results,
                                                                           {} if concrete._shares else None)
                    if concrete.layout is None:
                        # (Only tensors here: the generators kept are torch's default ones.)
                        states = decisions.generator_states((), concrete.global_generators) \
                            if concrete.global_generators else ()
                        try:
                            return concrete.run(args, (args, kwargs))
                        except DecisionFailed as exc:
                            return decisions.rerun(self, key, concrete, args, kwargs, args, exc, states=states)
        called, form = (args, kwargs), (len(args), tuple(kwargs))
        if kwargs or len(args) != self._n_positional:
            args, kwargs = self._normalize(args, kwargs)
        if self._specs:
            args = self._spec_args(args)
        try:
            key, tensors = self.cache_key(args, kwargs)
        except SymbolicArguments:
            return self._inline(*called)
        concrete = cache._programs.get(key)  # ProgramCache.get, inlined on the hit path
        if concrete is None or concrete is not cache._recent:
            concrete = cache.get(key)
            if concrete is None:
                key, concrete = self._miss(key, args, kwargs, form)
        if concrete.layout is not None:
            concrete = self._for_layout(concrete, key, args, kwargs, tensors, form)
        translator.last = cache.last = concrete
        states = decisions.generator_states(tensors, concrete.global_generators) if concrete.keeps_generators else ()
        try:
            return concrete.run(tensors, (args, kwargs))
        except DecisionFailed as exc:
            return decisions.rerun(self, key, concrete, args, kwargs, tensors, exc, form, states)

    def _inline(self, args, kwargs):
        """Called on Variables (static code inside program_guard): run the
        converted function on them, so its ops join the current program."""
        hints = tracer.current().name_hints
        for tensor_id, name in tracer.persistable_names(self._name_hints(args)).items():
            hints.setdefault(tensor_id, name)
        with CaptureMode(), torch.enable_grad():
            return conversion.convert_function(self._function)(*self._full_args(args), **kwargs)

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

    def _miss(self, key, args, kwargs, form):
        """(key, program) for a call whose exact `key` has no program: the
        program for the sizes that vary between its calls, found or built
        (d2s/varying_sizes.py), else one built for these sizes."""
        if self._specs is not None:  # the InputSpecs say which sizes vary
            return key, self._build(key, args, kwargs, form=form)
        cache = self.program_cache
        concrete = cache.exact.get(key)
        if concrete is not None:
            cache._recent = concrete  # (the program itself stays where the LRU order has it)
            return key, concrete
        masked, concrete, varying = varying_sizes.lookup(cache, key)
        if concrete is not None:
            return masked, concrete
        if varying:
            try:
                concrete = self._build(masked, args, kwargs, form=form, varying=varying)
            except Exception:  # noqa: BLE001 - traced again with exact sizes, whose error (if any) is raised
                varying_sizes.stay_exact(cache, key)
            else:
                varying_sizes.remember(cache, key, concrete)
                return masked, concrete
        return key, self._build(key, args, kwargs, form=form)

    def _build(self, key, args, kwargs, exact=False, form=None, varying=frozenset()):
        """`_build_once`, traced again while a trace finds a Python number
        on one path and a tensor on another used where the paths differ
        (ops/number_paths.py): its `if` is then decided. An instance whose
        class defines `__d2s_trace_context__` (d2s.Graph: what
        `loss.backward()` in `build` also steps) has every trace of its
        method made inside that context; its calls that find a program need
        none."""
        context = getattr(type(self._instance), "__d2s_trace_context__", None)
        if context is None:
            return self._build_decided(key, args, kwargs, exact, form, varying)
        with context(self._instance):
            return self._build_decided(key, args, kwargs, exact, form, varying)

    def _build_decided(self, key, args, kwargs, exact, form, varying):
        for _ in range(_MAX_NUMBER_DECISIONS):
            try:
                return self._build_once(key, args, kwargs, exact, form, varying)
            except number_paths.Decide as decide:
                site = decide.key
                if site in number_paths.DECIDED or site[0] == "undecidable":
                    break  # (decided, and still pending: the trips of a loop give it several types)
                number_paths.DECIDED.add(site)
        where = number_paths.site_of(site)
        why = "; this loop's test has effects, which d2s cannot evaluate once more" \
            if site[0] == "undecidable" else ""
        raise ConversionError(
            f"d2s could not decide the `if` or loop at line {where[1]}, whose value's Python type "
            "differs between paths (a number on one and a tensor on another, an int on one and a float on "
            "another, also between trips of a loop), where the code shows that type (returns it, calls "
            "`isinstance` on it, meets an integer tensor with it): keep it one type on every path (`0.0`, not `0`; "
            f"`torch.tensor(0.0)` where it becomes a tensor){why}", *where)

    def _build_once(self, key, args, kwargs, exact=False, form=None, varying=frozenset()):
        """The program for these arguments, cached under `key`. `exact`
        (converting again after a failed decision, d2s/decisions.py): a
        dynamic dimension of size 0 or 1 is traced as that size, not as 2,
        and checked when the program runs. `form`: how the caller passed
        the arguments (`_as_called`). `varying`: (tensor index, dim) pairs
        traced as run-time sizes (d2s/varying_sizes.py)."""
        with self.program_cache.lock:
            converted = conversion.convert_function(self._function)
            main, startup = Program(), Program()
            leaves = feed_leaves(args, kwargs)
            if leaves:
                main.device = leaves[0].tensor.device
            main.mode = mode_of(self._instance, args, kwargs)
            arg_names = self._feed_names()
            modules = [m for v in (self._instance, *args, *kwargs.values()) if isinstance(v, torch.nn.Module)
                       for m in v.modules()]
            before = module_state.snapshot(modules)
            with program_guard(main, startup), Tracer(main, self._name_hints(args)) as tr, \
                    module_state.restored_on_error(before) as undo, \
                    attribute_reads.AttributeReads(attribute_reads.data_objects(modules, module_watch.is_plain_value),
                                                   module_watch.is_plain_value) as attributes, \
                    attribute_reads.GroupReads(attribute_reads.optimizers_named(self._function, args, kwargs),
                                               module_watch.is_plain_value) as group_reads:
                tr.decides_numbers = True  # traced again to decide a number/tensor value (`_build`)
                dims = varying_sizes.feed_dims(leaves, varying) if varying else {}
                feeds = [self._feed(main, tr, leaf, arg_names, exact, dims.get(j, ()))
                         for j, leaf in enumerate(leaves)]
                state = input_trees.record_state([v for v in (*args, *kwargs.values()) if python_object(v)])
                # A tensor passed twice is one value in the trace too (`q is k` as eager
                # sees it); its second feed takes the same tensor and is not read.
                same = dict(same_tensors([leaf.tensor for leaf in leaves]))
                traced = [feeds[same.get(i, i)] for i in range(len(feeds))]
                made, remaining = [], traced  # taken in `leaves` order: the arguments, then kwargs
                sym_args = tuple(replace_tensors(v, remaining, arg_names[i] if i < len(arg_names) else
                                                  f"args[{i}]", made) for i, v in enumerate(args))
                sym_kwargs = {k: replace_tensors(v, remaining, k, made) for k, v in kwargs.items()}
                written = python_writes.watch(self._function, sym_args, sym_kwargs, arg_names, self._instance)
                undo.append(written.undo)  # a failed conversion leaves no graph value in the user's objects
                attributes.ignore([copy for _, copy, _ in made])
                attributes.add(written.values)  # objects of settings among arguments, globals, cells
                attributes.add_function(self._function)
                tr.watch = written
                # Trace with autograd on whatever the caller's mode: only a
                # `no_grad` block inside the function marks ops gradient-free.
                sym_args, sym_kwargs = self._as_called(sym_args, sym_kwargs, form)
                with CaptureMode(), torch.enable_grad(), written.recording():
                    out = raising_after_raise_ops(lambda: converted(*self._full_args(sym_args), **sym_kwargs),
                                                  main)()
                if isinstance(out, Unreachable):  # every run raises: at an earlier raise op or at the last
                    out = None
                # The caller's objects it changed: written after each run (each slot put back now).
                taken = written.take_argument_writes()
                # One node per object, across the returned value and the written ones, and
                # one list of fetches they all index: the returned value's first, then the
                # state part (the values written into the caller's objects and modules).
                shared, fetch = {}, []
                known = argument_writes.knower(written.effects.located) if taken else None
                out_tree = _output_tree(out, fetch, numbers=True, known=known, shared=shared)
                returned = len(fetch)
                changed, single_use = argument_writes.collect(taken, known, fetch, args, kwargs, shared)
                self._refuse_changed_arguments(args, kwargs, made, state, arg_names, written)
                writes, reads = module_state.collect(
                    before, tr.lifted, functools.partial(_output_tree, known=known, shared=shared, again=True),
                    fetch, written.constant_ok, written.attribute_line)
                fetch, state_fetch = fetch[:returned], fetch[returned:]
                # (A tensor two of these hold is read from each: module_state.aliased.)
                reads += module_state.global_reads(self._converted_functions(), tr.lifted)
                reads += module_state.object_reads(attributes.objects, tr.lifted)
                module_state.pin(reads, modules, tr.lifted)
                self._refuse_global_state(main)
                # Plain globals and closure values the code names: checked first on every run.
                functions = [self._function, *tr.functions.values()]
                values = python_reads.reads_of(functions, module_watch.is_plain_value) + attributes.found + \
                    python_reads.module_reads(modules, functions, module_watch.is_plain_value) + \
                    group_reads.found + list(tr.flag_reads.values()) + \
                    [python_values.read_by_call(query, value, label) for label, (query, value)
                     in {**process_state.imported_queries(functions), **tr.state_reads}.items()]
                if values:
                    python_values.check_first(main, values, module_watch.same_plain_value)
                replays = written.refuse_written(self._function.__qualname__)
                layout = self._layout_checks(main, feeds, leaves, tr) if tr.reads_layout else None
            # A checkpointed block whose values are read outside it runs inline.
            settle_checkpoints(main, [v.name for v in fetch + state_fetch if isinstance(v, Variable)])
            main.verify()
            concrete = ConcreteProgram(main, startup, feeds, out, fetch, out_tree, key[-1],
                                       (writes, reads, state_fetch) if writes or reads or changed else None,
                                       layout, replays, changed, single_use, varying)
            self._keep(key, concrete, self._note_state(writes, reads), args, kwargs)
            if has_live_ops(main):
                concrete.call_example = _call_example(args, kwargs)
            if _debug.level() >= 2:
                print(f"[d2s] program of {self._function.__qualname__}:\n{main.to_string()}", file=sys.stderr)
            return concrete

    def _feed(self, main, tr, leaf, arg_names, exact, dims=()):
        """The data Variable for one tensor of the call: named and shaped by
        its InputSpec when it is a positional argument that has one, else
        by its parameter name and its own shape, with the dimensions `dims`
        as run-time sizes."""
        spec = self._input_spec[leaf.position] if leaf.position is not None and self._input_spec \
            and leaf.position < len(self._input_spec) else None
        spec = spec if isinstance(spec, InputSpec) else None
        name = spec.name if spec is not None and spec.name else feed_name(leaf, arg_names)
        name = name if name not in main.global_block().vars else main.unique_name(name)
        t = leaf.tensor
        if is_generator(t):
            # The generator each call passes (runtime/runner.convert_feed): its
            # random ops draw from it when the program runs, never while tracing.
            return main.global_block().create_var(name=name, shape=(), dtype="uint8", kind=GENERATOR,
                                                  is_data=True, stop_gradient=True)
        shape = spec.shape if spec is not None else tuple(-1 if d in dims else n for d, n in enumerate(t.shape))
        fixed = [(i, n) for i, (d, n) in enumerate(zip(shape, t.shape)) if exact and d == -1 and n < 2]
        shape = tuple(n if (i, n) in fixed else d for i, (d, n) in enumerate(zip(shape, t.shape)))
        var = main.global_block().create_var(name=name, shape=shape, dtype=t.dtype, is_data=True,
                                             stop_gradient=not t.requires_grad)
        tr.symbolize(var, hints=tuple(t.shape))  # example sizes decide what tracing assumes
        if all(type(d) is int for d in var.dims):
            var.strides = tuple(t.stride())  # and its layout (ops/capture.py _strides)
        tr.examples[name] = t  # and example values the numbers read from it (int(t))
        if t.device != main.device:
            # A feed on another device than the first (CPU lengths beside GPU
            # inputs): its `.device` is its own (runtime/ir.py Variable.device).
            var.own_device = t.device
        if fixed:
            fw_check_dims(var, fixed)
        return var

    def _refuse_changed_arguments(self, args, kwargs, made, state, arg_names, written):
        """A trace that wrote graph values into an argument object: the
        program could not repeat that write on the caller's object."""
        named = list(zip(arg_names + [f"args[{i}]" for i in range(len(arg_names), len(args))], args))
        changed = input_trees.changed_argument(made) or next(
            ((name, type(v).__name__) for name, v in named + list(kwargs.items())
             if python_object(v) and holds_variable(v)), None)
        if changed is not None:
            input_trees.restore(state)
            raise ConversionError(
                f"{self._function.__qualname__} changes its argument `{changed[0]}` (a {changed[1]}) in "
                "place deeper than d2s follows the objects it reaches (6 levels, 2000 objects) or "
                "where it cannot write it again (a tuple, a set, a torch object): a program could not "
                "change the caller's object as eager does; return the changed value instead",
                *written.write_line(changed[0]))

    @staticmethod
    def _layout_checks(main, feeds, leaves, tr):
        """The strides a trace that read them assumed (layout_guard), checked
        at the program's start, where they travel with a saved program."""
        layout = layout_guard(feeds, [leaf.tensor for leaf in leaves], tr.layout_read_at)
        block = main.global_block()
        n = len(block.ops)
        for var, strides in zip(feeds, layout):
            if var.kind != GENERATOR:  # (a generator feed has no layout: layout_guard.layout_matches)
                fw_check_strides(var, strides)
        block.ops[:] = block.ops[n:] + block.ops[:n]
        return layout

    def _keep(self, key, concrete, noted, args, kwargs):
        """Cache `concrete` under `key` (and under the key with the module
        state it assumed, when the trace found new state: `noted`; a buffer
        that is state leaves the identities that key the call too)."""
        # The kinds of the module state this trace started from (jit.save checks them).
        concrete.state_attrs = list(self.program_cache.state_attrs)
        concrete.state_assumed = module_state.key(concrete.state_attrs)
        self.program_cache.put(key, concrete)
        if noted:
            # The key of the next call with the module state as it is now
            # (what this trace assumed) holds the state's kinds: the same program.
            self._refresh_training_flags(args, kwargs)
            self.program_cache.put(with_state_part(with_flags(key, self.program_cache.flags),
                                                   module_state.key(self.program_cache.state_attrs)), concrete)
        if len(self.program_cache) == MANY_PROGRAMS:
            why = self.program_cache.last_decision
            warnings.warn(
                f"{self._function.__qualname__} has built {MANY_PROGRAMS} programs: its arguments change "
                "shape or value between calls, or a program's decision failed; use d2s.InputSpec with None "
                "dimensions, or pass changing Python values (arguments, globals, config attributes) as tensors"
                + (f". The last program was converted again because {why}" if why else ""), stacklevel=4)

    def _converted_functions(self):
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


def _call_example(args, kwargs):
    """A copy of a call's arguments as they were before it ran, for a
    program holding a custom autograd.Function: `jit.save` traces the call
    again with the Function's forward inline (d2s/jit.py
    `_with_functions_inlined`), however the caller passed them (transformers
    models take keywords). None where they cannot be copied, or hold a
    module (a copy would be another module's weights)."""
    try:
        if any(isinstance(v, torch.nn.Module) for v in (*args, *kwargs.values())):
            return None
        return copy.deepcopy((tuple(args), dict(kwargs)))
    except Exception:  # noqa: BLE001 - an argument deepcopy cannot copy: save refuses, naming the Function
        return None
