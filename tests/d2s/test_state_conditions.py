"""A module's tensor tested as a condition (`if not self.initted:`, lazy
initialisation in k-means and ActNorm layers): the program tests what it
holds when the program runs, as eager does, instead of refusing to freeze
its value (d2s/operators/state.py `tested`)."""

import pytest
import torch
import torch.nn as nn

import d2s
from test_translate_control_flow import all_op_types


class LazyInit(nn.Module):
    def __init__(self, form):
        super().__init__()
        self.form = form
        self.register_buffer("initted", torch.tensor(False))
        self.register_buffer("mean", torch.zeros(3))

    def forward(self, x):
        if self.form == "not":
            if not self.initted:
                self.mean.copy_(x.mean(0))
                self.initted.fill_(True)
        elif self.form == "early return":
            if self.initted:
                return x - self.mean
            self.mean.copy_(x.mean(0))
            self.initted.fill_(True)
        elif self.form == "and":
            if x.sum() > -100 and not self.initted:
                self.mean.copy_(x.mean(0))
                self.initted.fill_(True)
        elif self.form == "while":
            while not self.initted:
                self.mean.add_(x.mean(0))
                self.initted.fill_(True)
        else:  # a conditional expression
            self.mean.copy_(self.mean if self.initted else x.mean(0))
            self.initted.fill_(True)
        return x - self.mean


@pytest.mark.parametrize("form", ["not", "early return", "and", "while", "ifexp"])
def test_a_buffer_tested_as_a_condition_is_read_when_the_program_runs(form, tmp_path):
    torch.manual_seed(0)
    eager, static = LazyInit(form), d2s.declarative(LazyInit(form))
    for k in range(3):  # the first call initialises, the others do not
        x = torch.randn(4, 3) + k
        assert torch.equal(static(x), eager(x))
        assert torch.equal(static.mean, eager.mean) and torch.equal(static.initted, eager.initted)
    assert len(static.forward.program_cache) == 1
    assert {"cond", "while"} & all_op_types(static.forward.concrete_program.main_program)
    d2s.jit.save(static, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 3])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    x = torch.randn(4, 3)
    assert torch.equal(loaded(x), eager(x))
