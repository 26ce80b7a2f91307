"""The Executor: compile cache, frees, feeds, run-time errors, tracing, and
cond/while on Variables against eager."""

import copy

import numpy as np
import pytest
import torch

import ops
import runtime
from ops import framework
from runtime import _debug


def _mlp_program(shape=(None, 3)):
    p = runtime.Program()
    with runtime.program_guard(p):
        x = runtime.data("x", list(shape))
        h = torch.relu(x * 2)
        y = (h + 1).sum(-1)
    return p, x, y


# -- compile cache and generated code ---------------------------------------------------------

def test_compile_cache_keyed_by_program_version():
    p, x, y = _mlp_program()
    exe = runtime.Executor()
    a = exe.compiled(p, ["x"], [y.name])
    assert exe.compiled(p, ["x"], [y.name]) is a
    assert runtime.Executor().compiled(p, ["x"], [y.name]) is a  # the cache lives on the program
    assert exe.compiled(p, ["x"], [x.name]) is not a  # other fetches, other function
    with runtime.program_guard(p):
        y2 = y * 3
    b = exe.compiled(p, ["x"], [y.name])
    assert b is not a
    assert exe.run(p, feed={"x": np.ones((2, 3), np.float32)}, fetch_list=[y2])[0].tolist() == [27.0, 27.0]


def test_intermediates_are_freed_after_last_use():
    p, x, y = _mlp_program()
    entry = runtime.Executor().compiled(p, ["x"], [y.name])
    lines = [l.strip() for l in entry.source.splitlines()]
    # The feed and each intermediate are deleted right after the op that
    # reads them last; the fetched value is returned, never deleted.
    ops_ = p.global_block().ops
    for op in ops_[:-1]:
        (name,) = op.input_names
        stmt = lines.index(f"del v_{name}")
        assert lines[stmt - 1].startswith(f"v_{op.output_names[0]} = ")
    assert not any(l.startswith("del") and f"v_{y.name}" in l for l in lines)
    assert lines[-1] == f"return (v_{y.name},)"


def test_tutorial_in_place_add_returns_11s():
    p = runtime.Program()
    with runtime.program_guard(p):
        x = runtime.data("x", [2, 2])
        x += 10
    out, = runtime.Executor().run(p, feed={"x": np.ones((2, 2), np.float32)}, fetch_list=[x])
    assert out.tolist() == [[11.0, 11.0], [11.0, 11.0]]


def test_numpy_feed_is_not_mutated_by_in_place_op():
    p = runtime.Program()
    with runtime.program_guard(p):
        x = runtime.data("x", [2, 2])
        x.mul_(3)
    arr = np.ones((2, 2), np.float32)
    out, = runtime.Executor().run(p, feed={"x": arr}, fetch_list=[x])
    assert out.tolist() == [[3.0, 3.0], [3.0, 3.0]] and arr.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_feed_dtype_is_converted_and_results_are_numpy_or_tensors():
    p, x, y = _mlp_program()
    exe = runtime.Executor()
    out, = exe.run(p, feed={"x": np.ones((4, 3), np.float16)}, fetch_list=[y])
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (4,)
    t, = exe.run(p, feed={"x": torch.ones(1, 3)}, fetch_list=[y], return_numpy=False)
    assert isinstance(t, torch.Tensor) and t.tolist() == [9.0]


@pytest.mark.parametrize("feed,match", [
    ({"x": np.ones((2, 4), np.float32)}, r"feed 'x' expects shape \[-1, 3\].*got \[2, 4\]"),
    ({"x": np.ones((3,), np.float32)}, r"expects shape"),
    ({"x": np.ones((2, 3)), "nope": np.ones(1)}, r"feed 'nope' is not a data variable.*data variables: x"),
    ({}, r"data variable\(s\) \['x'\] are used by the program but not fed"),
])
def test_feed_errors(feed, match):
    p, x, y = _mlp_program()
    with pytest.raises(ValueError, match=match):
        runtime.Executor().run(p, feed=feed, fetch_list=[y])


def test_fetch_of_unknown_name_and_wrong_program_type():
    p, x, y = _mlp_program()
    with pytest.raises(ValueError, match="fetch target 'zzz'"):
        runtime.Executor().run(p, feed={"x": np.ones((1, 3), np.float32)}, fetch_list=["zzz"])
    with pytest.raises(TypeError):
        runtime.Executor().run("program")


def test_run_time_op_failure_names_op_and_user_line():
    p = runtime.Program()
    with runtime.program_guard(p):
        x = runtime.data("x", [None, 4])
        y = x.view(-1, 8)  # fails only for an odd batch size, known at run time
    with pytest.raises(runtime.OpRuntimeError) as info:
        runtime.Executor().run(p, feed={"x": np.ones((3, 4), np.float32)}, fetch_list=[y])
    message = str(info.value)
    assert "torch.Tensor.view" in message and "while running op" in message
    assert f'File "{__file__}"' in message and "y = x.view(-1, 8)" in message
    assert runtime.Executor().run(p, feed={"x": np.ones((4, 4), np.float32)}, fetch_list=[y])[0].shape == (2, 8)


def test_debug_level_3_prints_each_op(capfd):
    p, x, y = _mlp_program()
    _debug.set_verbosity(3)
    try:
        runtime.Executor().run(p, feed={"x": np.ones((1, 3), np.float32)}, fetch_list=[y])
    finally:
        _debug.set_verbosity(None)
    err = capfd.readouterr().err
    runs = [l for l in err.splitlines() if l.startswith("[d2s] run ")]
    assert len(runs) == len(p.global_block().ops) == 4
    assert "torch.relu" in runs[1]
    runtime.Executor().run(p, feed={"x": np.ones((1, 3), np.float32)}, fetch_list=[y])
    assert "[d2s] run" not in capfd.readouterr().err  # level 0 again: the untraced function


def test_debug_env_variable(monkeypatch, capfd):
    p, x, y = _mlp_program()
    monkeypatch.setenv("D2S_DEBUG", "3")
    runtime.Executor().run(p, feed={"x": np.ones((1, 3), np.float32)}, fetch_list=[y])
    assert capfd.readouterr().err.count("[d2s] run ") == 4


# -- cond / while on Variables ---------------------------------------------------------------

W = torch.nn.Linear(3, 3)


def _branchy(x):
    return ops.cond(x.sum() > 0, lambda: W(x) * 2, lambda: W(x) - 1)


def _build(fn, shape):
    p = runtime.Program()
    with runtime.program_guard(p):
        x = runtime.data("x", shape)
        out = fn(x)
    return p, out


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true", "false"])
def test_cond_both_branches_and_gradients(sign):
    x = torch.ones(2, 3) * sign
    p, out = _build(_branchy, [None, 3])
    assert p.global_block().ops[-1].type == "cond" and out.shape == (-1, 3)
    got, = runtime.Executor().run(p, feed={"x": x}, fetch_list=[out], return_numpy=False)
    want = _branchy(x)
    assert torch.equal(got, want)
    W.zero_grad()
    want.sum().backward()
    eager_grads = [q.grad.clone() for q in W.parameters()]
    W.zero_grad()
    got.sum().backward()
    assert all(torch.equal(a, q.grad) for a, q in zip(eager_grads, W.parameters()))


def test_cond_branch_shapes_merge_to_minus_one():
    p, out = _build(lambda x: ops.cond(x.sum() > 0, lambda: x, lambda: x[:1]), [4, 3])
    assert out.shape == (-1, 3)
    exe = runtime.Executor()
    assert exe.run(p, feed={"x": np.ones((4, 3), np.float32)}, fetch_list=[out])[0].shape == (4, 3)
    assert exe.run(p, feed={"x": -np.ones((4, 3), np.float32)}, fetch_list=[out])[0].shape == (1, 3)


def test_cond_dtype_mismatch_names_output():
    with pytest.raises(runtime.ConversionError, match="'y' has dtype float32 in the true branch but int64"):
        _build(lambda x: ops.cond(x.sum() > 0, lambda: x, lambda: x.long(), names=["y"]), [2])


def _count_loop(x, n, start=None):
    # i < n, applying W each time: 0, 1 or many iterations depending on n.
    if start is None:
        start = framework.fill_constant(0) if isinstance(x, runtime.Variable) else torch.tensor(0)
    return ops.while_loop(lambda i, v: i < n, lambda i, v: (i + 1, W(v) * 0.5), [start, x])


def _run_count_loop(n, start=None):
    x = torch.ones(2, 3)
    p = runtime.Program()
    with runtime.program_guard(p):
        xv = runtime.data("x", [None, 3])
        nv = runtime.data("n", [], "int64")
        i, out = _count_loop(xv, nv, start)
    assert p.global_block().ops[-1].type == "while" and out.shape == (-1, 3)
    got_i, got = runtime.Executor().run(p, feed={"x": x, "n": torch.tensor(n)}, fetch_list=[i, out],
                                        return_numpy=False)
    want_i, want = _count_loop(x, torch.tensor(n))
    assert int(got_i) == n and torch.equal(got, want)
    return got, want


@pytest.mark.parametrize("n", [0, 1, 4])
def test_while_iterations_and_gradients(n):
    got, want = _run_count_loop(n)
    if n:
        W.zero_grad()
        want.sum().backward()
        eager = [q.grad.clone() for q in W.parameters()]
        W.zero_grad()
        got.sum().backward()
        assert all(torch.equal(a, q.grad) for a, q in zip(eager, W.parameters()))


def test_while_with_a_real_tensor_initial_value():
    _run_count_loop(2, start=torch.tensor(0))


def test_while_with_a_python_int_counter():
    _run_count_loop(2, start=0)


def test_while_growing_cat_relaxes_shape():
    def fn(x):
        n = runtime.data("n", [], "int64")
        return ops.while_loop(lambda i, acc: i < n, lambda i, acc: (i + 1, torch.cat([acc, acc[:1]])),
                              [framework.fill_constant(0), x])[1]
    p, out = _build(fn, [1, 2])
    assert out.shape == (-1, 2)
    for n in (0, 4):
        got, = runtime.Executor().run(p, feed={"x": np.arange(2, dtype=np.float32)[None], "n": np.int64(n)},
                                      fetch_list=[out])
        assert got.tolist() == [[0.0, 1.0]] * (n + 1)


def test_while_dtype_change_names_variable():
    with pytest.raises(runtime.ConversionError, match="loop variable 'acc' has dtype float32 before the loop but float64"):
        _build(lambda x: ops.while_loop(lambda a: a.sum() < 10, lambda a: [a.double() + 1], [x],
                                        names=["acc"]), [2])


def test_a_program_made_before_its_ops_records_the_default_dtype_they_were_built_under():
    p = runtime.Program()  # made under float32, as `default_main_program()` is at import
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with runtime.program_guard(p):
            x = runtime.data("x", [2], "float64")
            y = x + torch.arange(2) * 0.5  # the promotion takes the default dtype
        assert p.default_dtype == torch.float64
        out, = runtime.Executor().run(p, feed={"x": np.ones(2)}, fetch_list=[y], return_numpy=False)
        assert out.dtype == torch.float64
        torch.set_default_dtype(torch.float32)
        with pytest.raises(RuntimeError, match="traced under the default dtype torch.float64"):
            runtime.Executor().run(p, feed={"x": np.ones(2)}, fetch_list=[y])
    finally:
        torch.set_default_dtype(before)
