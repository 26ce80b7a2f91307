"""`t.item()`, `int(t)`, `float(t)`, `bool(t)` in converted code stand for
the number the tensor holds at that point when the program runs: a snapshot
(later in-place ops on the tensor do not change it), also for a module's own
buffers (`if self.initialized.item() == 0:` decides on every call, as in
eager, instead of being frozen or refused)."""

import copy
import math

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


def number_meets_tensor(x, t):
    s = float(x.max()) / 3                       # a double
    n = int(x.argmax())
    return t * s, s * t, t + s, t < s, t == s, t * n, torch.where(t > 0, t, s), t.clamp(max=s)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", [(), (3,)])
def test_a_number_from_a_tensor_promotes_as_a_python_number(dtype, shape):
    """Eager's wrapped-number promotion (`t_f32_0d * s` is float32, `t_int * s`
    the default float dtype) and its values, bit for bit, for every dtype and
    for 0-d and dimensioned tensors."""
    x = torch.tensor([0.1, 1.7, -0.2])
    t = (torch.tensor([0.3, -1.0, 2.0]) if shape else torch.tensor(0.5666)).to(dtype)
    want = number_meets_tensor(x, t)
    got = d2s.declarative(number_meets_tensor)(x, t)
    for a, b in zip(want, got):
        assert a.dtype == b.dtype and torch.equal(a, b), (a, b)


def half_times_number(x, dtype, shape):
    s = float(x.max())
    h = x.to(dtype) if shape else x.to(dtype).sum()
    return h * s


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(), (3,)])
def test_a_float_number_with_a_half_tensor_is_refused_at_the_line(dtype, shape):
    """torch computes float16/bfloat16 in float32 and reads a Python float
    into float32; a 0-d tensor operand is rounded to float16/bfloat16 first
    by some kernels, so d2s says so instead of rounding twice."""
    with pytest.raises(d2s.ConversionError, match=r"test_numbers_from_tensors.py.*`torch.Tensor.__mul__` of "
                       r"`s`, a Python number in eager code.*float16/bfloat16 rounding"):
        d2s.declarative(half_times_number)(torch.ones(3), dtype, shape)


def rounds_a_number(x):
    s = float(x.max())
    return round(s), math.floor(s), math.ceil(s), math.trunc(s), isinstance(round(s), int)


@pytest.mark.parametrize("top", [2.5, 3.5, -2.5, 1.7, -0.2, 4.0])
def test_round_floor_ceil_trunc_of_a_number_are_python_ints(top):
    """Python rounds half to even, as torch.round does; one program serves every value."""
    static = d2s.declarative(rounds_a_number)
    x = torch.tensor([top, top - 9.0])
    got = static(x)
    assert [int(g) for g in got[:4]] == list(rounds_a_number(x)[:4]) and got[4] is True


def rounds_to_digits(x):
    return round(float(x.max()), 2)


def test_round_with_digits_is_refused_at_the_line():
    with pytest.raises(d2s.ConversionError, match=r"round\(\) with ndigits of this value, a Python number"):
        d2s.declarative(rounds_to_digits)(torch.ones(3))


def psnr(x, y):
    mse = ((x - y) ** 2).mean()
    return 10 * math.log10(1 / mse.item())


def test_a_libm_function_of_a_number_is_refused_naming_what_to_do():
    """`math.log10` asks for a double now (libm's results are not torch's to
    the last bit): it was refused as `float(x)` of "this tensor"."""
    with pytest.raises(d2s.ConversionError, match=r"this number is a Python number read from a tensor.*"
                                                   r"torch\.log10") as info:
        d2s.declarative(psnr)(torch.rand(3), torch.rand(3))
    assert info.value.filename == __file__


def counts_and_reads(x, n):
    """A counter a tensor loop carries and numbers read from tensors, returned."""
    steps = 0
    total = 0.0
    for t in range(n):
        steps += 1
        total = total + x[t].sum().item()
    return x * 2, steps, [total, int(x.argmax())], {"positive": bool(x.sum() > 0)}


@pytest.mark.parametrize("n", [0, 1, 3])
def test_returned_numbers_are_python_numbers_on_every_path(n):
    """What the function returns holds them as eager's Python numbers (they
    were 0-d tensors), whether the loop ran no, one or several trips, with
    one program for every trip count."""
    static = d2s.declarative(counts_and_reads)
    for k in (n, 3 - n, n):
        x = torch.arange(12.0).view(4, 3) - 5
        got, want = static(x, torch.tensor(k)), counts_and_reads(x, torch.tensor(k))
        assert torch.equal(got[0], want[0])
        assert [type(v) for v in (got[1], *got[2], got[3]["positive"])] == \
            [type(v) for v in (want[1], *want[2], want[3]["positive"])]
        assert got[1:] == want[1:]
    assert len(static.program_cache) == 1
    assert any(op.type == "while" for op in static.concrete_program.main_program.global_block().ops)


def in_a_dict(x):
    n = int(x.sum())
    return x + 1 if n in {3: "three", 6: "six", "z": 0} else x - 1


def in_a_set(x):
    n = x.long().tolist()
    return x * 2 if n[0] in {1, 4} else x


def not_in_a_tuple(x):
    n = x[0].item()
    if n not in (1.0, 2, None):
        x = x * 5
    return x


@pytest.mark.parametrize("fn", [in_a_dict, in_a_set, not_in_a_tuple])
def test_a_number_in_a_container_is_found_by_value(fn):
    """`n in {3: ...}` of a number read from a tensor: eager finds it by
    value; by the Variable's identity it was never found (a silent wrong
    branch). Each value takes its own side of one program's `cond`."""
    static = d2s.declarative(fn)
    for values in ([1.0, 2.0], [4.0, 2.0], [2.0, 4.0], [1.5, 1.5]):
        x = torch.tensor(values)
        assert torch.equal(static(x), fn(x))
    assert len(static.program_cache) == 1
    assert "cond" in {op.type for block in static.concrete_program.main_program.blocks for op in block.ops}


def as_set(x):
    return x * len(set(x.long().tolist()))


def as_key(x):
    return {int(x.sum()): x}


def counted(x):
    import collections
    return x * collections.Counter(x.long().tolist())[1]


@pytest.mark.parametrize("fn, marker", [(as_set, "len(set("), (as_key, "{int("), (counted, "Counter")])
def test_hashing_a_number_is_refused_at_the_line(fn, marker):
    """`set(ns)` counted [1, 1] as two members (one per Variable)."""
    import inspect
    from runtime.errors import ConversionError
    with pytest.raises(ConversionError, match="found by identity, not by value") as info:
        d2s.declarative(fn)(torch.tensor([1.0, 1.0]))
    lines, first = inspect.getsourcelines(fn)
    assert info.value.filename == __file__
    assert info.value.lineno == first + next(i for i, line in enumerate(lines) if marker in line)


def looked_up(x):
    table = {1: 10.0, 2.0: 20.0, "name": 0.5}
    return x * table[int(x.sum())]


class Routed(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

    def forward(self, x):
        return {0: self.a, 3: self.b}[int(x.sum() > 0) * 3](x)


def test_a_dict_indexed_by_a_number_finds_its_value_at_run_time():
    """`table[int(t)]` looked the Variable up by identity: a KeyError naming
    a graph value. Now the value whose key equals the run's number (`2`
    finds the key `2.0`, as Python's lookup does), one program for all;
    a number that is no key raises KeyError when the program runs."""
    static = d2s.declarative(looked_up)
    for v in (1.0, 2.0, 1.0):
        x = torch.tensor([v / 2, v / 2])
        assert torch.equal(static(x), looked_up(x))
    assert len(static.program_cache) == 1
    with pytest.raises(KeyError):
        looked_up(torch.tensor([1.5, 1.5]))
    with pytest.raises(KeyError, match="no key of the dict equals the number"):
        static(torch.tensor([1.5, 1.5]))
    eager, routed = Routed(), d2s.declarative(Routed())
    for sign in (1.0, -1.0):
        x = torch.full((3, 2), sign)
        assert torch.equal(routed(x), eager(x))
    assert len(routed.forward.program_cache) == 1
    assert "cond" in {op.type for block in routed.forward.concrete_program.main_program.blocks for op in block.ops}
