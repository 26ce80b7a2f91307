"""Capture of calls that write a tensor argument although their op type
does not (`out=t`, `inplace=True`): recorded as the type's writing variant
(`torch.mul!`), an op that mutates its first input, so no pass drops,
merges or reorders it. A statement `torch.mul(w, 2.0, out=buf)` whose
result nobody reads was dropped as dead code (a silent wrong result)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s
from runtime import ConversionError
from runtime.optable import _OPS, get_op_def


def mul_out(y, buf):
    torch.mul(y, 2.0, out=buf)


def clamp_out(y, buf):
    torch.clamp(y, -1.0, 1.0, out=buf)


def relu_keyword(y, buf):
    F.relu(buf, inplace=True)


def relu_positional(y, buf):
    F.relu(buf, True)


def leaky_relu_keyword(y, buf):
    F.leaky_relu(buf, 0.1, inplace=True)


def relu_int(y, buf):
    F.relu(buf, inplace=1)  # the functional tests its truth: eager writes (ParityBench's FGVC_PIM)


WRITERS = {f.__name__: f for f in (mul_out, clamp_out, relu_keyword, relu_positional, leaky_relu_keyword, relu_int)}
TYPES = {"mul_out": "torch.mul!", "clamp_out": "torch.clamp!", "relu_keyword": "torch.nn.functional.relu!",
         "relu_positional": "torch.nn.functional.relu!", "leaky_relu_keyword": "torch.nn.functional.leaky_relu!",
         "relu_int": "torch.nn.functional.relu!"}


def _walk(writer):
    def walk(x, n):
        buf = x - 1.0
        i = 0
        while i < n:
            writer(x, buf)  # the result is not read: only the write shows
            x = x + buf
            if x.sum() > 0:
                writer(x * 0.5, buf)
                x = x - buf
            i += 1
        return x, buf
    return walk


@pytest.fixture(scope="module")
def walks():
    return {name: (_walk(w), d2s.declarative(_walk(w))) for name, w in WRITERS.items()}


@pytest.mark.parametrize("name", sorted(WRITERS))
@pytest.mark.parametrize("start", [-3.0, 0.5])  # the `if`: never taken, taken
@pytest.mark.parametrize("n", [0, 1, 3])
def test_writes_through_arguments_are_kept_on_every_path(walks, name, start, n):
    eager, static = walks[name]
    x = torch.tensor([start, -0.25, 2.0])
    want = eager(x.clone(), torch.tensor(n))
    got = static(x.clone(), torch.tensor(n))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    program = static.concrete_program.main_program
    types = [op.type for b in program.blocks for op in b.ops]
    assert {"while", "cond"} <= set(types) and types.count(TYPES[name]) == 2
    assert len(static.program_cache) == 1


def test_out_into_a_module_buffer():
    class Accumulate(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(3))

        def forward(self, x):
            torch.add(self.total, x, out=self.total)
            return x * 2

    eager, static = Accumulate(), d2s.declarative(Accumulate())
    for k in range(3):
        x = torch.full((3,), float(k))
        assert torch.equal(static(x), eager(x))
    assert torch.equal(static.total, eager.total) and torch.equal(eager.total, torch.full((3,), 3.0))


def test_out_with_several_tensors_is_refused_at_the_user_line():
    @d2s.declarative
    def sort_into(x):
        values, indices = torch.empty(3), torch.empty(3, dtype=torch.long)
        torch.sort(x, out=(values, indices))
        return values

    with pytest.raises(ConversionError, match="writes several tensors") as info:
        sort_into(torch.randn(3))
    assert info.value.filename == __file__


def test_a_loaded_program_names_the_writing_variant_first():
    """A program loaded in a fresh process names `torch.mul!` before any
    capture made it: the table derives it from `torch.mul`."""
    base = get_op_def("torch.mul")
    _OPS.pop("torch.mul!", None)
    variant = get_op_def("torch.mul!")
    assert variant.mutates and not base.mutates and variant.kernel is base.kernel
