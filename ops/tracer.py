"""The tracer: the state of one trace, kept off the IR.

Recording ops into a `Program` needs state that is not part of the program
itself: the block ops go to now, which real tensors were lifted into which
persistable Variables, the names to give them, which parameters/buffers the
program writes in place, the Variables standing for run-time sizes, and the
Python-level torch functions being expanded. One `Tracer` holds all of it
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
import weakref

from runtime.ir import Variable, default_main_program

_current = contextvars.ContextVar("d2s_tracer", default=None)
_implicit = weakref.WeakKeyDictionary()


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


class Mark:
    """What a rollback returns to: the current block, and per block its op
    and variable counts (blocks only grow while tracing, variables in
    insertion order)."""

    __slots__ = ("block", "blocks", "written")

    def __init__(self, tracer):
        self.block = tracer.block
        self.blocks = [(len(b.ops), len(b.vars)) for b in tracer.program.blocks]
        self.written = set(tracer.written)


class Tracer:
    """The state of one trace into `program`.

    `name_hints` maps id(tensor) -> a name for the persistable Variable a
    parameter or buffer is lifted into (its attribute path in the module).
    """

    def __init__(self, program, name_hints=None):
        self.program = program
        self.block = program.global_block()
        self.name_hints = dict(name_hints or {})
        self.lifted = {}        # id(tensor) -> name of its persistable Variable
        self.written = set()    # id(tensor) of parameters/buffers the program updates in place
        self.size_vars = {}     # (var name, block idx) -> tuple of dims (ints or 0-d Variables)
        self.expanding = set()  # Python-level torch functions whose body is being captured
        self._token = None

    # -- activation ----------------------------------------------------------------
    def __enter__(self):
        if self._token is not None:
            raise RuntimeError("a Tracer is active already; make a new one per trace")
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc):
        _current.reset(self._token)
        self._token = None

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

    def rollback(self, mark):
        """Remove everything recorded since `mark`: blocks created after it,
        ops and variables added to older blocks, bindings of removed
        variables, and the tracer's entries for them."""
        program = self.program
        program.truncate_blocks(len(mark.blocks))
        for block, (n_ops, n_vars) in zip(program.blocks, mark.blocks):
            removed = list(block.vars)[n_vars:]
            block.truncate(n_ops, removed)
            for name in removed:
                program.bound.pop(name, None)
        live = program.global_block().vars
        self.lifted = {k: n for k, n in self.lifted.items() if n in live}
        self.size_vars = {k: dims for k, dims in self.size_vars.items()
                          if all(_alive(d, program) for d in dims if isinstance(d, Variable))}
        self.block = mark.block
        self.written = set(mark.written)


def _alive(var, program):
    block = var.block
    return block.idx < len(program.blocks) and program.blocks[block.idx] is block and block.vars.get(var.name) is var
