"""Every side of a decision in a saved model (issue 22, DESIGN Semantics 8).

A tensor `if` whose sides give values no program output holds on both
(None and a tensor: transformers' mask helpers return None for a mask of
all ones) is converted for the side the example inputs take; the other
side is a `decision_failed` op (ops/control_flow/sides.py). In memory a run that
reaches it converts again (d2s/decisions.py). A saved model cannot convert,
and the examples `jit.save` traces with are zeros, so they take one side
only: a BERT saved so refuses every unpadded batch.

So `jit.save` traces once more for each such side its programs did not
convert, with that `if` converted for the other side
(`control_flow.forcing`), and saves those programs as the model's paths;
the loaded model runs the first and, when a run raises DecisionFailed,
the next (runtime state is untouched by a failed run: see `may_rerun`). A
side that cannot be traced at the saved sizes is left out: the loaded model
refuses inputs taking it with the DecisionFailed that names it.

The caller's grad mode is such a decision too: a program whose code read it
(`if torch.is_grad_enabled():` in the user's code, nn.MultiheadAttention's
fused inference kernel: ops/ambient_modes.py) starts with a `check_modes`
op, so `jit.save` traces once more in the other mode and saves that program
as a path: the loaded model serves calls with and without gradients.
"""

import torch

from ops import control_flow
from ops.autograd_function import has_live_ops
from runtime import runner
from runtime.errors import DecisionFailed

from . import decisions, module_state

# Programs per saved model at most: each decision doubles the paths.
MAX_PATHS = 8


def decided_sides(program):
    """{site key (control_flow.site_key): the side not converted} of the
    unmergeable `if`s `program` was converted for one side of."""
    out = {}
    for block in program.blocks:
        for op in block.ops:
            if op.type != "cond" or not op.origin:
                continue
            for side, key in ((True, "true_block"), (False, "false_block")):
                ops = op.attrs[key].ops
                if ops and ops[0].type == "decision_failed":  # where _specialise puts it
                    out.setdefault(control_flow.site_key(op.origin), side)
    return out


def grad_mode_read(program):
    """The grad mode `program` was converted for when its code reads the
    mode (its first op is a `check_modes` naming one), else None."""
    ops = program.global_block().ops
    if ops and ops[0].type == "check_modes":
        return ops[0].attrs["args"][0]
    return None


def other_paths(retrace, program):
    """Concrete programs for the sides `program` (and each program found
    so) did not convert, and for the other grad mode when it reads the
    mode: `retrace()` traces the function again (under
    `control_flow.forcing`, in the other mode). A side whose trace fails is
    left out."""
    found = _other_sides(retrace, program, MAX_PATHS - 1)
    grad = grad_mode_read(program)
    if grad is not None and len(found) < MAX_PATHS - 1:
        with torch.set_grad_enabled(not grad):
            try:
                other = retrace()
            except Exception:  # noqa: BLE001 - calls in that mode stay a DecisionFailed, naming itself
                return found
            found.append(other)
            found += _other_sides(retrace, other.main_program, MAX_PATHS - 1 - len(found))
    return found


def _other_sides(retrace, program, most):
    """At most `most` programs for the `if` sides `program` (and each
    program found so) did not convert."""
    tried, found = set(), []
    todo = [({}, program)]
    while todo:
        forced, current = todo.pop(0)
        for key, side in decided_sides(current).items():
            sides = {**forced, key: side} if key not in forced else None
            if sides is None or frozenset(sides.items()) in tried or len(found) >= most:
                continue
            tried.add(frozenset(sides.items()))
            with control_flow.forcing(sides):
                try:
                    concrete = retrace()
                except Exception:  # noqa: BLE001 - that side stays a DecisionFailed, naming itself
                    continue
                met = key in control_flow.forced_used
            if met:
                found.append(concrete)
                todo.append((sides, concrete.main_program))
    return found


def converted_paths(static, concrete):
    """The programs the calls of `static` converted under other decisions
    for the key of its latest call (d2s/decisions.py: a prompt of one token
    where torch decides `q_len > 1`, the other side of a tensor `if`) that
    take the feeds `concrete` takes, in its mode: a saved model holds them
    as paths too, so it serves every input the declarative function served
    (not one converted for module state as it no longer is: attributes
    that held one tensor then, d2s/module_state.py `aliased`)."""
    latest = static.concrete_program
    group = getattr(latest, "decisions", None) if latest is not None else None
    if group is None:
        return []
    feeds = _feeds(concrete)
    return [p for p in group.programs if p is not concrete and _feeds(p) == feeds
            and p.main_program.mode == concrete.main_program.mode and not has_live_ops(p.main_program)
            and (not p.state_aliases or module_state.aliases_hold(p))]


def _feeds(concrete):
    return [(v.name, v.kind, v.dtype, len(v.dims)) for v in concrete.inputs]


def may_rerun(compiled, failure, generators_restored=False):
    """Whether the run of `compiled` that raised `failure` (a
    DecisionFailed) did nothing observable before its check (an in-place
    write to a parameter, a random draw, a print; a draw, where the states
    of the generators it may draw from are put back first:
    `generators_restored`), so another path may run the same inputs."""
    op = None
    for exc in (failure, failure.__cause__):  # the runner re-raises the op's error naming the op
        if op is None and exc is not None:
            op = runner._failing_op(compiled, exc.__traceback__)
    return op is not None and decisions._effect_before(op, generators_restored) is None


def run_paths(paths, run, failure):
    """The result of the first of `paths` whose run (`run(path)`, raising
    DecisionFailed when its decisions do not hold) serves these inputs;
    `failure` (the first path's) when none does."""
    for path in paths:
        try:
            return run(path)
        except DecisionFailed:
            continue
    raise failure
