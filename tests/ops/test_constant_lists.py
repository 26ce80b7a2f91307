"""`.tolist()` of a tensor computed from constants alone
(`torch.tensor(x.shape[2:]).tolist()` of static sizes, ParityBench's
DDRNet and asteroid): the list is the same on every run, so tracing reads
it (ops/examples.py `constant_value`). Anything a run could change is
read when the program runs (a list of 0-d numbers, ops/capture.py and
d2s/operators/py_builtins.py `_tolist`): an input, a parameter, a size
known only at run time, a random draw, a tensor written in place
(directly or through a view), or a read inside a tensor branch or loop."""

import copy

import pytest
import torch
import torch.nn as nn

import d2s


def _sizes(x):
    h, w = torch.tensor(x.shape[2:]).tolist()
    dims = torch.arange(1, x.dim()).tolist()
    if x.sum() > 0:
        return x.sum(dims) * h + w
    return x.mean(dims) - h


def _after_a_pure_op(x):
    k = (torch.tensor([2, 3]) * 2).tolist()
    return x * k[0] + k[1]


@pytest.mark.parametrize("fn", [_sizes, _after_a_pure_op])
def test_a_list_of_constants_is_read_while_tracing(fn, tmp_path):
    static = d2s.declarative(fn)
    for sign in (1, -1):
        x = torch.randn(2, 3, 4, 5).abs() * sign
        assert torch.equal(static(x), fn(x))
    assert len(static.program_cache) == 1
    if fn is _sizes:
        assert "cond" in {op.type for op in static.concrete_program.main_program.global_block().ops}
    x = torch.randn(2, 3, 4, 5)
    d2s.jit.save(static, str(tmp_path / "m"))
    assert torch.equal(d2s.jit.load(str(tmp_path / "m"))(x), fn(x))


def _written(x):
    c = torch.tensor([3, 4])
    c.add_(x.sum().long())
    return x * c.tolist()[0]


def _written_through_a_view(x):
    c = torch.tensor([3, 4])
    c.view(-1).add_(x.sum().long())
    return x * c.tolist()[0]


def _from_the_input(x):
    return x * torch.tensor(x.shape).tolist()[0] + x.sum().tolist()


def _random(x):
    return x * torch.rand(2).tolist()[0]


def _in_a_branch(x):
    if x.sum() > 0:
        return x * torch.tensor([2, 3]).tolist()[0]
    return x


class _FromAParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def forward(self, x):
        return x * (self.w * 2).tolist()[0]


@pytest.mark.parametrize("make, spec", [
    (lambda: _written, None), (lambda: _written_through_a_view, None),
    (lambda: _from_the_input, [d2s.InputSpec([None, 2])]), (lambda: _random, None),
    (lambda: _in_a_branch, None), (_FromAParameter, None)])
def test_a_list_a_run_could_change_is_read_when_the_program_runs(make, spec):
    """Each of these was refused before `.tolist()` of a graph tensor became
    numbers read at run time (tests/d2s/test_tolist.py); the lists differ
    from call to call, and the program follows them."""
    eager = make()
    static = d2s.declarative(copy.deepcopy(eager), input_spec=spec)
    for rows, scale in ((3, 1.0), (5, -2.0), (3, 0.5)):
        x = torch.ones(rows, 2) * scale
        if isinstance(eager, nn.Module):
            with torch.no_grad():
                eager.w.mul_(2)
                static.w.mul_(2)
        torch.manual_seed(rows)
        want = eager(x)
        torch.manual_seed(rows)
        assert torch.equal(static(x), want)
