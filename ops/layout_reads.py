"""Reads of strides tracing cannot know, answered as decisions.

A value a tensor `if` merges from two layouts, a loop's carried value, and
what ops make of them have strides that depend on the path a run takes
(ops/infer.py `layout_unknown`). At static sizes a read of them answers
the strides of a new tensor of its sizes and the program checks, where the
read is, that the run's value has them (a `check_layout` op, exactly: a
dimension of size 1 counts, as `x.stride()` shows it). A run that breaks
it raises DecisionFailed; the call converts again (d2s/decisions.py)
answering, at that read, the strides the run had there, and keeps both
programs, each serving the runs whose values have its strides::

    if x.sum() > 0:              # first call: this side
        q = m.t().contiguous().t()
    else:
        q = m * 2.0
    k = q.stride(0)              # program 1 answers 3 and checks (3, 1): fails,
                                 # program 2 answers 1 and checks (1, 2)

A read inside a loop whose value changes layout from trip to trip has no
one answer: the second conversion fails at the same read with the first
answer again, and the call is refused at that line (`refuse_both`).

Reads are keyed by their site (the user frames from the read out to the
traced function, as the sides of an `if` are: ops/control_flow/sides.py),
so one helper called twice can be given two answers.
"""

import contextlib

from runtime.errors import ConversionError

from .control_flow import site_key

_FORCED = {}


@contextlib.contextmanager
def forcing(layouts):
    """Convert with these answers: {site key: strides} from failed runs."""
    saved = dict(_FORCED)
    _FORCED.clear()
    _FORCED.update(layouts)
    try:
        yield
    finally:
        _FORCED.clear()
        _FORCED.update(saved)


def answer(origin, ndim):
    """The strides a failed run had at the read at `origin`, else None."""
    for key in (site_key(origin), tuple(origin[:2]) if origin else None):
        strides = _FORCED.get(key) if key is not None else None
        if strides is not None and len(strides) == ndim:
            return tuple(strides)
    return None


def layout_taken(failing, failure):
    """{site key: strides} the run that raised `failure` at the op
    `failing` had at that read, else {}."""
    strides = getattr(failure, "strides", None)
    if failing is None or failing.type != "check_layout" or strides is None or not failing.origin:
        return {}
    return {site_key(failing.origin): tuple(strides)}


def refuse_both(decided, failing, failure):
    """ConversionError when this call's earlier conversion already answered
    the read that failed again with other strides: the value read there has
    two layouts within one call (trips of a loop), and a program answers one."""
    for key, strides in layout_taken(failing, failure).items():
        if key in decided and decided[key] != strides:
            filename, lineno, line = failing.origin[:3]
            raise ConversionError(
                f"{failure}\nd2s cannot convert this call: the value whose strides are read here has strides "
                f"{decided[key]} on one trip of a loop and {strides} on another, and a program answers one "
                f"read with one value; give it one layout before reading them (`.contiguous()`)\n    {line}",
                filename, lineno) from None
