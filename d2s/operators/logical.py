"""``and`` / ``or`` / ``not``: Python short-circuit evaluation on Python values
and on graph tensors alike.
"""

import operator

import torch

from ops import control_flow as cf
from ops import framework as fw
from ops import tracer
from ops.capture import graph_tensor
from runtime.errors import ConversionError
from runtime.optable import get_op_def

from .raising import raising_as_op
from .state import constant, is_var


def as_bool_var(value):
    value = graph_tensor(value)
    return value if is_var(value) or isinstance(value, torch.Tensor) else constant(bool(value))


def convert_logical_and(lhs, rhs):
    """``lhs() and rhs()``. With a graph tensor ``lhs()`` the result is
    ``torch.logical_and``; ``rhs()`` runs only where ``lhs()`` is true, as in
    Python, whenever that is observable (see ``_short_circuit``)."""
    a = lhs()
    if not is_var(a):
        return rhs() if a else a
    return _short_circuit(graph_tensor(a), rhs, torch.logical_and, rhs_when=True)


def convert_logical_or(lhs, rhs):
    """``lhs() or rhs()``. With a graph tensor ``lhs()`` the result is
    ``torch.logical_or``; ``rhs()`` runs only where ``lhs()`` is false, as in
    Python, whenever that is observable (see ``_short_circuit``)."""
    a = lhs()
    if not is_var(a):
        return a if a else rhs()
    return _short_circuit(graph_tensor(a), rhs, torch.logical_or, rhs_when=False)


def _short_circuit(a, rhs, op, rhs_when):
    """``op(a, rhs())`` for a graph tensor ``a``. ``rhs()`` is traced once in
    place; if it only appended effect-free ops the result is that op.
    Otherwise (it writes a tensor, draws random numbers, prints, checks, or
    raises while traced) it is traced again inside a ``cond`` on ``a``, so
    that it runs exactly when Python would run it."""
    tr = tracer.current()
    mark = tr.mark()
    try:
        b = rhs()
    except ConversionError:
        raise
    except Exception:  # noqa: BLE001 - raised only where Python evaluates rhs: see below
        pure = False
    else:
        pure = _effect_free_since(tr, mark)
    if pure:
        return op(a, as_bool_var(b))
    tr.rollback(mark)
    pred = a if a.dtype == torch.bool else fw.cast(a, torch.bool)
    evaluated = raising_as_op(lambda: as_bool_var(rhs()))
    if rhs_when:
        return cf.cond(pred, evaluated, lambda: pred)
    return cf.cond(pred, lambda: pred, evaluated)


def _effect_free_since(tr, mark):
    """True when every op recorded since ``mark`` is pure: no in-place write,
    random draw or side effect (print, assert, raise)."""
    for block in tr.program.blocks:
        n_ops = mark.blocks[block.idx][0] if block.idx < len(mark.blocks) else 0
        for op in block.ops[n_ops:]:
            opdef = get_op_def(op.type)
            if opdef.mutates or opdef.random or opdef.extra.get("side_effect"):
                return False
    return True


_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
            "!=": operator.ne, "is": operator.is_, "is not": operator.is_not,
            "in": lambda a, b: a in b, "not in": lambda a, b: a not in b}


def convert_compare_chain(first, *steps):
    """``first() op1 b1() op2 b2() ...`` for steps ``(op, b)``: each operand is
    evaluated once, and a later one only where Python evaluates it (after
    every comparison before it held), through ``convert_logical_and``, so a
    graph tensor comparison short-circuits as ``and`` does."""
    def compare(left, i):
        op, operand = steps[i]
        right = operand()
        result = _COMPARE[op](left, right)
        if i + 1 == len(steps):
            return result
        return convert_logical_and(lambda: result, lambda: compare(right, i + 1))
    return compare(first(), 0)


def convert_logical_not(value):
    """``not value``; ``torch.logical_not`` for a graph tensor."""
    if is_var(value):
        return torch.logical_not(graph_tensor(value))
    return not value
