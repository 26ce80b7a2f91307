"""Strides tracing cannot know: a value a tensor `if` merges, what ops
make of it, and views of transposes at run-time sizes (ops/infer.py
`layout_unknown`).

A read of strides (`x.stride()`, then `as_strided` with them: Longformer's
and LED's chunking) must give eager's on every path, or fail loudly when
the program runs; never strides of a layout the tensor does not have.
"""

import pytest
import torch
import torch.nn.functional as F

import d2s
from d2s import InputSpec
from runtime.errors import OpRuntimeError


def _op_types(static):
    return {op.type for block in static.concrete_program.main_program.blocks for op in block.ops}


def _chunks(z):
    """Longformer's overlapping chunks: `as_strided` with the tensor's own strides."""
    size = list(z.shape)
    size[-1] -= 1
    return z.as_strided(size, z.stride()) * 1


def same_layouts(x):
    if x.sum() > 0:
        y = x.t()
    else:
        y = x.t() * 2      # also transposed: both sides have one layout
    return _chunks(y.unsqueeze(0))


W = torch.randn(4, 3)
OWN_LAYOUT = {  # kernels that make one layout from any (ops/infer.py _LAYOUT_OF_ITS_OWN)
    "contiguous": lambda y: y.contiguous(),
    "linear": lambda y: F.linear(y, W),
    "layer_norm": lambda y: F.layer_norm(y, (3,)),
}


def own_layout_after(x, op):
    if x.sum() > 0:
        y = x.t()
    else:
        y = x.t().contiguous()  # the sides differ: `y`'s layout is known at run time only
    z = OWN_LAYOUT[op](y)       # ... but these make one layout from either
    return _chunks(z.t())


def other_layouts(x):
    if x.sum() > 0:
        y = x.t()
    else:
        y = x.t().contiguous()
    return _chunks(y.unsqueeze(0))  # unsqueeze keeps whichever layout `y` has


def view_chain(x):
    """No `if`: a view of a transpose of a view at run-time sizes (the
    strides were those of a contiguous stand-in before)."""
    s, b = x.shape[0], x.shape[1]
    q = x.view(s, b, 4, 8).transpose(0, 1)
    r = q.transpose(1, 2).reshape(b * 4, s, 8)
    return r.as_strided((b * 4, s - 1, 8), r.stride()) * 1


def padded_chunks(x):
    """LED's window padding (a size `if` whose sides differ in length, both
    contiguous), then chunks of a view of the padded value."""
    pad = (4 - x.shape[1] % 4) % 4
    if pad > 0:
        x = F.pad(x, (0, 0, 0, pad))
    h = x.view(x.size(0), torch.div(x.size(1), 4, rounding_mode="trunc"), 4, x.size(2))
    size, stride = list(h.size()), list(h.stride())
    size[1], stride[1] = size[1] * 2 - 1, stride[1] // 2
    return h.as_strided(size=size, stride=stride) * 1


def size_before_use(mask):
    """`mask.size()` of a merged value before any op takes it: one symbol
    per dimension (a second one made `expand` fail to trace)."""
    pad = (4 - mask.shape[1] % 4) % 4
    if pad > 0:
        mask = F.pad(mask, (0, pad))
    bsz, src = mask.size()
    return mask[:, None, None, :].expand(bsz, 1, src, src) * 1


SIGNS = [pytest.param(1, id="true_side"), pytest.param(-1, id="false_side")]


def test_sides_of_one_layout_keep_it():
    static = d2s.declarative(same_layouts)
    for shape in [(3, 4), (5, 6)]:  # the second size: converted at its own sizes (a transpose's strides)
        for sign in (1, -1):
            x = torch.rand(shape) * sign
            assert torch.equal(static(x), same_layouts(x)), (shape, sign)
    assert "cond" in _op_types(static)


def test_strides_of_a_transpose_at_run_time_sizes_are_refused():
    """At sizes known only at run time, tracing keeps the strides of a
    transpose (symbolic), not of what an op makes of it: refused at the
    user's line rather than taken from a contiguous stand-in."""
    static = d2s.declarative(same_layouts, input_spec=[InputSpec([None, None])])
    with pytest.raises(d2s.ConversionError, match="the strides of tensor `z` depend on its layout") as info:
        static(torch.rand(3, 4))
    assert info.value.filename == __file__


@pytest.mark.parametrize("op", sorted(OWN_LAYOUT))
@pytest.mark.parametrize("sign", SIGNS)
def test_a_kernel_of_its_own_layout_after_a_merge(sign, op):
    static = d2s.declarative(own_layout_after)
    x = torch.rand(3, 4) * sign
    assert torch.equal(static(x, op), own_layout_after(x, op))
    assert "cond" in _op_types(static)


def test_unknown_layout_read_is_checked():
    """The sides' layouts differ: the contiguous side gives eager's result,
    the other raises when the program runs (it never reads memory through
    strides the tensor does not have)."""
    static = d2s.declarative(other_layouts)
    x = -torch.rand(3, 4)
    assert torch.equal(static(x), other_layouts(x))
    with pytest.raises(OpRuntimeError, match="reads strides and was traced for tensor `z` contiguous"):
        static(-x)
    assert "cond" in _op_types(static)


def test_views_at_run_time_sizes():
    """The second call's conversion at run-time sizes cannot know the
    reshape's strides (a view of a transpose): it is made at the call's
    sizes instead, with eager's."""
    static = d2s.declarative(view_chain)
    for shape in [(6, 2, 32), (7, 3, 32), (5, 2, 32)]:
        x = torch.randn(shape)
        assert torch.equal(static(x), view_chain(x)), shape


def test_views_at_run_time_sizes_asked_for_are_refused():
    static = d2s.declarative(view_chain, input_spec=[InputSpec([None, None, 32])])
    with pytest.raises(d2s.ConversionError, match="the strides of tensor `r` depend on its layout") as info:
        static(torch.randn(6, 2, 32))
    assert info.value.filename == __file__


@pytest.mark.parametrize("first", [9, 8], ids=["first_padded", "first_unpadded"])
def test_chunks_of_a_padded_value(first):
    static = d2s.declarative(padded_chunks, input_spec=[InputSpec([None, None, 3])])
    for length in (first, 5, 8, 3):
        x = torch.randn(2, length, 3)
        assert torch.equal(static(x), padded_chunks(x)), length
    assert "cond" in _op_types(static)


@pytest.mark.parametrize("first", [9, 5], ids=["pad_3", "pad_3_hint_8"])
def test_size_of_a_merged_value_read_first(first):
    static = d2s.declarative(size_before_use, input_spec=[InputSpec([None, None], dtype=torch.int64)])
    for shape in [(2, first), (3, 8), (1, 1)]:
        x = torch.ones(shape, dtype=torch.int64)
        assert torch.equal(static(x), size_before_use(x)), shape
    assert "cond" in _op_types(static)


def carried(x, n):
    """A loop's carried value: its layout is the first trip's or a later
    one's, unknown to tracing; here contiguous on every trip, as checked."""
    y = x * 1
    i = torch.zeros((), dtype=torch.int64)
    while i < n:
        y = y * 2
        i += 1
    return _chunks(y.unsqueeze(0))


@pytest.mark.parametrize("trips", [0, 1, 3])
def test_a_carried_value_read_after_its_loop(trips):
    static = d2s.declarative(carried)
    x = torch.rand(3, 4)
    for n in (trips, 2):  # one program for any trip count
        assert torch.equal(static(x, torch.tensor(n)), carried(x, torch.tensor(n))), n
    assert len(static.program_cache) == 1
    assert "while" in _op_types(static)
