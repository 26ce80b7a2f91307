"""`t.requires_grad` read while converting is eager's answer: autograd's own
for torch's kernels (ops/infer.py `note_requires_grad`), not "some input
requires grad". `(x * 2).detach().requires_grad` was True in a program,
so `if y.requires_grad:` took the other side (a silent wrong result), and
`torch.zeros(3).copy_(x)` did not require grad where eager's does."""

import pytest
import torch
import torch.nn.functional as F

import d2s


def _detach_in_place(x):
    y = x * 2
    y.detach_()
    return y


def _requires_grad_in_place(x):
    y = (x * 2).detach()
    y.requires_grad_()
    return y


MAKERS = {
    "detach": lambda x: (x * 2).detach(),
    "data": lambda x: (x * 2).data,
    "zeros_like": torch.zeros_like,
    "full_like": lambda x: torch.full_like(x, 2.0),
    "randn_like": torch.randn_like,
    "new_ones": lambda x: x.new_ones(2),
    "new_tensor": lambda x: x.new_tensor([1.0, 2.0]),
    "histc": lambda x: torch.histc(x, 4),
    "as_tensor_of_detached": lambda x: torch.as_tensor(x.detach()),
    "detach_": _detach_in_place,
    "requires_grad_": _requires_grad_in_place,
    "copy_into_a_new_tensor": lambda x: torch.zeros(3).copy_(x),
    "index_put_into_a_new_tensor": lambda x: torch.zeros(3).index_put_((torch.tensor([0]),), x[:1]),
    "factory_requires_grad": lambda x: torch.zeros(3, requires_grad=True) * 1,
    "floor": torch.floor,
    "one_hot": lambda x: F.one_hot(x.argmax(), 3).float(),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
@pytest.mark.parametrize("grad", [True, False])
def test_requires_grad_is_eagers(name, grad):
    make = MAKERS[name]

    def fn(x):
        y = make(x)
        # A Python branch on the flag: each side gives another value.
        return (y * 2 if y.requires_grad else y * 0 + 5), y.requires_grad

    x = torch.randn(3, requires_grad=True)
    torch.manual_seed(0)
    with torch.set_grad_enabled(grad):
        want = fn(x)
        torch.manual_seed(0)
        got = d2s.declarative(fn)(x)
    assert got[1] == want[1]
    assert torch.equal(got[0], want[0])
    assert got[0].requires_grad == want[0].requires_grad
