"""What cannot be captured fails at the user's line, naming the function."""

import re

import pytest
import torch

import runtime
from ops.capture import CaptureMode
from opcheck import build, randn

HERE = __file__


def _line_of(marker):
    for i, line in enumerate(open(HERE), 1):
        if marker in line and "_line_of" not in line:
            return i
    raise AssertionError(marker)


def _raises_at(fn, marker, *names, capture_mode=True):
    with pytest.raises(runtime.ConversionError) as info:
        build(fn, [randn(2, 3)], capture_mode=capture_mode)
    err = info.value
    assert err.filename == HERE and err.lineno == _line_of(marker), (err.filename, err.lineno, str(err))
    for name in names:
        assert name in str(err), str(err)
    return err


def test_torch_save_is_not_allowlisted(tmp_path):
    path = str(tmp_path / "x.pt")
    _raises_at(lambda x: torch.save(x, path), "torch.save(x, path)", "torch.save", "I/O")  # torch.save(x, path)


@pytest.mark.parametrize("capture_mode", [True, False])
def test_builtin_torch_function_outside_the_lists(capture_mode):
    # torch._cast_Float is a C++ builtin that torch does not declare public.
    _raises_at(lambda x: torch._cast_Float(x), "torch._cast_Float(x)", "_cast_Float",  # torch._cast_Float(x)
               capture_mode=capture_mode)


def test_tensor_method_outside_the_lists():
    _raises_at(lambda x: x.apply_(abs), "x.apply_(abs)", "apply_")  # x.apply_(abs)


@pytest.mark.parametrize("how,form", [("bool(x)", lambda x: bool(x.sum())),  # bool(x.sum())
                                      ("x.item()", lambda x: x.sum().item()),  # .item()
                                      ("int(x)", lambda x: int(x.sum())),  # int(x.sum())
                                      ("float(x)", lambda x: float(x.sum())),  # float(x.sum())
                                      ("x.tolist()", lambda x: x.tolist()),  # .tolist()
                                      ("x.numpy()", lambda x: x.numpy()),  # .numpy()
                                      ("an if", lambda x: 1 if x.sum() > 0 else 0)])  # if x.sum()
def test_python_value_of_a_variable(how, form):
    markers = {"bool(x)": "bool(x.sum())", "x.item()": "x.sum().item()", "int(x)": "int(x.sum())",
               "float(x)": "float(x.sum())", "x.tolist()": "x.tolist()", "x.numpy()": "x.numpy()",
               "an if": "1 if x.sum() > 0"}
    err = _raises_at(form, markers[how], "known only when the program runs")
    # The user's variable when one on that line holds the tensor, never the program's `tmp_N`.
    assert re.search(r"tensor `x`|this tensor", str(err)) and "tmp_" not in str(err)


def test_kernel_failure_at_build_time_names_op_and_shapes():
    err = _raises_at(lambda x: x @ x, "lambda x: x @ x", "__matmul__", "float32[2, 3]")  # lambda x: x @ x
    # Inputs are named by the user's variables on that line, or by position: never `tmp_N`.
    assert "(x: float32[2, 3])" in str(err) and "tmp_" not in str(err), str(err)


def test_kernel_failure_names_an_unnamed_input_by_position():
    err = _raises_at(lambda x: x.sum().view(5), "x.sum().view(5)", "input 1: float32[]")  # x.sum().view(5)
    assert "tmp_" not in str(err)


def _rows_sum(x, n):
    h = x[:, 0] * 0 if x.shape[1] else torch.zeros(x.shape[0], x.shape[2])
    for t in range(n):
        h = h + x[:, t]  # rows of an empty dimension
    return h


def test_kernel_failure_in_a_loop_body_these_inputs_skip_says_why():
    """A loop over an empty dimension: eager runs no trip, d2s still traces
    the body. The message is the kernel's own ("index ... out of bounds"),
    with why d2s met it; never the symbol ("u0") a symbolic run stopped at."""
    import d2s
    static = d2s.declarative(_rows_sum)
    with pytest.raises(runtime.ConversionError) as info:  # the first call's sizes are exact
        static(torch.ones(2, 0, 4), torch.tensor(0))
    err = info.value
    assert err.filename == HERE and err.lineno == _line_of("rows of an empty dimension")
    assert "out of bounds for dimension 1 with size 0" in str(err), str(err)
    assert "traces every branch and loop body" in str(err) and ": u0" not in str(err)
    # After a call of other sizes, the dimension is a run-time size
    # (d2s/varying_sizes.py): the body traces, and the empty rows run no trip.
    static = d2s.declarative(_rows_sum)
    for x, n in ((torch.ones(2, 3, 4), 3), (torch.ones(2, 0, 4), 0)):
        assert torch.equal(static(x, torch.tensor(n)), _rows_sum(x, torch.tensor(n)))
