"""``seq[i]`` where ``seq`` is a Python tuple or list and ``i`` an int known
only when the program runs (it depends on a tensor: ``c[int(x.sum() > 0)]``,
a counter a tensor loop carries).

Python indexes the sequence with a Python int; in a program the index is a
graph tensor, so the items become one tensor array read at that index, with
Python's bounds check (``IndexError`` when a run goes out of range, as
eager raises it). Items of one Python number type, or tensors of one dtype,
can be staged; a sequence of anything else is refused at the user's line.
"""

import torch

from ops import control_flow as cf
from ops import framework as fw
from ops.user_frames import error_at_user_line, user_origin
from runtime.ir import Variable

from .state import is_var


def convert_getitem(seq, index):
    """Equivalent Python: ``return seq[index]``."""
    if not (type(seq) in (tuple, list) and is_var(index)):
        return seq[index]
    index = fw.fill_constant(index, torch.int64) if not isinstance(index, Variable) else index
    if index.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool) \
            or index.shape:
        raise error_at_user_line(
            f"a Python {type(seq).__name__} indexed by a tensor that is not an integer number "
            f"({index.dtype_name}{list(index.shape)}); index it by an int")
    items = list(seq)
    numbers = {type(v) for v in items if isinstance(v, (bool, int, float))}
    tensors = [v for v in items if isinstance(v, (Variable, torch.Tensor))]
    if not items or not (len(numbers) == 1 and not tensors or len(tensors) == len(items)
                         and len({(v.dtype, v.dim()) if isinstance(v, torch.Tensor) else (v.dtype, len(v.shape))
                                  for v in tensors}) == 1):
        raise error_at_user_line(
            f"a Python {type(seq).__name__} indexed by an int known only when the program runs must hold numbers "
            "of one type or tensors of one dtype and rank, to be read at run time; this one holds "
            f"{sorted({type(v).__name__ for v in items})}: pick the value with `if`/`elif` on the index instead")
    index = index if index.dtype == torch.int64 else fw.cast(index, torch.int64)
    _check_bounds(index, len(items), type(seq).__name__)
    item = fw.array_read(fw.array_from_list(items), index)
    if numbers:
        item.python_number = True  # a Python number, as eager's item
    return item


def _check_bounds(index, length, kind):
    """``IndexError`` when a run's index is outside ``-length <= index < length``."""
    inside = (index >= -length) & (index < length)

    def out_of_range():
        fw.raise_(IndexError(f"{kind} index out of range"), origin=user_origin())
        return cf.Unreachable("index")

    cf.cond(inside, lambda: (), out_of_range)
