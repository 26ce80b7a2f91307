"""Reads of metadata whose answer depends on the path a run takes, answered as decisions.

A value a tensor `if` merges from two sides, a loop's carried value, and
what ops make of them can have strides (ops/infer.py `layout_unknown`) and
a `requires_grad` flag (one side made under `torch.no_grad()`, or
`.detach()`ed) that depend on the path. Tracing answers one (at static
sizes the strides of a new tensor of its sizes; for the flag, the trace's
own) and the program checks, where the read is, that the run's value has
it (a `check_layout` op, exactly: a dimension of size 1 counts, as
`x.stride()` shows it; a `check_requires_grad` op). A run that breaks it
raises DecisionFailed; the call converts again (d2s/decisions.py)
answering, at that read, what the run had there, and keeps both programs,
each serving the runs whose values agree with it::

    if x.sum() > 0:              # first call: this side
        q = m.t().contiguous().t()
    else:
        q = m * 2.0
    k = q.stride(0)              # program 1 answers 3 and checks (3, 1): fails,
                                 # program 2 answers 1 and checks (1, 2)

A read inside a loop whose value changes from trip to trip has no one
answer: the second conversion fails at the same read with the first answer
again, and the call is refused at that line (`refuse_both`).

Reads are keyed by their kind and site (the user frames from the read out
to the traced function, as the sides of an `if` are:
ops/control_flow/sides.py), so one helper called twice can be given two answers.
"""

import contextlib

from runtime.errors import ConversionError

from . import framework
from .control_flow import site_key
from .user_frames import user_name, user_origin_at_site

_FORCED = {}


@contextlib.contextmanager
def forcing(answers):
    """Convert with these answers: {(kind, site key): answer} from failed runs."""
    saved = dict(_FORCED)
    _FORCED.clear()
    _FORCED.update(answers)
    try:
        yield
    finally:
        _FORCED.clear()
        _FORCED.update(saved)


# The check op of each kind of read, and what its failure names.
_KINDS = {"check_layout": ("strides", "has strides {} on one trip of a loop and {} on another"),
          "check_requires_grad": ("requires_grad", "has requires_grad {} on one trip of a loop and {} on another")}
_ADVICE = {"strides": "give it one layout before reading them (`.contiguous()`)",
           "requires_grad": "read the flag of a value made one way on every trip"}


def _read_key(origin):
    """The key of a read: its site by lines (not instructions, as an `if`'s
    is): reads of one line answer alike (`z * 2 if z.requires_grad else z,
    z.requires_grad` converts once for the other path, not once per read)."""
    key = site_key(origin)
    return key[:1] + tuple(frame[:2] for frame in key[1:]) if key and key[0] == "site" else key


def answer(kind, origin, fits=lambda value: True):
    """What a failed run had at the read of `kind` at `origin`, else None."""
    for key in (_read_key(origin), tuple(origin[:2]) if origin else None):
        value = _FORCED.get((kind, key)) if key is not None else None
        if value is not None and fits(value):
            return value
    return None


def taken(failing, failure):
    """{(kind, site key): answer} the run that raised `failure` at the op
    `failing` had at that read, else {}."""
    value = getattr(failure, "answer", None)
    if failing is None or failing.type not in _KINDS or value is None or not failing.origin:
        return {}
    return {(_KINDS[failing.type][0], _read_key(failing.origin)): value}


def refuse_both(decided, failing, failure):
    """ConversionError when this call's earlier conversion already answered
    the read that failed again with another answer: the value read there
    differs within one call (trips of a loop), and a program answers one."""
    for key, value in taken(failing, failure).items():
        if key in decided and decided[key] != value:
            filename, lineno, line = failing.origin[:3]
            kind, what = _KINDS[failing.type]
            raise ConversionError(
                f"{failure}\nd2s cannot convert this call: the value read here {what.format(decided[key], value)}, "
                f"and a program answers one read with one value; {_ADVICE[kind]}\n    {line}",
                filename, lineno) from None


def requires_grad(var, tr):
    """`var.requires_grad` read by the user's code, for a value an op made
    where the trace's answer is True: True, or what a failed run had at
    this read; checked when the program runs (a side made under
    `torch.no_grad()`, a `.detach()` on one path: eager's is False there)."""
    origin = user_origin_at_site(tr.entry_frame)
    flag = answer("requires_grad", origin)
    flag = True if flag is None else flag
    framework.check_requires_grad(var, flag, user_name(var), origin)
    return flag
