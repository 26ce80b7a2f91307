"""Python numbers in ops: the dtypes eager code gets from them.

While tracing, a value that eager code has as a Python number (`t.item()`,
`float(t)`, `int(t)`, `bool(t)`, a number a tensor loop or branch carries)
is a 0-d tensor standing for it: float64 for a float (a Python float is a
double), int64 for an int, bool for a bool. A 0-d tensor takes part in
torch's type promotion differently from a Python number: a Python number
is a *wrapped number* of the lowest priority (`t_f32_0d * 1.5` is float32,
`t_int * 1.5` the default float dtype), a 0-d float64 tensor wins against
other 0-d tensors and against integer tensors (`t_f32_0d * s` is float64).
Arithmetic on numbers alone follows Python (`n / 3` of ints is a float,
`b + b` of bools an int), not torch (float32 and bool).

So each op recorded with such an input is checked against eager:

  - the dtypes of the op's results with Python values in place of the
    numbers (through the Python operator for `a + b` and friends, so that
    `1.5 + t` reflects as eager does) are what eager gives;
  - where the recorded op would give other dtypes, or compares in another
    dtype (`t_f32_0d < s`: eager compares in float32), each number is cast
    first to the dtype eager computes in: torch reads a wrapped Python
    number, and a 0-d tensor alike, converted to the op's computation
    dtype, so the cast gives the same values bit for bit;
  - a float number meeting float16/bfloat16 tensors is refused: torch
    computes those in float32 and reads a wrapped float into float32, but
    some kernels convert a 0-d tensor operand to float16/bfloat16 first, so
    no 0-d tensor reproduces eager's rounding.

Before:                                  After:
    s = float(t)      # float64 0-d          s = float(t)
    y = x_f32_0d * s  # float64 (wrong)      s_f32 = cast(s, float32)
                                             y = x_f32_0d * s_f32   # float32, as eager
"""

import operator

import torch

from runtime.ir import SCALAR, Variable

from .infer import Meta

_BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift", "and", "or", "xor")
_COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
_UNARY = ("neg", "pos", "abs", "invert")


def _operator(name):
    return getattr(operator, name + "_" if name in ("and", "or") else name)


# op type -> (Python operator, reflected)
PYTHON_OPERATORS = {}
for _n in _BINARY + _COMPARE + _UNARY:
    PYTHON_OPERATORS[f"torch.Tensor.__{_n}__"] = (_operator(_n), False)
for _n in _BINARY:
    PYTHON_OPERATORS[f"torch.Tensor.__r{_n}__"] = (_operator(_n), True)


def number_inputs(inputs, stands_for_number):
    """Indices of the inputs that stand for Python numbers held as 0-d tensors."""
    return [i for i, v in enumerate(inputs)
            if isinstance(v, Variable) and v.kind != SCALAR and v.shape == () and stands_for_number(v)]


def all_numbers(inputs, numbers):
    """Whether every input is a number: one standing as a 0-d tensor, or a
    run-time size (a SCALAR Variable, a Python int when the program runs)."""
    return all(i in numbers or inputs[i].kind == SCALAR for i in range(len(inputs)))


def python_value(var):
    """A Python number of `var`'s kind (its value does not matter: dtypes only)."""
    return python_value_of(var.dtype)


def python_value_of(dtype):
    """A Python number of the kind `dtype` stands for (dtypes only)."""
    if dtype == torch.bool:
        return True
    if dtype.is_complex:
        return 1.5 + 0.5j
    if dtype.is_floating_point:
        return 1.5
    return 3


def python_number_dtype(value):
    """The dtype a Python number stands as in a program: bool, int64,
    float64 (a Python float is a double), complex128."""
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    if isinstance(value, complex):
        return torch.complex128
    return torch.float64


def number_dtype(dtype):
    """The dtype of the Python number `t.item()` reads from a tensor of `dtype`."""
    if dtype == torch.bool:
        return torch.bool
    if dtype.is_complex:
        return torch.complex128
    return torch.float64 if dtype.is_floating_point else torch.int64


def can_differ(inputs, numbers):
    """Whether a wrapped number could promote differently from the 0-d tensor:
    int and bool numbers beside a dimensioned tensor never do (the dimensioned
    operands decide), so loop counters indexing tensors cost no extra check."""
    if any(inputs[i].dtype.is_floating_point or inputs[i].dtype.is_complex for i in numbers):
        return True
    others = [v for i, v in enumerate(inputs) if i not in numbers]
    return not any(v.shape != () for v in others)


def dtypes(meta):
    """The dtypes of an inferred result, in order (Python numbers by their kind)."""
    if isinstance(meta, Meta):
        return [meta.dtype]
    if isinstance(meta, (bool, int, float, complex)):
        return [python_number_dtype(meta)]
    if isinstance(meta, (torch.SymBool, torch.SymInt, torch.SymFloat)):
        return [torch.bool if isinstance(meta, torch.SymBool) else torch.int64 if isinstance(meta, torch.SymInt)
                else torch.float64]
    if isinstance(meta, (list, tuple)) and not isinstance(meta, torch.Size):
        return [d for m in meta for d in dtypes(m)]
    return []


def eager_call(op_type, fn, args):
    """What eager code calls, given the op's argument tree: a dunder on a
    tensor standing for a number is the Python operator on the number."""
    if op_type in PYTHON_OPERATORS and len(args) in (1, 2):
        py, reflected = PYTHON_OPERATORS[op_type]
        return py, (tuple(reversed(args)) if reflected else args)
    return fn, args


def computation_dtype(inputs, numbers, wrapped):
    """The dtype torch computes an elementwise op of `inputs` in: with the
    numbers as wrapped Python numbers (`wrapped`) or as the 0-d tensors
    they are; None when the inputs are not all plain tensors."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
    values = []
    # Plain torch calls, not ops of the program being traced.
    with torch._C.DisableTorchFunction():
        for i, v in enumerate(inputs):
            if not isinstance(v, Variable) or v.kind not in ("tensor", SCALAR):
                return None
            if (wrapped and i in numbers) or v.kind == SCALAR:
                values.append(python_value(v))
            else:
                values.append(torch.empty((1,) * len(v.shape), dtype=v.dtype, device="meta"))
        try:
            return elementwise_dtypes(*values, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]
        except Exception:  # noqa: BLE001 - no promotion among these inputs
            return None


def cast_target(inputs, numbers, expected):
    """The dtype to cast the numbers to so the op computes as eager does, or
    None when no cast reaches it. `expected`: eager's result dtypes."""
    if all_numbers(inputs, numbers):
        # Numbers only: Python arithmetic (`n / 3` a float) or a factory
        # (`torch.tensor(s)`, float32 from a float): eager's result dtype.
        return expected[0] if len(set(expected)) == 1 else None
    target = computation_dtype(inputs, numbers, wrapped=True)
    return None if target in LOW_PRECISION else target


LOW_PRECISION = (torch.float16, torch.bfloat16)


def rounds_differently(inputs, numbers):
    """Whether a float number meets tensors computed in float16/bfloat16:
    torch reads a wrapped Python float into float32 there and rounds once,
    but converts a 0-d tensor operand to float16/bfloat16 first (some
    kernels), so no 0-d tensor gives eager's values."""
    return any(inputs[i].dtype.is_floating_point for i in numbers) and \
        computation_dtype(inputs, numbers, wrapped=True) in LOW_PRECISION
