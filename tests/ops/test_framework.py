"""Framework ops (fill_constant, cast, shape, print, assert, tensor arrays)
and torch.linalg."""

import pytest
import torch

import runtime
from ops import framework
from opcheck import build, check, randn, run


@pytest.mark.parametrize("value,dtype", [(3, torch.int64), (2.5, torch.float64), (True, torch.bool)])
def test_fill_constant(value, dtype):
    """A Python number as what Python holds: a float is a double."""
    program, feeds, out = build(lambda x: framework.fill_constant(value), [randn(1)])
    assert out.shape == () and out.dtype == dtype
    got, = run(program, feeds, out, [randn(1)])
    assert torch.equal(got, torch.tensor(value, dtype=dtype))


@pytest.mark.parametrize("dtype", ["float64", torch.int32, "bool"])
def test_cast(dtype):
    x = randn(3, 2) * 3
    program, feeds, out = build(lambda v: framework.cast(v, dtype), [x], {0: [0]})
    assert out.shape == (-1, 2)
    got, = run(program, feeds, out, [x])
    assert torch.equal(got, x.to(runtime.ir.torch_dtype(dtype)))


def test_shape_op():
    x = randn(5, 3)
    program, feeds, out = build(lambda v: framework.shape(v), [x], {0: [0]})
    assert out.shape == (2,) and out.dtype == torch.int64
    assert torch.equal(run(program, feeds, out, [x])[0], torch.tensor([5, 3]))


def test_print_prints_when_the_program_runs(capsys):
    x = torch.tensor([1.0, 2.0])
    program, feeds, out = build(lambda v: (framework.print_("value:", v * 2, sep="|"), v + 1)[1], [x])
    assert capsys.readouterr().out == ""  # nothing at build time
    run(program, feeds, out, [x])
    assert capsys.readouterr().out == f"value:|{x * 2}\n"


def test_assert_passes_and_fails_at_run_time():
    program, feeds, out = build(lambda v: (framework.assert_(v > 0, "v must be positive"), v * 1)[1],
                                [torch.ones(2)])
    run(program, feeds, out, [torch.ones(2)])
    with pytest.raises(AssertionError, match="v must be positive"):
        run(program, feeds, out, [torch.tensor([1.0, -1.0])])


def test_tensor_array_append_length_read_stack():
    def fn(x):
        arr = framework.array_create()
        arr.append(x)
        arr.append(x * 2)
        return framework.array_length(arr), framework.array_read(arr, 1), torch.stack(arr), torch.cat(arr)
    x = randn(3, 2)
    program, feeds, out = build(fn, [x], {0: [0]})
    assert out[1].shape == (-1, 2)
    n, second, stacked, cat = run(program, feeds, out, [x])
    assert int(n) == 2 and torch.equal(second, x * 2)
    assert torch.equal(stacked, torch.stack([x, x * 2])) and torch.equal(cat, torch.cat([x, x * 2]))


def test_tensor_array_from_list_relaxes_shapes():
    def fn(x):
        arr = framework.array_from_list([x, x[:2]])
        return framework.array_read(arr, 0), torch.cat(arr)
    x = randn(3, 2)
    program, feeds, out = build(fn, [x])
    assert out[0].shape == (-1, 2)  # elements of different lengths
    first, cat = run(program, feeds, out, [x])
    assert torch.equal(first, x) and torch.equal(cat, torch.cat([x, x[:2]]))


def test_tensor_array_rejects_a_different_rank():
    with pytest.raises(runtime.ConversionError, match="cannot append"):
        build(lambda x: framework.array_from_list([x]).append(x[0]), [randn(3, 2)])


# -- linalg --------------------------------------------------------------------------------------

def _spd(n):
    a = randn(n, 4, 4)
    return (a @ a.transpose(-1, -2) + 4 * torch.eye(4),)


LINALG = {
    "inv": lambda a: torch.linalg.inv(a),
    "det": lambda a: torch.linalg.det(a),
    "slogdet": lambda a: torch.linalg.slogdet(a),
    "solve": lambda a: torch.linalg.solve(a, a[..., :1]),
    "cholesky": lambda a: torch.linalg.cholesky(a),
    "qr": lambda a: torch.linalg.qr(a),
    "eigh": lambda a: torch.linalg.eigh(a),
    "svdvals": lambda a: torch.linalg.svdvals(a),
    "norm": lambda a: (torch.linalg.norm(a), torch.linalg.vector_norm(a, dim=-1), torch.linalg.matrix_norm(a)),
    "matrix_power": lambda a: torch.linalg.matrix_power(a, 3),
    "multi_dot": lambda a: torch.linalg.multi_dot([a[0], a[0], a[0]]),
    "pinv": lambda a: torch.linalg.pinv(a),
}


@pytest.mark.parametrize("dyn", [None, {0: [0]}], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(LINALG))
def test_linalg(name, dyn):
    check(LINALG[name], _spd, dyn)
