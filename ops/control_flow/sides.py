"""Sides of a tensor `if` converted for the example inputs only.

A branch whose values cannot be merged with the other's (None and a
tensor, different structures), or whose tracing fails (a reshape valid
only for the sizes that take it), is converted for the side the example
inputs take. The other side becomes a `decision_failed` op: a run that
reaches it makes the declarative call convert again for its inputs, which
take that side (d2s/decisions.py); a saved program refuses such inputs.
"""

import contextlib

from .. import framework, tracer
from ..user_frames import TORCH_DIR, user_origin
from .undefined import Unreachable

# {key: side}: `if`s whose values cannot be merged, converted for the side
# given here instead of the example inputs' (d2s/save_paths.py traces each
# such side for a saved model). `_FALLBACK`: the side where replaying the
# example cannot tell (d2s/decisions.py: the side a run took). A key is
# `site_key(origin)`: the line and the calls that reached it, so two calls
# of one helper can be given different sides. `forced_used` records which
# of them tracing met.
_FORCED, _FALLBACK = {}, {}
forced_used = set()


@contextlib.contextmanager
def forcing(sides, fallback=False):
    """Convert the unmergeable `if`s at these user lines for these sides
    (`fallback`: only where the example inputs' side is unknown)."""
    table = _FALLBACK if fallback else _FORCED
    saved = dict(table)
    table.clear()
    table.update(sides)
    forced_used.clear()
    try:
        yield
    finally:
        table.clear()
        table.update(saved)


def site_key(origin):
    """The key of a cond op's `if` in the forcing tables: its user frames
    out to the traced function (user_frames.Origin.site), else its line."""
    if not origin:
        return None
    site = getattr(origin, "site", None)
    return ("site",) + site if site else tuple(origin[:2])


def forced_side(origin, table=_FORCED):
    # The line alone where the key came from a copy of the program that
    # kept only the line (a JSON round trip keeps no site).
    for key in (site_key(origin), tuple(origin[:2]) if origin else None):
        if key is not None and key in table:
            forced_used.add(key)
            return table[key]
    return None


def example_side(tr, pred, real_sizes=False):
    """True/False: the side of `pred` the inputs being traced take; None
    when replaying the ops that compute it cannot tell (`real_sizes`: see
    ops/examples.py)."""
    value = tr.example_int(pred, None, real_sizes)
    return None if value is None else bool(value)


def side_to_convert(tr, pred, origin, t_leaves, f_leaves):
    """True/False: the side of an `if` whose values cannot be merged that
    this conversion keeps (the other becomes a `decision_failed` op)."""
    taken = forced_side(origin)
    if taken is None:
        # The side the run on these very inputs takes, right after this
        # conversion (checked when it runs): replayed at the inputs' own
        # sizes, which the trace has as 2 where they are 0 or 1.
        taken = example_side(tr, pred, real_sizes=True)
        if taken is not None and origin:
            tr.example_sides.setdefault(tuple(origin[:2]), taken)
    taken = forced_side(origin, _FALLBACK) if taken is None else taken
    if taken is None and origin:
        # The side the example inputs took at this very line elsewhere in
        # the trace (a mask helper run for the prompt, then again in the
        # loop that feeds one token at a time, where replay cannot tell).
        taken = tr.example_sides.get(tuple(origin[:2]))
    if taken is None:
        # Which path these inputs take is unknown: the side holding
        # tensors where the other holds None, else the true side; a run
        # taking the other one raises DecisionFailed, and the call
        # converts again for the side that run took (d2s/decisions.py).
        taken = not any(a is None and b is not None for a, b in zip(t_leaves, f_leaves))
    return taken


@contextlib.contextmanager
def tracing_side(tr, pred, side, origin=None):
    tr.sides.append((pred, side, origin))
    try:
        yield
    finally:
        tr.sides.pop()


def decide_failed_side(exc):
    """For an exception raised inside torch or d2s while a side of a tensor
    `if` was traced (a kernel refusing sizes that side never runs with, as
    `view(b, h, 1, d)` under `if q_len == 1` with a symbolic q_len): when the
    example inputs do not take this side (or a side around it), the side
    becomes a `decision_failed` op (converted again when a run takes it)
    and this returns True. False for an error the user's code raised
    itself, or on a side the inputs take: that error is what eager raises.

    Where replaying the example cannot tell the side (its condition comes
    from ops replay does not run: longformer's `if is_global_attn:`), the
    side a run took (d2s/decisions.py) tells; failing that, the innermost
    side is taken for one the inputs skip, unless the other side of that
    `if` was too (both sides failing is the `if` failing). If the inputs do
    take it, the run raises DecisionFailed, the call converts again knowing
    the side, and then this returns False: the error is raised at the
    user's line."""
    tr = tracer.current()
    if not tr.sides or not raised_by_torch(exc):
        return False
    taken = [example_side(tr, pred) for pred, _, _ in tr.sides]
    taken = [forced_side(origin, _FALLBACK) if t is None else t for t, (_, _, origin) in zip(taken, tr.sides)]
    if not any(t is (not side) for t, (_, side, _) in zip(taken, tr.sides)):
        pred, side, _ = tr.sides[-1]
        if taken[-1] is not None or (id(pred), not side) in tr.unknown_sides_failed:
            return False
        tr.unknown_sides_failed.add((id(pred), side))
    framework.decision_failed(
        f"this program was converted for inputs that do not take this side of a tensor `if` (tracing "
        f"it failed: {type(exc).__name__}: {str(exc)[:200]}); these inputs take it, which d2s "
        "converts when a declarative call first takes it: a saved program holds only the sides its "
        "example inputs took (save from inputs that take this side for a program of its own)",
        origin=user_origin())
    return True


def raised_by_torch(exc):
    """Whether `exc` is torch refusing the sizes it was given: a kernel's
    inference failing (ops/capture.py marks it), or an error raised inside
    torch's own Python code. Not an error the user's code raised (a
    `raise`, an `assert`, `[1, 2][4]`): that one is what eager raises on
    that side, a `raise` op."""
    if getattr(exc, "kernel_failed", False):
        return True
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb.tb_frame.f_code.co_filename, tb.tb_next
    return last is not None and last.startswith(TORCH_DIR)


def specialise(tblock, fblock, taken, origin, why):
    """Empty the side not `taken` and make it one `decision_failed` op;
    returns the Unreachable value its outputs are."""
    dead = fblock if taken else tblock
    where = f"{origin[0]}:{origin[1]}" if origin else "a tensor `if`"
    line = f" (`{origin[2]}`)" if origin and origin[2] else ""
    tr = tracer.current()
    with tr.block_guard(dead):
        framework.decision_failed(
            f"this program was converted for inputs that take the {'true' if taken else 'false'} side of the "
            f"`if` at {where}{line} ({why}); these inputs take the other side, which d2s converts when a "
            "declarative call first takes it: a saved program holds only the sides its example inputs took "
            "(save from inputs that take this side for a program of its own)", origin=origin)
    # First in the block: what the side traced before it (up to where its
    # tracing failed) never runs.
    dead.ops.insert(0, dead.ops.pop())
    return Unreachable("decided")

