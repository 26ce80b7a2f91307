"""NumPy ufuncs on graph tensors: `np.sqrt(x)`, `np.maximum(x, 0)`, `x * arr`.

In eager PyTorch a ufunc applied to a tensor converts it with
`Tensor.__array__`, computes in NumPy (NumPy's dtype rules: `np.sqrt` of an
int64 tensor is float64) and wraps the result back into a tensor with
`Tensor.__array_wrap__` (a bool result becomes uint8). So each ufunc of the
`numpy` namespace is an op, `numpy.<name>`, whose kernel is that ufunc on the
real tensors: the program computes exactly what eager computes, when it
runs. A Variable's `__array_ufunc__` (installed by ops/capture.py) records it.

Python operators between a tensor and a NumPy value follow eager's path:
  - `x * arr` (tensor on the left, an ndarray on the right): torch's operator
    returns NotImplemented for an ndarray, so Python asks `arr.__rmul__(x)`,
    which is `np.multiply(x, arr)` in NumPy: the `numpy.multiply` op
    (`arithmetic_with_array`, called by capture for the Variable's operator);
  - `np.float64(2) * x` (a NumPy scalar on the left): NumPy defers to the
    tensor's `__rmul__` (torch's type promotion, a float32 result);
  - `arr * x` (an ndarray on the left): eager raises TypeError (NumPy defers
    to the tensor, whose reflected operator returns NotImplemented); so does
    the Variable.
An operator reaches a Variable's `__array_ufunc__` exactly like an explicit
`np.multiply(...)` call does, so the caller's bytecode tells them apart.

A 0-d Variable that stands for a Python number (`n = int(t)`) is refused at
the user's line: eager NumPy would give a NumPy scalar there, not a tensor.
"""

import dis
import os
import sys

import numpy as np
import torch

from .recording import record, stands_for_number
from .registry import OpDef, op_for_callable, register
from .user_frames import error_at_user_line, user_name

# ufunc -> (operator, reflected operator): the ufuncs NumPy calls for Python
# operators with a NumPy operand on the left.
_OPERATOR_UFUNCS = {
    np.add: ("__add__", "__radd__"), np.subtract: ("__sub__", "__rsub__"),
    np.multiply: ("__mul__", "__rmul__"), np.true_divide: ("__truediv__", "__rtruediv__"),
    np.floor_divide: ("__floordiv__", "__rfloordiv__"), np.remainder: ("__mod__", "__rmod__"),
    np.power: ("__pow__", "__rpow__"), np.matmul: ("__matmul__", "__rmatmul__"),
    np.bitwise_and: ("__and__", "__rand__"), np.bitwise_or: ("__or__", "__ror__"),
    np.bitwise_xor: ("__xor__", "__rxor__"), np.left_shift: ("__lshift__", "__rlshift__"),
    np.right_shift: ("__rshift__", "__rrshift__"),
    np.equal: ("__eq__", "__eq__"), np.not_equal: ("__ne__", "__ne__"),
    np.less: ("__lt__", "__gt__"), np.less_equal: ("__le__", "__ge__"),
    np.greater: ("__gt__", "__lt__"), np.greater_equal: ("__ge__", "__le__"),
}

_NUMPY_DTYPES = {
    torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
    torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
    torch.uint8: np.uint8, torch.bool: np.bool_, torch.complex64: np.complex64,
    torch.complex128: np.complex128,
}


def _abstract(ufunc, args):
    """The result eager would give, without data: the broadcast shape, and
    the dtype NumPy's own rules give for these operand dtypes (a bool result
    as uint8, as `Tensor.__array_wrap__` makes it)."""
    shapes, samples = [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.dtype not in _NUMPY_DTYPES:
                raise TypeError(f"numpy.{ufunc.__name__}: NumPy has no dtype for {a.dtype}")
            shapes.append(a.shape)
            samples.append(np.zeros((1,) * a.dim() or (), dtype=_NUMPY_DTYPES[a.dtype]))
        else:
            samples.append(a)
    shape = torch.broadcast_shapes(*shapes)
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    with np.errstate(all="ignore"):
        results = ufunc(*samples)
    results = results if isinstance(results, tuple) else (results,)
    outs = []
    for r in results:
        dtype = np.asarray(r).dtype
        dtype = np.dtype(np.uint8) if dtype == np.bool_ else dtype
        outs.append(torch.empty(shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype, device=device))
    return tuple(outs) if len(outs) > 1 else outs[0]


def _is_fake(tensor):
    if type(tensor) is torch.Tensor or isinstance(tensor, torch.nn.Parameter):
        return False  # the run-time case, without importing the fake tensor module
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(tensor)


def _kernel(ufunc):
    def kernel(*args):
        # Shape/dtype inference runs kernels on meta and fake tensors, which
        # have no data to hand to NumPy.
        if any(isinstance(a, torch.Tensor) and (a.is_meta or _is_fake(a)) for a in args):
            return _abstract(ufunc, args)
        return ufunc(*args)
    kernel.__name__ = ufunc.__name__
    return kernel


def _register():
    for name in sorted(dir(np)):
        ufunc = getattr(np, name)
        if isinstance(ufunc, np.ufunc) and ufunc.__name__ == name:  # aliases (np.abs) share the ufunc
            register(OpDef(f"numpy.{name}", kernel=_kernel(ufunc)), ufunc)


_register()


# Python operator -> the ufunc NumPy's reflected operator calls.
_DUNDER_UFUNCS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
    "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "matmul": np.matmul,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "lshift": np.left_shift, "rshift": np.right_shift,
}


def ufunc_for_operator(name, other):
    """The ufunc eager ends in for `x <name> other` when `other` is an ndarray
    (`__mul__`, and `__imul__`, which falls back to it), else None."""
    if not isinstance(other, np.ndarray):
        return None
    if name.startswith("__i") and name[3:-2] in _DUNDER_UFUNCS:
        return _DUNDER_UFUNCS[name[3:-2]]
    return _DUNDER_UFUNCS.get(name[2:-2]) if name.startswith("__") else None


_OWN_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d) + os.sep
                  for d in ("ops", "runtime"))


def _called_by_operator():
    """Whether the code that reached this ufunc evaluated a Python operator
    (`a * b`, `a < b`) rather than calling the ufunc by name."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_DIRS):
        frame = frame.f_back
    if frame is None or frame.f_lasti < 0:
        return False
    name = dis.opname[frame.f_code.co_code[frame.f_lasti]]
    return name in ("BINARY_OP", "COMPARE_OP") or name.startswith(("BINARY_", "INPLACE_"))


def array_ufunc(var, ufunc, method, *inputs, **kwargs):
    """`Variable.__array_ufunc__`: the ufunc call as an op (see module doc)."""
    name = f"numpy.{getattr(ufunc, '__name__', ufunc)}"
    if method != "__call__" or kwargs:
        how = f"{name}.{method}" if method != "__call__" else f"{name} with {', '.join(sorted(kwargs))}="
        raise error_at_user_line(
            f"`{how}` on a graph tensor cannot be part of a program; use the torch function instead")
    left = inputs[0]
    if ufunc in _OPERATOR_UFUNCS and len(inputs) == 2 and isinstance(left, (np.ndarray, np.generic)) \
            and _called_by_operator():
        # `left <op> var` with a NumPy left operand (a Variable on the left
        # never reaches NumPy through an operator: see ufunc_for_operator).
        right = inputs[1]
        if isinstance(left, np.ndarray) and left.ndim == 0:
            # NumPy hands a scalar's comparison over as a 0-d array; a real
            # 0-d array on the left fails in eager, so this is the scalar.
            left = left[()]
        if isinstance(left, np.ndarray):
            raise TypeError(f"unsupported operand types for numpy.{ufunc.__name__}: 'numpy.ndarray' and "
                            "'Tensor' (torch's reflected operator does not take an ndarray)")
        return getattr(right, _OPERATOR_UFUNCS[ufunc][1])(left)
    return record_ufunc(ufunc, inputs)


def record_ufunc(ufunc, inputs):
    """The `numpy.<ufunc>` op on `inputs` (Variables, tensors, Python and NumPy values)."""
    name = f"numpy.{ufunc.__name__}"
    for a in inputs:
        if stands_for_number(a) and not isinstance(a, (int, float, bool)):
            raise error_at_user_line(
                f"`{name}` of {user_name(a, 'value')}, a number read from a tensor or a size known "
                "only at run time: NumPy would give a NumPy scalar here, which the program cannot hold; use math or torch functions")
    opdef = op_for_callable(ufunc)
    if opdef is None:
        raise error_at_user_line(f"`{name}` is not a NumPy ufunc d2s knows")
    # NumPy scalars keep their NumPy dtype (a 0-d array, lifted as a constant
    # tensor that NumPy reads back as the same 0-d array) instead of turning
    # into Python numbers, whose dtype NumPy would read differently.
    args = tuple(np.asarray(a) if isinstance(a, np.generic) else a for a in inputs)
    return record(opdef, ufunc, args, {})

