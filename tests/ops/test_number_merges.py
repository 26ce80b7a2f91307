"""Python numbers of two types on the two paths of a tensor `if`
(ops/control_flow/merge.py `_merge_number_types`).

A literal used to take the other side's dtype: `return 0.5` after a path
returning `7` came back as `0`, `k = 3` beside a run-time bool as `True`.
Now each path keeps its value's type: where the side the inputs take is
known the other side is a decision; where it is not, both widen, and the
widened value is decided (ops/number_paths.py) where its type shows.
"""

import pytest
import torch

import d2s


def int_or_float_returned(x):
    if x.sum() > 0:
        return x * 1, 7
    return x * 1, 0.5


def int_or_run_time_bool(x):
    k = 3
    if x.sum() > 0:
        k = x.sum().item() > 1
    return x * 1, k


def bool_or_int_returned(x):
    if x.sum() > 0:
        return x * 1, 7
    return x * 1, False


def widened_in_a_loop(x):
    """The side of the `if` in the loop is not known from the example: the
    literal and the float widen, the value is pending, and returned it
    decides the `if` (a guess a run corrects)."""
    s = 0.0
    for v in x:
        s = 2 if v > 0.5 else s
    return x * 1, s


def widened_then_used(x, i):
    """The widened value meets an int64 tensor: eager's dtype is int64 on
    the int path, float32 on the other."""
    s = 0.5
    for v in x:
        s = 3 if v > 0.5 else s
    return i * s


def widened_beside_float(x):
    """Used only where int and float give one result (a float32 tensor
    times 3 or 3.0): one program, no decision."""
    s = 0.5
    for v in x:
        s = 3 if v > 0.5 else s
    return x * s


CASES = [int_or_float_returned, int_or_run_time_bool, bool_or_int_returned]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("first", [1.0, -1.0], ids=["true_first", "false_first"])
def test_each_path_keeps_its_numbers_type(fn, first):
    static = d2s.declarative(fn)
    for sign in (first, -first, first):
        x = torch.ones(3) * sign
        got, want = static(x), fn(x)
        assert type(got[1]) is type(want[1]) and got[1] == want[1], (sign, got[1], want[1])
        assert torch.equal(got[0], want[0])
    assert all("cond" in {op.type for b in c.main_program.blocks for op in b.ops} for c in static.program_cache)


@pytest.mark.parametrize("order", [[[0.1, 0.2, 0.3], [0.9, 0.9, 0.9], [0.9, 0.1, 0.2], []],
                                   [[0.9, 0.1, 0.2], [], [0.9, 0.9, 0.9], [0.1, 0.2, 0.3]]],
                         ids=["float_first", "int_first"])
def test_a_widened_number_keeps_its_type_where_it_shows(order):
    """It came back `2.0` where eager has `2` (the fuzzer's s27d case)."""
    static = d2s.declarative(widened_in_a_loop)
    for values in order + order:
        x = torch.tensor(values)
        got, want = static(x), widened_in_a_loop(x)
        assert type(got[1]) is type(want[1]) and got[1] == want[1], (values, got[1], want[1])
        assert "while" in {op.type for b in static.concrete_program.main_program.blocks for op in b.ops}


@pytest.mark.parametrize("values", [[0.1, 0.2, 0.3], [0.9, 0.9, 0.9]])
def test_a_widened_number_meeting_an_int_tensor_keeps_eagers_dtype(values):
    static = d2s.declarative(widened_then_used)
    i = torch.arange(3)
    for v in (values, [0.9, 0.9, 0.9] if values[0] < 0.5 else [0.1, 0.2, 0.3]):
        x = torch.tensor(v)
        got, want = static(x, i), widened_then_used(x, i)
        assert got.dtype == want.dtype and torch.equal(got, want), (v, got, want)


def test_an_if_in_a_loop_taking_both_sides_is_refused_where_the_type_shows():
    static = d2s.declarative(widened_in_a_loop)
    static(torch.tensor([0.1, 0.2, 0.3]))
    with pytest.raises(d2s.ConversionError, match=r"takes both sides within it") as err:
        static(torch.tensor([0.1, 0.9, 0.1]))  # (0.0, then 2: a float, then an int within the loop)
    assert "s = 2 if v > 0.5 else s" in str(err.value)


@pytest.mark.parametrize("values", [[0.1, 0.2, 0.3], [0.9, 0.1, 0.2], [0.9, 0.9, 0.9]])
def test_a_widened_number_where_its_type_cannot_show_is_one_program(values):
    static = d2s.declarative(widened_beside_float)
    x = torch.tensor(values)
    assert torch.equal(static(x), widened_beside_float(x))
    assert len(static.program_cache) == 1
    assert "while" in {op.type for b in static.concrete_program.main_program.blocks for op in b.ops}


def bool_or_float_carried(x):
    """A bool on some trips of a float loop variable: carried widened, one
    trace (a spec "widened" to the dtype it had was traced again until the
    limit: "did not settle after 6 traces")."""
    a = x * 1.0
    t = x.sum()
    s = 0.0
    w = 0
    while w < 3 and a.sum() < 2.5:
        w += 1
        s = bool(t > 1.0) if a.sum() > 1.0 else s
    return a + t + s


@pytest.mark.parametrize("scale", [0.1, 0.5, 1.0])
def test_a_narrower_number_on_some_trips_is_carried_widened(scale):
    static = d2s.declarative(bool_or_float_carried)
    x = torch.ones(3) * scale
    assert torch.equal(static(x), bool_or_float_carried(x))
    assert "while" in {op.type for b in static.concrete_program.main_program.blocks for op in b.ops}


def int_made_float_by_trips(x):
    """`n` is the int 0 after zero trips, a float after any (it was 0.0)."""
    n = 0
    for v in x:
        n += 0.5
    return x * 1, n


def float_made_int_by_trips(x):
    """`s` is the float 0.5 after zero trips, the int 3 after any (it was 3.0)."""
    s = 0.5
    for v in x:
        s = 3
    return x * 1, s


def trips_type_meets_int_tensor(x, i):
    n = 0
    for v in x:
        n = n + 1.5
    return i * n


def mixed_after_the_first_trip(x):
    """An int on the first trip, a float on the second: no one type after it."""
    s = 0
    for v in x:
        s = 0.5 if isinstance(s, int) else 1
    return x * 1, s


@pytest.mark.parametrize("fn", [int_made_float_by_trips, float_made_int_by_trips], ids=lambda f: f.__name__)
@pytest.mark.parametrize("first", [0, 3], ids=["zero_trips_first", "trips_first"])
def test_a_loop_changing_a_numbers_type_keeps_eagers_type_for_every_trip_count(fn, first):
    static = d2s.declarative(fn)
    for n in (first, 3 - first, 1, first):
        x = torch.ones(n)
        got, want = static(x), fn(x)
        assert type(got[1]) is type(want[1]) and got[1] == want[1], (n, got[1], want[1])
    # (the loop decided: `if test: loop`; the program for runs with trips holds the loop)
    kinds = [{op.type for b in c.main_program.blocks for op in b.ops} for c in static.program_cache]
    assert all("cond" in k for k in kinds) and any("while" in k for k in kinds), kinds


@pytest.mark.parametrize("n", [0, 2])
def test_a_loop_changing_a_numbers_type_keeps_the_dtype_it_meets(n):
    static = d2s.declarative(trips_type_meets_int_tensor)
    i = torch.arange(3)
    for trips in (n, 2 - n):
        x = torch.ones(trips)
        got, want = static(x, i), trips_type_meets_int_tensor(x, i)
        assert got.dtype == want.dtype and torch.equal(got, want), (trips, got, want)


def test_a_type_changing_on_later_trips_is_refused_where_it_shows():
    static = d2s.declarative(mixed_after_the_first_trip)
    with pytest.raises(d2s.ConversionError, match=r"could not decide") as err:
        static(torch.ones(3))
    assert "test_number_merges.py" in str(err.value)


def type_changed_by_a_loop_whose_test_has_effects(x):
    acc = torch.zeros(1)
    n = 0
    while acc.add_(1).sum() < x.sum():
        n += 0.5
    return n


@pytest.mark.parametrize("v", [1.0, 3.0], ids=["zero_trips", "two_trips"])
def test_a_loop_whose_test_has_effects_is_refused_where_the_type_shows(v):
    """`if test: loop` would run the test's effects once more: not decided.
    It came back 0.0 where eager has 0."""
    static = d2s.declarative(type_changed_by_a_loop_whose_test_has_effects)
    with pytest.raises(d2s.ConversionError, match=r"could not decide .*test has effects") as err:
        static(torch.ones(1) * v)
    assert "test_number_merges.py" in str(err.value)


def float_literal_into_an_int_loop_variable(x):
    s = 0
    for v in x:
        s = 0.5
    return x * s


@pytest.mark.parametrize("n", [3, 0, 1])
def test_a_literal_a_trip_gives_keeps_its_value(n):
    """The literal took the loop variable's dtype: `s = 0.5` where `s` was
    the int 0 was int64 0, and `x * s` came back zeros."""
    static = d2s.declarative(float_literal_into_an_int_loop_variable)
    for trips in (n, 3 - n):
        x = torch.ones(trips) + 1
        got, want = static(x), float_literal_into_an_int_loop_variable(x)
        assert got.dtype == want.dtype and torch.equal(got, want), (trips, got, want)


def float_start_of_an_int_tensor_loop_variable(x, i):
    """`s` is 0.5 in the first trip, an int64 tensor after: the loop variable
    was int64 from the start, so the first trip read 0 (`t` came back 2.0
    where eager has 2.5)."""
    s = 0.5
    t = torch.zeros(())
    for v in x:
        t = t + s
        s = i * 1
    return t * 1


@pytest.mark.parametrize("first", [2, 0, 1, 3])
def test_a_number_a_loop_makes_a_narrower_tensor_is_read_as_the_number_in_the_first_trip(first):
    static = d2s.declarative(float_start_of_an_int_tensor_loop_variable)
    i = torch.tensor(2)
    for n in (first, 3 - first, first):
        x = torch.ones(n)
        got, want = static(x, i), float_start_of_an_int_tensor_loop_variable(x, i)
        assert got.dtype == want.dtype and torch.equal(got, want), (n, got, want)
