"""The CPU generator's state in converted code (d2s/operators/rng.py):
`torch.random.fork_rng` restores it when the program runs, not only while
tracing."""

import pytest
import torch

import d2s


def forked(x):
    with torch.random.fork_rng():
        inner = torch.rand(4)
        if x.sum() > 0:
            inner = inner + torch.rand(4)
    return inner + x, torch.rand(4) + x


def not_forked(x):
    with torch.random.fork_rng(enabled=False):
        inner = torch.rand(4)
    return inner + x, torch.rand(4) + x


@pytest.mark.parametrize("fn", [forked, not_forked])
def test_draws_after_the_block_are_eagers(fn):
    static = d2s.declarative(fn)
    for seed in (0, 1):
        for x in (torch.ones(4), -torch.ones(4)):  # both paths of the branch in the block
            torch.manual_seed(seed)
            want = fn(x)
            torch.manual_seed(seed)
            got = static(x)
            assert all(torch.equal(a, b) for a, b in zip(want, got))
    program = static.concrete_program.main_program
    types = [op.type for block in program.blocks for op in block.ops]
    assert len(static.program_cache) == 1
    forks = fn is forked
    assert ("cond" in types) == forks
    assert types.count("torch.get_rng_state") == types.count("torch.set_rng_state") == int(forks)


def fork_devices(x):
    with torch.random.fork_rng(devices=[0], device_type="cuda"):
        return x + torch.rand(2)


def test_forking_an_accelerator_generator_is_refused_at_the_users_line():
    with pytest.raises(d2s.ConversionError, match=r"fork_rng over cuda devices \[0\]") as err:
        d2s.declarative(fork_devices)(torch.ones(2))
    assert err.value.filename == __file__
