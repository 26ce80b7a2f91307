"""Golden before/after text of each pass on programs with `cond` and
`while`, and the pipeline's results equal to the unoptimised program's."""

import numpy as np
import pytest
import torch

import d2s
import runtime
from runtime import passes
from runtime.passes import PassContext, cse, dce, hoist_constants, inplace, loop_slices, pretranspose, scalars

from pass_programs import (LinearSteps, bump_until, count_until, rows_total, frozen_scale, ops_text, positive_rows_sum, repeated_sums,
                           scaled_branches, shrink_steps, tanh_twice, traced, two_empty_lists, two_lists)

@pytest.fixture
def run_pass():
    """run_pass(module, program, feeds, fetches) -> (rewritten copy, fetch names)."""
    def run(module, program, feed_names, fetch_names):
        ctx = PassContext(program.copy(), feed_names, fetch_names)
        module.run(ctx)
        return ctx.program, ctx.fetch_names
    return run


COUNT_UNTIL = """\
block 0
  tmp_1 = fill_constant(False, torch.bool)
  tmp_2 = fill_constant(0, torch.int64)
  Out=[broke_2, i_1, x_1] = while(Init=[tmp_1, tmp_2, x], X=[n]) {body_block: block[1], body_outs: ['broke_1', 'tmp_10', 'tmp_9'], cond_block: block[2], cond_out: 'tmp_8', loop_vars: ['broke_0', 'i_0', 'x_0']}
  tmp_14 = torch.tanh(x_1)
block 1
  tmp_9 = torch.Tensor.__mul__(x_0, 0.5)
  tmp_10 = torch.Tensor.__add__(i_0, 1)
  tmp_11 = torch.Tensor.sum(tmp_9)
  tmp_12 = torch.Tensor.__lt__(tmp_11, 1)
  Out=[broke_1] = cond(Cond=[tmp_12], X=[]) {false_block: block[4], false_outs: ['broke_0'], true_block: block[3], true_outs: ['tmp_13']}
block 2
  tmp_6 = torch.logical_not(broke_0)
  tmp_7 = torch.Tensor.__lt__(i_0, n)
  tmp_8 = torch.Tensor.__and__(tmp_6, tmp_7)
block 3
  tmp_13 = fill_constant(True, torch.bool)
block 4
"""


@pytest.fixture(scope="module")
def counted():
    return traced(count_until, torch.ones(3), torch.tensor(4))


def test_traced_program_is_the_before_text(counted):
    assert ops_text(counted[0]) == COUNT_UNTIL


def test_dce_drops_the_unused_op_only(counted, run_pass):
    after, fetches = run_pass(dce, *counted)
    assert ops_text(after) == COUNT_UNTIL.replace("  tmp_14 = torch.tanh(x_1)\n", "")
    assert fetches == ["x_1", "i_1"]


def test_scalars_make_counter_length_and_break_flag_python_values(counted, run_pass):
    after, fetches = run_pass(scalars, *counted)
    assert ops_text(after) == """\
block 0
  n_i_0 = scalar_from_tensor(n)
  tmp_1 = py.const(False)
  tmp_2 = py.const(0)
  Out=[broke_2, i_1, x_1] = while(Init=[tmp_1, tmp_2, x], X=[n]) {body_block: block[1], body_outs: ['broke_1', 'tmp_10', 'tmp_9'], cond_block: block[2], cond_out: 'tmp_8', loop_vars: ['broke_0', 'i_0', 'x_0']}
  tmp_14 = torch.tanh(x_1)
  i_1_t_0 = fill_constant(i_1, torch.int64)
block 1
  tmp_9 = torch.Tensor.__mul__(x_0, 0.5)
  tmp_10 = py.add(i_0, 1)
  tmp_11 = torch.Tensor.sum(tmp_9)
  tmp_12 = torch.Tensor.__lt__(tmp_11, 1)
  Out=[broke_1] = cond(Cond=[tmp_12], X=[]) {false_block: block[4], false_outs: ['broke_0'], true_block: block[3], true_outs: ['tmp_13']}
block 2
  tmp_6 = py.not(broke_0)
  tmp_7 = py.lt(i_0, n_i_0)
  tmp_8 = py.and(tmp_6, tmp_7)
block 3
  tmp_13 = py.const(True)
block 4
"""
    # The fetched counter goes back to the 0-d int64 tensor it was.
    assert fetches == ["x_1", "i_1_t_0"]
    after.verify()


def test_scalars_on_a_cuda_program_keep_feeds_tensors(counted, run_pass):
    # The pass reads only the program's device: a CPU trace stands for a CUDA one here.
    program, feeds, fetches = counted
    program = program.copy()
    program.device = torch.device("cuda")
    after, _ = run_pass(scalars, program, feeds, fetches)
    text = ops_text(after)
    # The counter and the break flag (CPU tensors there too) are Python values; `n` may be a CUDA
    # tensor, so `i < n` stays a torch op, whose result is on n's device as eagerly.
    assert "scalar_from_tensor" not in text
    assert "tmp_10 = py.add(i_0, 1)" in text and "tmp_6 = py.not(broke_0)" in text
    assert "tmp_7 = torch.Tensor.__lt__(i_0_t_0, n)" in text and "i_0_t_0 = fill_constant(i_0, torch.int64)" in text
    assert "tmp_8 = torch.Tensor.__and__(tmp_6_t_0, tmp_7)" in text
    after.verify()


def test_hoist_constants_only_where_every_reader_makes_a_fresh_tensor(run_pass):
    program, feeds, fetches = scaled_branches()
    after, _ = run_pass(hoist_constants, program, feeds, fetches)
    assert ops_text(after) == """\
block 0
  tmp_1 = fill_constant(2.0, torch.float32)
  tmp_2 = torch.Tensor.sum(x)
  tmp_3 = torch.Tensor.__gt__(tmp_2, 0)
  Out=[cond_out_0] = cond(Cond=[tmp_3], X=[x]) {false_block: block[2], false_outs: ['tmp_5'], true_block: block[1], true_outs: ['tmp_4']}
  Out=[loop_out_0] = while(Init=[cond_out_0], X=[]) {body_block: block[3], body_outs: ['tmp_11'], cond_block: block[4], cond_out: 'tmp_9', loop_vars: ['loop_var_0']}
  tmp_12 = torch.Tensor.expand(tmp_1, 3)
  tmp_13 = torch.stack([loop_out_0, tmp_12])
block 1
  tmp_4 = torch.Tensor.__mul__(x, tensor(0.5000))
block 2
  tmp_5 = torch.Tensor.__sub__(x, tensor(0.5000))
block 3
  tmp_10 = torch.Tensor.__add__(loop_var_0, tensor(0.5000))
  tmp_11 = torch.Tensor.__add__(tmp_10, 1)
block 4
  tmp_8 = torch.Tensor.sum(loop_var_0)
  tmp_9 = torch.Tensor.__lt__(tmp_8, 100)
"""
    after.verify()


def test_optimize_leaves_the_traced_program_alone(counted):
    program, feeds, fetches = counted
    before = program.to_string()
    passes.optimize(program, feeds, fetches)
    assert program.to_string() == before


@pytest.mark.parametrize("n", [0, 1, 3, 50])
def test_count_until_bit_identical_to_eager_on_every_path(n):
    """n=0: no trip; 1, 3: the loop test ends it; 50: the `break` ends it."""
    x = torch.full((3,), 40.0)
    want_x, want_i = count_until.dygraph_function(x, torch.tensor(n))
    got_x, got_i = count_until(x, torch.tensor(n))
    assert torch.equal(got_x, want_x)
    assert type(got_i) is type(want_i) is int and got_i == want_i  # the counter is a Python int, as eager's
    types = {op.type for b in count_until.concrete_program.main_program.blocks for op in b.ops}
    assert {"while", "cond"} <= types


def test_scalars_leave_values_written_in_place_tensors(run_pass):
    """`y = n * 1` is integer arithmetic, but `y.add_(1)` writes it (and
    `view.add_` writes `k` through a view): as Python ints they would never change."""
    program, feeds, fetches = traced(bump_until, torch.ones(3), torch.tensor(0))
    after, _ = run_pass(scalars, program, feeds, fetches)
    text = ops_text(after)
    assert "torch.Tensor.__mul__(n, 1)" in text and "torch.Tensor.__add__(n, 0)" in text
    assert "torch.Tensor.__lt__(tmp_0, 5)" in text and "scalar_from_tensor" not in text
    assert "py.const(False)" in text  # the break flag is still a Python bool
    after.verify()


@pytest.mark.parametrize("n", [0, 2, 3, 6])
def test_values_written_in_place_bit_identical_to_eager(n):
    """n=0, 2: the `break` at y == 3 ends the loop; 3: the test; 6: no trip."""
    want = bump_until.dygraph_function(torch.ones(3), torch.tensor(n))
    assert torch.equal(bump_until(torch.ones(3), torch.tensor(n)), want)
    types = {op.type for b in bump_until.concrete_program.main_program.blocks for op in b.ops}
    assert {"while", "cond"} <= types and len(bump_until.program_cache) == 1


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_hoisted_constants_run_the_same_on_both_branches(sign):
    program, feeds, fetches = scaled_branches()
    exe = runtime.Executor()
    x = torch.full((3,), sign)
    got = exe.run(program, feed={"x": x}, fetch_list=fetches)[0]
    y = x * 0.5 if sign > 0 else x - 0.5
    while y.sum() < 100:
        y = y + torch.tensor(0.5) + 1
    np.testing.assert_array_equal(got, torch.stack([y, torch.full((3,), 2.0)]).numpy())


def test_debug_level_2_prints_the_program_after_each_pass(counted, capsys):
    runtime._debug.set_verbosity(2)
    try:
        passes.optimize(*counted)
    finally:
        runtime._debug.set_verbosity(None)
    err = capsys.readouterr().err
    for name in ("dce", "cse", "scalars", "loop_slices", "hoist_constants"):
        assert f"program after pass {name}:" in err
    assert "py.lt(i_0, n_i_0)" in err


def test_unknown_level_is_an_error(counted):
    with pytest.raises(ValueError, match="optimize must be one of 'default', 'fast'"):
        passes.optimize(*counted, level="fastest")


def test_loop_slices_unbinds_once_before_the_loop(run_pass):
    program, feeds, fetches = traced(positive_rows_sum, torch.randn(5, 3), torch.tensor(4))
    after, _ = run_pass(loop_slices, program, feeds, fetches)
    assert ops_text(after) == """\
block 0
  tmp_0 = torch.zeros(3)
  tmp_1 = fill_constant(0, torch.int64)
  x_slices_0 = unbind_slices(x, 0)
  Out=[acc_2, ctr_1] = while(Init=[tmp_0, tmp_1], X=[n, x, x_slices_0]) {body_block: block[1], body_outs: ['acc_1', 'tmp_5'], cond_block: block[2], cond_out: 'tmp_4', loop_vars: ['acc_0', 'ctr_0']}
block 1
  tmp_5 = torch.Tensor.__add__(ctr_0, 1)
  tmp_6 = py.index(x_slices_0, ctr_0)
  tmp_7 = torch.Tensor.sum(tmp_6)
  tmp_8 = torch.Tensor.__gt__(tmp_7, 0)
  Out=[acc_1] = cond(Cond=[tmp_8], X=[x, ctr_0, acc_0, x_slices_0]) {false_block: block[4], false_outs: ['acc_0'], true_block: block[3], true_outs: ['tmp_10']}
block 2
  tmp_4 = torch.Tensor.__lt__(ctr_0, n)
block 3
  tmp_9 = py.index(x_slices_0, ctr_0)
  tmp_10 = torch.Tensor.__add__(acc_0, tmp_9)
block 4
"""
    after.verify()


def test_loop_slices_unbind_what_a_loop_over_a_tensor_walks(run_pass):
    """`for row in x` selects `x.select(0, ctr)` per step: unbound once, as eager's `iter(x)` does."""
    program, feeds, fetches = traced(rows_total, torch.randn(4, 3))
    after, _ = run_pass(loop_slices, *run_pass(scalars, program, feeds, fetches)[:1], feeds, fetches)
    text = ops_text(after)
    assert "unbind_slices(x, 0)" in text and "py.index(x_slices_0, ctr_0)" in text and "select" not in text


@pytest.mark.parametrize("n", [0, 2, 5])
def test_loop_slices_bit_identical_values_and_gradients(n):
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(n))
    results = []
    for fn in (positive_rows_sum.dygraph_function, positive_rows_sum):
        xi = x.clone().requires_grad_()
        out = fn(xi, torch.tensor(n))
        (out * torch.arange(3.0)).sum().backward() if out.requires_grad else None
        results.append((out.detach(), xi.grad))
    (want, want_grad), (got, got_grad) = results
    assert torch.equal(got, want)
    assert (got_grad is None and want_grad is None) or torch.equal(got_grad, want_grad)


def _slice_beside_whole(x, n):
    """A per-trip slice and a read of the whole `x` in each trip."""
    h = torch.zeros(x.shape[0])
    for t in range(n):
        h = torch.tanh(x[:, t] * 0.3 + h + x.sum(1) * 0.1)
    return h


def _slice_under_no_grad(x, n):
    """A per-trip slice taken under `no_grad`: no gradient reaches `x` through it."""
    h = torch.zeros(x.shape[0])
    for t in range(n):
        with torch.no_grad():
            y = x[:, t]
        h = torch.tanh(y * 0.3 + h)
    return h + x.sum(1)


def _rows_beside_whole(x, n):
    """`for row in x` with `x` read whole in each trip, and an early exit."""
    h = torch.zeros(x.shape[1])
    for row in x:
        h = torch.tanh(x.mean(0) - h + row)
        if h.sum() > n:
            break
    return h + x.sum(0)


def _rows_beside_an_in_place_write(x, n):
    """`for row in x` whose trips write a tensor of their own in place
    (fuzz s30c-315: the rows were sliced per trip there)."""
    h = torch.zeros(x.shape[1])
    for row in x:
        k = n * 1
        while k.add_(1) < 4:
            pass
        h = torch.tanh(x[0] - h) + row
    return x + h


def _first_trip_traced_apart(x, n):
    """`s` is an int before the loop and a float after a trip: the first
    trip is traced ahead of the loop, and takes the first row there."""
    h = torch.zeros(x.shape[1])
    s = 0
    for row in x:
        s = s + 1.5
        h = torch.tanh(x.mean(0) - h + row * s)
        if h.sum() > n:
            break
    return h + x.sum(0), s


@pytest.mark.parametrize("fn, per_trip", [
    (_slice_beside_whole, True), (_slice_under_no_grad, True), (_rows_beside_whole, False),
    (_rows_beside_an_in_place_write, False), (_first_trip_traced_apart, False)])
def test_loop_slices_gradients_are_eagers_to_the_bit(fn, per_trip):
    """One program for inputs taking zero, some and all trips (and the early
    exit): values, Python numbers and gradients equal eager's bit for bit.
    A slice the user takes per trip stays per trip where one node summing
    the slices' gradients would add them in another order than eager (or
    under its own `no_grad`); a `for` loop's rows are always eager's one
    `unbind`."""
    static = d2s.declarative(fn)
    sliced = fn in (_slice_beside_whole, _slice_under_no_grad)
    first = None
    for rows, n in [(4, 0.0), (4, 100.0), (4, -100.0), (0, 0.0)] if not sliced else [(5, 0), (5, 2), (5, 5)]:
        x = torch.randn(4 if sliced else rows, rows if sliced else 5,
                        generator=torch.Generator().manual_seed(int(n) % 7)) * 3
        count = torch.tensor(n)
        if fn is _rows_beside_an_in_place_write:
            count = torch.tensor(int(n) % 3)
        got = []
        for f in (fn, static):
            xi = x.clone().requires_grad_()
            out = f(xi, count.clone())
            value = out[0] if isinstance(out, tuple) else out
            value.sum().backward() if value.requires_grad else None
            got.append((value.detach(), xi.grad, out[1] if isinstance(out, tuple) else None))
        first = first or static.concrete_program  # (the first input's program has the loop)
        (want, want_grad, want_n), (have, have_grad, have_n) = got
        assert torch.equal(have, want)
        assert (have_grad is None and want_grad is None) or torch.equal(have_grad, want_grad)
        assert have_n == want_n and type(have_n) is type(want_n)
    # One program for every shape (a loop of no trips over no rows has its own shape).
    assert len(static.program_cache) == (1 if sliced else 2)
    program = first.main_program
    assert any(op.type == "while" for block in program.blocks for op in block.ops)
    optimized = passes.optimize(program, [v.name for v in first.inputs], [v.name for v in first.fetch_vars])[0]
    text = ops_text(optimized)
    if per_trip:
        assert "unbind_slices" not in text and "__getitem__" in text
    else:
        assert "unbind_slices(x, 0)" in text and "torch.select" not in text


def test_a_for_loops_rows_keep_their_mark_through_a_save(tmp_path):
    """`for_rows` is part of the saved program: a loaded program slices as eagerly too."""
    static = d2s.declarative(_rows_beside_whole)
    static(torch.randn(3, 5), torch.tensor(0.0))
    program = static.concrete_program.main_program
    loaded = runtime.serialization.program_from_dict(runtime.serialization.program_to_dict(program))
    marked = [op for p in (program, loaded) for block in p.blocks for op in block.ops if op.attrs.get("for_rows")]
    assert len(marked) == 2 and "{for_rows}" in program.to_string()


def test_loop_slices_past_the_end_is_an_index_error():
    with pytest.raises(Exception, match="out of range"):
        positive_rows_sum(torch.ones(2, 3), torch.tensor(3))


def test_cse_reuses_a_pure_result_in_branches_and_loop_bodies(run_pass):
    program, feeds, fetches = traced(repeated_sums, torch.ones(3))
    after, _ = run_pass(cse, program, feeds, fetches)
    assert ops_text(after) == """\
block 0
  tmp_0 = torch.Tensor.sum(x)
  tmp_2 = torch.Tensor.__gt__(tmp_0, 0)
  Out=[y_0] = cond(Cond=[tmp_2], X=[x, tmp_0]) {false_block: block[2], false_outs: ['tmp_5'], true_block: block[1], true_outs: ['tmp_4']}
  Out=[y_2] = while(Init=[y_0], X=[x]) {body_block: block[3], body_outs: ['tmp_15'], cond_block: block[4], cond_out: 'tmp_11', loop_vars: ['y_1']}
block 1
  tmp_4 = torch.Tensor.__mul__(x, tmp_0)
block 2
  tmp_5 = torch.Tensor.__sub__(x, tmp_0)
block 3
  tmp_13 = torch.Tensor.__abs__(tmp_0)
  tmp_14 = torch.Tensor.__add__(y_1, tmp_13)
  tmp_15 = torch.Tensor.__add__(tmp_14, 1)
block 4
  tmp_10 = torch.Tensor.sum(y_1)
  tmp_11 = torch.Tensor.__lt__(tmp_10, 10)
"""
    after.verify()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cse_results_bit_identical_on_both_branches(sign):
    x = torch.linspace(0.1, 0.7, 3) * sign
    assert torch.equal(repeated_sums(x), repeated_sums.dygraph_function(x))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cse_leaves_gradient_carrying_ops_alone(sign, run_pass):
    """Merged, `tanh(x)`'s two readers would have their gradient
    contributions summed in another order than eager's two nodes (fuzz seed
    7, program 3740; tests/d2s/fuzz has the original): with x requiring grad
    the program is left as it is and gradients are bit-identical on both
    branches; without, the branch reuses the first tanh."""
    x = torch.linspace(0.2, 0.8, 4) * sign
    for requires_grad in (True, False):
        xs = x.clone().requires_grad_(requires_grad)
        program, feeds, fetches = traced(tanh_twice, xs)
        after, _ = run_pass(cse, program, feeds, fetches)
        tanhs = [op for b in after.blocks for op in b.ops if op.type == "torch.tanh"]
        assert any(op.type == "cond" for op in program.global_block().ops)
        assert len(tanhs) == (2 if requires_grad else 1)
    xg = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad((tanh_twice(xg) * torch.arange(4.0)).sum(), [xg])
    (expected,) = torch.autograd.grad((tanh_twice.dygraph_function(xg) * torch.arange(4.0)).sum(), [xg])
    assert torch.equal(grad, expected)


def test_cse_leaves_programs_with_in_place_writes_alone(run_pass):
    program, feeds, fetches = scaled_branches()
    with runtime.program_guard(program):
        x = program.global_block().vars["x"]
        x.add_(1)
    after, _ = run_pass(cse, program, feeds, fetches)
    assert ops_text(after) == ops_text(program)


@pytest.mark.parametrize("fn, maker", [(two_lists, "array_from_list"), (two_empty_lists, "array_create")])
def test_cse_never_merges_two_lists(fn, maker, run_pass):
    """Two `[x]` (or two `[]`) are two lists: merged, the loop's appends to
    both went into one (a silent wrong result: each stacked list held every
    element twice)."""
    program, feeds, fetches = traced(fn, torch.zeros(2), torch.tensor(3))
    after, _ = run_pass(cse, program, feeds, fetches)
    assert ops_text(after) == ops_text(program)
    assert sum(op.type == maker for op in after.global_block().ops) == 2


@pytest.mark.parametrize("level", ["default", "fast"])
@pytest.mark.parametrize("fn, n", [(two_lists, 0), (two_lists, 1), (two_lists, 3), (two_empty_lists, 1),
                                   (two_empty_lists, 3)])
def test_two_lists_bit_identical_to_eager(level, fn, n):
    compiled = d2s.declarative(fn.dygraph_function, optimize=level)
    args = (torch.linspace(-1.0, 1.0, 2), torch.tensor(n))
    for got, expected in zip(compiled(*args), fn.dygraph_function(*args)):
        assert got.shape == expected.shape and torch.equal(got, expected)
    assert any(op.type == "while" for op in compiled.concrete_program.main_program.global_block().ops)


def test_no_grad_region_is_one_with_statement():
    w = torch.ones(3, requires_grad=True)
    out = frozen_scale(torch.ones(3), w)
    assert torch.equal(out, frozen_scale.dygraph_function(torch.ones(3), w)) and not out.requires_grad
    source = frozen_scale.concrete_program.compiled.source
    assert source.count("with no_grad") == 1
    assert """\
    with no_grad_no_grad():
        v_tmp_0 = k___mul__(v_w, 2)
        del v_w
        v_tmp_1 = k___add__(v_tmp_0, 1)
        del v_tmp_0
        v_tmp_2 = k_tanh(v_tmp_1)
    del v_tmp_1
""" in source


SHRINK_STEPS_INPLACE = """\
block 0
  tmp_0 = torch.Tensor.__mul__(x, 2.0)
  torch.Tensor.tanh_(tmp_0)
  tmp_2 = torch.Tensor.sum(tmp_0)
  tmp_3 = torch.Tensor.__gt__(tmp_2, 0)
  Out=[y_0] = cond(Cond=[tmp_3], X=[tmp_0]) {false_block: block[2], false_outs: ['tmp_6'], true_block: block[1], true_outs: ['tmp_4']}
  tmp_8 = fill_constant(0, torch.int64)
  Out=[i_1, y_2] = while(Init=[tmp_8, y_0], X=[n]) {body_block: block[3], body_outs: ['tmp_14', 'tmp_11'], cond_block: block[4], cond_out: 'tmp_10', loop_vars: ['i_0', 'y_1']}
  tmp_15 = torch.Tensor.__add__(y_2, x)
block 1
  tmp_4 = torch.Tensor.__mul__(tmp_0, 0.5)
  torch.Tensor.add_(tmp_4, 1.0)
block 2
  tmp_6 = torch.Tensor.__sub__(tmp_0, 1.0)
block 3
  tmp_11 = torch.Tensor.__sub__(y_1, 0.1)
  torch.Tensor.relu_(tmp_11)
  torch.Tensor.mul_(tmp_11, y_1)
  tmp_14 = torch.Tensor.__add__(i_0, 1)
block 4
  tmp_10 = torch.Tensor.__lt__(i_0, n)
"""


def test_inplace_reuses_dead_fresh_temporaries_only(run_pass):
    """Golden before/after: a fresh temporary read once, in the same block
    (block 0, a branch, a loop body) is written in place; `y` from outside
    a sub-block, the loop output and the feed `x` never are."""
    with torch.no_grad():
        shrink_steps(torch.ones(3), torch.tensor(2))
    program, feeds, fetches = traced(shrink_steps, torch.ones(3), torch.tensor(2))
    assert any(op.type == "cond" for op in program.global_block().ops)
    after, fetched = run_pass(inplace, program, feeds, fetches)
    assert ops_text(after) == SHRINK_STEPS_INPLACE and fetched == fetches


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("n", [0, 1, 4])
def test_inplace_variant_bit_identical_on_every_path(sign, n):
    """Under no_grad the in-place variant runs: bit-identical to eager on
    both branches and 0/1/several trips, inputs untouched; with grad the
    plain program runs and gradients match eager bit for bit."""
    x = torch.linspace(0.1, 0.9, 5) * sign
    x_before = x.clone()
    with torch.no_grad():
        got = shrink_steps(x, torch.tensor(n))
    assert torch.equal(got, shrink_steps.dygraph_function(x, torch.tensor(n))) and torch.equal(x, x_before)
    assert "k_tanh_(" in shrink_steps.concrete_program._inference.source
    xg = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(shrink_steps(xg, torch.tensor(n)).sum(), [xg])
    (expected,) = torch.autograd.grad(shrink_steps.dygraph_function(xg, torch.tensor(n)).sum(), [xg])
    assert torch.equal(grad, expected)


def test_inplace_never_writes_a_temporary_read_twice_or_broadcast(run_pass):
    @d2s.declarative
    def twice(x, row):
        t = x * 2.0
        u = torch.tanh(t) + t         # t is read twice: not written; tanh(t) is, by the add
        v = (x + 1.0) + row           # x + 1 is [3, 4]; row [4] broadcasts into it: fine
        w = (row * 2.0) + x           # row * 2 is [4], the sum [3, 4]: never written
        return u, v, w

    x, row = torch.randn(3, 4), torch.randn(4)
    with torch.no_grad():
        got = twice(x, row)
    assert all(torch.equal(a, b) for a, b in zip(got, twice.dygraph_function(x, row)))
    program, feeds, fetches = traced(twice, x, row)
    after, _ = run_pass(inplace, program, feeds, fetches)
    types = [op.type for op in after.global_block().ops]
    assert types == ["torch.Tensor.__mul__", "torch.tanh", "torch.Tensor.add_", "torch.Tensor.__add__",
                     "torch.Tensor.add_", "torch.Tensor.__mul__", "torch.Tensor.__add__"]


LINEAR_STEPS_PRETRANSPOSED = """\
block 0
  tmp_0 = torch.addmm(fc.bias, x, fc.weight_t_0)
  tmp_1 = torch.Tensor.sum(tmp_0)
  tmp_2 = torch.Tensor.__gt__(tmp_1, 0)
  Out=[y_0] = cond(Cond=[tmp_2], X=[tmp_0, fc.weight, fc.bias, fc.weight_t_0]) {false_block: block[2], false_outs: ['tmp_0'], true_block: block[1], true_outs: ['tmp_3']}
  tmp_5 = fill_constant(0, torch.int64)
  Out=[i_1, y_2] = while(Init=[tmp_5, y_0], X=[n, fc.weight, fc.bias, fc.weight_t_0]) {body_block: block[3], body_outs: ['tmp_10', 'tmp_9'], cond_block: block[4], cond_out: 'tmp_7', loop_vars: ['i_0', 'y_1']}
  tmp_11 = torch.mm(y_2, head.weight_t_0)
  tmp_12 = torch.Tensor.__getitem__(y_2, 0)
  tmp_13 = torch.nn.functional.linear(tmp_12, fc.weight, fc.bias)
block 1
  tmp_3 = torch.addmm(fc.bias, tmp_0, fc.weight_t_0)
block 2
block 3
  tmp_8 = torch.addmm(fc.bias, y_1, fc.weight_t_0)
  tmp_9 = torch.tanh(tmp_8)
  tmp_10 = torch.Tensor.__add__(i_0, 1)
block 4
  tmp_7 = torch.Tensor.__lt__(i_0, n)
"""


def test_pretranspose_golden(run_pass):
    """`linear` on a parameter with a 2-d input, in block 0, a branch and a
    loop body, becomes addmm/mm on the weight's transpose (a derived
    argument); on a 1-d input it stays `linear`."""
    model = d2s.declarative(LinearSteps())
    model(torch.ones(3, 4), torch.tensor(2))
    concrete = model.forward.concrete_program
    after, _ = run_pass(pretranspose, concrete.main_program, [v.name for v in concrete.inputs],
                        [v.name for v in concrete.fetch_vars])
    assert ops_text(after) == LINEAR_STEPS_PRETRANSPOSED
    assert after.derived_transposes == {"fc.weight_t_0": "fc.weight", "head.weight_t_0": "head.weight"}


def _linear_pair():
    torch.manual_seed(0)
    eager = LinearSteps()
    fast = d2s.declarative(LinearSteps(), optimize="fast")
    fast.load_state_dict(eager.state_dict())
    return eager, fast


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("n", [0, 1, 3])
def test_pretranspose_values_on_every_path_and_training_untouched(sign, n):
    """Both branches, 0/1/several trips: under no_grad the pretransposed
    variant gives eager's values bit for bit; with grad on (three SGD
    steps) the program keeps `linear`, values and gradients bit for bit."""
    eager, fast = _linear_pair()
    x = torch.linspace(-1, 1, 12).reshape(3, 4) * sign
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, fast)]
    for _ in range(3):
        with torch.no_grad():
            assert all(torch.equal(a, b) for a, b in zip(eager(x, torch.tensor(n)), fast(x, torch.tensor(n))))
        outs = []
        for model, opt in zip((eager, fast), opts):
            opt.zero_grad()
            out = model(x, torch.tensor(n))
            (out[0].sum() + out[1].sum()).backward()
            outs.append(out)
        assert all(torch.equal(a, b) for a, b in zip(*outs))
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), fast.parameters()))
        for opt in opts:
            opt.step()
    concrete = fast.forward.concrete_program
    assert "k_addmm" in concrete._inference.source and "k_addmm" not in concrete.compiled.source


@pytest.mark.parametrize("change", ["no_grad_first", "freeze", "swap_data", "inference_mode_first"])
def test_pretransposed_weights_are_remade_when_stale(change):
    """Grad-mode calls after no_grad/inference_mode ones train exactly; a
    transpose is remade after a freeze, a swapped `.data`, a mode change."""
    eager, fast = _linear_pair()
    x = torch.randn(3, 4)
    if change == "no_grad_first":
        with torch.no_grad():
            fast(x, torch.tensor(1))
    elif change == "inference_mode_first":
        with torch.inference_mode():
            fast(x, torch.tensor(1))
    else:
        fast(x, torch.tensor(1))
    if change == "freeze":
        for m in (eager, fast):
            m.fc.weight.requires_grad_(False)
    elif change == "swap_data":
        new = torch.randn(4, 4)
        eager.fc.weight.data, fast.fc.weight.data = new.clone(), new.clone()
    for m in (eager, fast):
        m(x, torch.tensor(1))[0].sum().backward()
    for a, b in zip(eager.parameters(), fast.parameters()):
        assert (a.grad is None) == (b.grad is None) and (a.grad is None or torch.equal(a.grad, b.grad))
    with torch.no_grad():
        assert torch.equal(fast(x, torch.tensor(1))[0], eager(x, torch.tensor(1))[0])
    fast.fc.weight.data = torch.randn(4, 4)  # swapped after the transpose was made
    eager.fc.weight.data = fast.fc.weight.data.clone()
    with torch.inference_mode():
        assert torch.equal(fast(x, torch.tensor(1))[0], eager(x, torch.tensor(1))[0])
