"""Augmented assignment (``x += v``) with Python's in-place semantics.
"""

import operator

from ops.capture import stands_for_number

from .state import is_var


_AUGMENTED = {
    "+=": (operator.iadd, operator.add), "-=": (operator.isub, operator.sub),
    "*=": (operator.imul, operator.mul), "/=": (operator.itruediv, operator.truediv),
    "//=": (operator.ifloordiv, operator.floordiv), "%=": (operator.imod, operator.mod),
    "**=": (operator.ipow, operator.pow), "@=": (operator.imatmul, operator.matmul),
    "&=": (operator.iand, operator.and_), "|=": (operator.ior, operator.or_),
    "^=": (operator.ixor, operator.xor), "<<=": (operator.ilshift, operator.lshift),
    ">>=": (operator.irshift, operator.rshift),
}


def convert_augassign(symbol, value, operand):
    """``value += operand`` (for ``symbol`` ``'+='``, and so on), returning the
    new value. Equivalent Python: ``return operator.iadd(value, operand)``.
    A graph tensor is updated in place, as in eager (views and other names
    bound to it see the change), unless it stands for a Python number (a
    counter a graph loop carries, ``t.item()``): then other names must not
    see it change (``last = i; i += 1``), so the update is out of place."""
    inplace, binary = _AUGMENTED[symbol]
    return binary(value, operand) if is_var(value) and stands_for_number(value) else inplace(value, operand)
