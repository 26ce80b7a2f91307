"""`d2s.jit.save` / `d2s.jit.load`: a declarative layer or function saved as
plain data (program.json + params.safetensors) and loaded, with no model
source, as a `TranslatedLayer`: an `nn.Module` whose weights are trainable
`nn.Parameter`s.
"""

import copy
import re
import warnings

import torch

from ops.autograd_function import has_live_ops, inline_for_save
from runtime import foreign_tracers, modes, output_tree, runner
from runtime.errors import ConversionError, DecisionFailed
from runtime.executor import Executor
from runtime.io import prune_program, read_model, refuse_live_ops, save_model
from runtime.ir import GENERATOR, torch_dtype
from runtime.passes import check_level
from runtime.serialization import program_to_dict

from . import (argument_writes, decisions, module_call, module_state, python_writes, save_paths, save_sizes,
               slot_values)
from .graph import Graph
from .decorator import declarative
from .input_spec import InputSpec
from .static_function import StaticFunction
from .translator_state import STATE


def _example(spec):
    """A zeros tensor matching `spec` (dynamic dimensions get size 2) to trace with."""
    if isinstance(spec, torch.Tensor):
        return spec
    if not isinstance(spec, InputSpec):
        raise TypeError(f"input_spec entries must be d2s.InputSpec or tensors, got {type(spec).__name__}")
    return torch.zeros([2 if d == -1 else d for d in spec.shape], dtype=torch_dtype(spec.dtype))


def _examples(static, input_spec):
    """Lists of zeros tensors to trace `input_spec` with, in the order to
    try them: example tensors as given, `None` dimensions at the sizes of
    the user's latest call where it fits, else at default sizes, small to
    large (d2s/save_sizes.py), never a made-up 2 that changes the program;
    a fresh generator for a `torch.Generator` entry (a generator argument,
    which the loaded model takes from its caller)."""
    for s in input_spec:
        if not isinstance(s, (InputSpec, torch.Tensor, torch.Generator)):
            raise TypeError(f"input_spec entries must be d2s.InputSpec, tensors or a torch.Generator (for a "
                            f"generator argument), got {type(s).__name__}")
    specs = _specs(input_spec)
    return [[torch.Generator(s.device) if isinstance(s, torch.Generator) else s if isinstance(s, torch.Tensor)
             else save_sizes.example(s, n) for s, n in zip(input_spec, sizes)]
            for sizes in save_sizes.sizes_to_try(static, specs)]


def _specs(input_spec):
    """The InputSpec of each entry (a tensor's own; a generator stays itself)."""
    return [s if isinstance(s, (InputSpec, torch.Generator)) else InputSpec.from_tensor(s) for s in input_spec]


def _static_of(layer_or_function, input_spec):
    if isinstance(layer_or_function, torch.nn.Module):
        forward = layer_or_function.forward
        if not isinstance(forward, StaticFunction):
            forward = declarative(type(layer_or_function).forward).__get__(layer_or_function)
        return forward
    if isinstance(layer_or_function, StaticFunction):
        return layer_or_function
    return declarative(layer_or_function)


def concrete_to_save(static, input_spec, what):
    """(static, example inputs or None, concrete program) that `what`
    (jit.save, onnx.export) writes: traced for `input_spec` when given, else
    for the input_spec the function was declared with, else the program of
    its latest call. A function that has none of these is an error that says
    what to do, never an empty or guessed program."""
    if input_spec is None and static.concrete_program is None:
        input_spec = static._input_spec
    if input_spec is None:
        concrete = static.concrete_program
        if concrete is None:
            name = type(static._instance).__name__ if static._instance is not None else static.__name__
            raise ValueError(
                f"{what}({name}): {name} has not run yet, so there is no program to save; call it once "
                f"on example inputs first, or pass input_spec=[d2s.InputSpec([None, ...], 'float32'), ...] "
                f"(to {what} or to d2s.declarative)")
        argument_writes.refuse_saving(concrete, what)
        python_writes.refuse_saving(concrete.python_writes, what)
        return static, None, concrete
    specs = _specs(input_spec)
    first = None
    for examples in _examples(static, input_spec):
        fresh = StaticFunction(static._function, specs, instance=static._instance)
        try:
            concrete = fresh.get_concrete_program(*examples)
            save_sizes.refuse_pinned_sizes(concrete, specs, examples)
            argument_writes.refuse_saving(concrete, what)
            python_writes.refuse_saving(concrete.python_writes, what)
            return fresh, examples, concrete
        except Exception as exc:  # noqa: BLE001 - larger default sizes may serve; else the first error
            first = first or exc
    raise first


def _with_functions_inlined(static, examples, concrete):
    """The program traced again with custom autograd.Functions' forwards
    inline (ops/autograd_function.py; call it under `inline_for_save()`),
    for the same inputs: the latest call's own arguments where the program
    kept them (`ConcreteProgram.call_example`, any form of call), else its
    tensor inputs; unchanged when neither serves (save then refuses, naming
    the Function)."""
    if examples is None and concrete.call_example is not None:
        # The latest call again, in its own form (keywords, Python values).
        args, kwargs = copy.deepcopy(concrete.call_example)  # the trace may change them (a cache it grows)
        fresh = StaticFunction(static._function, static._input_spec, instance=static._instance)
        return fresh, None, fresh.get_concrete_program(*args, **kwargs)
    if examples is None:
        if static._n_positional != len(concrete.inputs):
            return static, examples, concrete  # Python arguments too: save refuses, naming the Function
        specs = [torch.Generator() if v.kind == GENERATOR else
                 InputSpec([None if isinstance(d, str) or d == -1 else d for d in v.dims], v.dtype)
                 for v in concrete.inputs]
        examples = [s if isinstance(s, torch.Generator) else _example(s) for s in specs]
        static = StaticFunction(static._function, specs, instance=static._instance)
    static = StaticFunction(static._function, static._input_spec, instance=static._instance)
    return static, examples, static.get_concrete_program(*examples)


def _modules_of(static):
    """The modules whose `training` flag selects the program, if any."""
    instance = static._instance
    return list(instance.modules()) if isinstance(instance, torch.nn.Module) else []


def _concrete_in_mode(static, examples, modules, training):
    """The concrete program built with every module in `modules` in the
    given mode; their flags are restored afterwards."""
    saved = [m.training for m in modules]
    try:
        for m in modules:
            m.training = training
        return static.get_concrete_program(*examples)
    finally:
        for m, flag in zip(modules, saved):
            m.training = flag


def _part(concrete):
    """(program, feed names, fetch variables, output tree, state updates):
    what a saved model runs, how it gives back what the function returns,
    and how it carries module state from one call to the next."""
    program, fetch = concrete.main_program, list(concrete.fetch_vars)
    updates = []
    if concrete.state_reads:
        # The state as the module holds it now: where the eager model's next call starts.
        try:
            module_state.refresh_reads(concrete.state_reads, program.bound, concrete.state_aliases)
        except DecisionFailed as exc:
            raise ValueError(f"cannot save the latest call's program: {exc}; call the model once as it is now "
                             "before saving") from None
        block = program.global_block()
        fetched = fetch + concrete.state_fetch  # what the state trees index
        for var_name, (_, k) in module_state.carried(concrete.state_reads, concrete.state_writes):
            read, written = block.vars[var_name], fetched[k]
            if list(read.shape) != list(written.shape) or read.dtype != written.dtype:
                raise ValueError(
                    f"cannot save: the function reads module state as {read.dtype_name}{list(read.shape)} and "
                    f"stores {written.dtype_name}{list(written.shape)} back, so each call would need another "
                    "program; a saved model's state keeps one shape (save with static sizes in input_spec)")
            index = next((i for i, v in enumerate(fetch) if v is written), None)  # `return h` too
            if index is None:
                index = len(fetch)
                fetch.append(written)
            before = next((i for name, i in updates if name == var_name), None)
            if before is None:
                updates.append((var_name, index))
            elif before != index:
                # Two attributes read as one tensor (module_state.aliased), written apart.
                raise ValueError(
                    f"cannot save: module state read as one tensor (`{var_name}`) is written back as two "
                    "values, which a saved model's state (one variable) cannot carry; give each "
                    "attribute a tensor of its own")
    if concrete.state_attrs:
        _check_state_kinds(concrete)
    return program, [v.name for v in concrete.inputs], fetch, concrete.out_tree, updates


def _check_state_kinds(concrete):
    """The program must be the one for the module state as it is now: after
    a first call from `self.hidden = None`, the next call (and a saved
    model) starts from a tensor, another program."""
    now = module_state.key(concrete.state_attrs)
    if now != concrete.state_assumed:
        changed = next((n for (n, a), (_, b) in zip(concrete.state_assumed, now) if a != b), "?")
        raise ValueError(
            f"cannot save the latest call's program: it was built for module state `{changed}` as it was "
            "before that call, and the module now holds another kind of value there (None became a tensor, "
            "or a shape changed), which takes another program; call the model once more, or pass input_spec")


def _same_program(a, b):
    pruned = [program_to_dict(prune_program(p, feeds, [v.name for v in fetches])) for p, feeds, fetches, *_ in (a, b)]
    return (pruned[0] == pruned[1] and a[1] == b[1] and [v.name for v in a[2]] == [v.name for v in b[2]]
            and a[3:] == b[3:])


def _module_state(module):
    """{"parameters": {key: tensor}, "buffers": {key: tensor}} in state-dict order."""
    # nn.Module's own: a d2s.Graph's state_dict adds optimizer state.
    state = torch.nn.Module.state_dict(module, keep_vars=True)
    state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    return {"parameters": {k: v for k, v in state.items() if isinstance(v, torch.nn.Parameter)},
            "buffers": {k: v for k, v in state.items() if not isinstance(v, torch.nn.Parameter)}}


def save(layer_or_function, path, input_spec=None):
    """Save the program of `layer_or_function` for the inputs `input_spec`
    describes (InputSpecs, with None for dynamic dimensions, or example
    tensors). Without `input_spec`, the program of the latest call is saved,
    or, before any call, the one for the input_spec given to `declarative`.

    For a module, the programs of both modes are recorded when they differ
    (dropout, batch norm) and `input_spec` is given, so that the loaded
    layer's `train()` / `eval()` switch between them; without `input_spec`
    only the latest call's mode is saved. The module's state-dict keys are
    recorded, so the loaded layer's `state_dict()` has the same keys."""
    if isinstance(layer_or_function, Graph):  # its inference part, traced in eval mode
        with layer_or_function.serving() as part:
            return save(part, path, input_spec)
    if isinstance(layer_or_function, TranslatedLayer):
        # Already a program (e.g. a loaded model after fine-tuning): save it as it is.
        layer_or_function._save(path)
        return
    static = _static_of(layer_or_function, input_spec)
    modules = _modules_of(static)
    mode, same, one_mode = None, False, None
    called = static
    static, examples, concrete = concrete_to_save(static, input_spec, "jit.save")
    both_modes = examples is not None
    # Every trace from here is for the file: the other mode's program may call a
    # Function this one does not (PhiMoE's router calls one in training only).
    with inline_for_save():
        if has_live_ops(concrete.main_program):
            static, examples, concrete = _with_functions_inlined(static, examples, concrete)
        main, alternate = _part(concrete), None
        refuse_live_ops(concrete.main_program)  # not inlined: before other paths are compared with it
        paths = [_part(c) for c in save_paths.other_paths(
            lambda: _retrace(static, examples), concrete.main_program)] if examples is not None else []
        paths += [part for part in map(_part, save_paths.converted_paths(called, concrete))
                  if not any(_same_program(part, other) for other in [main] + paths)]
        if examples is not None:
            paths += _size_paths(static, concrete, examples, [main] + paths)
        if modules:
            mode = "train" if modules[0].training else "eval"
            if both_modes:
                other, one_mode = _other_mode(static, examples, modules, mode)
                if other is not None and _same_program(main, other):
                    same = True  # one program serves both modes, whatever its ops
                else:
                    alternate = other
    state = _module_state(static._instance) if isinstance(static._instance, torch.nn.Module) else None
    save_model(path, main, mode=mode, alternate=alternate, state=state, both_modes=same, paths=paths,
               one_mode=one_mode)


def _size_paths(static, concrete, examples, saved):
    """The parts of the programs traced at sizes across a decision torch took
    on the traced sizes (a feature map one pixel wide: save_sizes.size_paths),
    each followed by those of its `if` sides not converted at its sizes
    (save_paths.other_paths: an unpadded prompt shorter than a scan's chunk
    takes both), none the same as one of `saved`, within MAX_PATHS."""
    room = save_paths.MAX_PATHS - len(saved)
    out = []
    for other, inputs in save_sizes.size_paths(lambda given: _retrace(static, given), concrete, static._input_spec,
                                               examples, room):
        if len(out) >= room:
            break
        # (Its other sides are traced only while there is room for them: each trace costs a conversion.)
        sides = save_paths.other_paths(lambda: _retrace(static, inputs), other.main_program) \
            if len(out) + 1 < room else []
        for found in [other] + sides:
            if len(out) >= room or has_live_ops(found.main_program):
                continue
            try:
                part = _part(found)
            except ValueError:  # (module state of another shape at those sizes: they stay a DecisionFailed)
                continue
            if not any(_same_program(part, kept) for kept in saved + out):
                out.append(part)
    return out


def _other_mode(static, examples, modules, mode):
    """(the part for the mode other than `mode`, None), or (None, why)
    when that mode's code cannot be converted (wav2vec2 draws its training
    masks with numpy): the model is saved for `mode` only, with a warning,
    and the loaded layer refuses to switch, saying why."""
    other = "eval" if mode == "train" else "train"
    try:
        return _part(_concrete_in_mode(static, examples, modules, mode == "eval")), None
    except ConversionError as exc:
        why = (f"its {other}-mode program could not be converted when it was saved, so only {mode} mode "
               f"was saved: {str(exc).strip().splitlines()[0][:1000]}")
        warnings.warn(f"jit.save: {why}", stacklevel=3)
        return None, why


def _retrace(static, examples):
    """The function traced again, not from `static`'s cache (under
    `control_flow.forcing`: other sides of its decisions)."""
    fresh = StaticFunction(static._function, static._input_spec, instance=static._instance)
    return fresh.get_concrete_program(*examples)


class _State(torch.nn.Module):
    """Holds the parameters and buffers under one prefix of the original
    module's state-dict keys (`encode` of `encode.weight`)."""


def _fits(part, inputs):
    """Whether `inputs` have the ranks and static sizes of the feeds of
    `part` (a saved program and its feed names)."""
    block = part[0].global_block()
    for name, value in zip(part[1], inputs):
        var = block.vars[name]
        if var.kind != GENERATOR and isinstance(value, torch.Tensor) and (
                len(var.shape) != value.dim() or any(d not in (-1, n) for d, n in zip(var.shape, value.shape))):
            return False
    return True


class TranslatedLayer(torch.nn.Module):
    """A loaded program as a module: call it with tensors (in the saved feed
    order); its weights are parameters, so it can be fine-tuned.

    Its state-dict keys are the saved module's (`conv.weight`), so state
    dicts move both ways between it and the original. `train()` / `eval()`
    switch to the program saved for that mode; a mode that was not saved is
    an error, never the other mode's program run silently."""

    def __init__(self, program, feed_names, fetch_vars, mode=None, alternate=None, state=None, outputs=None,
                 state_updates=(), both_modes=False, paths=(), optimize="default", one_mode=None):
        super().__init__()
        # The level of passes and native code its calls run (runtime/passes), as for a declarative call.
        self._optimize = check_level(optimize)
        # `outputs`: what a call returns around the fetches (runtime/output_tree.py);
        # None for models saved by save_inference_model: the fetches themselves.
        # `state_updates`: (persistable name, fetch index), module state carried to the next call.
        main = (program, list(feed_names), list(fetch_vars), outputs, tuple(state_updates))
        self._mode_ops = sorted({op.type for op, _ in modes.mode_ops(program)})
        if mode is None and alternate is None:
            mode = modes.mode_from_ops(program)  # saved without a mode: what its ops say, if they agree
        self._one_mode = one_mode  # why the other mode's program is missing
        if (self._mode_ops and not both_modes) or alternate is not None or one_mode is not None:
            self._programs = {mode: main}  # mode None: ops that disagree, neither mode known
        else:
            self._programs = {"train": main, "eval": main}  # traced the same in both, or no op differs
        if alternate is not None:
            block = alternate.program.global_block()
            self._programs[alternate.mode] = (alternate.program, list(alternate.feed_names),
                                              [block.vars[n] for n in alternate.fetch_names], alternate.outputs,
                                              tuple(alternate.state_updates))
        # Programs of `main`'s mode for other sides of its decisions
        # (d2s/save_paths.py): tried in order when a run raises DecisionFailed.
        self._paths = [(p.program, list(p.feed_names), [p.program.global_block().vars[n] for n in p.fetch_names],
                        p.outputs, tuple(p.state_updates)) for p in paths]
        self._main = main
        self._saved_mode = mode
        self._slots = {}
        self._register_state(state)
        self._compiled = {}
        self._drawn = {}  # (id(program), device) -> the default generators its runs draw from
        # The parameter values of the latest call's function, kept until the module's tensors change.
        self._slot_values = slot_values.SlotValues(slot_values.watch(self), self._lookup)
        self._part = main
        self.program, self.feed_names, self.fetch_vars, self._outputs, self._updates = main
        super().train(mode != "eval")

    # -- state -----------------------------------------------------------------------
    def _register_state(self, state):
        """Every persistable value of the programs becomes a parameter or a
        buffer under its state-dict key (a tree of `_State` modules for
        dotted keys), its variable's name where none was saved; values the
        saved module's state does not hold (lifted constants) are
        non-persistent buffers."""
        values, specs = {}, {}
        for program, *_ in self._all_parts():
            for var in program.persistable_vars():
                if var.name in program.bound:
                    values.setdefault(var.name, program.bound[var.name])
                    specs.setdefault(var.name, var)
        if state is not None:
            # (state-dict key, variable name, kind); a key need not be a valid name (`conv-1.weight`).
            order = [(k, n, "parameter") for k, n in state["parameters"].items()]
            order += [(k, n, "buffer") for k, n in state["buffers"].items()]
            named = {n for _, n, _ in order}
            order += [(n, n, "constant") for n in values if n not in named]
        else:
            order = [(n, n, "parameter" if not specs[n].stop_gradient and values[n].dtype.is_floating_point
                      else "buffer") for n in sorted(values)]
        made = {}  # variable name -> its tensor: keys of one tensor (tied weights) share it
        for key, name, kind in order:
            value = made.get(name)
            if value is None:
                value = values[name] if name in values else state["values"][name]
                if kind == "parameter":
                    value = torch.nn.Parameter(value.detach().clone(), requires_grad=value.dtype.is_floating_point)
                made[name] = value
            self._slots[name] = self._place(key, value, kind)
        self._bind_slots()

    def _bind_slots(self):
        """Bind the programs' values to what the module holds now."""
        for program, *_ in self._all_parts():
            for name in list(program.bound):
                if name in self._slots:
                    program.bind(name, self._lookup(name))

    def _place(self, name, value, kind):
        """Register `value` as `name`, a state-dict key (creating `_State`
        parents for a dotted key), and return (owner module, attribute name)."""
        *parents, leaf = name.split(".")
        owner = self
        for part in parents:
            child = owner._modules.get(part)
            if child is None:
                if hasattr(owner, part):
                    return self._place_flat(name, value, kind)
                child = _State()
                owner.add_module(part, child)
            elif not isinstance(child, _State):
                return self._place_flat(name, value, kind)
            owner = child
        if hasattr(owner, leaf) or leaf in owner._modules:
            return self._place_flat(name, value, kind)
        self._register(owner, leaf, value, kind)
        return owner, leaf

    def _place_flat(self, name, value, kind):
        # A name that clashes with an attribute of this class (`program`, ...).
        key = re.sub(r"\W", "_", name)
        while hasattr(self, key):
            key += "_"
        self._register(self, key, value, kind)
        return self, key

    @staticmethod
    def _register(owner, key, value, kind):
        if kind == "parameter":
            owner.register_parameter(key, value)
        else:
            owner.register_buffer(key, value, persistent=kind != "constant")

    def _all_parts(self):
        return list(self._programs.values()) + self._paths

    def _lookup(self, name):
        owner, key = self._slots[name]
        return getattr(owner, key)

    # -- modes -------------------------------------------------------------------------
    def train(self, mode=True):
        key = "train" if mode else "eval"
        if key not in self._programs and self._one_mode is not None:
            raise RuntimeError(f"cannot switch this loaded model to {key} mode: {self._one_mode}")
        if key not in self._programs:
            built = (f"was built in {self._saved_mode} mode" if self._saved_mode else
                     "was saved without its mode, and its ops do not agree on one")
            raise RuntimeError(
                f"cannot switch this loaded model to {key} mode: its program {built} and holds ops that differ "
                f"between the modes ({', '.join(self._mode_ops)}), and no {key}-mode program was saved (running "
                f"this one would silently compute what {self._saved_mode or 'its'} mode computes); save it with "
                "d2s.jit.save(module, path, input_spec=[...]), which records both modes")
        self._part = self._programs[key]
        self.program, self.feed_names, self.fetch_vars, self._outputs, self._updates = self._part
        return super().train(mode)

    # nn.Module's call machinery only where something surrounds `forward` (a hook, compile, a trace).
    __call__ = module_call.call_class_forward

    def forward(self, *inputs):
        if foreign_tracers.active():  # torch.jit.trace, torch.export, torch.compile
            return foreign_tracers.call(self._forward, inputs, {}, "a loaded d2s model (TranslatedLayer)", inputs)
        return self._forward(*inputs)

    def __prepare_scriptable__(self):  # torch.jit.script asks each module this first
        raise foreign_tracers.ForeignTraceError(foreign_tracers.SCRIPT_MESSAGE)

    def _forward(self, *inputs):
        if len(inputs) != len(self.feed_names):
            raise TypeError(f"this model takes {len(self.feed_names)} inputs ({', '.join(self.feed_names)}), "
                            f"got {len(inputs)}")
        part = self._part
        if not self._paths:
            return self._run_part(part, inputs)
        device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), None)
        states = decisions.generator_states(inputs, self._generators(part, device))
        try:
            return self._run_part(part, inputs)
        except DecisionFailed as failure:
            # Inputs taking a side this program was not converted for: the
            # path converted for it, if one was saved and the failed run
            # changed nothing a second run would change again (its draws from
            # the caller's generators are undone: `states`).
            if self.program is not self._main[0] \
                    or not save_paths.may_rerun(self._runner(part).entry(), failure, bool(states)):
                raise

            def run(path):
                decisions.restore_generators(states)
                return self._run_part(path, inputs)
            # (A path converted for other static sizes, a one-token prompt's, is for those sizes only.)
            return save_paths.run_paths([p for p in self._paths if _fits(p, inputs)], run, failure)

    def _generators(self, part, device):
        """torch's default generators `part`'s program draws from, run on
        `device` (kept before a run that may be repeated on another path)."""
        key = (id(part[0]), device)
        found = self._drawn.get(key)
        if found is None:
            found = self._drawn[key] = decisions.global_generators(part[0], device)
        return found

    def _runner(self, part):
        """The LeveledProgram running `part`'s program at this layer's level."""
        program, feed_names, fetch_vars = part[:3]
        run = self._compiled.get(id(program))
        if run is None:
            run = self._compiled[id(program)] = runner.LeveledProgram(
                Executor(), program, feed_names, [v.name for v in fetch_vars], self._optimize)
        return run

    def _run_part(self, part, inputs):
        program, feed_names, fetch_vars, outputs, updates = part
        run = self._runner(part)
        tensors = run.feeds("input").convert(inputs)
        entry = run.entry(tensors)
        # Look the values up through the module so .to(), load_state_dict and
        # fine-tuning act on what the program reads.
        params = self._slot_values.values(entry.param_names, entry)
        results = run.call(entry, tensors, params, self._lookup)[:len(fetch_vars)]
        for name, index in updates:  # as eager leaves `self.hidden` for its next call
            owner, key = self._slots[name]
            setattr(owner, key, results[index])
        if outputs is not None:
            # With a memo: a node the file names twice (`{"same": k}`) is one object, built once.
            return output_tree.rebuild(outputs, results, {})
        return results[0] if len(results) == 1 else tuple(results)

    # -- saving and printing ----------------------------------------------------------------
    def _save(self, path):
        self._bind_slots()  # after .to(), load_state_dict, carried state: not what was bound at load
        mode, alternate = self._saved_mode, None
        main = self._programs.get(mode) or next(iter(self._programs.values()))
        other = self._programs.get("eval" if mode == "train" else "train")
        if mode is not None and other is not None and other is not main:
            alternate = other
        save_model(path, main, mode=mode, alternate=alternate, state=_module_state(self),
                   both_modes=other is main, paths=self._paths, one_mode=self._one_mode)

    def __repr__(self):
        block = self.program.global_block()
        show = lambda v: f"{v.name}: generator" if v.kind == GENERATOR else \
            f"{v.name}: {v.dtype_name}[{', '.join('any' if d == -1 else str(d) for d in v.shape)}]"
        feeds = ", ".join(show(block.vars[n]) for n in self.feed_names)
        fetches = ", ".join(show(v) for v in self.fetch_vars)
        n_params = sum(p.numel() for p in self.parameters())
        n_tensors = len(list(self.parameters())) + len(list(self.buffers()))
        modes = ("train and eval" if len(self._programs) == 2 and set(self._programs) == {"train", "eval"}
                 else f"{self._saved_mode or 'mode unknown'} only")
        return (f"TranslatedLayer(\n  feeds: {feeds}\n  fetches: {fetches}\n"
                f"  parameters: {n_params:,} elements; {n_tensors} tensors in all\n"
                f"  mode: {'train' if self.training else 'eval'} (programs: {modes})\n)")


def load(path, optimize=None):
    """Load a model saved by `jit.save` (or any save_inference_model
    directory) as a TranslatedLayer; validates before anything runs.
    `optimize`: the level its calls run at ("default", bit-identical to
    eager on CPU, or "fast"; None: `ProgramTranslator().optimize`), with the
    passes and native code of a declarative call at that level."""
    optimize = check_level(optimize or STATE.optimize)
    model = read_model(path)
    programs = [model.program] + ([model.alternate.program] if model.alternate else [])
    for program in programs + [p.program for p in model.paths]:
        for var in program.persistable_vars():
            program.bind(var.name, model.params[var.name])
    state = None
    if model.state is not None:
        state = dict(model.state, values={n: model.params[n] for names in model.state.values()
                                          for n in names.values()})
    block = model.program.global_block()
    return TranslatedLayer(model.program, model.feed_names, [block.vars[n] for n in model.fetch_names],
                           mode=model.mode, alternate=model.alternate, state=state, outputs=model.outputs,
                           state_updates=model.state_updates, both_modes=model.both_modes, paths=model.paths,
                           optimize=optimize, one_mode=model.one_mode)
