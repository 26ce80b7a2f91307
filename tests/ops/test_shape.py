"""Shape ops: the -1 must land exactly in the dims that follow the batch."""

import pytest
import torch

import d2s
from opcheck import check, randn
from runtime.errors import ConversionError

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


# In-place ops that give a tensor new sizes or strides: the same tensor
# object has them from there on, and Python reads them (`y.shape`, `len`,
# `is_contiguous`). The program follows them with a new name bound to the
# same tensor (`rebind`), in block 0, in a branch and in a loop body.
def _unsqueeze_then_transpose(x):
    y = x * 1
    y.unsqueeze_(1)
    y.transpose_(0, 1)
    return y.sum(0) * x, y.shape[0], len(y)


def _t_of_a_square_slice(x):
    y = x[:, :2] * 1
    y.t_()
    return y.is_contiguous(), y.stride(), y + 1


def _squeeze_chain(x):
    p = x * 1
    p.unsqueeze_(-1).unsqueeze_(-1)
    p.squeeze_(-1)
    p.squeeze_()  # no size-1 dimension left: nothing changes
    return p @ torch.ones(3, 2)


def _in_a_branch(x):
    y = x * 2
    if x.sum() > 0:
        y = y * 3
        y.unsqueeze_(0)
    else:
        y = y.unsqueeze(0)
    return y.shape[0], y.sum(1) * 2


def _in_a_loop(x, n):
    i = 0
    acc = x.sum(0)
    while i < n:
        z = x * i
        z.swapdims_(0, 1)
        acc = acc + z.sum(1)
        i += 1
    return acc


def _resized(x):
    x = x.detach()  # (eager resizes no tensor that requires grad)
    y = x * 2
    y.resize_(3, 2)  # the same elements, new sizes
    z = x.new_empty(0)
    z.resize_as_(x).copy_(x)  # grown, then filled
    return y.shape[0], y + 1, z * 3


def _written_by_out(x):
    x = x.detach()  # (an `out=` call takes no tensor that requires grad)
    t = x.new_empty(0)
    torch.mul(x, 2, out=t)  # the kernel resizes `t` to the result's shape
    c = x.new_zeros(1)
    torch.cumsum(x, 1, out=c)
    return t.shape[0], len(c), t + c


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    return a == b


@pytest.mark.parametrize("fn, inputs, kind", [
    (_unsqueeze_then_transpose, [(torch.randn(2, 3),)], None),
    (_t_of_a_square_slice, [(torch.randn(2, 3),)], None),
    (_squeeze_chain, [(torch.randn(2, 3),)], None),
    (_resized, [(torch.randn(2, 3),)], None),
    (_written_by_out, [(torch.randn(2, 3),)], None),
    (_in_a_branch, [(torch.ones(2, 3),), (-torch.ones(2, 3),)], "cond"),
    (_in_a_loop, [(torch.randn(2, 3), torch.tensor(0)), (torch.randn(2, 3), torch.tensor(3))], "while")])
@pytest.mark.parametrize("optimize", ["default", "fast"])
def test_in_place_ops_that_change_sizes_are_followed(fn, inputs, kind, optimize):
    static = d2s.declarative(fn, optimize=optimize)
    for args in inputs:
        with torch.no_grad():  # the variant whose `inplace` pass reuses dead temporaries
            assert _same(fn(*args), static(*args))
        eager_args = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
        static_args = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
        want, got = fn(*eager_args), static(*static_args)
        assert _same(want, got)
        loss = [v for v in (want if isinstance(want, tuple) else (want,)) if isinstance(v, torch.Tensor)]
        if loss and loss[-1].requires_grad:
            loss[-1].sum().backward()
            got_loss = [v for v in (got if isinstance(got, tuple) else (got,)) if isinstance(v, torch.Tensor)]
            got_loss[-1].sum().backward()
            assert torch.equal(eager_args[0].grad, static_args[0].grad)
    assert len(static.program_cache) == 2  # one per grad mode, each serving every input
    types = [op.type for block in static.concrete_program.main_program.blocks for op in block.ops]
    assert "rebind" in types and (kind is None or kind in types)


def test_in_place_size_changes_at_run_time_sizes(tmp_path):
    def fn(x):
        y = x * 1
        y.unsqueeze_(1)
        z = y.squeeze_(1).t_()
        return z.sum(0) + 1, y.size(1), y.shape

    static = d2s.declarative(fn, input_spec=[d2s.InputSpec([None, 3])])
    for batch in (2, 5, 1):  # one program, a free batch size
        x = torch.randn(batch, 3)
        assert _same(fn(x), static(x))
    assert len(static.program_cache) == 1
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for batch in (1, 4):
        x = torch.randn(batch, 3)
        assert torch.equal(loaded(x)[0], fn(x)[0])


def _on_an_input(x):
    x.unsqueeze_(0)
    return x


def _from_outside_the_branch(x):
    y = x * 2
    if x.sum() > 0:
        y.t_()
    return y


def _out_of_another_shape(x):
    torch.mul(x.sum(0), 2, out=x)  # resizes the input
    return x


@pytest.mark.parametrize("fn", [_on_an_input, _from_outside_the_branch, _out_of_another_shape])
def test_in_place_size_changes_it_cannot_follow_are_refused_at_the_line(fn):
    with pytest.raises(ConversionError, match="changes the sizes or strides of") as info:
        d2s.declarative(fn)(torch.ones(2, 3))
    assert info.value.filename == __file__
