"""`x.data_ptr()` of a graph tensor (ops/storage_address.py): compared for
identity while tracing, any other use refused at the user's line."""

import pytest
import torch

import d2s


def project(query, key):
    # fairseq's attention: one fused projection when query and key are one tensor.
    if query.data_ptr() == key.data_ptr():
        return query * 2
    return query + key


def self_attention(x):
    return project(x, x)


class FlatWeights(torch.nn.Module):
    """torchMoji's LSTM: compares its parameters' pointers with a cached list."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))
        self._data_ptrs = []

    def forward(self, x):
        if list(p.data.data_ptr() for p in self.parameters()) == self._data_ptrs:
            return x
        return x * self.w


@pytest.mark.parametrize("build, make", [(lambda: self_attention, lambda: (torch.randn(4),)),
                                         (FlatWeights, lambda: (torch.randn(3),))],
                         ids=["same_tensor", "list_of_pointers"])
def test_identity_known_while_tracing_is_answered(build, make):
    eager, static = build(), d2s.declarative(build())
    for _ in range(2):
        args = make()
        assert torch.equal(static(*args), eager(*args))
    fn = static.forward if isinstance(static, torch.nn.Module) else static
    assert len(fn.program_cache) == 1


def pointer_arithmetic(x):
    return x * (x.data_ptr() % 16 == 0)


def hashed(x):
    return {x.data_ptr(): x}[x.data_ptr()]


@pytest.mark.parametrize("fn, args, message", [
    (project, (torch.ones(2), torch.ones(2)), "whether tensor `query` and tensor `key` share memory"),
    (pointer_arithmetic, (torch.ones(2),), "cannot be used as a Python number"),
    (hashed, (torch.ones(2),), "cannot be used as a Python number"),
], ids=["two_tensors", "arithmetic", "hash"])
def test_other_uses_are_refused_at_the_users_line(fn, args, message):
    with pytest.raises(d2s.ConversionError, match=message) as err:
        d2s.declarative(fn)(*args)
    assert err.value.filename == __file__
