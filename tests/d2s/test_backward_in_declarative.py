"""`loss.backward()`, `opt.zero_grad()` and `opt.step()` inside a declarative
function are ops of its program: gradients (through `cond` and `while`, for
every branch and trip count) and updates equal eager's, from one program."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x, n):
        if x.mean() > 0:
            h = torch.tanh(self.a(x))
        else:
            h = torch.sigmoid(self.b(x))
        i = 0
        while i < n:
            h = h + 0.5 * torch.tanh(self.b(h))
            i += 1
        return h


def backward_only(model, x, n, y):
    loss = F.mse_loss(model(x, n), y)
    loss.backward()
    return loss


CASES = [(1.0, 0), (-1.0, 2), (1.0, 3), (-1.0, 0), (1.0, 1)]


def _inputs(sign, n):
    gen = torch.Generator().manual_seed(n)
    return torch.randn(3, 4, generator=gen).abs() * sign, torch.tensor(n), torch.randn(3, 4, generator=gen)


def test_backward_accumulates_grads_like_eager_on_every_path():
    torch.manual_seed(0)
    eager = Branchy()
    model = copy.deepcopy(eager)
    static = d2s.declarative(backward_only)
    for sign, n in CASES:
        x, count, y = _inputs(sign, n)
        x_eager, x_static = x.clone().requires_grad_(), x.clone().requires_grad_()
        for _ in range(2):  # a second backward accumulates into .grad, as eager does
            torch.testing.assert_close(static(model, x_static, count, y), backward_only(eager, x_eager, count, y))
        torch.testing.assert_close(x_static.grad, x_eager.grad)
        for (name, p), (_, q) in zip(eager.named_parameters(), model.named_parameters()):
            assert (p.grad is None) == (q.grad is None), name  # an unreached layer gets no .grad at all
            if p.grad is not None:
                torch.testing.assert_close(q.grad, p.grad, msg=lambda m: f"{sign}, {n}, {name}: {m}")
        eager.zero_grad()
        model.zero_grad()
    assert len(static.program_cache) == 1
    types = [op.type for block in static.concrete_program.main_program.blocks for op in block.ops]
    assert {"cond", "while", "tensor_backward"} <= set(types)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.AdamW(p, lr=0.05),
], ids=["momentum", "adamw"])
def test_one_program_train_step_with_torch_optim(make):
    torch.manual_seed(0)
    eager = Branchy()
    model = copy.deepcopy(eager)
    eager_opt, opt = make(eager.parameters()), make(model.parameters())

    def step(model, opt, x, n, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x, n), y)
        loss.backward()
        opt.step()
        return loss

    static = d2s.declarative(step)
    for sign, n in CASES:
        x, count, y = _inputs(sign, n)
        torch.testing.assert_close(static(model, opt, x, count, y), step(eager, eager_opt, x, count, y))
        for p, q in zip(eager.parameters(), model.parameters()):
            torch.testing.assert_close(q, p)
    torch.testing.assert_close(opt.state_dict()["state"], eager_opt.state_dict()["state"])
    assert len(static.program_cache) == 1
    types = [op.type for op in static.concrete_program.main_program.global_block().ops]
    assert types[0] == "optimizer_zero_grad" and types[-1] == "optimizer_step"


def _backward_in_branch(model, x):
    loss = model(x, 0).sum()
    if loss > 0:
        loss.backward()
    return loss


def _scheduler_in_function(model, sched, x):
    loss = model(x, 0).sum()
    sched.step()
    return loss


def _non_scalar_loss(model, x):
    model(x, 0).backward()


@pytest.mark.parametrize("fn, message", [
    (_backward_in_branch, "under a tensor condition or loop"),
    (_scheduler_in_function, "an lr scheduler"),
    (_non_scalar_loss, "only for a scalar loss"),
])
def test_what_cannot_be_staged_is_refused_at_the_users_line(fn, message):
    model = Branchy()
    args = [model]
    if fn is _scheduler_in_function:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        args.append(torch.optim.lr_scheduler.StepLR(opt, 1))
    with pytest.raises(d2s.ConversionError, match=message) as err:
        d2s.declarative(fn)(*args, torch.randn(2, 4).abs())
    assert err.value.filename == __file__


def _weighted_backward(model, x, weights):
    out = model(x)
    out.backward(torch.ones_like(out) * weights)
    return out


def test_backward_of_a_non_scalar_with_gradient():
    torch.manual_seed(0)
    eager = nn.Linear(3, 2)
    model = copy.deepcopy(eager)
    x, weights = torch.randn(4, 3), torch.tensor([1.0, -2.0])
    torch.testing.assert_close(d2s.declarative(_weighted_backward)(model, x, weights),
                               _weighted_backward(eager, x, weights))
    torch.testing.assert_close(model.weight.grad, eager.weight.grad)
    torch.testing.assert_close(model.bias.grad, eager.bias.grad)
