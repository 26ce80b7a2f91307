"""Elementwise torch functions, Python operators (plain, reflected, in-place)
and indexing, captured and run against eager PyTorch."""

import operator

import numpy as np
import pytest
import torch

from opcheck import check, randn

UNARY = ("abs neg exp expm1 log1p sin cos tanh sigmoid relu floor ceil round trunc frac sign "
         "reciprocal erf square atan asinh sqrt rsqrt log nan_to_num isnan isfinite logical_not").split()


def positive(n):
    return (randn(n, 4).abs() + 0.1,)


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("dyn", [None, {0: [0]}], ids=["static", "dynamic"])
def test_unary_function(name, dyn):
    fn = getattr(torch, name)
    check(lambda x: fn(x), positive, dyn)


@pytest.mark.parametrize("name", ["exp", "tanh", "relu", "sqrt", "floor"])
def test_unary_method(name):
    check(lambda x: getattr(x, name)(), positive, {0: [0]})


BINARY = "add sub mul div maximum minimum pow atan2 fmod remainder eq lt ge logical_and hypot".split()


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("dyn", [None, {0: [0], 1: [0]}], ids=["static", "dynamic"])
def test_binary_function(name, dyn):
    fn = getattr(torch, name)
    check(lambda x, y: fn(x, y), lambda n: (randn(n, 3), randn(n, 3, seed=1).abs() + 0.5), dyn)


def test_broadcast_keeps_known_dims():
    # [-1, 1] + [1, 4]: only the first dim depends on the unknown batch size.
    check(lambda x, y: x + y, lambda n: (randn(n, 1), randn(1, 4)), {0: [0]})


def test_where_clamp_lerp():
    check(lambda x, y: (torch.where(x > 0, x, y), torch.clamp(x, -0.5, 0.5), torch.lerp(x, y, 0.3),
                        x.clamp(min=0.0), torch.addcmul(x, x, y, value=2.0)),
          lambda n: (randn(n, 3), randn(n, 3, seed=1)), {0: [0], 1: [0]})


OPERATORS = [operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
             operator.mod, operator.pow, operator.eq, operator.ne, operator.lt, operator.le,
             operator.gt, operator.ge]


@pytest.mark.parametrize("op", OPERATORS, ids=lambda o: o.__name__)
@pytest.mark.parametrize("side", ["var_var", "var_scalar", "scalar_var", "var_tensor", "tensor_var"])
def test_python_operators(op, side):
    const = torch.full((3,), 1.5)
    forms = {
        "var_var": lambda x, y: op(x, y),
        "var_scalar": lambda x, y: op(x, 2.0),
        "scalar_var": lambda x, y: op(2.0, y),  # reflected: __radd__, __rsub__, ...
        "var_tensor": lambda x, y: op(x, const),
        "tensor_var": lambda x, y: op(const, y),  # a real tensor on the left dispatches to the Variable
    }
    check(forms[side], lambda n: (randn(n, 3), randn(n, 3, seed=1).abs() + 0.5), {0: [0], 1: [0]})


@pytest.mark.parametrize("op", [operator.and_, operator.or_, operator.xor, operator.lshift,
                                operator.rshift], ids=lambda o: o.__name__)
def test_integer_operators(op):
    make = lambda n: (torch.arange(n * 3).reshape(n, 3), torch.arange(n * 3).reshape(n, 3) % 3)
    check(lambda x, y: (op(x, y), op(x, 1)), make, {0: [0], 1: [0]})


@pytest.mark.parametrize("op", [operator.neg, operator.pos, operator.abs], ids=lambda o: o.__name__)
def test_unary_operators(op):
    check(lambda x: op(x), lambda n: (randn(n, 3),), {0: [0]})


def test_invert_and_matmul():
    check(lambda b, x, w: (~b, x @ w, w.t() @ x.t()),
          lambda n: (randn(n, 3) > 0, randn(n, 3), randn(3, 2, seed=1)), {0: [0], 1: [0]})


INPLACE = [operator.iadd, operator.isub, operator.imul, operator.itruediv]


@pytest.mark.parametrize("op", INPLACE, ids=lambda o: o.__name__)
def test_inplace_operators(op):
    def fn(x, y):
        z = x * 1.0  # an intermediate, so the feed itself is not written
        z = op(z, y)
        z = op(z, 2.0)
        return z
    check(fn, lambda n: (randn(n, 3), randn(n, 3, seed=1).abs() + 0.5), {0: [0], 1: [0]})


@pytest.mark.parametrize("name,args", [("add_", (1.0,)), ("mul_", (3.0,)), ("clamp_", (-0.1, 0.1)),
                                       ("relu_", ()), ("fill_", (7.0,)), ("zero_", ()), ("exp_", ())])
def test_inplace_methods(name, args):
    def fn(x):
        y = x + 0
        r = getattr(y, name)(*args)
        return y, r, y * 2  # y after the write, the method's result (y itself), a later read
    check(fn, lambda n: (randn(n, 3),), {0: [0]})


def test_inplace_on_feed_does_not_change_caller_tensor():
    # Writing a feed in place writes the fed tensor, as eager does to its argument.
    x = randn(2, 3)
    check(lambda v: v.add_(1.0), lambda n: (x.clone(),))


# -- indexing ----------------------------------------------------------------------------------

INDEXES = {
    "int": lambda x: x[1],
    "neg_int": lambda x: x[-1],
    "slice": lambda x: x[1:3],
    "step": lambda x: x[::2],
    "col": lambda x: x[:, 2],
    "ellipsis": lambda x: x[..., 1],
    "none": lambda x: x[None, :, None],
    "mixed": lambda x: x[1:, None, ..., 0],
    "index_tensor": lambda x: x[torch.tensor([0, 2, 2])],
    "index_list": lambda x: x[:, [0, 3]],
}


def test_getitem_bool_mask_is_value_dependent():
    # How many elements a mask selects is known only at run time.
    check(lambda x: x[x > 0], lambda n: (randn(4, 5, 2),), shapes=[(-1,)])


@pytest.mark.parametrize("key", sorted(INDEXES))
def test_getitem_static(key):
    check(INDEXES[key], lambda n: (randn(4, 5, 2),))


@pytest.mark.parametrize("key", ["col", "ellipsis", "none", "index_list", "step"])
def test_getitem_dynamic_batch(key):
    check(INDEXES[key], lambda n: (randn(n, 5, 2),), {0: [0]})


def test_getitem_with_variable_index():
    check(lambda x, i: (x[i], x[:, i]), lambda n: (randn(4, 5), torch.tensor([3, 0, 1])))


def test_getitem_variable_int_and_slice_bounds():
    # A run-time int index keeps the other dims; a run-time slice bound makes
    # its own dim unknown (an out-of-range stand-in must not fix it at 0).
    def fn(x, k):
        return x[k], x[k:], x[:, :k], x.narrow(0, 0, k)
    check(fn, lambda n: (randn(4, 5), torch.tensor(2)), shapes=[(5,), (-1, 5), (4, -1), (-1, 5)])


SETITEMS = {
    "int": lambda y, v: y.__setitem__(1, 5.0),
    "slice": lambda y, v: y.__setitem__(slice(0, 2), v[0]),
    "col": lambda y, v: y.__setitem__((slice(None), 0), -1.0),
    "ellipsis": lambda y, v: y.__setitem__((Ellipsis, 1), v[:, 1]),
    "mask": lambda y, v: y.__setitem__(y > 0, 0.0),
    "index": lambda y, v: y.__setitem__(torch.tensor([0, 2]), v[:2]),
}


@pytest.mark.parametrize("key", sorted(SETITEMS))
def test_setitem(key):
    def fn(x, v):
        y = x * 1.0
        SETITEMS[key](y, v)
        return y, y.sum()
    check(fn, lambda n: (randn(4, 3), randn(4, 3, seed=1)))


def test_setitem_dynamic_batch():
    def fn(x):
        y = x.clone()
        y[:, 0] = 0.0
        y[..., 1] += 1.0
        return y
    check(fn, lambda n: (randn(n, 3),), {0: [0]})


NUMPY_OPERANDS = [
    lambda x: np.float64(2.5) * x,                    # numpy scalar on the left: defers to x.__rmul__
    lambda x: 10 / np.log(10) * x - np.float32(1.0),
    lambda x: x / np.sqrt(np.float64(3.0)),
]


@pytest.mark.parametrize("fn", NUMPY_OPERANDS)
def test_numpy_operand_on_the_left_defers_to_the_tensor(fn):
    # As torch.Tensor, a Variable has __array_priority__: numpy does not try to convert it.
    check(fn, lambda n: (randn(n, 4),), {0: [0]})
