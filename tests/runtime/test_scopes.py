"""One static program run with two Scopes trains two independent copies of
the network: the startup program initialises parameters and optimizer state
in the scope it runs in, `exe.run(main, scope=s)` reads and updates `s`'s."""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s


def test_two_scopes_train_two_copies_independently():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    initial = copy.deepcopy(net)
    main, startup = d2s.Program(), d2s.Program()
    with d2s.program_guard(main, startup):
        x = d2s.data("x", [None, 3])
        y = d2s.data("y", [None, 1])
        loss = F.mse_loss(net(x), y)
        d2s.optimizer.Adam(learning_rate=0.05).minimize(loss)
    assert [op.type for op in startup.global_block().ops].count("scope_copy") == 4

    exe = d2s.Executor(d2s.CPUPlace())
    scopes = [d2s.Scope(), d2s.Scope()]
    eager = [copy.deepcopy(net), copy.deepcopy(net)]
    opts = [torch.optim.Adam(m.parameters(), lr=0.05) for m in eager]
    for scope in scopes:
        exe.run(startup, scope=scope)
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        for k in range(2):  # different data for each copy
            xs, ys = torch.randn(5, 3, generator=gen) * (k + 1), torch.randn(5, 1, generator=gen)
            (static_loss,) = exe.run(main, feed={"x": xs, "y": ys}, fetch_list=[loss], scope=scopes[k])
            eager_loss = F.mse_loss(eager[k](xs), ys)
            opts[k].zero_grad()
            eager_loss.backward()
            opts[k].step()
            assert static_loss.item() == eager_loss.item()
    for k in range(2):
        for (name, p), var in zip(eager[k].named_parameters(), main.persistable_vars()):
            assert torch.equal(scopes[k].find_var(var.name), p), name
    assert not torch.equal(scopes[0].find_var("param_0"), scopes[1].find_var("param_0"))
    # without a scope the program keeps using the module's own tensors, untouched so far
    for p, q in zip(initial.parameters(), net.parameters()):
        assert torch.equal(p, q)
    exe.run(startup)  # the global scope: optimizer state; parameters stay the module's
    xs, ys = torch.ones(2, 3), torch.ones(2, 1)
    exe.run(main, feed={"x": xs, "y": ys}, fetch_list=[loss])
    opt = torch.optim.Adam(initial.parameters(), lr=0.05)
    F.mse_loss(initial(xs), ys).backward()
    opt.step()
    for p, q in zip(initial.parameters(), net.parameters()):
        assert torch.equal(p, q)
