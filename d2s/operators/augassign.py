"""Augmented assignment (``x += v``) with Python's in-place semantics.
"""

import operator

from ops import number_paths
from ops.recording import number_or_tensor, stands_for_number
from ops.user_frames import error_at_user_line

from .state import is_var, other_names


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
    if is_var(value) and stands_for_number(value):
        return binary(value, operand)
    if is_var(value) and number_or_tensor(value):
        number_paths.observe(value)  # decided per path where its `if`'s side is known (ops/number_paths.py)
        _refuse_other_names(symbol, value)
    return inplace(value, operand)


def _refuse_other_names(symbol, value):
    """A value that is a Python number on some paths and a tensor on others
    (`s = 0.0`, then `s = s + t` in a tensor loop) held by two names (`prev =
    s; s += v`): eager leaves the other name alone where it is a number and
    changes it in place where it is a tensor; one program does one or the other."""
    holders = sorted({(other, where) for other, _, where in other_names({id(value): ""})})
    if len(holders) > 1:
        names = " and ".join(f"{other!r}{where}" for other, where in holders)
        raise error_at_user_line(
            f"{names} hold one value that is a Python number on some paths and a tensor on others (a tensor "
            f"loop or `if` makes it a tensor on some paths only); `{symbol}` changes the other name where it is "
            "a tensor but not where it is a number, and one program cannot do both: write `s = s + v` (no other "
            "name changes) or make it a tensor on every path (e.g. `torch.tensor(0.0)` in place of `0.0`)")
