"""NumPy ufuncs on tensors (`numpy.<name>` ops, ops/numpy_ufuncs.py) as
torch calls, for torch's tracers.

NumPy computes a ufunc outside torch, so a trace (torch.export for ONNX
regions and d2s.export) would see only the empty tensor that shape
inference gives. For the elementwise ufuncs below, torch has a function
that computes the same values: each operand is cast to the dtype NumPy's
own rules give the result (`np.sqrt` of an int64 tensor is float64, a
Python float beside a float32 tensor stays float32), and the torch
function computes in that dtype. The values agree with NumPy's up to the
rounding of the last bit (sqrt and the arithmetic operators exactly, as
IEEE operations). Ufuncs not listed (comparisons, whose bool result eager
wraps as uint8; floor_divide and remainder, whose float semantics differ;
power, whose integer cases NumPy refuses) stay untraceable: refused.
"""

import dataclasses

import numpy as np
import torch

_TORCH_FORMS = {
    "sqrt": torch.sqrt, "exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sin": torch.sin,
    "cos": torch.cos, "absolute": torch.abs, "negative": torch.neg, "square": torch.square,
    "add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "true_divide": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum,
}

_NUMPY_DTYPES = {
    torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
    torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
    torch.uint8: np.uint8,
}


def has_torch_form(op_type):
    return op_type.startswith("numpy.") and op_type[len("numpy."):] in _TORCH_FORMS


def _result_dtype(ufunc, args):
    """The NumPy dtype of `ufunc(*args)`, from one-element samples of the
    tensors' dtypes (other operands as they are: Python numbers are NumPy's
    weak scalars)."""
    samples = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.dtype not in _NUMPY_DTYPES:
                raise TypeError(f"numpy.{ufunc.__name__} of a {a.dtype} tensor has no torch form")
            samples.append(np.zeros((1,), dtype=_NUMPY_DTYPES[a.dtype]))
        else:
            samples.append(a)
    with np.errstate(all="ignore"):
        return np.asarray(ufunc(*samples)).dtype


def _kernel(name):
    ufunc, fn = getattr(np, name), _TORCH_FORMS[name]

    def kernel(*args):
        dtype = _result_dtype(ufunc, args)
        wanted = torch.from_numpy(np.zeros(0, dtype)).dtype
        # Other operands (a number, an ndarray) are cast by NumPy to the
        # result's dtype before it computes: so here.
        operands = [a.to(wanted) if isinstance(a, torch.Tensor) else torch.from_numpy(np.array(a, dtype=dtype))
                    for a in args]
        result = fn(*operands)
        if result.dtype != wanted:  # torch's promotion would differ from NumPy's: no silent other dtype
            raise TypeError(f"numpy.{name}: torch computes {result.dtype}, NumPy {dtype}")
        return result
    kernel.__name__ = f"traced_numpy_{name}"
    return kernel


def traced(opdef, op_type):
    """`opdef` with a torch kernel when `op_type` is a NumPy ufunc listed
    above, else `opdef` itself."""
    if not has_torch_form(op_type):
        return opdef
    return dataclasses.replace(opdef, kernel=_kernel(op_type[len("numpy."):]))
