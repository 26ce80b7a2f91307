"""The tracer: the state of one trace, kept off the IR.

Recording ops into a `Program` needs state that is not part of the program
itself: the block ops go to now, which real tensors were lifted into which
persistable Variables, the names to give them, the symbolic shapes
(ops/symbolic.py), and the Python-level torch functions being expanded. One `Tracer` holds all of it
for one trace; `current()` finds it through a context variable.

    with Tracer(program, name_hints):      # d2s: one per declarative build
        ... converted function runs ...    # ops/ reads tracer state via current()

Static-graph code written under `program_guard` without a trace (the
`d2s.data` + torch calls style) gets an implicit tracer per program, made on
first use and kept as long as the program lives, so lifting the same tensor
twice still yields one Variable.

Rollback is one mechanism: `mark()` snapshots what a trial trace may add,
`rollback(mark)` removes it (ops, variables, blocks, bindings and the
tracer's own bookkeeping), so a probe leaves no trace behind.
"""

import contextlib
import contextvars
import sys
import weakref

import torch

from runtime import run_modes
from runtime.format_rules import safe_names
from runtime.ir import default_main_program

from . import ambient_modes, cold_start, host_random, process_state
from .examples import example_int

_current = contextvars.ContextVar("d2s_tracer", default=None)
_MISSING = object()  # a `python_writes` entry's value before: the key was absent
_implicit = weakref.WeakKeyDictionary()


def active():
    """The tracer of the trace under way (a declarative build), or None."""
    return _current.get()


def current():
    """The tracer recording into the current main program."""
    program = default_main_program()
    tracer = _current.get()
    if tracer is not None and tracer.program is program:
        return tracer
    tracer = _implicit.get(program)
    if tracer is None:
        tracer = _implicit[program] = Tracer(program)
    return tracer


def _kept_as_is(tensor):
    return tensor


class Mark:
    """What a rollback returns to: the current block, and per block its op
    and variable counts (blocks only grow while tracing, variables in
    insertion order)."""

    __slots__ = ("block", "blocks", "guards", "writes")

    def __init__(self, tracer):
        self.block = tracer.block
        self.blocks = [(len(b.ops), len(b.vars)) for b in tracer.program.blocks]
        self.guards = tracer._shapes.emitted if tracer._shapes is not None else 0
        self.writes = len(tracer.python_writes)


def persistable_names(hints):
    """`hints` (id(tensor) -> state-dict key) with each key made a safe,
    distinct variable name (runtime/format_rules.safe_names): a program is
    saved under its variable names, and PyTorch's keys need not be valid
    ones (`add_module('conv-1', ...)`). The saved state keeps the keys."""
    names = safe_names(list(hints.values()))
    return {tensor_id: names[key] for tensor_id, key in hints.items()}


class Tracer:
    """The state of one trace into `program`.

    `name_hints` maps id(tensor) -> a name for the persistable Variable a
    parameter or buffer is lifted into (its attribute path in the module).
    """

    # Whether a number/tensor value may be left pending (ops/number_paths.py):
    # only a declarative call's trace, which is traced again to decide it.
    decides_numbers = False

    def __init__(self, program, name_hints=None):
        self.program = program
        self.block = program.global_block()
        self.name_hints = persistable_names(name_hints or {})
        self.lifted = {}        # id(tensor) -> name of its persistable Variable
        self.expanding = set()  # Python-level torch functions whose body is being captured
        self.examples = {}      # feed name -> the tensor of the call being traced (ops/examples.py)
        self.sides = []         # (condition, side, the if's origin) of each tensor `if` side being traced, innermost last
        self.example_sides = {}  # (file, line) -> the side of an unmergeable `if` the example inputs took there
        # (id(condition), side): sides whose tracing failed where the example's side is unknown (control_flow.sides)
        self.unknown_sides_failed = set()
        self.reads_layout = False  # the trace read strides (`x.stride()`, `is_contiguous()`): see _strides
        self.layout_read_at = None  # where it first did: the user's (file, line, text)
        # (namespace dict, key, value before) of Python attribute writes made while
        # tracing that a rollback takes back (d2s logs module attribute assignments).
        self.python_writes = []
        self.backward_leaves = set()  # Variables whose `.grad` a recorded `loss.backward()` set (read_grad)
        self.backward_stepped = False  # a d2s.Graph's `loss.backward()`, which also steps, was recorded
        self._shapes = None     # ops.symbolic.Shapes, made on the first dynamic dimension
        self.entry_frame = None  # the frame that entered this tracer, while it is active
        self._token = None
        self._patches = None    # what the trace changes in torch/random/numpy while active (__enter__)
        self.caller_modes = None  # (grad, inference) of the caller, read on entry
        self.autocast_start = None  # the caller's autocast (runtime/run_modes.py), read on entry
        self.modes_read = {}      # "grad"/"inference" -> the caller's mode the user's code read
        self.flag_reads = {}  # id -> a parameter's `requires_grad` the user's code read (ops/python_values.py)
        self.functions = {}  # id -> each converted function the trace called (ops/python_reads.py)
        # d2s/python_writes.py's Watch of this trace, while it runs: the writes it
        # carries or refuses, the iterators that outlive the call (d2s/operators/for_loops.py)
        self.watch = None
        self.attribute_reads = None  # ops/attribute_reads.py's AttributeReads of this trace, while it runs
        self.state_reads = {}  # label -> (query, answer): torch's settings, environment variables read (ops/process_state.py)
        self.user_enabled_grad = False  # the user's code turned gradients on inside the trace
        self.try_depth = 0        # user `try` bodies with handlers under way (d2s try_scope)
        # id(value) -> (value, {id: object}): the objects a cond/while output is
        # on some path (ops/control_flow/identity.py)
        self.identities = {}

    @property
    def shapes(self):
        """The trace's symbolic shapes (ShapeEnv + FakeTensorMode), made on
        first use so that static traces never import sympy."""
        if self._shapes is None:
            from .symbolic import Shapes  # lazy: sympy and torch's symbolic shapes, for dynamic traces only
            from .light_simplify import light_floordiv  # lazy: imports sympy
            self._shapes = Shapes(self)
            if self._patches is not None:  # inside `with tracer:` (ended with it)
                self._patches.enter_context(light_floordiv(active))
            cold_start.refresh()  # the symbolic-shape modules are loaded now
        return self._shapes

    def symbolize(self, var, hints=None):
        """Give `var`'s run-time dimensions (-1) symbols; `hints` are example sizes."""
        if any(d == -1 or isinstance(d, str) for d in var.dims):
            self.shapes.symbolize(var, hints)

    def example_int(self, var, default, real_sizes=False):
        """The int the integer tensor `var` holds for the call being traced
        (a size symbol's hint; see examples.example_int for `real_sizes`),
        else `default`."""
        value = example_int(self, var, real_sizes)
        return default if value is None else value

    def new_guards(self):
        """(check, message) for each size assumption made since the last
        call, once each; `recording.emit_guards` records them as ops."""
        if self._shapes is None:
            return []
        return list({id(c): (c, m) for c, m in self._shapes.new_guards()}.values())

    # -- activation ----------------------------------------------------------------
    def __enter__(self):
        if self._token is not None:
            raise RuntimeError("a Tracer is active already; make a new one per trace")
        self._token = _current.set(self)
        # The frame tracing runs under (`with Tracer(...): fn(...)`): where
        # a user line's site stops (user_frames.user_origin_at_site).
        self.entry_frame = sys._getframe(1)
        self._patches = contextlib.ExitStack()
        # Sizes are compared and symbols made outside shape inference too
        # (`if x.size(0) > 2:` in user code): keep torch._dynamo unloaded for the whole trace.
        self._patches.enter_context(cold_start.dynamo_free())
        # A draw from Python's or numpy's global random state would be a
        # constant of the program (ops/host_random.py).
        self._patches.enter_context(host_random.refuse_global_draws(active))
        # The user's code asking for the grad/inference mode sees the
        # caller's, and the program checks it (ops/ambient_modes.py).
        self.caller_modes = ambient_modes.caller_modes()
        self.autocast_start = run_modes.full_autocast_state()
        # A program that is not retraced per call (saved, TracedLayer) checks its caller's against it.
        self.program.autocast = run_modes.traced_autocast(self.autocast_start)
        self._patches.enter_context(ambient_modes.answer_caller_modes(active))
        # torch's settings and environment variables read are checked when the program runs (ops/process_state.py).
        self._patches.enter_context(process_state.noting_queries(active))
        # A custom autograd.Function applied by code d2s does not convert is an op too (ops/autograd_function.py).
        from . import autograd_function  # lazy: it records through capture and recording, which import this module
        self._patches.enter_context(autograd_function.recording_every_apply(active))
        # The caller's saved-tensor hooks (`save_on_cpu`, a memory tracker)
        # are the program's runs' to see: the meta and example tensors
        # tracing computes with autograd on never reach them.
        try:
            self._patches.enter_context(torch.autograd.graph.saved_tensors_hooks(_kept_as_is, _kept_as_is))
        except RuntimeError:  # the caller disabled saved-tensor hooks: none can run anyway
            pass
        return self

    def __exit__(self, exc_type, *exc):
        try:
            if exc_type is None and self._shapes is not None:
                self._shapes.finish(self.program)
            # First: a saved model finds the mode it was converted for there (d2s/save_paths.py).
            if exc_type is None and self.modes_read:
                ambient_modes.check_modes_first(self.program, self.modes_read)
        finally:
            patches, self._patches = self._patches, None
            try:
                patches.__exit__(exc_type, *exc)  # the last entered first; host_random may refuse here
            finally:
                _current.reset(self._token)
                self._token = None
                self.entry_frame = None  # a frame holds its locals alive

    # -- blocks ----------------------------------------------------------------------
    def new_block(self):
        """A new block whose parent is the current block."""
        return self.program.create_block(self.block.idx)

    @contextlib.contextmanager
    def block_guard(self, block):
        """Record ops into `block` inside the `with`."""
        saved = self.block
        self.block = block
        try:
            yield block
        finally:
            self.block = saved

    # -- rollback --------------------------------------------------------------------
    def mark(self):
        return Mark(self)

    def log_write(self, namespace, key):
        """Note that `namespace[key]` (an object's `__dict__`) is about to be
        assigned: a rollback past this point puts back what it holds now."""
        self.python_writes.append((namespace, key, namespace.get(key, _MISSING)))

    def rollback(self, mark):
        """Remove everything recorded since `mark`: blocks created after it,
        ops and variables added to older blocks, bindings of removed
        variables, the tracer's entries for them, and the logged Python
        attribute writes (`python_writes`)."""
        program = self.program
        # The logged writes first: one may be a block's entry for a name
        # (ops/recording.py renames a Variable), which keeps its place in
        # the block's order and so is removed below when made after `mark`.
        while len(self.python_writes) > mark.writes:  # newest first: the oldest value is what stays
            namespace, key, before = self.python_writes.pop()
            if before is _MISSING:
                namespace.pop(key, None)
            else:
                namespace[key] = before
        program.truncate_blocks(len(mark.blocks))
        for block, (n_ops, n_vars) in zip(program.blocks, mark.blocks):
            removed = list(block.vars)[n_vars:]
            block.truncate(n_ops, removed)
            for name in removed:
                program.bound.pop(name, None)
        live = program.global_block().vars
        self.lifted = {k: n for k, n in self.lifted.items() if n in live}
        self.block = mark.block
        if self._shapes is not None:
            # Assumptions whose checks were rolled back are checked again at the next op.
            self._shapes.emitted = min(self._shapes.emitted, mark.guards)

