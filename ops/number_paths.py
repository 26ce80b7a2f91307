"""A Python number on one path, a tensor on another: decided where it shows.

`v = t.sum() if c else 0.1` (or `extra = 0; if c: extra = t.sum()`, or
`s = 0.1; for ...: s = s + t`, which zero trips leave a number) is one
program value of the tensor's dtype. Where it only meets tensors that
decide the dtype, with a number that dtype holds exactly (`total + extra`
of a float32 `total`, `extra` the int 0), that value is eager's on every
path: one program serves both (and an ONNX or torch.export program holds
both sides). Elsewhere eager's paths differ in what follows: the value
returned (`0.1`, not a tensor), its precision (a double where the tensor
is float32: `v * d` of a float64 `d`), the dtype of what it meets (`0 * i`
of an int64 `i` is int64), `isinstance`, Python arithmetic on it.

So the merged value carries a `Pending` (the `if`'s site, the number's
dtype, whether the tensor's dtype holds it exactly); where the trace uses
it in a way whose result depends on the path (`observe`), the trace
raises `Decide`, and the function is traced again with that site among
`DECIDED`: its `if` then converts one side (the one the inputs take, or a
guess a run corrects where replay cannot tell) and makes the other a
decision (ops/control_flow/merge.py `_number_beside_tensor`,
d2s/decisions.py), so each path gives eager's value and type exactly. A loop whose zero trips
leave the number is decided as `if test: loop` (while_op `_trips_decided`).
"""

import dataclasses

import torch

from runtime.ir import Variable, torch_dtype

from . import tracer
from .wrapped_numbers import python_number_dtype

# Site keys (ops/control_flow/sides.py `site_key`) whose merged number and
# tensor some trace saw used where the paths differ: decided from then on
# (a property of the code at that site, kept for the process).
DECIDED = set()
# Keys of loops whose trips give a number another type than the value
# before the loop: decided, their first trip is traced apart (ops/control_flow/while_op.py).
PEELED = set()


@dataclasses.dataclass(frozen=True)
class Pending:
    """A merged number/tensor value not decided yet: the site that decides
    it, the number's dtype (bool, int64, float64), and whether the merged
    dtype holds the number's value exactly."""

    key: tuple
    number_dtype: torch.dtype
    exact: bool


def undecidable(key):
    """The key of a site no trace can decide (a loop whose test has effects,
    which `if test: loop` would run once more): where its value's type
    shows, the conversion is refused (StaticFunction._build)."""
    return None if key is None else ("undecidable", key)


def site_of(key):
    """(file, line) of a decision key."""
    if key[0] == "undecidable":
        key = key[1]
    return tuple(key[1][:2]) if key[0] == "site" else tuple(key[:2])


class Decide(BaseException):
    """Raised where a pending value is used in a way that depends on the
    path; the conversion traces again with `key` decided. A BaseException:
    no handler of the user's code (`except Exception:` in a traced `try`)
    or of a branch being traced (its errors become `raise` ops) may take it."""

    def __init__(self, key):
        super().__init__(key)
        self.key = key


def pending(value):
    return value.pending_number if isinstance(value, Variable) else None


def number_kind(dtype):
    """bool < int < float < complex: the kind of Python number a dtype holds
    (widths of one kind are one kind)."""
    dtype = torch_dtype(dtype)
    return 0 if dtype == torch.bool else 3 if dtype.is_complex else 2 if dtype.is_floating_point else 1


def holds_exactly(number, dtype):
    """Whether a tensor of `dtype` holds the Python `number` exactly."""
    if isinstance(number, bool):
        return True
    with torch._C.DisableTorchFunction():
        try:
            return torch.tensor(number, dtype=dtype).item() == number
        except (OverflowError, RuntimeError):
            return False


def note(var, key, number, tensor_dtype, exact=True):
    """Mark the merged `var` pending at `key`. `number`: the number side's
    value (a Python number, or a Variable standing for one); `exact=False`:
    `var` may differ from both paths' values (decided wherever it meets
    anything but numbers). Not in a trace that is not traced again
    (`Tracer.decides_numbers`): one value of the tensor's dtype there, as
    where the side is not known."""
    if not tracer.current().decides_numbers:
        return
    if isinstance(number, (bool, int, float)):
        holds, number_dtype = holds_exactly(number, tensor_dtype), python_number_dtype(number)
    else:
        number_dtype = number.dtype
        holds = torch.promote_types(number_dtype, tensor_dtype) == tensor_dtype and \
            (tensor_dtype.is_floating_point or not number_dtype.is_floating_point)
    var.pending_number = Pending(key, number_dtype, exact and holds)


def carry(result, inputs, computed):
    """`result` of an op on numbers and pending values only (`v * 2`,
    `v.detach()`): pending too, inexact once arithmetic rounds in the
    merged dtype where Python rounds a double (`computed`)."""
    found = next((pending(v) for v in inputs if pending(v) is not None), None)
    if found is not None:
        result.pending_number = dataclasses.replace(found, exact=found.exact and not computed)


def observe(value):
    """`value` is used where its type shows (returned, `isinstance`, `+=`
    with another name holding it): raise `Decide` if it is pending."""
    found = pending(value)
    if found is not None:
        raise Decide(found.key)


def observe_in_op(inputs, eager_dtypes, actual_dtypes):
    """An op meets pending inputs beside other values: the same where the
    merged value is exact and the op's dtypes are eager's with the number
    as a Python number (`eager_dtypes`, None when they cannot be told)."""
    for value in inputs:
        found = pending(value)
        if found is None:
            continue
        if not found.exact or eager_dtypes is None or list(eager_dtypes) != list(actual_dtypes):
            raise Decide(found.key)

