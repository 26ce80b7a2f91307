"""Numbers read from tensors while tracing take the traced call's values as
their symbols' hints (ops/examples.py): the program's own size checks hold
for the call it was built from, and every later call either gives eager's
result or fails a check, never a silent difference."""

import pytest
import torch
import torch.nn.functional as F

import d2s
from runtime.errors import ConversionError


def masked_softmax(att, lengths):
    # A length read as a Python int sizes a new tensor and an arange.
    lengths = lengths.type_as(att.data)
    idx = torch.arange(0, int(lengths[0]), out=att.data.new(int(lengths[0])).long()).unsqueeze(1)
    mask = (idx.float() < lengths.unsqueeze(0)).float()
    e = torch.exp(att) * mask
    return e / (e.sum(0, True) + 1e-4)


def pad_to(x1, x2):
    # Sizes wrapped in tensors, then given to F.pad: the padded size must
    # equal x2's for the cat, which holds only for the real differences.
    dy = torch.tensor([x2.size(2) - x1.size(2)])
    dx = torch.tensor([x2.size(3) - x1.size(3)])
    x1 = F.pad(x1, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
    return torch.cat([x2, x1], dim=1)


def narrow_by(x, n):
    # The number depends on the input's values through pure ops.
    k = int((n * 2).sum() - 1)
    return x.new(k).fill_(1.0) * x[:k]


def _close(fn, args):
    torch.testing.assert_close(d2s.declarative(fn)(*args), fn(*args), rtol=0, atol=0)


@pytest.mark.parametrize("lengths", [[4, 3, 2, 1], [4, 4, 1, 0], [0.3, 0.5, 0.2, 0.9]])
def test_int_of_an_input_sizes_a_tensor(lengths):
    torch.manual_seed(0)
    _close(masked_softmax, (torch.rand(4), torch.tensor(lengths)))


@pytest.mark.parametrize("shapes", [((1, 2, 4, 4), (1, 2, 6, 5)), ((1, 1, 3, 3), (1, 1, 3, 4))])
def test_sizes_wrapped_in_tensors_pad_then_cat(shapes):
    _close(pad_to, tuple(torch.rand(s) for s in shapes))


def test_one_program_later_values_match_eager_or_fail_a_check():
    fn = d2s.declarative(narrow_by)
    x = torch.arange(8.0)
    for values in ([1, 2], [2, 2], [0, 1]):  # the first builds the program; the others reuse it
        n = torch.tensor(values)
        # or, where one breaks a size check of the program, convert again (d2s/decisions.py)
        torch.testing.assert_close(fn(x, n), narrow_by(x, n), rtol=0, atol=0)
    # k = 1 ([0, 1]) breaks no check: the product's `k != 1` is a layout
    # decision (both operands' lengths are k, so their shapes agree at 1) and
    # goes like other shape-neutral guards; one program serves all three.
    assert len(fn.program_cache) == 1


def test_an_input_written_in_place_is_not_its_example():
    def bump_then_read(x, n):
        n.add_(2)  # the replay must not take the example as n's value here
        return x[: int(n[0])] * 2

    x = torch.arange(6.0)
    got = d2s.declarative(bump_then_read)(x, torch.tensor([1]))
    torch.testing.assert_close(got, bump_then_read(x, torch.tensor([1])), rtol=0, atol=0)


class NormThenCount(torch.nn.Module):
    """A norm in training mode updates its running statistics (a write its
    schema does not declare); a number read after it needs the example's
    values, which the replay finds without running the norm again."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        y = self.norm(x)
        n = int((y > 0).sum())
        return torch.zeros(n) + y.sum()


@pytest.mark.parametrize("norm", [lambda: torch.nn.BatchNorm1d(4),
                                  lambda: torch.nn.InstanceNorm1d(4, track_running_stats=True)],
                         ids=["batch_norm", "instance_norm"])
def test_a_replay_for_an_example_never_repeats_a_side_effect(norm):
    torch.manual_seed(0)
    eager = NormThenCount(norm()).train()
    static = d2s.declarative(NormThenCount(norm()).train())
    static.load_state_dict(eager.state_dict())
    for shift in (0.0, 1.0, 2.0):  # the first call converts; the program serves the others
        x = torch.randn(5, 4, 3 if isinstance(eager.norm, torch.nn.InstanceNorm1d) else 1).squeeze(-1) + shift
        assert torch.equal(static(x), eager(x))
        for name, want in eager.norm.state_dict().items():
            assert torch.equal(static.norm.state_dict()[name], want), name
    assert len(static.forward.program_cache) == 1


def sized_by_a_constant_after_a_masked_select(x):
    picked = x[x > 0]  # a data-dependent size: tracing goes on with fake tensors from here
    n = torch.div(x.shape[1], 2, rounding_mode="trunc")  # a tensor made from constants
    if x.sum() > 0:
        a = x.reshape(x.shape[0], n, 2)  # Longformer's chunks: two views sized by `n`...
        b = x.as_strided((x.shape[0], n, 2), (x.shape[1], 2, 1))
        y = (a * b).view(x.shape[0] * x.shape[1])  # ...must be seen to agree, as they do for the example
    else:
        y = x.view(-1)
    return y, picked.sum()


@pytest.mark.parametrize("sign", [1, -1])
def test_a_number_read_by_a_fake_tensor_kernel_has_its_example_as_hint(sign):
    """`x.reshape(b, n, 2)` reads the 0-d `n` as an int inside the kernel:
    under fake tensors as under meta ones, the symbol it makes gets `n`'s
    example value as its hint (a made-up hint failed `a * b` while tracing)."""
    static = d2s.declarative(sized_by_a_constant_after_a_masked_select)
    for x in (torch.randn(3, 8).abs() * sign, torch.randn(3, 8).abs() * -sign):
        for got, want in zip(static(x), sized_by_a_constant_after_a_masked_select(x)):
            assert torch.equal(got, want)
    assert "cond" in {op.type for op in static.concrete_program.main_program.global_block().ops}


# -- in-place writes in the replay ------------------------------------------------------------
# `bool(t)` in torch's own code is the example's answer, checked when the
# program runs (ops/capture.py `_decided`). These functions call `__bool__`
# where torch would; the fixture makes the test's code count as torch's.

@pytest.fixture
def decided_as_in_torch(monkeypatch):
    from ops import capture
    monkeypatch.setattr(capture, "called_from_torch", lambda: True)


def mask_made_in_place(x, lengths):
    # F._canonical_mask's way: a fresh tensor written in place.
    mask = torch.zeros_like(lengths).masked_fill_(lengths > 2, 1)
    mask[0] = mask[0] * 3  # read before the write, which it does not see
    return x * 2 if (mask.sum() > 4).__bool__() else x - 1


def view_taken_before_the_write(x, n):
    buf = torch.zeros_like(n)
    head = buf[:1]  # sees the write below
    buf.fill_(1)
    return x * 2 if (head.sum() == n[0]).__bool__() else x - 1


def sibling_view_written(x, n):
    buf = torch.zeros_like(n)
    head = buf[:1]
    rest = buf[0:]  # the same memory through another name
    rest.fill_(1)
    return x * 2 if (head.sum() == n[0]).__bool__() else x - 1


def input_written_through_an_alias(x, n):
    t = n.contiguous()  # n itself
    t.add_(1)
    return x * 2 if (n[0] > 1).__bool__() else x - 1


@pytest.mark.usefixtures("decided_as_in_torch")
def test_a_tensor_written_in_place_by_the_replay_decides_for_the_example():
    """The replay runs an in-place op on a copy of a tensor only it holds:
    each answer of the decision has its program, which checks it. The write
    was not replayed, and the decision was refused."""
    static = d2s.declarative(mask_made_in_place)
    x = torch.arange(4.0)
    cases = [torch.tensor([3, 0, 4, 5]), torch.tensor([3, 0, 0, 5]), torch.tensor([0, 4, 0, 0]),
             torch.tensor([0, 9, 9, 0])]
    for lengths in cases:  # answers True, False, False, True
        assert torch.equal(static(x, lengths), mask_made_in_place(x, lengths))
    assert len(static.program_cache) == 2
    for concrete in static.program_cache:
        types = [op.type for op in concrete.main_program.global_block().ops]
        assert "torch.Tensor.masked_fill_" in types and "check_bool" in types


@pytest.mark.usefixtures("decided_as_in_torch")
@pytest.mark.parametrize("fn", [view_taken_before_the_write, sibling_view_written, input_written_through_an_alias])
def test_a_write_another_value_would_see_is_not_replayed(fn):
    """A view taken before a write to its memory (through its base or a
    sibling), or an example written through an alias, would see the write; replayed on a copy they would not, and the
    example's answer would be wrong. Refused, as any decision the replay
    cannot tell."""
    with pytest.raises(ConversionError, match="known only when the program runs"):
        d2s.declarative(fn)(torch.arange(4.0), torch.tensor([1]))


# -- writes a replay must not miss: in a branch, through a view --------------------------------

def written_in_a_branch(x):
    acc = torch.zeros(3)
    if x.sum() > 0:
        acc.add_(1.0)
    if acc.sum() > 2.5:  # a side replay must tell right, or refuse to tell
        return x * 1, None
    return x * 2, x


def written_in_the_test(x):
    acc = torch.zeros(3)
    if x.sum() > 0 and acc.add_(1.0).sum() > 2.5:
        return x * 1, None
    return x * 2, x


def base_written_through_a_view(x):
    acc = torch.zeros(3)
    head = acc[:2]
    head.add_(2.0)
    if acc.sum() > 2.5:
        return x * 1, None
    return x * 2, x


def base_written_through_a_view_in_a_branch(x):
    acc = torch.zeros(3)
    head = acc[:2]
    if x.sum() > 0:
        head.add_(2.0)
    if acc.sum() > 2.5:
        return x * 1, None
    return x * 2, x


@pytest.mark.parametrize("fn", [written_in_a_branch, written_in_the_test, base_written_through_a_view,
                                base_written_through_a_view_in_a_branch], ids=lambda f: f.__name__)
@pytest.mark.parametrize("first", [1.0, -1.0], ids=["positive_first", "negative_first"])
def test_a_value_written_where_the_replay_cannot_follow_is_not_replayed_stale(fn, first):
    """The replay read `acc` as it was before a write in a branch (or the
    `and` of a test), or before a write through its view: it told the wrong
    side of the next `if`, and each program converted again was converted
    for it too, until the call failed at the limit of 8 programs
    (DecisionFailed). Now such a read is unknown: the side is a guess a run
    corrects."""
    static = d2s.declarative(fn)
    for sign in (first, -first, first):
        x = torch.ones(3) * sign
        got, want = static(x), fn(x)
        assert torch.equal(got[0], want[0]) and (got[1] is None) == (want[1] is None), sign
    assert len(static.program_cache) <= 3
    assert all("cond" in {op.type for op in c.main_program.global_block().ops} for c in static.program_cache)
