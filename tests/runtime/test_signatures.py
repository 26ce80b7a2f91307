"""runtime/signatures.check_call takes every call torch's Python bindings
take, beyond the native schemas: keyword-only arguments of hand-written
bindings (`x.nonzero(as_tuple=True)`) and torch's deprecated argument orders
(`torch.addmm(beta, input, alpha, mat1, mat2)`); it still refuses what no
binding takes. Each accepted call is run in eager torch first, so the case
itself proves torch takes it."""

import warnings

import pytest
import torch

from runtime.signatures import CallError, check_call

X = torch.arange(9.0).reshape(3, 3)
V = torch.arange(3.0)
B = torch.arange(18.0).reshape(2, 3, 3)
INDICES = torch.tensor([[0, 1], [1, 0]])

TAKEN = {
    "x.nonzero(as_tuple=True)": (torch.Tensor.nonzero, (X,), {"as_tuple": True}),
    "torch.nonzero(x, as_tuple=False)": (torch.nonzero, (X,), {"as_tuple": False}),
    "torch.sparse_coo_tensor(..., check_invariants=True)": (
        torch.sparse_coo_tensor, (INDICES, V[:2], (2, 2)), {"check_invariants": True}),
    "torch.addmm(beta, input, alpha, mat1, mat2)": (torch.addmm, (1, X, 2, X, X), {}),
    "torch.addmm(beta, input, mat1, mat2)": (torch.addmm, (1, X, X, X), {}),
    "x.addmm(beta, alpha, mat1, mat2)": (torch.Tensor.addmm, (X, 1, -2, X, X), {}),
    "x.addmm_(beta, alpha, mat1, mat2)": (torch.Tensor.addmm_, (X.clone(), 1, -2, X, X), {}),
    "torch.addmv(beta, input, alpha, mat, vec)": (torch.addmv, (1, V, 2, X, V), {}),
    "torch.addr(beta, input, alpha, vec1, vec2)": (torch.addr, (1, X, 2, V, V), {}),
    "torch.addbmm(beta, input, alpha, b1, b2)": (torch.addbmm, (1, X, 2, B, B), {}),
    "torch.baddbmm(beta, input, alpha, b1, b2)": (torch.baddbmm, (1, B, 2, B, B), {}),
    "torch.addcmul(input, value, t1, t2)": (torch.addcmul, (X, 2, X, X), {}),
    "x.addcdiv_(value, t1, t2)": (torch.Tensor.addcdiv_, (X.clone(), 2, X, X + 1), {}),
}

REFUSED = {
    "an unknown keyword": (torch.nonzero, (X,), {"as_list": True}, "keyword 'as_list' is not an argument"),
    "as_tuple on another function": (torch.sum, (X,), {"as_tuple": True}, "keyword 'as_tuple' is not"),
    "a dtype as as_tuple": (torch.nonzero, (X,), {"as_tuple": torch.float32}, "takes no dtype"),
    "too many positional arguments": (torch.addmm, (1, X, 2, X, X, X), {}, "6 positional arguments"),
    "a dtype in a deprecated order": (torch.addmm, (1, X, torch.float32, X, X), {}, "takes no dtype"),
    "a device among addcmul's": (torch.addcmul, (X, torch.device("cpu"), X, X), {}, "takes no device"),
}


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_a_call_torch_takes_is_taken(case):
    kernel, args, kwargs = TAKEN[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecated orders warn
        kernel(*args, **kwargs)  # torch takes it
    check_call(kernel, args, kwargs)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_call_no_binding_takes_is_refused(case):
    kernel, args, kwargs, message = REFUSED[case]
    with pytest.raises(CallError, match=message):
        check_call(kernel, args, kwargs)
