"""Sizes that vary from call to call (d2s/varying_sizes.py): the second
size of a dimension traces it as a run-time size, and that program serves
every later size there, on every path (both sides of a tensor `if`, a
size decision checked when the program runs, zero and several loop
trips). Code that needs such a size as Python text or a number it cannot
follow keeps exact sizes, with eager's results; under an InputSpec the same
text is refused at the user's line."""

import numpy as np
import pytest
import torch

import d2s
from runtime.errors import ConversionError


def _ops(static):
    return {op.type for c in static.program_cache for b in c.main_program.blocks for op in b.ops}


def trims(x):
    if x.shape[0] > 4:  # a decision on a size: checked when the program runs
        x = x[:4]
    if x.sum() > 0:  # a tensor `if`
        return x * 2
    return x - 1


def accumulates(x):
    total = torch.zeros(x.shape[1:])
    for i in range(x.shape[0]):  # a loop over a run-time size: zero and several trips
        total = total + x[i]
    return total


@pytest.mark.parametrize("fn, sizes, op", [
    (trims, [3, 6, 2, 9, 4, 1], "cond"),
    (accumulates, [3, 1, 5, 0, 2], "while"),
])
def test_one_program_serves_every_later_size(fn, sizes, op):
    static = d2s.declarative(fn)
    for k, n in enumerate(sizes):
        for sign in (1, -1):
            x = sign * torch.arange(float(n * 3)).reshape(n, 3)
            assert torch.equal(static(x), fn(x)), (n, sign)
        if k == 1:
            after_second = len(static.program_cache)
    assert len(static.program_cache) == after_second  # the sizes after the second needed none
    assert op in _ops(static)


def test_only_the_dimensions_that_varied_are_run_time_sizes():
    static = d2s.declarative(lambda x: x.sum(0) * 2)
    static(torch.ones(2, 3))
    static(torch.ones(5, 3))
    assert static.concrete_program.inputs[0].shape == (-1, 3)
    static(torch.ones(4, 3))
    assert len(static.program_cache) == 2
    assert torch.equal(static(torch.ones(5, 4)), torch.full((4,), 10.0))
    assert static.concrete_program.inputs[0].shape == (-1, -1)


def spells(x):
    return x * len(str(x.shape[0]))


def numpy_sized(x):
    return x + torch.from_numpy(np.arange(x.shape[0], dtype=np.float32))


@pytest.mark.parametrize("fn", [spells, numpy_sized])
def test_code_that_needs_the_number_keeps_exact_sizes(fn):
    static = d2s.declarative(fn)
    sizes = (2, 5, 12, 7, 12)
    for n in sizes:
        assert torch.equal(static(torch.ones(n)), fn(torch.ones(n)))
    assert len(static.program_cache) == len(set(sizes))


@pytest.mark.parametrize("text", [lambda n: str(n), lambda n: f"{n}", lambda n: repr(n)])
def test_a_run_time_size_as_text_is_refused_at_its_line(text):
    # The symbol's text (`s0`) where eager's is the number: a silent wrong
    # value before (len(str(12)) was 3).
    def f(x):
        return x * len(text(x.shape[0]))
    static = d2s.declarative(f, input_spec=[d2s.InputSpec([None])])
    with pytest.raises(ConversionError, match="known only when the program runs") as info:
        static(torch.ones(3))
    assert info.value.filename == __file__
