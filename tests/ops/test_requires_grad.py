"""`t.requires_grad` read while converting is eager's answer: autograd's own
for torch's kernels (ops/infer.py `note_requires_grad`), not "some input
requires grad". `(x * 2).detach().requires_grad` was True in a program,
so `if y.requires_grad:` took the other side (a silent wrong result), and
`torch.zeros(3).copy_(x)` did not require grad where eager's does."""

import pytest
import torch
import torch.nn.functional as F

import d2s


def _detach_in_place(x):
    y = x * 2
    y.detach_()
    return y


def _requires_grad_in_place(x):
    y = (x * 2).detach()
    y.requires_grad_()
    return y


MAKERS = {
    "detach": lambda x: (x * 2).detach(),
    "data": lambda x: (x * 2).data,
    "zeros_like": torch.zeros_like,
    "full_like": lambda x: torch.full_like(x, 2.0),
    "randn_like": torch.randn_like,
    "new_ones": lambda x: x.new_ones(2),
    "new_tensor": lambda x: x.new_tensor([1.0, 2.0]),
    "histc": lambda x: torch.histc(x, 4),
    "as_tensor_of_detached": lambda x: torch.as_tensor(x.detach()),
    "detach_": _detach_in_place,
    "requires_grad_": _requires_grad_in_place,
    "copy_into_a_new_tensor": lambda x: torch.zeros(3).copy_(x),
    "index_put_into_a_new_tensor": lambda x: torch.zeros(3).index_put_((torch.tensor([0]),), x[:1]),
    "factory_requires_grad": lambda x: torch.zeros(3, requires_grad=True) * 1,
    "floor": torch.floor,
    "one_hot": lambda x: F.one_hot(x.argmax(), 3).float(),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
@pytest.mark.parametrize("grad", [True, False])
def test_requires_grad_is_eagers(name, grad):
    make = MAKERS[name]

    def fn(x):
        y = make(x)
        # A Python branch on the flag: each side gives another value.
        return (y * 2 if y.requires_grad else y * 0 + 5), y.requires_grad

    x = torch.randn(3, requires_grad=True)
    torch.manual_seed(0)
    with torch.set_grad_enabled(grad):
        want = fn(x)
        torch.manual_seed(0)
        got = d2s.declarative(fn)(x)
    assert got[1] == want[1]
    assert torch.equal(got[0], want[0])
    assert got[0].requires_grad == want[0].requires_grad


def no_grad_on_one_side(x):
    if x.sum() > 0:
        y = x * 2
    else:
        with torch.no_grad():
            y = x * 3           # eager: y.requires_grad is False on this path
    z = y + 1
    return (z * 2 if z.requires_grad else z * 0 + 5), z.requires_grad


def detached_on_some_trips(x, n):
    y = x * 1
    for i in range(n):
        y = y.detach() * 2 if x.sum() > i else y * 2
    return y * 1, y.requires_grad


@pytest.mark.parametrize("first", [1.0, -1.0], ids=["grad_side_first", "no_grad_side_first"])
def test_requires_grad_of_a_value_made_without_grad_on_one_path(first):
    """The flag of a merged value depends on the side a run takes: read,
    it is a decision (checked where it is read; a run of the other side
    converts again answering that side's), never the trace's True on the
    `no_grad` path."""
    static = d2s.declarative(no_grad_on_one_side)
    for sign in (first, -first, first):
        x = (torch.rand(3) * sign).requires_grad_()
        got, want = static(x), no_grad_on_one_side(x)
        assert got[1] == want[1] and torch.equal(got[0], want[0]), sign
    assert len(static.program_cache) == 2
    assert "cond" in {op.type for c in static.program_cache for b in c.main_program.blocks for op in b.ops}


@pytest.mark.parametrize("sign, n", [(1.0, 0), (1.0, 2), (-1.0, 2), (1.0, 1)])
def test_requires_grad_after_a_loop(sign, n):
    """Zero trips keep the input's flag; a trip that detaches drops it."""
    static = d2s.declarative(detached_on_some_trips)
    for s, trips in [(sign, n), (-sign, n + 1), (sign, n)]:
        x = (torch.full((3,), 0.6) * s).requires_grad_()
        got, want = static(x, torch.tensor(trips)), detached_on_some_trips(x, torch.tensor(trips))
        assert got[1] == want[1] and torch.equal(got[0], want[0]), (s, trips)


class Scaler(torch.nn.Module):
    def __init__(self, learn):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((3,), 0.5), requires_grad=learn)

    def forward(self, x, n):
        g = x[:1]
        h = x * 1
        for i in range(n):
            h = h * self.w      # requires grad from the first trip on, where `w` does
            if not self.w.requires_grad:
                g += 1.0        # an in-place write to the input: a failed run could not be repeated
        return h * 1, h.requires_grad


@pytest.mark.parametrize("learn", [False, True])
@pytest.mark.parametrize("n", [0, 1, 3])
def test_requires_grad_of_a_loops_value_is_known_from_its_trips(learn, n):
    """A value a loop carries requires grad where a trip makes it so (was:
    always, a silent True where eager's is False). Where it depends on the
    trip count (zero trips keep the input's flag) the read is a decision."""
    model = Scaler(learn)
    static = d2s.declarative(Scaler(learn))
    for trips in (n, 2, 0):
        want, got = model(torch.ones(3), torch.tensor(trips)), static(torch.ones(3), torch.tensor(trips))
        assert got[1] == want[1] and torch.equal(got[0], want[0]), trips
    programs = list(static.forward.program_cache)
    assert len(programs) == (2 if learn else 1)
    assert all("while" in {op.type for b in p.main_program.blocks for op in b.ops} for p in programs)
