"""``x.append(v)``: a Python list, or a tensor array inside a graph loop.
"""

from ops import framework as fw
from runtime.ir import TENSOR_ARRAY

from .state import is_var


def convert_list_append(target, value):
    """``target.append(value)``; an ``array_append`` op for a tensor array."""
    if is_var(target) and target.kind == TENSOR_ARRAY:
        fw.array_append(target, value)
    else:
        target.append(value)
