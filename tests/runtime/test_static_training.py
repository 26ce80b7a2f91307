"""Static training: `opt.minimize(loss)` inside program_guard, then
exe.run(startup) and exe.run(main) in a loop, against the same loop in plain
PyTorch with torch.optim."""

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s

XS = np.array([[1.0], [2.0], [3.0], [4.0]], dtype="float32")
YS = 2 * XS

OPTIMIZERS = {
    "sgd": (lambda: d2s.optimizer.SGD(learning_rate=0.01), lambda p: torch.optim.SGD(p, lr=0.01)),
    "momentum": (lambda: d2s.optimizer.Momentum(learning_rate=0.01, momentum=0.9),
                 lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)),
    "adam": (lambda: d2s.optimizer.Adam(learning_rate=0.05), lambda p: torch.optim.Adam(p, lr=0.05)),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_linear_regression_matches_torch_optim(name):
    make_static, make_eager = OPTIMIZERS[name]
    torch.manual_seed(0)
    static_layer = nn.Linear(1, 1)
    eager_layer = nn.Linear(1, 1)
    eager_layer.load_state_dict(static_layer.state_dict())

    main, startup = d2s.Program(), d2s.Program()
    with d2s.program_guard(main, startup):
        x = d2s.data("x", [None, 1])
        y = d2s.data("y", [None, 1])
        loss = F.mse_loss(static_layer(x), y)
        make_static().minimize(loss)
    assert [op.type for op in main.global_block().ops][-3:] == ["backward", name, name]

    exe = d2s.Executor(d2s.CPUPlace())
    exe.run(startup)
    opt = make_eager(eager_layer.parameters())
    for _ in range(20):
        (static_loss,) = exe.run(main, feed={"x": XS, "y": YS}, fetch_list=[loss])
        eager_loss = F.mse_loss(eager_layer(torch.from_numpy(XS)), torch.from_numpy(YS))
        opt.zero_grad()
        eager_loss.backward()
        opt.step()
        assert static_loss.item() == eager_loss.item()
    assert torch.equal(static_layer.weight, eager_layer.weight)
    assert torch.equal(static_layer.bias, eager_layer.bias)


def test_clone_for_test_drops_training_ops():
    main, startup = d2s.Program(), d2s.Program()
    layer = nn.Linear(1, 1)
    with d2s.program_guard(main, startup):
        x = d2s.data("x", [None, 1])
        pred = layer(x)
        loss = F.mse_loss(pred, x)
        d2s.optimizer.SGD(0.1).minimize(loss)
    test_program = main.clone(for_test=True)
    types = [op.type for op in test_program.global_block().ops]
    assert "backward" not in types and "sgd" not in types
    before = layer.weight.detach().clone()
    (out,) = d2s.Executor().run(test_program, feed={"x": XS}, fetch_list=[pred.name])
    assert torch.equal(layer.weight, before)
    np.testing.assert_array_equal(out, layer(torch.from_numpy(XS)).detach().numpy())


def test_minimize_without_parameters_is_an_error():
    main = d2s.Program()
    with d2s.program_guard(main, d2s.Program()):
        x = d2s.data("x", [None, 1])
        loss = (x * 2).sum()
        with pytest.raises(ValueError, match="no trainable parameter"):
            d2s.optimizer.SGD(0.1).minimize(loss)
