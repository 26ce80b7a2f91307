"""Calls that write tensor arguments their schemas do not declare written
(batch norm's running statistics in training mode, also through
torch.native_batch_norm; embedding's and embedding_bag's weight under
max_norm) are effects: no pass drops an unused one or merges two equal ones.
Dead-code removal dropped `F.batch_norm(x, rm, rv, training=True)` whose
result nothing read, and CSE merged two equal calls into one update: the
running statistics silently differed from eager."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))

    def forward(self, x):
        a = F.batch_norm(x, self.rm, self.rv, training=True, momentum=0.5)
        b = F.batch_norm(x, self.rm, self.rv, training=True, momentum=0.5)
        return a + b


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))
        self.emb = nn.Embedding(5, 3, max_norm=1.0)

    def forward(self, x, ids):
        F.batch_norm(x, self.rm, self.rv, training=True, momentum=0.5)
        F.instance_norm(x.unsqueeze(0).transpose(1, 2), self.rm, self.rv, use_input_stats=True)
        self.emb(ids)
        if x.sum() > 0:
            return x * 2
        return x - 1


class UnusedNative(nn.Module):
    """The native functions behind the composites (their schemas say
    nothing of the writes either) and embedding_bag's renormalisation."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))
        self.register_buffer("table", torch.randn(5, 3) * 3)
        self.register_buffer("offsets", torch.tensor([0, 1]))

    def forward(self, x, ids):
        torch.native_batch_norm(x, None, None, self.rm, self.rv, True, 0.5, 1e-5)
        F.embedding_bag(ids, self.table, self.offsets, max_norm=1.0)
        if x.sum() > 0:
            return x * 2
        return x - 1


@pytest.mark.parametrize("make", [Twice, Unused, UnusedNative])
@pytest.mark.parametrize("optimize", ["default", "fast"])
def test_undeclared_writes_happen_as_in_eager(make, optimize):
    torch.manual_seed(0)
    eager = make()
    torch.manual_seed(0)
    module = make()
    static = d2s.declarative(module, optimize=optimize)
    ids = torch.tensor([1, 2])
    for x in (torch.randn(4, 3) + 2, -torch.rand(4, 3) - 1):  # both branches of Unused
        args = (x,) if make is Twice else (x, ids)
        assert torch.equal(static(*args), eager(*args))
        for name, value in eager.state_dict().items():
            assert torch.equal(module.state_dict()[name], value), name
