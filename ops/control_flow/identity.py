"""Which object a value is, across tensor `if`s and loops: `a is b`, `id(a)`.

Eagerly, after

    y = x
    if x.sum() > 0:
        y = x * 2

`y is x` holds on the path that skipped the assignment only. Under a trace,
`y` is the `cond` op's new output Variable on both paths, and Python's own
`is` would answer False for every input. So each output of a `cond` or a
`while` notes the values it stands for on some path (its candidates: each
side's value, the value before the loop), and `is` between tensors is:

    a is b                                   -> True
    no candidate in common                   -> False on every path
    one and the same candidate on each side  -> True (the other paths raise)
    an output of a `cond` whose sides answer
    differently                              -> the condition (or its negation),
                                                a bool known when the program runs
    otherwise (a loop's output)              -> refused at the user's line

Inside a loop body a carried value is, on later trips, whatever the body
made of it on the trip before, which the trace has not seen when it reads
it: it may be any object (`ANY`).
"""

import dataclasses

import torch

from runtime.ir import Variable

from .. import framework, tracer
from ..user_frames import error_at_user_line
from .undefined import Undefined, Unreachable

ANY = object()  # a carried loop value on a later trip: any object the body can reach


@dataclasses.dataclass(eq=False)
class _Entry:
    value: object  # held: no id here is reused by a new object while the trace runs
    objs: dict  # id -> each object the value may be on some path (held too)
    pred: object = None  # a `cond` output: its condition,
    sides: tuple = ()  # and the value on each side (true, false)


def note(out, sides, pred=None):
    """`out` stands for one of `sides` (values on each path as the user's
    code has them; `pred` the condition that picks, for a `cond`); a side
    that never reaches a read (Undefined, Unreachable) stands for nothing."""
    tr = tracer.active()
    if tr is None:
        return
    objs = {}
    for side in sides:
        if side is ANY:
            objs[id(ANY)] = ANY
        elif _observable(side):
            objs.update(candidates(side))
    if set(objs) != {id(out)}:
        tr.identities[id(out)] = _Entry(out, objs, pred, tuple(sides) if pred is not None else ())


def _observable(value):
    return isinstance(value, (Variable, torch.Tensor)) and not isinstance(value, (Undefined, Unreachable))


def candidates(value):
    """id -> object: the objects `value` may be on some path of a run."""
    entry = _entry(value)
    return dict(entry.objs) if entry is not None else {id(value): value}


def _entry(value):
    tr = tracer.active()
    return tr.identities.get(id(value)) if tr is not None else None


def same_object(a, b):
    """Python's `a is b`, for values that may be graph outputs: a bool, or a
    bool Variable where the answer depends on a `cond`'s condition."""
    if a is b:
        return True
    if not (isinstance(a, (Variable, torch.Tensor)) and isinstance(b, (Variable, torch.Tensor))):
        return False
    if tracer.active() is None:
        return False
    answer = _same(a, b)
    if answer is None:
        raise error_at_user_line(
            "whether these two tensors are one object (`is`) depends on how many trips a tensor loop took or "
            "on what its body rebinds; compare values, or keep a Python flag of the path instead")
    return answer


def _same(a, b):
    """True/False on every path, a bool Variable, or None (not known)."""
    if a is b:
        return True
    ca, cb = candidates(a), candidates(b)
    if id(ANY) not in ca and id(ANY) not in cb:
        if not ca.keys() & cb.keys():
            return False
        if len(ca) == len(cb) == 1:
            return True
    for value, other in ((a, b), (b, a)):
        entry = _entry(value)
        if entry is not None and entry.pred is not None:
            return _by_condition(entry, other)
    return None


def _by_condition(entry, other):
    live = [(side, _same(v, other)) for side, v in zip((True, False), entry.sides) if _observable(v)]
    answers = {answer for _, answer in live if isinstance(answer, bool)}
    if len(answers) != len(live) or not live:  # a side not known, or none live
        return None
    if len(answers) == 1:
        return answers.pop()
    pred = entry.pred if entry.pred.dtype == torch.bool else framework.cast(entry.pred, torch.bool)
    same_when_true = dict(live)[True]
    out = pred.clone() if same_when_true else torch.logical_not(pred)
    out.python_number = True  # a Python bool in eager code
    return out


def object_id(value):
    """Python's `id(value)`: refused where `value` is one of several objects
    depending on the path taken (eager's id differs by path)."""
    if isinstance(value, (Variable, torch.Tensor)) and tracer.active() is not None:
        objs = candidates(value)
        if len(objs) > 1 or id(ANY) in objs:
            raise error_at_user_line(
                "id() of a tensor that is one of several objects depending on the path a tensor `if` or loop "
                "took before this line (a name it rebinds on one path only): eager's id differs by path")
        (only,) = objs.values()
        return id(only)
    return id(value)
