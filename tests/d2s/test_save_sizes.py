"""jit.save with `None` dimensions traces at the user's sizes (the latest
call's, else d2s/save_sizes.py's defaults), never at a made-up 2, and a
program whose size checks would refuse every real input is not saved."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s
from d2s import save_sizes


class Stem(nn.Module):
    """A 4x4/stride-4 stem, a stride-2 conv + batch norm, a pool and an
    interpolate: each refused or pinned to one size when traced at 2."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 4, stride=4)
        self.down = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(3, stride=2)

    def forward(self, x):
        h = self.pool(self.norm(self.down(self.stem(x))))
        if h.mean() > 0:  # a tensor condition: the saved program holds a cond
            h = h * 2
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        return F.adaptive_avg_pool2d(h, 1).flatten(1)


class PinnedWidth(nn.Module):
    """Takes one width only: a table added as it is (no slice to the width)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(64.0))

    def forward(self, x):
        return x + self.table


class PositionTable(nn.Module):
    """Takes any length up to 64: the table sliced to the length."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(64.0))

    def forward(self, x):
        return x + self.table[: x.shape[1]]


def _ops(program):
    return [op.type for b in program.blocks for op in b.ops]


@pytest.mark.parametrize("call_first", [False, True])
def test_save_with_none_dims_serves_real_sizes(tmp_path, call_first):
    torch.manual_seed(0)
    model = Stem().eval()
    if call_first:  # the latest call's sizes are traced
        d2s.declarative(model)(torch.randn(1, 3, 48, 40))
    d2s.jit.save(model, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 3, None, None])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert "cond" in _ops(loaded.program)
    for shape in [(2, 3, 64, 64), (1, 3, 96, 80), (3, 3, 128, 200)]:
        for sign in (1, -1):
            x = sign * torch.randn(shape).abs()
            assert torch.equal(loaded(x), model(x))


def test_sizes_come_from_the_latest_call_where_it_fits_the_spec():
    model = Stem().eval()
    static = d2s.declarative(model)
    static(torch.randn(1, 3, 48, 40))
    spec = d2s.InputSpec([None, 3, None, None])
    # batch 1 is traced at 2 (torch would specialise a size of 1)
    assert save_sizes.example_sizes(static.forward, [spec]) == [[2, 3, 48, 40]]
    other = d2s.InputSpec([None, 4, None, None])  # does not fit the call: the defaults
    assert save_sizes.example_sizes(static.forward, [other]) == [[2, 4, 64, 64]]


def test_a_check_pinning_a_none_dimension_is_a_failed_save(tmp_path):
    with pytest.raises(ValueError, match=r"would refuse real inputs"):
        d2s.jit.save(PinnedWidth(), str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, None])])
    assert not (tmp_path / "m").exists()
    # the width given as it is: saved, and the batch stays dynamic
    d2s.jit.save(PinnedWidth(), str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 64])])
    x = torch.randn(5, 64)
    assert torch.equal(d2s.jit.load(str(tmp_path / "m"))(x), PinnedWidth()(x))


def test_a_table_of_at_most_the_traced_size_saves(tmp_path):
    d2s.jit.save(PositionTable(), str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, None])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for shape in [(1, 3), (4, 64), (2, 17)]:
        x = torch.randn(shape)
        assert torch.equal(loaded(x), PositionTable()(x))


class ConvHead(nn.Module):
    """A classifier head sized for the traced image: takes 2x2 images only."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))


def test_checks_failing_at_every_other_size_are_a_failed_save(tmp_path):
    """Traced at the latest call's 2x2, the head's input size is checked
    to be 4: true at 2x2 only, so saving with None sides is refused, naming
    the check; with the sides given, the batch stays dynamic."""
    model = ConvHead().eval()
    d2s.declarative(model)(torch.randn(2, 3, 2, 2))
    with pytest.raises(ValueError, match=r"would refuse real inputs: this program was converted for inputs where"):
        d2s.jit.save(model, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 3, None, None])])
    assert not (tmp_path / "m").exists()
    d2s.jit.save(model, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 3, 2, 2])])
    x = torch.randn(5, 3, 2, 2)
    assert torch.equal(d2s.jit.load(str(tmp_path / "m"))(x), model(x))


class Deep(nn.Module):
    """Six unpadded stride-2 convolutions: 64 pixels shrink to nothing
    (31, 15, 7, 3, 1, then a 3x3 kernel on 1x1), so tracing at the default
    64 fails; the default sizes grow until one serves."""

    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(*[nn.Conv2d(3 if i == 0 else 4, 4, 3, stride=2) for i in range(6)])

    def forward(self, x):
        h = self.convs(x)
        if h.mean() > 0:
            h = h * 2
        return F.adaptive_avg_pool2d(h, 1).flatten(1)


def test_default_sizes_grow_until_the_model_traces(tmp_path):
    model = Deep().eval()
    spec = d2s.InputSpec([None, 3, None, None])
    assert save_sizes.sizes_to_try(d2s.declarative(model).forward, [spec]) == [
        [[2, 3, n, n]] for n in (save_sizes.DEFAULT_SIZES[1],) + save_sizes.LARGER]
    d2s.jit.save(model, str(tmp_path / "m"), input_spec=[spec])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert "cond" in _ops(loaded.program)
    for shape in [(1, 3, 200, 256), (3, 3, 256, 256), (2, 3, 300, 220)]:
        for sign in (1, -1):
            x = sign * torch.randn(shape).abs()
            assert torch.equal(loaded(x), model(x))


def test_sizes_the_user_gave_are_not_grown():
    # the latest call fits the spec: its sizes only, and its error stays the error
    model = ConvHead().eval()
    static = d2s.declarative(model)
    static(torch.randn(2, 3, 2, 2))
    assert save_sizes.sizes_to_try(static.forward, [d2s.InputSpec([None, 3, None, None])]) == [[[2, 3, 2, 2]]]


class SqueezedWidth(nn.Module):
    """`squeeze(-1)` decides on the width after a stride-2 conv: torch drops
    that dimension where it is 1 (inputs 1 or 2 wide), keeps it elsewhere."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x):
        h = self.conv(x).squeeze(-1)
        if h.mean() > 0:
            h = h * 2
        return h.sum(1)


def test_a_saved_model_holds_programs_for_sizes_across_a_decision(tmp_path):
    """Traced at 64, the program checks that the width after the conv is not
    1; jit.save finds the sizes where that check fails (in the scan of
    save_sizes.size_paths) and saves a program traced there as a path, so the
    loaded model serves them as eager does, one program per side."""
    torch.manual_seed(0)
    model = SqueezedWidth().eval()
    d2s.jit.save(model, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 3, None, None])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert len(loaded._paths) == 1
    for program in [loaded.program, loaded._paths[0][0]]:
        assert "cond" in _ops(program) and "check_sizes" in _ops(program)
    for shape in [(2, 3, 64, 64), (1, 3, 32, 2), (2, 3, 5, 1), (3, 3, 2, 2), (2, 3, 17, 9)]:
        for sign in (1, -1):
            x = sign * torch.randn(shape).abs()
            want = model(x)
            got = loaded(x)
            assert got.shape == want.shape and torch.equal(got, want)


def test_sizes_that_do_not_trace_are_left_out():
    """A size of the scan that does not trace (a network too deep for it
    fails eagerly too) gives no path, and the other sizes failing the same
    checks are not traced again."""
    spec = d2s.InputSpec([None, 3, None, None])
    example = torch.zeros(2, 3, 64, 64)
    concrete = d2s.declarative(SqueezedWidth().eval(), input_spec=[spec]).forward.get_concrete_program(example)
    tried = []

    def retrace(examples):
        tried.append(list(examples[0].shape))
        raise RuntimeError("too small")

    assert save_sizes.size_paths(retrace, concrete, [spec], [example], 7) == []
    assert len(tried) == 1 and tried[0][3] <= 2  # the first width whose conv output is 1 wide


class MaskedSqueeze(SqueezedWidth):
    """SqueezedWidth with a mask that is None where it is all ones (as
    transformers' mask helpers): an `if` whose sides cannot be merged, so
    each side is a path of its own, at each side of the size decision."""

    def forward(self, x, mask):
        h = self.conv(x).squeeze(-1)
        m = _mask_or_none(mask)
        if m is not None:
            h = h * m.sum()
        return h.sum(1)


def _mask_or_none(mask):
    if mask.all():
        return None
    return mask


def test_size_paths_hold_both_sides_of_a_decision_on_values(tmp_path):
    torch.manual_seed(0)
    model = MaskedSqueeze().eval()
    path = str(tmp_path / "m")
    d2s.jit.save(model, path, input_spec=[d2s.InputSpec([None, 3, None, None]), d2s.InputSpec([None, None])])
    loaded = d2s.jit.load(path)
    assert len(loaded._paths) == 3  # (the traced side, the other) x (width 1 after the conv, wider)
    for shape in [(2, 3, 64, 64), (1, 3, 32, 2), (2, 3, 5, 1)]:
        for full in (True, False):
            x = torch.randn(shape)
            mask = torch.ones(shape[0], 3) if full else torch.tensor([[1.0, 0.0, 1.0]] * shape[0])
            want = model(x, mask)
            got = loaded(x, mask)
            assert got.shape == want.shape and torch.equal(got, want)


class Flagged(nn.Module):
    """A size check under a size `if` (MobileViT's `interpolate` flag): the
    check runs on one side only, which the save's replay follows."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x):
        h = self.conv(x)
        odd = False
        if h.shape[-1] != 2 * (h.shape[-1] // 2):
            odd = True
        if odd:
            h = h.squeeze(-1) if h.shape[-1] == 1 else h[..., 1:]
        return h.sum(1)


def test_checks_on_one_side_of_a_size_if_are_scanned(tmp_path):
    torch.manual_seed(0)
    model = Flagged().eval()
    d2s.jit.save(model, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 3, None, None])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert all("cond" in _ops(program) for program in [loaded.program] + [p[0] for p in loaded._paths])
    for shape in [(2, 3, 64, 64), (2, 3, 9, 6), (2, 3, 5, 2), (1, 3, 7, 1), (3, 3, 8, 10)]:
        x = torch.randn(shape)
        want = model(x)
        got = loaded(x)
        assert got.shape == want.shape and torch.equal(got, want)
