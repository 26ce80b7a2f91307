"""Functions that write a tensor in place inside a tensor `if` or `while`
(directly, or through a view made there), shared by the ONNX and
torch.export tests: an exported branch or loop must yield the new value,
since exported values are immutable. Each case: (function, op type its
program must hold, inputs taking every path). `CarriesState`: state a
forward carries from call to call, which no exported or inference model
keeps (tests/deploy/test_onnx.py, test_jit.py)."""

import torch
import torch.nn as nn


def add_in_a_branch(x):
    y = x * 1
    if x.sum() > 0:
        y.add_(1)
    return y


def mul_in_a_loop(x):
    y = x * 1
    n = (x.sum() > 0).long() * 3  # 0 or 3 trips
    while n > 0:
        y.mul_(2)
        n = n - 1
    return y


def through_a_view_in_a_branch(x):
    y = x * 1
    if x.sum() > 0:
        flat = y.view(-1)
        flat.add_(1)
    return y


def through_a_transpose_in_a_loop(x):
    y = x * 1
    n = (x.sum() > 0).long() * 2
    while n > 0:
        y.t().mul_(2)
        n = n - 1
    return y


def through_data_in_a_branch(x):
    y = x * 1
    if x.sum() > 0:
        y.data.copy_(x * 3)
    return y + 1


CASES = [(add_in_a_branch, "cond"), (mul_in_a_loop, "while"), (through_a_view_in_a_branch, "cond"),
         (through_a_transpose_in_a_loop, "while"), (through_data_in_a_branch, "cond")]


def inputs():
    """Both branches; zero and several trips."""
    torch.manual_seed(0)
    return [torch.rand(3, 3) + 0.1, -torch.rand(3, 3) - 0.1]


class CountsCalls(nn.Module):
    """Writes its own buffer under a tensor `if`: an exported model, which
    keeps no state between runs, would differ from its later calls."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        if x.sum() > 0:
            self.count.add_(1)
        return x * self.count


class CarriesState(torch.nn.Module):
    """State carried from call to call by assignment (`self.h = h`), read by
    the next call: each call's result depends on the calls before it."""

    def __init__(self):
        super().__init__()
        self.h = torch.zeros(1, 3)

    def forward(self, x):
        h = x + self.h
        if h.sum() > 0:
            h = h * 0.5
        self.h = h
        return h
