"""Shape ops: the -1 must land exactly in the dims that follow the batch."""

import pytest
import torch

from opcheck import check, randn

SHAPE_OPS = {
    "view": lambda x: x.view(-1, 6),
    "view_keep": lambda x: x.view(x.size(0), 2, 3),  # a run-time size used as an int
    "reshape": lambda x: x.reshape(-1, 3, 2),
    "flatten": lambda x: torch.flatten(x, 1),
    "flatten_all": lambda x: x.flatten(),
    "permute": lambda x: x.permute(2, 0, 1),
    "transpose": lambda x: x.transpose(0, 1),
    "t_of_2d": lambda x: x[:, 0].t(),
    "squeeze": lambda x: x.unsqueeze(1).squeeze(1),
    "unsqueeze": lambda x: torch.unsqueeze(x, -1),
    "expand": lambda x: x[:, :1].expand(-1, 4, 3),
    "expand_as": lambda x: x[:, :1, :1].expand_as(x),
    "repeat": lambda x: x.repeat(2, 1, 1),
    "flip": lambda x: torch.flip(x, [0, 2]),
    "contiguous": lambda x: x.transpose(1, 2).contiguous(),
    "cat0": lambda x: torch.cat([x, x * 2], 0),
    "cat1": lambda x: torch.cat((x, x), dim=1),
    "stack": lambda x: torch.stack([x, x + 1], 1),
    "split": lambda x: torch.split(x, 1, dim=1),
    "split_sizes": lambda x: x.split([1, 2], dim=2),
    "chunk": lambda x: x.chunk(2, -1),
    "unbind": lambda x: x.unbind(1),
    "gather": lambda x: torch.gather(x, 2, (x > 0).long()),
    "index_select": lambda x: x.index_select(1, torch.tensor([1, 0])),
    "masked_fill": lambda x: x.masked_fill(x < 0, 0.0),
    "tril": lambda x: torch.tril(x),
    "roll": lambda x: torch.roll(x, 1, 1),
    "einsum": lambda x: torch.einsum("bij,bkj->bik", x, x),
    "bmm": lambda x: torch.bmm(x, x.transpose(1, 2)),
    "matmul": lambda x: torch.matmul(x, torch.ones(3, 5)),
    "T": lambda x: x[0].T,
    "type_as": lambda x: x.long().type_as(x),
    "shape_as_tensor": lambda x: x * torch._shape_as_tensor(x)[0],  # fairseq's positional embeddings
    "to_dtype": lambda x: (x.to(torch.float64), x.int(), x.bool(), x.double()),
}


@pytest.mark.parametrize("dyn", [None, {0: [0]}], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_shape_op(name, dyn):
    check(SHAPE_OPS[name], lambda n: (randn(n, 2, 3),), dyn)


def test_cat_along_the_dynamic_dim_of_two_feeds():
    # Two independent unknown dims: their sum is unknown, the rest is known.
    check(lambda a, b: torch.cat([a, b]), lambda n: (randn(n, 3), randn(n + 1, 3)), {0: [0], 1: [0]})


def test_split_of_dynamic_dim_into_fixed_chunks_is_dynamic_count():
    # The number of pieces depends on the run-time size: a Python value that
    # cannot be known when the program is built.
    import runtime
    from opcheck import build
    with pytest.raises(runtime.ConversionError, match="depends on a dimension known only at run time"):
        build(lambda x: torch.split(x, 1, dim=0), [randn(3, 2)], {0: [0]})


def test_reshape_with_runtime_int():
    check(lambda x, k: x.reshape(k, -1), lambda n: (randn(4, 6), torch.tensor(2)), shapes=[(-1, -1)])


@pytest.mark.parametrize("dyn", [None, {0: [0]}], ids=["static", "dynamic"])
def test_size_and_shape_attributes(dyn):
    def fn(x):
        # Known dims are Python ints; the batch dim is a run-time 0-d int.
        b, c, w = x.shape if dyn is None else x.size()
        return x.reshape(b, c * w) + c
    check(fn, lambda n: (randn(n, 2, 3),), dyn)
