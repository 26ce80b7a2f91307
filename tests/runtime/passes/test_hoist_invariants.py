"""hoist_invariants (fast level): a loop-invariant op of a `while` body runs
in the first trip only. Golden text on a loop with a `cond` in its body;
values bit-identical to eager and gradients within the fast level's
tolerance for zero, one and several trips on both branches; loops where a
shared result could be observed (appended, carried out, written in place)
and ops that are not pure or read what the loop changes are left alone."""

import pytest
import torch

import d2s
from runtime.passes import PassContext, hoist_invariants

from pass_programs import lists_per_trip, ops_text, scaled_walk, traced

RTOL, ATOL = 1e-5, 1e-6  # docs/performance.md: the fast level's tolerance

SCALED_WALK = """\
block 0
  tmp_1 = fill_constant(0, torch.int64)
  Out=[i_1, y_2] = while(Init=[tmp_1, x], X=[n, w]) {body_block: block[1], body_outs: ['tmp_11', 'y_1'], cond_block: block[2], cond_out: 'tmp_3', loop_vars: ['i_0', 'y_0']}
block 1
  tmp_4 = torch.Tensor.__mul__(w, 2.0)
  tmp_5 = torch.Tensor.tanh(tmp_4)
  tmp_6 = torch.Tensor.__mul__(y_0, tmp_5)
  tmp_7 = torch.Tensor.__add__(tmp_6, 1.0)
  tmp_8 = torch.Tensor.sum(tmp_7)
  tmp_9 = torch.Tensor.__gt__(tmp_8, 100)
  Out=[y_1] = cond(Cond=[tmp_9], X=[tmp_7, tmp_4]) {false_block: block[4], false_outs: ['tmp_7'], true_block: block[3], true_outs: ['tmp_10']}
  tmp_11 = torch.Tensor.__add__(i_0, 1)
block 2
  tmp_3 = torch.Tensor.__lt__(i_0, n)
block 3
  tmp_10 = torch.Tensor.__sub__(tmp_7, tmp_4)
block 4
"""


def _hoisted(fn, *args):
    program, feeds, fetches = traced(fn, *args)
    ctx = PassContext(program.copy(), feeds, fetches)
    hoist_invariants.run(ctx)
    ctx.program.verify()
    return program, ctx.program


def _once_ops(program):
    return [op.type for b in program.blocks for op in b.ops if op.attrs.get("once")]


def test_golden_invariant_ops_run_once():
    before, after = _hoisted(scaled_walk, torch.ones(3), torch.full((3,), 0.5), torch.tensor(3))
    assert ops_text(before) == SCALED_WALK
    assert ops_text(after) == SCALED_WALK.replace(
        "__mul__(w, 2.0)\n", "__mul__(w, 2.0)  {once}\n").replace("tanh(tmp_4)\n", "tanh(tmp_4)  {once}\n")


_SERVING = set()  # the programs that served the cases below


@pytest.mark.parametrize("start", [1.0, 60.0])  # the `cond` in the body: false, true
@pytest.mark.parametrize("n", [0, 1, 3])
def test_values_bit_identical_and_gradients_close_on_every_path(start, n):
    results = []
    for fn in (scaled_walk.dygraph_function, scaled_walk):
        x = torch.full((3,), start, requires_grad=True)
        w = torch.tensor([0.5, -0.25, 1.0], requires_grad=True)
        out = fn(x, w, torch.tensor(n))
        out.sum().backward()
        results.append((out.detach(), x.grad, w.grad))
    (want, want_dx, want_dw), (got, got_dx, got_dw) = results
    assert torch.equal(got, want)
    torch.testing.assert_close(got_dx, want_dx, rtol=RTOL, atol=ATOL)
    if n == 0:
        assert got_dw is None and want_dw is None
    else:
        torch.testing.assert_close(got_dw, want_dw, rtol=RTOL, atol=ATOL)
    concrete = scaled_walk.concrete_program
    assert {"while", "cond"} <= {op.type for b in concrete.main_program.blocks for op in b.ops}
    assert "is None" in concrete.compiled.source
    _SERVING.add(id(concrete))
    assert len(_SERVING) == 1  # one program for every path and trip count


@d2s.declarative(optimize="fast")
def appends_invariant(w, n):
    """`s` would be one tensor appended n times; the caller writes one row."""
    rows = []
    i = 0
    while i < n:
        s = w * 2.0
        rows.append(s.view(-1))
        i += 1
    return rows


@d2s.declarative(optimize="fast")
def carries_invariant_out(x, w, n):
    """`prev` and `y` would end as one tensor after two trips."""
    i = 0
    y = x
    prev = x
    while i < n:
        prev = y
        y = w + 1.0
        i += 1
    return prev, y


@d2s.declarative(optimize="fast")
def writes_in_place(x, w, n):
    i = 0
    while i < n:
        s = w * 2.0
        x.add_(s)
        i += 1
    return x


@d2s.declarative(optimize="fast")
def draws_and_reads_the_counter(x, n):
    i = 0
    y = x
    while i < n:
        y = y + torch.rand(3) * 0 + x * i
        i += 1
    return y


@pytest.mark.parametrize("fn, args", [
    (appends_invariant, (torch.ones(3), torch.tensor(2))),
    (carries_invariant_out, (torch.ones(3), torch.ones(3), torch.tensor(2))),
    (writes_in_place, (torch.ones(3), torch.ones(3), torch.tensor(2))),
    (draws_and_reads_the_counter, (torch.ones(3), torch.tensor(2))),
])
def test_loops_where_sharing_shows_and_impure_ops_are_left_alone(fn, args):
    _, after = _hoisted(fn, *args)
    assert _once_ops(after) == []


@pytest.mark.parametrize("n", [0, 1, 2])
def test_escaping_invariants_stay_separate_tensors(n):
    for fn, args in ((appends_invariant, (torch.ones(3),)), (carries_invariant_out, (torch.ones(3), torch.ones(3)))):
        want = fn.dygraph_function(*args, torch.tensor(n))
        got = fn(*args, torch.tensor(n))
        assert len(got) == len(want)
        if len(want):
            want[0].add_(10)  # shared storage would show in the other values
            got[0].add_(10)
        for g, w in zip(got, want):
            assert torch.equal(g, w)


@pytest.mark.parametrize("n, m", [(0, 2), (1, 2), (3, 2), (2, 0)])
def test_a_list_made_in_each_trip_is_a_new_list(n, m):
    """`inner = []` reads nothing the loop changes, but each trip's is a new
    list: marked `once`, the later trips appended to the first trip's list
    (a silent wrong result: len 2, 4, 6 instead of 2, 2, 2)."""
    fast = d2s.declarative(lists_per_trip, optimize="fast")
    args = (torch.ones(2), torch.tensor(n), torch.tensor(m))
    assert torch.equal(fast(*args), lists_per_trip(*args))
    _, after = _hoisted(fast, *args)
    assert "array_create" not in _once_ops(after)
