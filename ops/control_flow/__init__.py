"""Graph control flow: the `cond` and `while` ops and the explicit API.

`cond(pred, true_fn, false_fn)` and `while_loop(cond, body, loop_vars)` work
on eager values and on Variables alike:

    cond(pred, t, f)            ==  t() if pred else f()
    while_loop(c, b, vs)        ==  while c(*vs): vs = b(*vs)
                                    return vs

With a Variable condition they trace the branches / the body into
sub-blocks and append one op whose outputs are new Variables:

    cond:   Out = cond(Cond, X) {true_block, false_block, true_outs, false_outs}
    while:  Out = while(X)      {cond_block, body_block, loop_vars, cond_out, body_outs}

The executor lowers them to a Python `if` / `while True: ... break` around the
sub-blocks' statements, so gradients flow through the branch and the
iterations actually taken.

The rooms, in the order a `cond` uses them:

    undefined.py   `Undefined` / `Unreachable`: a name with no value on a path
    identity.py    which object a cond/while output is on each path (`is`, `id()`)
    values.py      branch and loop values as Variables, labels for messages
    merge.py       one parent-level value from the two sides' values
    sides.py       a side converted for the example inputs only (decisions)
    cond_op.py     the `cond` op: `cond()`, its emitter
    while_op.py    the `while` op: `while_loop()`, its emitter
    checkpoint_op.py  the `checkpoint` op: a block torch's checkpoint runs
                   (recomputed in backward), `settle` for blocks whose
                   values are read outside them
"""

from .checkpoint_op import checkpointed, settle
from .cond_op import cond
from .sides import decide_failed_side, forced_used, forcing, raised_by_torch, site_key
from .undefined import Undefined, Unreachable
from .while_op import while_loop

__all__ = ["Undefined", "Unreachable", "checkpointed", "cond", "decide_failed_side", "forced_used", "forcing",
           "raised_by_torch", "settle", "site_key", "while_loop"]
