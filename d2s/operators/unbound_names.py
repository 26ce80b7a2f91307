"""Names a tensor `if` binds on one path only.

Python's scoping: after `if c: y = 1` (no `else`), `y` is bound when the
path taken bound it, and a read raises UnboundLocalError otherwise. When
one side of a tensor `if` binds a name and the other does not (or may
not: a tensor loop or `if` in it binds it on some paths), the `cond` op
carries, beside the value, a bound flag each side sets; a later read
checks it when the program runs (`convert_load`).

    if x.sum() > 0:                  y, y_bound = cond(x.sum() > 0,
        y = x * 2          ->            lambda: (x * 2, True),
    return y                             lambda: (placeholder, False))
                                     return y  (raises unless y_bound)

`find_unbound` finds such names once both sides are traced (the `if` is
traced again with a flag for each: `MaybeUnbound`), `bound_flag` gives a
side's flag, `keep_unbound_flag` merges them.
"""

import weakref

import torch

from ops import control_flow as cf
from ops.user_frames import error_at_user_line
from runtime.ir import Variable

from .state import Undefined, constant, is_var, maybe_unbound


def keep_unbound_flag(name, old, sides, merged, k, flag):
    """A name that may be unbound (first assigned in a graph loop, or on one
    path of this or an earlier `if`: `find_unbound`) stays that value, with
    its flag, where no branch assigns it; where every branch that reaches
    the merge binds it, it is bound; otherwise (a side leaves it unbound or
    maybe unbound) it is bound after the `if` when the path taken bound it:
    `flag`, the op's output that each side sets (`bound_flag`), says so
    when the program runs."""
    if all(v is old for v in sides):
        merged[k] = old
    elif isinstance(merged[k], Undefined):
        # The sides that bind it became `decision_failed` checks (values of
        # theirs could not be merged with the other side's, cf.cond): where
        # this program goes on, the name is unbound.
        merged[k] = old if isinstance(old, Undefined) else Undefined(name)
    elif any(isinstance(v, Undefined) or maybe_unbound(v) for v in sides):
        if not isinstance(merged[k], Variable):
            # (A Python value bound on one path only: no op output to flag.)
            raise error_at_user_line(
                f"{name!r} is first assigned inside a loop over a tensor, on one path of this `if` on a tensor, "
                "to a Python value; assign it before the loop, or make it a tensor")
        merged[k].unbound_unless, merged[k].unbound_unless_name = flag, name


def bound_flag(value, old):
    """Whether the name holding `value` after one side of an `if` is bound,
    as a value of that side: the flag it had before (`old`, not assigned),
    the flag of a value itself maybe unbound (an inner `if` assigned it on
    one path), else True."""
    if isinstance(value, Undefined):  # (not bound yet: the loop's first trip, `LoopFirst`)
        return constant(False)
    if maybe_unbound(value):  # (also `old` itself, left as it was)
        return value.unbound_unless
    return constant(True)


def side_kind(value):
    """How a side leaves an output: "gone" (no later read sees it: the side
    returned, raised or jumped), "unbound", "maybe" (a tensor loop or `if`
    in the side first assigned it: its flag says whether a run bound it),
    or "bound"."""
    if isinstance(value, cf.Unreachable):
        return "gone"
    if isinstance(value, Undefined):
        return "unbound"
    return "maybe" if maybe_unbound(value) else "bound"


def find_unbound(site, trace):
    """Once both sides are traced: raise `MaybeUnbound` for the outputs not
    yet in `first_bound` that a later read may find unbound (one side binds
    the name, the other does not, or may not), as Python's scoping has it:
    the `if` is traced again with a flag for each (`bound_flag`), and a
    read raises UnboundLocalError when the program took a path that left it
    unbound (`convert_load`). A value no program output can leave unset on
    some paths (a string, None, a list or tuple) is refused at the user's
    line, after a `break`/`continue` the `if` guards; elsewhere such a name
    is not flagged, and the `if` is converted for the side the inputs take
    (ops/control_flow/sides.py: the other side converts again when a run
    takes it), where the name is bound or unbound as eager has it. Names
    `flagged` for a loop that first assigned them before the `if` are
    `keep_unbound_flag`'s; the lowered return value is not a name (cf.cond
    gives it a placeholder where a path has not returned)."""
    kinds, first_bound = trace.kinds, site.first_bound
    sides = [(side, kinds[side]) for side in ("true", "false") if side in kinds]
    found = set()
    for k, name in enumerate(trace.outs):
        if name in site.return_names or (k in trace.flagged and name not in first_bound):
            continue
        here = {side: kind[k] for side, kind in sides}
        states = {state for state, _ in here.values()}
        if "maybe" in states or {"unbound", "bound"} <= states:
            unflaggable = [side for side, (state, value) in here.items() if state == "bound" and not _flaggable(value)]
            if unflaggable and site.jump is not None:
                side = unflaggable[0]
                raise _unflaggable(name, side, here[side][1], here, site.lines, site.jump)
            if not unflaggable:
                found.add(name)
    if found - first_bound:
        raise MaybeUnbound(found)


def _flaggable(value):
    """Whether a `cond` output can hold `value` with a placeholder on the
    path that leaves the name unbound: a tensor (or tensor array), a size,
    or a Python number (a 0-d tensor in the merge)."""
    if isinstance(value, (bool, int, float)) or isinstance(value, torch.Tensor):
        return True
    return is_var(value)


def _unflaggable(name, side, value, here, lines, jump):
    """The ConversionError for `name`, bound to `value` (not `_flaggable`) by
    `side` and left unbound (or maybe unbound) by the other side."""
    other = "false" if side == "true" else "true"
    why = (f"a name left unbound on one path must hold a tensor or a number on the others, and {name!r} "
           f"holds a value of type `{type(value).__name__}` there")
    if jump is not None and side == "true":
        kind, jump_line = jump[:2]
        return error_at_user_line(
            f"{name!r} is assigned at {_assigned_at(lines, name, side)}, after the `{kind}` at line {jump_line} that a "
            f"tensor decides, but not on the path that takes the `{kind}`, and is not defined before it; {why}: "
            "assign it before the loop")
    left = ("not in the {} branch" if here[other][0] == "unbound"
            else "may be left unbound by the {} branch (a loop or `if` on a tensor there binds it on some paths "
            "only)").format(other)
    return error_at_user_line(
        f"{name!r} is assigned in the {side} branch ({_assigned_at(lines, name, side)}) but {left} of the `if` on a "
        f"tensor at this line, and is not defined before it; {why}: assign it before the if or in both branches")


def _assigned_at(lines, name, side):
    line = lines.get(name, (None, None))[0 if side == "true" else 1]
    return f"line {line}" if line is not None else "its value from before the `if`"


# The names each `if` (by its true branch's code) carried with a flag when it
# was last traced, per trace: an enclosing branch or loop traces it again, and
# starting from them spares it a retry each time (an `elif` chain would
# otherwise trace its last arm 2**length times). A name carried with a flag
# that both sides bind in a later trace is bound after the `if` (its flag
# unused: `keep_unbound_flag`).
FIRST_BOUND = weakref.WeakKeyDictionary()


class MaybeUnbound(Exception):
    """Retry the ``if`` carrying a bound flag for these names (`find_unbound`)."""

    def __init__(self, names):
        super().__init__(names)
        self.names = names
