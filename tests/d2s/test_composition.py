"""Declarative code composes with the static API: a declarative module or
function called on `d2s.data` Variables inside `program_guard` joins the
current program, so `minimize` trains it; DDP wraps declarative models, not
the other way round."""

import copy
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from mnist import MNIST, loss_fn, synthetic_digits  # noqa: E402


def test_static_api_trains_a_declarative_model_loss_for_loss():
    torch.manual_seed(0)
    eager = MNIST()
    model = d2s.declarative(copy.deepcopy(eager))
    main, startup = d2s.Program(), d2s.Program()
    with d2s.program_guard(main, startup):
        image = d2s.data("image", [None, 1, 28, 28])
        label = d2s.data("label", [None], "int64")
        probs, acc = model(image, label)  # the `if label is not None` branch, inlined
        loss = loss_fn(probs, label)
        d2s.optimizer.Momentum(learning_rate=0.05, momentum=0.9).minimize(loss)
    names = set(main.global_block().vars)
    assert {"conv_pool_1.conv.weight", "fc.bias"} <= names  # the module's own parameter names
    assert len(model.forward.program_cache) == 0  # nothing built on the side

    exe = d2s.Executor(d2s.CPUPlace())
    exe.run(startup)
    opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    images, labels = synthetic_digits(4 * 8, seed=1)
    for step in range(4):
        x, y = images[step * 8:(step + 1) * 8], labels[step * 8:(step + 1) * 8]
        static_loss, static_acc = exe.run(main, feed={"image": x.numpy(), "label": y.numpy()},
                                          fetch_list=[loss, acc])
        probs_e, acc_e = eager(x, y)
        eager_loss = loss_fn(probs_e, y)
        opt.zero_grad()
        eager_loss.backward()
        opt.step()
        np.testing.assert_allclose(static_loss, eager_loss.item(), rtol=1e-5)
        np.testing.assert_allclose(static_acc, acc_e.item())
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


@d2s.declarative
def clipped_relu(x, limit):
    if limit > 0:
        return torch.clamp(x, 0.0, limit)
    return F.relu(x)


def test_declarative_function_with_a_python_argument_inlines():
    main = d2s.Program()
    with d2s.program_guard(main, d2s.Program()):
        x = d2s.data("x", [None, 3])
        y = clipped_relu(x, 1.5)
    assert [op.type for op in main.global_block().ops] == ["torch.clamp"]
    (out,) = d2s.Executor().run(main, feed={"x": np.array([[-1.0, 0.5, 3.0]], "float32")}, fetch_list=[y])
    np.testing.assert_array_equal(out, [[0.0, 0.5, 1.5]])


def test_declarative_of_ddp_says_to_wrap_the_other_way_round():
    ddp = torch.nn.DataParallel(nn.Linear(2, 2))
    with pytest.raises(d2s.ConversionError, match=r"DataParallel\(d2s.declarative\(model\)\)"):
        d2s.declarative(ddp)


def test_a_data_parallel_module_called_inside_declarative_code_is_refused():
    wrapped = torch.nn.DataParallel(nn.Linear(2, 2))

    def forward(x):
        return wrapped(x) * 2

    with pytest.raises(d2s.ConversionError, match=r"wrap the other way round") as err:
        d2s.declarative(forward)(torch.ones(1, 2))
    assert err.value.filename == __file__


class Branchy(nn.Module):
    """Each branch uses its own layer: a step that takes one branch gives the
    other layer no gradient, and torch.optim leaves it (and its state) alone."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        if x.mean() > 0:
            h = torch.tanh(self.a(x))
        else:
            h = torch.sigmoid(self.b(x))
        i = torch.zeros(())
        while i < 2:  # a tensor loop variable: a graph `while`
            h = h + 0.5 * torch.tanh(h)
            i = i + 1
        return h


@pytest.mark.parametrize("static_opt, eager_opt", [
    (lambda: d2s.optimizer.Momentum(0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    (lambda: d2s.optimizer.Adam(0.05), lambda p: torch.optim.Adam(p, lr=0.05)),
], ids=["momentum", "adam"])
def test_minimize_skips_parameters_the_taken_branch_does_not_reach(static_opt, eager_opt):
    torch.manual_seed(0)
    eager = Branchy()
    model = d2s.declarative(copy.deepcopy(eager))
    main, startup = d2s.Program(), d2s.Program()
    with d2s.program_guard(main, startup):
        x, y = d2s.data("x", [None, 4]), d2s.data("y", [None, 4])
        loss = F.mse_loss(model(x), y)
        static_opt().minimize(loss)
    assert {"cond", "while"} <= {op.type for op in main.global_block().ops}
    exe = d2s.Executor()
    exe.run(startup)
    opt = eager_opt(eager.parameters())
    gen = torch.Generator().manual_seed(2)
    for sign in (1, -1, -1, 1, 1, -1):
        xs, ys = torch.rand(3, 4, generator=gen) * sign, torch.randn(3, 4, generator=gen)
        (static_loss,) = exe.run(main, feed={"x": xs, "y": ys}, fetch_list=[loss])
        eager_loss = F.mse_loss(eager(xs), ys)
        opt.zero_grad()
        eager_loss.backward()
        opt.step()
        assert static_loss.item() == eager_loss.item()
    for p, q in zip(eager.parameters(), model.parameters()):
        assert torch.equal(p, q)
