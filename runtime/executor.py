"""Places, scopes and the Executor.

`Executor(place).run(program, feed, fetch_list)` compiles the program once
per (program version, feeds, fetches) into a Python function (see
`codegen.py`) and calls it. Programs run under PyTorch autograd, so a loss
fetched with `return_numpy=False` can be back-propagated into the bound
parameters.

`D2S_DEBUG=3` (or `set_verbosity(3)`) compiles a tracing variant that prints
every op as it runs.
"""

import sys
import weakref

import torch

from . import _debug, foreign_tracers
from . import native, passes
from .codegen import compile_program
from .effects import written_in_place
from .runner import check_shape, convert_feed, convert_input, run_compiled  # noqa: F401 - re-exported
from .ir import Program, Variable, default_main_program
from .optable import get_op_def
from .run_modes import check_caller_modes

# The executor's own tables per program, beside it (a Program holds only IR)
# and gone with it: compiled forms by (version, feeds, fetches, level,
# variant), and what a run reads of the program (`_Facts`, by version).
_compiled = weakref.WeakKeyDictionary()
_facts = weakref.WeakKeyDictionary()


class CPUPlace:
    device = torch.device("cpu")

    def __repr__(self):
        return "CPUPlace()"


class CUDAPlace:
    def __init__(self, device_id=0):
        if not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0:
            raise TypeError(f"CUDAPlace takes a device index (an int >= 0), got {device_id!r}")
        # Checked here rather than at the first kernel, where torch reports a
        # bare AssertionError from deep inside a run.
        if not torch.cuda.is_available():
            reason = ("this PyTorch build has no CUDA support" if torch.version.cuda is None
                      else "no CUDA device is visible")
            raise RuntimeError(f"CUDAPlace({device_id}): {reason} (torch {torch.__version__}); "
                               "use d2s.CPUPlace(), or install a CUDA build of PyTorch on a machine with a GPU")
        if device_id >= torch.cuda.device_count():
            raise RuntimeError(f"CUDAPlace({device_id}): only {torch.cuda.device_count()} CUDA device(s) visible")
        self.device_id = device_id
        self.device = torch.device("cuda", device_id)

    def __repr__(self):
        return f"CUDAPlace({self.device_id})"


class Scope:
    """Name -> tensor storage for persistable variables (parameters,
    optimizer state) that outlive one run."""

    def __init__(self, parent=None):
        self.parent = parent
        self._vars = {}

    def find_var(self, name):
        scope = self
        while scope is not None:
            if name in scope._vars:
                return scope._vars[name]
            scope = scope.parent
        return None

    def var(self, name):
        return self.find_var(name)

    def set(self, name, value):
        self._vars[name] = value

    def __contains__(self, name):
        return self.find_var(name) is not None

    def names(self):
        return sorted(self._vars)

    def new_scope(self):
        return Scope(self)


_global_scope = Scope()


def global_scope():
    return _global_scope




def _trace_op(op):
    print(f"[d2s] run {op.to_string()}", file=sys.stderr, flush=True)


class Executor:
    def __init__(self, place=None):
        self.place = place or CPUPlace()

    # -- compilation ------------------------------------------------------------------
    def compiled(self, program, feed_names, fetch_names, optimize="default", inference=False, device=None):
        """The CompiledBlock for these feeds/fetches, built once per program
        version: the program is rewritten by the passes of level `optimize`
        (see `passes`; the program itself is not changed), then compiled.
        `inference`: the variant to call when grad mode is off (it reuses
        dead temporaries in place). `device`: the device of the feeds, when
        known; a program traced on another device runs with its
        device-following attributes on this one (runtime/ir.py `Program.device`)."""
        trace = _debug.level() >= 3
        elsewhere = device is not None and device != program.device
        key = (program._version, tuple(feed_names), tuple(fetch_names), trace, optimize, inference,
               device if elsewhere else None)
        cache = _compiled.setdefault(program, {})
        entry = cache.get(key)
        if entry is None:
            if len(cache) > 64:
                cache.clear()
            run = program.on_device(device) if elsewhere else program
            optimized, fetches = passes.optimize(run, feed_names, fetch_names, optimize, inference)
            entry = compile_program(optimized, feed_names, fetches, get_op_def,
                                    _trace_op if trace else None, native.load(),
                                    fused_autograd=optimize == "fast")
            entry.fetch_names = list(fetch_names)
            cache[key] = entry
            if _debug.level() >= 2:
                print(f"[d2s] compiled program:\n{entry.source}", file=sys.stderr)
        return entry

    def compiled_for_call(self, program, feed_names, fetch_names, optimize="default", device=None):
        """The CompiledBlock a call makes in the current grad mode, as a
        declarative call chooses it: with grad mode off the in-place variant
        (`inference`), unless its parameters differ from the grad-mode
        function's (callers pass those). `device`: as for `compiled`."""
        entry = self.compiled(program, feed_names, fetch_names, optimize, device=device)
        if torch.is_grad_enabled():
            return entry
        variant = self.compiled(program, feed_names, fetch_names, optimize, inference=True, device=device)
        return variant if variant.param_names == entry.param_names else entry

    # -- running ------------------------------------------------------------------------
    def run(self, program=None, feed=None, fetch_list=None, scope=None, return_numpy=True, optimize="default"):
        """Run `program` on `feed`; `optimize`: the level of passes and
        native code ("default": bit-identical to eager on CPU, or "fast";
        see runtime/passes), as for a declarative call."""
        if foreign_tracers.active():  # torch.jit.trace, torch.export, torch.compile (runtime/foreign_tracers.py)
            return foreign_tracers.call(self.run, (program, feed, fetch_list, scope, return_numpy, optimize), {},
                                        "Executor.run of a d2s program",
                                        [v for v in (feed or {}).values() if isinstance(v, torch.Tensor)])
        program = program or default_main_program()
        if not isinstance(program, Program):
            raise TypeError(f"Executor.run expects a Program, got {type(program).__name__}")
        feed = dict(feed or {})
        fetch_names = [v.name if isinstance(v, Variable) else str(v) for v in (fetch_list or [])]
        block = program.global_block()
        facts = _program_facts(program)
        for name in fetch_names:
            if name not in facts.all_vars:
                raise ValueError(f"fetch target {name!r} is not a variable of the program")
        for name in feed:
            var = block.vars.get(name)
            if var is None or not var.is_data:
                known = ", ".join(v.name for v in program.data_vars()) or "none"
                raise ValueError(f"feed {name!r} is not a data variable of the program (data variables: {known})")
        missing = [n for n in facts.needed_feeds if n not in feed]
        if missing:
            raise ValueError(f"data variable(s) {missing} are used by the program but not fed")
        feed_names = sorted(feed)
        entry = self.compiled_for_call(program, feed_names, fetch_names, passes.check_level(optimize),
                                       self.place.device)
        check_caller_modes(program)
        feeds = [self._to_tensor(feed[n], block.vars[n], copy=n in facts.mutated_feeds) for n in feed_names]
        params = resolve_persistables(program, entry.param_names, scope)
        if entry.derived:  # fast level, grad mode off: the weights' transposes (passes/pretranspose.py)
            params += [w.t() for w in resolve_persistables(program, entry.derived, scope)]
        results = run_compiled(entry, feeds + params)
        target_scope = scope or global_scope()
        for name, value in zip(entry.written_params, results[len(fetch_names):]):
            if scope is None and name in facts.module_copies:
                continue  # without a scope, programs read the module's own tensors: no copy to keep
            target_scope.set(name, value)
        results = results[:len(fetch_names)]
        if return_numpy:
            return [_to_numpy(r) for r in results]
        return list(results)

    def _to_tensor(self, value, var, copy):
        """The feed tensor (see runner.convert_input); `copy`: the program
        writes this feed in place, so it must not share the caller's memory."""
        tensor = convert_feed(value, var, "feed", self.place.device)
        if not isinstance(tensor, torch.Tensor):
            return tensor  # a generator: the program draws from the caller's own
        # A tensor passed through, or one made from an array, may share memory with the caller's.
        shares = tensor is value or not isinstance(value, torch.Tensor)
        return tensor.clone() if copy and shares else tensor


def check_feed_shape(var, tensor):
    check_shape(tensor, var.name, var.shape)


def _to_numpy(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, list):
        return [_to_numpy(v) for v in value]
    return value


class _Facts:
    """What `run` checks on every call, computed once per program version."""

    def __init__(self, program):
        ops = [op for b in program.blocks for op in b.ops]
        data = {v.name for v in program.data_vars()}
        used = {n for op in ops for n in op.input_names + op.output_names}
        self.version = program._version
        self.all_vars = {n for b in program.blocks for n in b.vars}
        self.needed_feeds = sorted(data & used)
        # Feeds written in place by some op: numpy feeds share memory with
        # the caller's array, so those are copied first.
        # Per-scope copies of module tensors a startup program makes (ops
        # flagged `scope_init`; see ops/framework.py init_in_startup).
        self.module_copies = {n for op in ops if get_op_def(op.type).scope_init
                              for n in op.output_names}
        self.mutated_feeds = {written_in_place(op) for op in ops} & data


def _program_facts(program):
    facts = _facts.get(program)
    if facts is None or facts.version != program._version:
        facts = _facts[program] = _Facts(program)
    return facts


def resolve_persistables(program, names, scope=None):
    """Values of persistable variables: the given scope first, then the
    tensors the program is bound to, then the global scope."""
    out = []
    bound = program.bound
    for name in names:
        value = scope.find_var(name) if scope is not None else None
        if value is None:
            value = bound.get(name)
        if value is None:
            value = _global_scope.find_var(name)
        if value is None:
            raise ValueError(f"persistable variable {name!r} has no value: run the startup program "
                             "first, or load the model's parameters")
        out.append(value)
    return out
