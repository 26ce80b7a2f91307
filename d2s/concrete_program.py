"""`ConcreteProgram`: one traced program of a declarative function, with its
compiled function and what runs around it (module state, pretransposed
weights, the inference variant).

The pretranspose contract: at the fast level `runtime/passes/pretranspose.py`
makes the compiled function take transposed weights after the parameters
(`CompiledBlock.derived` names their sources); `ConcreteProgram._transposes`
makes them and keeps them fresh.
"""

import torch

from runtime import runner
from runtime.errors import DecisionFailed
from runtime.executor import Executor
from runtime.ir import GENERATOR
from runtime.output_tree import rebuild, repeated

from . import argument_writes as argument_writes_, decisions, module_state, python_writes


class ConcreteProgram:
    """One traced program: its feeds (in argument order), its outputs (the
    returned structure with Variables in it), and the compiled function."""

    def __init__(self, main_program, startup_program, inputs, outputs, fetch_vars, out_tree, optimize="default",
                 state=None, layout=None, python_writes=(), argument_writes=(), single_use=False,
                 varying=frozenset()):
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
        self.state_aliases = module_state.aliased(self.state_reads)  # attributes read as one variable
        self.state_attrs, self.state_assumed = [], ()  # set by StaticFunction._build
        # Plain values the trace assigned to module attributes, set again
        # after each run (d2s/python_writes.py `replay`).
        self.python_writes = list(python_writes)
        # The caller's objects it changes in place (d2s/argument_writes.py),
        # written after each run from fetches in the state part; the returned
        # value may name them too (a cache passed in and returned).
        self.argument_writes = list(argument_writes)
        self._names_arguments = bool(argument_writes) and argument_writes_.names_arguments(out_tree)
        # The caller's objects each run looks up first (their steps among the arguments).
        self._argument_steps = argument_writes_.steps_named(
            self.argument_writes, ([out_tree] if self._names_arguments else []) +
            [w.tree for w in self.state_writes]) if argument_writes else ()
        self.single_use = single_use  # it wrote objects keyed by identity (d2s/argument_writes.py `collect`)
        self.varying = varying  # dims traced as run-time sizes (d2s/varying_sizes.py)
        self.compiled = Executor().compiled(main_program, [v.name for v in inputs],
                                            [v.name for v in fetch_vars + self.state_fetch], optimize)
        self._inference = None  # the CompiledBlock for calls with grad mode off, made on the first one
        self._transposed_version = None
        self._transposed_sources, self._transposer = [], runner.Transposes()
        self._params_version = None
        self._params = ()
        # A single returned tensor (the common case) needs no tree rebuild.
        self._single = out_tree == ("fetch", 0) and not self.state_writes and not self.argument_writes
        # A node met twice (`return ys, ys`, `self.cache = ys; return ys`): rebuilt with one
        # memo for the returned value and the module state written, one object (d2s/output_types.py).
        self._shares = bool(repeated(out_tree, *(w.tree for w in self.state_writes)))
        # The returned value resolved with the writes' memo: it names the caller's objects, or holds
        # an object a write holds too (the module state written is resolved then too).
        self._resolve_returned = self._names_arguments or (bool(argument_writes) and bool(repeated(
            out_tree, *(w.tree for w in argument_writes), *(w.tree for w in self.state_writes))))
        # The generators it draws from (a `torch.Generator` argument, torch's default
        # ones: training dropout): their states are kept before each run, so a run
        # that breaks a decision can be repeated (d2s/decisions.py).
        self.draws_from_feeds = any(v.kind == GENERATOR for v in inputs)
        self.global_generators = decisions.global_generators(main_program)
        self.keeps_generators = self.draws_from_feeds or bool(self.global_generators)
        # Nothing to do around the call but pass the parameters (the hit
        # path in StaticFunction.__call__ then calls the function itself).
        self._plain = not self.state_reads and not self.state_writes and layout is None and \
            not self.python_writes and not self.argument_writes and not self.global_generators
        # (args, kwargs) of the call that built it, when it holds a custom autograd.Function (static_function.py)
        self.call_example = None
        self.decisions = None  # the decisions.Group of the programs sharing its cache key, once there are more

    def run(self, tensors, arguments=None):
        """The function's result for the call's `tensors` (its feeds);
        `arguments`: the call's (args, kwargs), which a program that changes
        its argument objects writes (`argument_writes`)."""
        program = self.main_program
        if self.state_reads:
            # The previous call's state is what the module attributes hold now.
            module_state.refresh_reads(self.state_reads, program.bound, self.state_aliases)
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
        if self.argument_writes:
            return self._write_arguments(results, arguments)
        # Every tree indexes all of `results` (the returned value's fetches, then the state part).
        memo = {} if self._shares else None
        if self.state_writes:
            module_state.apply_writes(self.state_writes, lambda tree: rebuild(tree, results, memo))
        if self.python_writes:
            python_writes.replay(self.python_writes)
        return results[0] if self._single else rebuild(self.out_tree, results, memo)

    def _write_arguments(self, results, arguments):
        out_tree = self.out_tree
        objects = argument_writes_.objects_of(self._argument_steps, *arguments)
        resolving, rebuilding = {}, {}  # one object per node, in the written values and the returned one
        argument_writes_.apply(self.argument_writes, results, objects, resolving, rebuilding)
        if self.state_writes:
            module_state.apply_writes(self.state_writes, lambda tree: rebuild(
                argument_writes_.resolved(tree, objects, resolving), results, rebuilding))
        if self.python_writes:
            python_writes.replay(self.python_writes)
        if self._resolve_returned:
            out_tree = argument_writes_.resolved(out_tree, objects, resolving)
        return rebuild(out_tree, results, rebuilding)


    def _transposes(self, entry):
        """The transposed weights `entry` takes after the parameters
        (runtime/passes/pretranspose.py, fast level; kept fresh by
        runner.Transposes)."""
        version = (entry, self.main_program._version)
        if version != self._transposed_version:  # which tensors: new only through Program.bind
            self._transposed_version = version
            self._transposed_sources = [self.main_program.bound[n] for n in entry.derived]
        return self._transposer.get(self._transposed_sources)

    def _compile_inference(self):
        """The variant run when grad mode is off (called only then): the
        same passes, then in-place reuse of dead temporaries
        (runtime/passes/inplace.py), chosen as every runner chooses it."""
        self._inference = Executor().compiled_for_call(self.main_program, self.compiled.feed_names,
                                                       self.compiled.fetch_names, self.optimize)
        return self._inference


_grad_enabled = torch.is_grad_enabled
