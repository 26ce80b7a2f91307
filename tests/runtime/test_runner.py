"""One input policy for every way to run a program (runtime/runner.py):
Executor.run, declarative calls with InputSpec, TracedLayer and
TranslatedLayer. Safe casts only, rank and static sizes checked, every
message names the feed or argument."""

import re

import numpy as np
import pytest
import torch

import d2s
import runtime
from runtime.runner import safe_cast

from runner_funcs import Affine, scaled, shifted


def _program():
    program = runtime.Program()
    with runtime.program_guard(program):
        n = runtime.data("n", [], "int64")
        x = runtime.data("x", [None, 3], "float32")
        y = x * 2
        m = n + 1
    return program, y, m


@pytest.mark.parametrize("feed, error, message", [
    ({"n": 2.7}, TypeError, r"feed 'n' expects int64, got float64: casting would lose information"),
    ({"n": np.float32(1.0)}, TypeError, r"feed 'n' expects int64, got float32"),
    ({"n": "3"}, TypeError, r"feed 'n' expects a tensor of int64, got the string '3'"),
    ({"n": None}, TypeError, r"feed 'n' expects a tensor of int64, got None"),
    ({"x": object()}, TypeError, r"feed 'x' expects a tensor of float32, got a object"),
    ({"x": np.ones((2, 4), np.float32)}, ValueError, r"feed 'x' expects shape \[-1, 3\]"),
    ({"x": np.ones(3, np.float32)}, ValueError, r"feed 'x' expects shape \[-1, 3\] .*got \[3\]"),
    ({"x": np.ones((1, 3), np.complex64)}, TypeError, r"feed 'x' expects float32, got complex64"),
])
def test_executor_refuses_unsafe_feeds_naming_them(feed, error, message):
    program, y, m = _program()
    full = {"n": 1, "x": np.ones((2, 3), np.float32), **feed}
    with pytest.raises(error, match=message):
        runtime.Executor().run(program, feed=full, fetch_list=[y, m])


def test_executor_makes_safe_casts():
    program, y, m = _program()
    got_y, got_m = runtime.Executor().run(program, feed={"n": np.int32(4), "x": [[1, 2, 3]]}, fetch_list=[y, m])
    assert got_m == 5 and got_m.dtype == np.int64
    np.testing.assert_array_equal(got_y, [[2.0, 4.0, 6.0]])
    assert got_y.dtype == np.float32  # int64 list -> float32 feed (a widening cast)


@pytest.mark.parametrize("src, dst, ok", [
    (torch.bool, torch.int64, True), (torch.int16, torch.float32, True), (torch.int32, torch.float64, True),
    (torch.float32, torch.float64, True), (torch.float16, torch.float32, True), (torch.bfloat16, torch.float32, True),
    (torch.uint8, torch.bfloat16, True), (torch.float32, torch.complex64, True),
    # numpy's "safe" rule: some values would change
    (torch.float64, torch.float32, False), (torch.int32, torch.float32, False), (torch.int64, torch.float32, False),
    (torch.float16, torch.bfloat16, False), (torch.int64, torch.int32, False),
    (torch.float32, torch.int64, False), (torch.int64, torch.bool, False), (torch.complex64, torch.float64, False),
])
def test_safe_cast_rule(src, dst, ok):
    assert safe_cast(src, dst) is ok
    if torch.bfloat16 not in (src, dst):  # numpy's own rule, where numpy has the dtypes
        assert np.can_cast(torch.empty(0, dtype=src).numpy().dtype, torch.empty(0, dtype=dst).numpy().dtype,
                           "safe") is ok


@pytest.mark.parametrize("value", [torch.ones(2, 3, dtype=torch.float64), np.ones((2, 3)),
                                   torch.ones(2, 3, dtype=torch.int64)])
def test_feeds_of_another_dtype_are_refused_naming_the_feed(value):
    program, y, m = _program()
    with pytest.raises(TypeError, match=r"feed 'x' expects float32, got (float64|int64): numpy's 'safe' casting"):
        runtime.Executor().run(program, feed={"n": 1, "x": value}, fetch_list=[y])


@pytest.mark.parametrize("args, error, message", [
    (("text",), TypeError, r"argument 'x' expects a tensor of float32, got the string 'text'"),
    ((None,), TypeError, r"argument 'x' expects a tensor of float32, got None"),
    ((3, torch.ones(2, 3)), ValueError, r"argument 'x' expects shape \[-1, 3\] \(-1: any size\), got \[\]"),  # swapped
    ((torch.ones(2, 4),), ValueError, r"argument 'x' expects shape \[-1, 3\].*does not match InputSpec"),
    ((torch.ones(3),), ValueError, r"argument 'x' expects shape"),
])
def test_input_spec_is_matched_to_the_parameters(args, error, message):
    with pytest.raises(error, match=message):
        scaled(*args)


def test_input_spec_casts_safely_and_keeps_one_program():
    scaled.program_cache.clear()
    assert scaled(torch.ones(2, 3, dtype=torch.float16)).dtype == torch.float32
    with pytest.raises(TypeError, match=r"argument 'x' expects float32, got float64: numpy's 'safe' casting"):
        scaled(torch.ones(2, 3, dtype=torch.float64))  # never computed in float32 silently
    assert torch.equal(scaled(np.ones((4, 3), np.float32)), torch.full((4, 3), 2.0))
    assert len(scaled.program_cache) == 1
    with pytest.raises(TypeError, match=r"argument 'idx' expects int64, got float32"):
        shifted(torch.full((1, 3), 2.7))


def test_traced_layer_checks_its_inputs():
    torch.manual_seed(0)
    model = Affine()
    _, traced = d2s.TracedLayer.trace(model, [torch.randn(4, 3)])
    x = torch.randn(4, 3)
    assert torch.equal(traced(x.half()), model(x.half().float()))
    with pytest.raises(TypeError, match=r"expected 1 input\(s\) \(input_0\), got 2"):
        traced(x, x)
    with pytest.raises(ValueError, match=r"input 'input_0' expects shape \[4, 3\]"):
        traced(torch.randn(5, 3))
    with pytest.raises(TypeError, match=r"input 'input_0' expects a tensor of float32, got the string"):
        traced("x")


def test_translated_layer_checks_its_inputs(tmp_path):
    torch.manual_seed(0)
    static = d2s.declarative(Affine())
    d2s.jit.save(static, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 3])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    x = torch.randn(2, 3)
    torch.testing.assert_close(loaded(x.half()), static(x.half().float()))
    with pytest.raises(TypeError, match=r"input 'x' expects float32, got float64: numpy's 'safe' casting"):
        loaded(x.double())
    with pytest.raises(TypeError, match=r"input 'x' expects float32, got complex64"):
        loaded(x.to(torch.complex64))
    with pytest.raises(TypeError, match=r"input 'x' expects a tensor of float32, got None"):
        loaded(None)



def _feed_vars():
    program = runtime.Program()
    with runtime.program_guard(program):
        x = runtime.data("x", [None, 3], "float32")
        n = runtime.data("n", [2], "int64")
    return [x, n]


@pytest.mark.parametrize("values", [
    (torch.ones(4, 3), torch.ones(2, dtype=torch.int64)),  # plain: passed as they are
    (torch.ones(4, 3).half(), torch.ones(2, dtype=torch.int64)),  # a safe cast
    (torch.nn.Parameter(torch.ones(4, 3)), torch.ones(2, dtype=torch.int64)),  # a subclass
    (np.ones((4, 3), np.float32), [1, 2]),
    (torch.ones(4, 4), torch.ones(2, dtype=torch.int64)),  # a static size
    (torch.ones(4, 3), torch.ones(3, dtype=torch.int64)),
    (torch.ones(3), torch.ones(2, dtype=torch.int64)),  # the rank
    (torch.ones(4, 3), torch.ones(2)),  # an unsafe cast
    (torch.ones(4, 3),),  # the count
])
def test_feeds_take_the_plain_case_and_give_the_policy_for_the_rest(values):
    feeds = runtime.runner.Feeds(_feed_vars(), "input")
    try:
        want = runtime.runner.convert_inputs(values, feeds.vars, "input")
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            feeds.convert(values)
        return
    got = feeds.convert(values)
    assert [(t.dtype, t.shape) for t in got] == [(t.dtype, t.shape) for t in want]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    if all(type(v) is torch.Tensor for v in values) and want[0] is values[0]:
        assert all(a is b for a, b in zip(got, values))
