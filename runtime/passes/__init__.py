"""Program passes: rewrites of a Program between tracing and codegen.

The executor never changes the program a user traced (its text, saved form
and inspection stay as traced): `optimize` copies it, runs a fixed pipeline of
passes over the copy, and codegen compiles the result. One pass per file,
each with a before/after docstring:

  level "default" (CPU results bit-identical to eager):
      dce -> cse -> scalars -> loop_slices -> hoist_constants -> dce -> direct_kernels
  level "fast" (exact up to floating-point rounding; see each pass):
      fuse_rnn_loops -> dce -> cse -> scalars -> loop_slices -> hoist_constants -> hoist_invariants
      -> dce -> direct_kernels
  and for calls with grad mode off (`inference=True`), at the end:
      ... -> pretranspose (fast level only) -> inplace

  - dce: drop ops nothing observes (pure, outputs unused);
  - cse: a pure op repeating an earlier one (same inputs, same arguments)
    reuses its result;
  - scalars: CPU integer/bool 0-d values (loop counters, lengths, break
    flags) run as Python ints/bools;
  - loop_slices: `x[:, t]` of a loop-invariant `x` by the loop counter is
    one `x.unbind(1)` before the loop and a Python index per step (a `for`
    loop's rows always, as eager; a per-trip slice where the gradient stays
    eager's to the bit);
  - hoist_constants: `fill_constant`s only read by ops that make a fresh
    result are created once, at compile time, instead of on every call;
  - direct_kernels: `F.embedding`, `F.relu`, `F.max_pool2d`, `F.dropout`,
    `F.softmax` (Python wrappers) call the C kernel they would call;
  - inplace: an elementwise op whose input is a temporary nothing else
    reads writes its result into it (only where autograd is off);
  - pretranspose (fast, grad mode off): `linear` on a parameter is `addmm`
    on the weight's transpose, made once by the caller and reused while valid;
  - hoist_invariants (fast): an op of a loop body whose inputs the loop
    never changes runs in the first trip only, later trips reuse its result;
  - fuse_rnn_loops: a `while` loop applying an LSTM/GRU/RNN cell step by step
    over a sequence becomes one fused `torch.lstm`/`gru`/`rnn_*` call.

`D2S_DEBUG=2` prints the program after each pass. (Codegen itself groups
consecutive ops of a user's `no_grad` block under one `with no_grad():`.)

Passes read op facts (effects: mutates, random, side effects) from the op
table through `ctx.get_op_def`; runtime never imports `ops`.
"""

import sys

from .. import _debug
from ..optable import get_op_def
from . import (cse, dce, direct_kernels, fuse_rnn_loops, hoist_constants, hoist_invariants, inplace, loop_slices,
               pretranspose, scalars)

LEVELS = ("default", "fast")

PIPELINES = {
    "default": (dce, cse, scalars, loop_slices, hoist_constants, dce, direct_kernels),
    "fast": (fuse_rnn_loops, dce, cse, scalars, loop_slices, hoist_constants, hoist_invariants, dce,
             direct_kernels),
}


class PassContext:
    """What every pass may read: the program being rewritten, the names the
    caller feeds and fetches, and the op table."""

    def __init__(self, program, feed_names, fetch_names):
        self.program = program
        self.feed_names = list(feed_names)
        self.fetch_names = list(fetch_names)
        self.get_op_def = get_op_def


def check_level(level):
    if level not in LEVELS:
        raise ValueError(f"optimize must be one of {', '.join(map(repr, LEVELS))}, got {level!r}")
    return level


def optimize(program, feed_names, fetch_names, level="default", inference=False):
    """(a rewritten copy of `program`, the names to fetch from it); the
    original program is left as it is. `inference`: the variant for calls
    with grad mode off, which ends with `inplace`."""
    work = program.copy()
    ctx = PassContext(work, feed_names, fetch_names)
    tail = (((pretranspose,) if level == "fast" else ()) + (inplace,)) if inference else ()
    for step in PIPELINES[check_level(level)] + tail:
        step.run(ctx)
        if _debug.level() >= 2:
            print(f"[d2s] program after pass {step.__name__.rsplit('.', 1)[-1]}:\n{work.to_string()}",
                  file=sys.stderr)
    return work, ctx.fetch_names
