"""`t.tolist()` in converted code: a list of the numbers the tensor holds
when the program runs (one 0-d value per element, each standing for the
Python number eager has there, as `t.item()` does), so a mixture of
experts that splits its tokens by `counts.tolist()` (transformers' JetMoE)
converts into one program serving every routing; a tensor whose sizes are
known only at run time, or one too large to list element by element, is
refused at the user's line."""

import copy
import inspect

import pytest
import torch
import torch.nn.functional as F

import d2s
from runtime.errors import ConversionError

EXPERTS = 3


def line_of(fn, text):
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def function(static):
    return static.forward if isinstance(static, torch.nn.Module) else static


def op_types(static):
    return {op.type for block in function(static).concrete_program.main_program.blocks for op in block.ops}


class Experts(torch.nn.Module):
    """Top-1 routing as JetMoE groups it: sort the tokens by expert, split
    them by each expert's count, one weight per piece, add them back."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(EXPERTS, 4, 4))

    def forward(self, x, route):
        counts = F.one_hot(route, EXPERTS).sum(0)
        order = route.argsort(stable=True)
        pieces = x[order].split(counts.tolist(), dim=0)
        out = torch.cat([p @ self.weight[i] for i, p in enumerate(pieces)], 0)
        return torch.zeros_like(x).index_add(0, order, out)


ROUTES = {"every expert": [0, 2, 1, 0, 2, 2], "one unused": [2, 2, 0, 0, 2, 0], "all to one": [1] * 6}


def test_split_by_counts_serves_every_routing_with_one_program():
    eager = Experts()
    static = d2s.declarative(copy.deepcopy(eager))
    for route in ROUTES.values():
        x = torch.randn(6, 4)
        xe, xs = x.clone().requires_grad_(), x.clone().requires_grad_()
        route = torch.tensor(route)
        want, got = eager(xe, route), static(xs, route)
        assert torch.equal(got, want)
        want.square().sum().backward()
        got.square().sum().backward()
        assert torch.equal(xs.grad, xe.grad)
        assert torch.equal(static.weight.grad, eager.weight.grad)
        eager.weight.grad = static.weight.grad = None
    assert len(function(static).program_cache) == 1
    # The pieces' sizes are run-time values, and their concatenation has the
    # tokens' size again: the last is the dimension less the others (an
    # `index_add` of it over all tokens checks that size, hints or not).
    program = function(static).concrete_program.main_program
    ops = {op.type: op for block in program.blocks for op in block.ops}
    split, cat = ops["torch.Tensor.split"], ops["torch.cat"]
    assert all(isinstance(program.global_block().vars[n].dims[0], str) for n in split.output_names)
    assert program.global_block().vars[cat.output_names[0]].dims == (6, 4)


def test_split_by_counts_saved_and_loaded(tmp_path):
    eager = Experts().eval()
    static = d2s.declarative(copy.deepcopy(eager))
    x = torch.randn(6, 4)
    static(x, torch.tensor(ROUTES["every expert"]))
    d2s.jit.save(static, str(tmp_path / "experts"))
    loaded = d2s.jit.load(str(tmp_path / "experts"))
    for route in ROUTES.values():
        route = torch.tensor(route)
        assert torch.equal(loaded(x, route), eager(x, route))


def numbers_drive_python(x, t):
    n = t.tolist()
    total = x * int(n[0])             # a decision: int() needs the number itself
    for _ in range(n[1]):             # a run-time trip count: a `while` op
        total = total + 1
    if n[2] > 1:                      # a tensor condition: a `cond` op
        total = total * 2
    return total


@pytest.mark.parametrize("values", [(2, 0, 3), (2, 1, 0), (2, 4, 2)])
def test_elements_are_numbers_that_loops_and_branches_read(values):
    static = d2s.declarative(numbers_drive_python)
    x = torch.arange(3.0)
    for v in (values, (2, 2, 5), values):
        t = torch.tensor(v)
        assert torch.equal(static(x, t), numbers_drive_python(x, t))
    assert len(static.program_cache) == 1
    assert {"while", "cond"} <= op_types(static)


def list_then_bump(x, t):
    ns = t.tolist()
    t.add_(1)
    return x * ns[0] + ns[1]


def test_the_list_is_a_snapshot_of_the_tensor():
    static = d2s.declarative(list_then_bump)
    te, ts = torch.tensor([3, 4]), torch.tensor([3, 4])
    assert torch.equal(static(torch.ones(2), ts), list_then_bump(torch.ones(2), te))
    assert torch.equal(ts, te)


def as_list(x):
    return (x * 2).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (0,), (2, 0)])
def test_returned_lists_equal_eager_values_and_types(dtype, shape):
    static = d2s.declarative(as_list)
    for seed in (0, 1):
        x = (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 4).to(dtype)
        got, want = static(x), as_list(x)
        assert got == want
        assert repr(got) == repr(want)  # the same Python number types (ints, floats, bools) and nesting
    assert len(static.program_cache) == 1


def positives_as_list(x):
    return x[x > 0].tolist()


def huge_list(x):
    return (x.sum() + torch.zeros(5000)).tolist()


@pytest.mark.parametrize("fn, marker, words", [
    (positives_as_list, "tolist", "sizes are known only when the program runs"),
    (huge_list, "tolist", "5000 elements"),
])
def test_refused_at_the_line(fn, marker, words):
    with pytest.raises(ConversionError, match=words) as info:
        d2s.declarative(fn)(torch.randn(3))
    assert info.value.lineno == line_of(fn, marker)
    assert info.value.filename == __file__


def static_sizes_as_list(x):
    return x.new_zeros(torch.tensor(x.shape[1:]).tolist())


def test_a_list_computed_from_constants_stays_python_numbers():
    static = d2s.declarative(static_sizes_as_list)
    assert torch.equal(static(torch.ones(2, 3, 4)), torch.zeros(3, 4))
    assert "torch.Tensor.unbind" not in op_types(static)  # no element read at run time
