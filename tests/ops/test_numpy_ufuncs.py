"""NumPy ufuncs and NumPy operands on graph tensors: each call ends where
eager PyTorch ends (NumPy's own computation and dtype rules for ufuncs and
for `x <op> ndarray`, torch's for a NumPy scalar on the left), as ops that
run when the program runs. Eager PyTorch is the oracle, bit for bit."""

import warnings

import numpy as np
import pytest
import torch

import d2s
from opcheck import check, randn

# numpy warns about torch's old-style __array_wrap__ on every eager call
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def positive(n):
    return (randn(n, 4).abs() + 0.5,)


UFUNC_CALLS = [
    lambda x: np.sqrt(x),
    lambda x: x / np.sqrt(x),
    lambda x: np.exp(x),
    lambda x: np.log(x) + 1,
    lambda x: np.maximum(x, 0.75),
    lambda x: np.isnan(x),                          # a bool result comes back as uint8
    lambda x: np.sqrt(x.long()),                    # NumPy's rule: int64 -> float64
    lambda x: np.add(x, np.float64(1.0)),           # a NumPy scalar keeps its dtype: float64
    lambda x: np.multiply(np.float64(2.0), x),      # called by name: NumPy's rule, not torch's
    lambda x: np.modf(x * 3),                       # two outputs
    lambda x: np.power(x, np.arange(4)),            # an array operand: a constant of the program
]


@pytest.mark.parametrize("fn", UFUNC_CALLS)
@pytest.mark.parametrize("dyn", [None, {0: [0]}], ids=["static", "dynamic"])
def test_ufunc_of_a_graph_tensor_is_an_op(fn, dyn):
    program, _ = check(fn, positive, dyn)
    assert any(op.type.startswith("numpy.") for op in program.global_block().ops)


OPERATORS = [
    lambda x: x * np.arange(4),                     # torch's __mul__ declines; NumPy's __rmul__: float64
    lambda x: x - np.ones(4, dtype=np.float32),
    lambda x: _iadd(x),
    lambda x: np.float64(2.5) * x,                  # a NumPy scalar on the left defers to x.__rmul__: float32
    lambda x: np.float32(0.5) < x,                  # ... and to x.__gt__
    lambda x: x + np.float64(1.0),
    lambda x: x + np.array(1.0),                    # 0-d: a 0-d constant, not [1]
]


def _iadd(x):
    y = x.clone()
    y += np.ones(4)  # torch's __iadd__ declines: y becomes NumPy's y + ones, float64
    return y


@pytest.mark.parametrize("fn", OPERATORS)
def test_operator_with_a_numpy_operand_follows_eager(fn):
    check(fn, positive, {0: [0]})


def test_ndarray_on_the_left_fails_as_in_eager():
    x = torch.rand(3, 4)
    with pytest.raises(TypeError):
        np.ones(4) * x
    program = d2s.Program()
    with d2s.program_guard(program):
        v = d2s.data("x", [None, 4])
        with pytest.raises(TypeError):
            np.ones(4) * v


class Scaled(torch.nn.Module):
    def forward(self, x, n):
        if np.sqrt(n).sum() > 4:  # a ufunc result under a tensor condition
            return x / np.sqrt(n)
        return np.maximum(x, 0.0)


@pytest.mark.parametrize("big", [True, False])
def test_declarative_ufuncs_save_and_reload(big, tmp_path):
    x, n = torch.randn(3, 4), torch.rand(3, 4) + (1.0 if big else 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = Scaled()(x, n)
        static = d2s.declarative(Scaled())
        assert torch.equal(static(x, n), want)
        d2s.jit.save(static, str(tmp_path / "m"))
        loaded = d2s.jit.load(str(tmp_path / "m"))
        for big_n in (torch.rand(3, 4) + 1.0, torch.rand(3, 4) * 0.01):  # both branches
            assert torch.equal(loaded(x, big_n), Scaled()(x, big_n))


def test_ufunc_methods_and_out_are_refused_at_the_line():
    def reduce_(x):
        return np.add.reduce(x)

    def with_out(x):
        return np.sqrt(x, out=np.empty(4))

    for fn in (reduce_, with_out):
        program = d2s.Program()
        with d2s.program_guard(program):
            with pytest.raises(d2s.ConversionError, match="numpy") as info:
                fn(d2s.data("x", [4]))
        assert info.value.lineno is not None
