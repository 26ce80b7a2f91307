"""Factory and random ops under CaptureMode run when the program runs."""

import pytest
import torch

import runtime
from opcheck import build, check, randn, run

FACTORIES = {
    "zeros": lambda x: torch.zeros(2, 3) + x.sum(),
    "ones_dtype": lambda x: torch.ones(4, dtype=torch.int64),
    "full": lambda x: torch.full((2, 2), 7.0),
    "arange": lambda x: torch.arange(0, 10, 3),
    "linspace": lambda x: torch.linspace(0, 1, 5),
    "eye": lambda x: torch.eye(3),
    "zeros_like": lambda x: torch.zeros_like(x),
    "ones_like": lambda x: torch.ones_like(x, dtype=torch.int32),
    "full_like": lambda x: torch.full_like(x, 2.5),
    "new_zeros": lambda x: x.new_zeros(2, 3),
    "randn": lambda x: torch.randn(3, 4),
    "rand": lambda x: torch.rand(2, 5),
    "randint": lambda x: torch.randint(0, 10, (6,)),
    "randperm": lambda x: torch.randperm(7),
    "randn_like": lambda x: torch.randn_like(x),
    "normal": lambda x: torch.normal(0.0, 1.0, (3,)),
    "multinomial": lambda x: torch.multinomial(x.abs() + 0.1, 2),
    "two_draws": lambda x: (torch.rand(3), torch.randn(2)),
}


@pytest.mark.parametrize("dyn", [None, {0: [0]}], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factory_same_values_as_eager(name, dyn):
    check(FACTORIES[name], lambda n: (randn(n, 4),), dyn, seed=42)


def test_random_draws_happen_at_run_time():
    x = randn(2, 4)
    program, feeds, out = build(lambda v: torch.randn(3) + v.sum(), [x])
    a, = run(program, feeds, out, [x])
    b, = run(program, feeds, out, [x])
    assert not torch.equal(a, b)


def test_building_does_not_consume_random_draws():
    # The draws after a build are the same as without the build, so a
    # program built then run matches eager under one manual_seed.
    torch.manual_seed(3)
    state = torch.get_rng_state()
    build(lambda v: (torch.randn(3), torch.bernoulli(v.sigmoid()), torch.randperm(4)), [randn(2, 2)])
    assert torch.equal(torch.get_rng_state(), state)


def test_factory_with_runtime_size():
    def fn(x):
        n = x.size(0)  # a SymInt: the batch, known only at run time
        return torch.arange(n), torch.zeros((n, 3)), torch.full((n,), 2.0), x.new_ones(n, 2)
    check(fn, lambda n: (randn(n, 4),), {0: [0]}, shapes=[(-1,), (-1, 3), (-1,), (-1, 2)])


def test_factory_varargs_with_runtime_size():
    # x.size(0) is a torch.SymInt, which torch's argument parser takes anywhere an int goes.
    check(lambda x: torch.zeros(x.size(0), 3), lambda n: (randn(n, 4),), {0: [0]}, shapes=[(-1, 3)])


def test_factory_outside_capture_mode_is_a_constant():
    # Without CaptureMode only calls on Variables are recorded: a factory
    # runs once, eagerly, and its tensor is lifted as a constant.
    program, feeds, out = build(lambda v: v + torch.ones(2), [randn(2)], capture_mode=False)
    assert [op.type for op in program.global_block().ops] == ["torch.Tensor.__add__"]
    assert any(v.persistable for v in program.global_block().vars.values())


class ReplayDropout(torch.nn.Module):
    """A reversible network's pattern: keep the generator's state, replay a
    draw from it (here only on one path)."""

    def forward(self, x):
        state = torch.get_rng_state()
        first = torch.nn.functional.dropout(x, 0.5, True)
        if x.sum() > 0:
            torch.set_rng_state(state)
        return first, torch.nn.functional.dropout(x, 0.5, True), state


def test_rng_state_is_read_and_written_when_the_program_runs(tmp_path):
    import d2s
    eager, static = ReplayDropout(), d2s.declarative(ReplayDropout())
    xs = [torch.ones(64), -torch.ones(64)]
    for seed in (0, 1):
        for x in xs:
            torch.manual_seed(seed)
            want = eager(x)
            torch.manual_seed(seed)
            got = static(x)
            assert all(torch.equal(a, b) for a, b in zip(want, got))
            assert torch.equal(want[0], want[1]) == bool(x.sum() > 0)  # replayed on one path only
    program = static.forward.concrete_program.main_program
    types = [op.type for block in program.blocks for op in block.ops]
    assert len(static.forward.program_cache) == 1
    assert {"cond", "torch.get_rng_state", "torch.set_rng_state"} <= set(types)
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for x in xs:
        torch.manual_seed(2)
        want = eager(x)
        torch.manual_seed(2)
        assert all(torch.equal(a, b) for a, b in zip(want, loaded(x)))
