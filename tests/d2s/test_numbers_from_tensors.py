"""`t.item()`, `int(t)`, `float(t)`, `bool(t)` in converted code stand for
the number the tensor holds at that point when the program runs: a snapshot
(later in-place ops on the tensor do not change it), also for a module's own
buffers (`if self.initialized.item() == 0:` decides on every call, as in
eager, instead of being frozen or refused)."""

import copy

import pytest
import torch
import torch.nn as nn

import d2s


def item_then_bump(x, t):
    n = t.item()
    t.add_(1)
    return x * n


def casts_then_bump(x, t):
    n, f, b = int(t), float(t), bool(t > 3)
    t.add_(1)
    return x * n + f + b


@pytest.mark.parametrize("fn", [item_then_bump, casts_then_bump])
@pytest.mark.parametrize("start", [3, 5])
def test_a_number_is_a_snapshot_of_the_tensor(fn, start):
    static = d2s.declarative(fn)
    x = torch.ones(2)
    t_eager, t_static = torch.tensor(start), torch.tensor(start)
    torch.testing.assert_close(static(x, t_static), fn(x, t_eager), rtol=0, atol=0)
    assert t_static.item() == t_eager.item()


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.tensor(3))

    def forward(self, x):
        n = self.count.item()
        self.count.add_(1)
        return x * n


class InitOnce(nn.Module):
    """Data-dependent initialisation on the first call (ActNorm, Glow)."""

    def __init__(self, c):
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(1, c, 1, 1))
        self.scale = nn.Parameter(torch.ones(1, c, 1, 1))
        self.register_buffer("initialized", torch.tensor(0, dtype=torch.uint8))

    def forward(self, x):
        if self.initialized.item() == 0:
            with torch.no_grad():
                flat = x.permute(1, 0, 2, 3).reshape(x.shape[1], -1)
                self.loc.data.copy_(-flat.mean(1).view(1, -1, 1, 1))
                self.scale.data.copy_(1 / (flat.std(1).view(1, -1, 1, 1) + 1e-6))
            self.initialized.fill_(1)
        return self.scale * (x + self.loc)


@pytest.mark.parametrize("make, shape", [(Counter, (2,)), (lambda: InitOnce(3), (2, 3, 4, 4))])
def test_a_module_buffer_read_as_a_number_follows_every_call(make, shape):
    torch.manual_seed(0)
    eager = make()
    static = d2s.declarative(copy.deepcopy(eager))
    for i in range(3):  # the first call takes the other path than the later ones
        x = torch.rand(shape) + i
        torch.testing.assert_close(static(x), eager(x), rtol=0, atol=0)
    assert len(static.forward.program_cache) == 1
    for (name, a), (_, b) in zip(eager.state_dict().items(), static.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_init_once_branch_is_a_cond():
    static = d2s.declarative(InitOnce(3))
    program = d2s.ProgramTranslator().get_program(static, torch.rand(2, 3, 4, 4))[0]
    assert "cond" in [op.type for op in program.global_block().ops]
