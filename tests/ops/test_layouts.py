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


@pytest.mark.parametrize("first", SIGNS)
def test_unknown_layout_read_is_a_decision(first):
    """The sides' layouts differ: the program answers the strides of the
    first run's side and checks them where they are read; a run of the
    other side converts again answering its strides (ops/path_reads.py).
    Both programs serve, each the runs of its layout."""
    static = d2s.declarative(other_layouts)
    for sign in (first, -first, first, -first):
        x = torch.rand(3, 4) * sign
        assert torch.equal(static(x), other_layouts(x)), sign
    assert len(static.program_cache) == 2
    assert all("cond" in {op.type for b in c.main_program.blocks for op in b.ops} for c in static.program_cache)


def size_one_strides(x):
    if x.sum() > 0:
        q = (x * 2).reshape(3, 1).t()   # (1, 3) of strides (1, 1): `is_contiguous()` too
    else:
        q = (x * 3).reshape(1, 3)       # (1, 3) of strides (3, 1)
    return q.stride(0), q.is_contiguous()


@pytest.mark.parametrize("first", SIGNS)
def test_a_size_one_dimension_stride_is_read_exactly(first):
    """The check compares the strides read, not `is_contiguous()` (which
    holds for both sides here: the program answered 3 where eager reads 1)."""
    static = d2s.declarative(size_one_strides)
    for sign in (first, -first):
        x = torch.ones(3) * sign
        assert static(x) == size_one_strides(x), sign


def contiguous_of_one_row(x, m):
    """`.contiguous()` of a (3, 1) value whose layout a loop leaves unknown
    is that value itself (`is_contiguous()` holds whatever a size-1
    dimension's stride): eager keeps strides (1, 3) on one path; the
    program answered (1, 1), the strides of a new tensor (found by the fuzzer)."""
    t = x.sum()
    q = m * 1.0
    w = 0
    while w < 1:
        w += 1
        q = q.t().contiguous().t() if t > -0.5 else q
        if t > 0.0:
            return q.stride(0) + q.stride(1) * 0.5
    q = q.t().contiguous().t()
    return q.stride(0) + q.stride(1) * 0.5


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("first", [1.0, -1.0, 0.0])
def test_contiguous_of_a_size_one_dimension_keeps_its_input(rows, first):
    static = d2s.declarative(contiguous_of_one_row)
    for total in (first, 0.0, -1.0, 1.0):
        x, m = torch.tensor([total, 0.0, 0.0]), torch.rand(rows, 3)
        assert static(x, m) == contiguous_of_one_row(x, m), total


def contiguous_at_run_time_rows(m, n):
    q = m * 1.0
    for i in range(n):
        q = q.t().contiguous().t() if q.sum() > i else q * 2.0
    q = q.t().contiguous()   # (3, rows): its own strides where rows > 1, `q.t()`'s where rows == 1
    return q * 1.0, q.stride(0), q.stride(1)


def test_contiguous_at_run_time_sizes_is_checked_where_read():
    """At run-time sizes the program answers the strides of a new tensor
    and checks them where they are read: a run with one row, whose
    `contiguous()` keeps its input, converts again answering those."""
    static = d2s.declarative(contiguous_at_run_time_rows,
                             input_spec=[d2s.InputSpec([None, 3]), d2s.InputSpec([], torch.int64)])
    for rows, n in [(3, 2), (1, 2), (2, 0), (1, 1), (4, 3)]:
        m, count = torch.rand(rows, 3), torch.tensor(n)
        got, want = static(m, count), contiguous_at_run_time_rows(m, count)
        assert torch.equal(got[0], want[0]) and got[1:] == want[1:], (rows, n, got[1:], want[1:])


def flip_flop(x, n):
    q = x * 1
    k = 0
    for i in range(n):
        if x.sum() > i:
            q = q.t().contiguous().t()
        else:
            q = q.contiguous()
        k = k + q.stride(0)  # one layout on some trips, the other on the rest
    return q * 1, k


def _flip_flop_cases():
    x = torch.ones(2, 3)  # x.sum() == 6: the first 6 trips transpose
    return [(x * 9, 3), (-x, 3), (x, 0), (x * 9, 1), (-x, 2)]


@pytest.mark.parametrize("order", [1, -1], ids=["transposed_first", "contiguous_first"])
def test_a_loop_reads_one_layout_per_call(order):
    """A read in a loop whose value has one layout on every trip of a
    call (either one, call by call; zero trips read nothing)."""
    static = d2s.declarative(flip_flop)
    for x, n in _flip_flop_cases()[::order]:
        got, want = static(x, torch.tensor(n)), flip_flop(x, torch.tensor(n))
        assert torch.equal(got[0], want[0]) and got[1] == want[1], (x.sum(), n)
    assert {"while", "cond"} <= {op.type for c in static.program_cache for b in c.main_program.blocks for op in b.ops}


def test_a_loop_read_of_two_layouts_in_one_call_is_refused():
    """Trips of one call read two layouts at one line: a program answers a
    read with one value, so the call is refused at that line (and a later
    call of one layout still converts)."""
    static = d2s.declarative(flip_flop)
    x = torch.ones(2, 3)
    with pytest.raises(d2s.ConversionError, match="has strides .* on one trip of a loop and .* on another") as info:
        static(x, torch.tensor(8))
    assert info.value.filename == __file__ and "k = k + q.stride(0)" in str(info.value)
    got, want = static(x, torch.tensor(4)), flip_flop(x, torch.tensor(4))
    assert torch.equal(got[0], want[0]) and got[1] == want[1]


def test_a_feed_of_an_odd_size_one_stride_at_varying_sizes_is_refused():
    """`is_contiguous()` holds for a (1, 3) tensor of strides (1, 1), but a
    read answers (3, 1) at varying sizes: refused, naming the copy that
    gives it a new tensor's strides."""
    static = d2s.declarative(lambda x: x.stride(0) * 10 + x.stride(1), input_spec=[InputSpec([None, 3])])
    assert static(torch.zeros(2, 3)) == 31
    odd = torch.arange(3.).reshape(3, 1).t()
    with pytest.raises(d2s.ConversionError, match=r"clone\(memory_format=torch.contiguous_format\)"):
        static(odd)
    assert static(odd.clone(memory_format=torch.contiguous_format)) == 31


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
