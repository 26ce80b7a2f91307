"""A Python number on one path of a tensor `if`, a tensor on the other
(ops/control_flow/merge.py `_number_beside_tensor`).

The number used to take the tensor's dtype on both paths: `0.1` came back
as a float32 tensor (`0.10000000149` beside a float64 tensor, where eager
has the double 0.1), `0` as `tensor(0.)` (float32 beside an int64 tensor,
where eager's product is int64). Where the side the inputs take is known
the `if` converts that side and the other is a decision: each path gives
eager's value and type. `max`/`min` of a tensor and a number, and
`t or 0.1`, pick the operand itself the same way.
"""

import pytest
import torch

import d2s
from runtime.errors import DecisionFailed

F64 = torch.ones(2, dtype=torch.float64)
I64 = torch.ones(2, dtype=torch.int64)


def float_literal_or_tensor(x):
    v = x.sum() if x.sum() > 0.1 else 0.1
    return v * F64, v


def int_literal_or_tensor(x):
    k = x.sum() if x.sum() > 0 else 0
    return k * I64, k


def number_bound_in_one_branch(x):
    s = 0.1
    if x.sum() > 0:
        s = x.mean()
    return x * 1.0, s * F64, s


def builtin_max_min(x):
    hi, lo = max(x.sum(), 0.1), min(x.mean(), 0.1)
    return hi * F64, lo * F64, hi, lo


def or_a_number(x):
    v = (x.sum() > 0).float().sum() or 0.1
    return v * F64, v


CASES = [float_literal_or_tensor, int_literal_or_tensor, number_bound_in_one_branch, builtin_max_min, or_a_number]


def _same(got, want):
    assert type(got) is type(want), (got, want)
    if isinstance(want, tuple):
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
    else:
        assert got == want, (got, want)


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("first", [1.0, -1.0], ids=["tensor_path_first", "number_path_first"])
def test_each_path_gives_eagers_value_and_type(fn, first):
    static = d2s.declarative(fn)
    for sign in (first, -first, first, -first):
        x = torch.ones(3) * sign
        _same(static(x), fn(x))
    # one decision group (a program per side), each holding the `cond`
    assert len({id(c.decisions) for c in static.program_cache}) == 1
    for concrete in static.program_cache:
        assert "cond" in {op.type for b in concrete.main_program.blocks for op in b.ops}


def number_a_loop_makes_a_tensor(x, n):
    """`s` is the float 0.1 after zero trips, a float32 tensor after any."""
    s = 0.1
    k = 0
    for i in range(n):
        s = s + x.sum()
        k = k + x.long().sum()
    return s * F64, k * I64, s, k


def number_a_while_makes_a_tensor(x, n):
    total = 0
    while n > 0:
        total = total + x.mean()
        n = n - 1
    return total


def accumulated_in_place(x, n):
    """yolact_edge's `loss = 0; for p in preds: loss += p.mean()`: the loop
    variable itself, written in place on every trip. Zero trips gave back
    `tensor(0.)` and `tensor(0)` where eager has the ints 0."""
    total, count = 0, 0
    for i in range(n):
        total += x.mean() * i
        count += (x > 0).sum()
    return total, count


@pytest.mark.parametrize("fn", [number_a_loop_makes_a_tensor, number_a_while_makes_a_tensor, accumulated_in_place],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("first", [0, 2], ids=["zero_trips_first", "trips_first"])
def test_zero_trips_keep_the_number(fn, first):
    """The loop is `if test: loop`, decided: a program for runs with trips
    (holding the `while`), one for runs with none."""
    static = d2s.declarative(fn)
    for n in (first, 2 - first, 1, 0, 3):
        x, count = torch.ones(3) * (n - 0.5), torch.tensor(n)
        _same(static(x, count), fn(x, count))
    assert len({id(c.decisions) for c in static.program_cache}) == 1
    ops = [{op.type for b in c.main_program.blocks for op in b.ops} for c in static.program_cache]
    assert any("while" in o for o in ops) and all("cond" in o for o in ops)


def bool_over_a_float_beside_a_first_name(x, m):
    """fuzz s30a-1149: `s` is the float 0.0 before the loop and the bool
    `bool(t > 2.5)` after a trip taking the true side; `v` has no value
    before the loop. The loop's number was not decided where the loop also
    first assigned a name: `s` came back as the float 1.0 for eager's True."""
    t = x.sum()
    s = 0.0
    for row in m:
        s = bool(t > 2.5) if x.sum() > 2.5 else s
        v = row + 1
    return v + s, s


def number_made_a_tensor_beside_a_first_name(x, m):
    s = 0.5
    for row in m:
        s = s + row.sum()
        v = row * 2
    return v, s


def int_made_a_float_in_a_while_beside_a_first_name(x, m):
    s = 0
    i = 0
    while i < m.shape[0] and x.sum() > -100:
        s = 0.5 if x.sum() > 0 else s
        v = x + i
        i += 1
    return v, s


def bool_over_a_float_with_a_return_inside(x, m):
    """A `return` inside the loop: its value has none before the loop
    either (the same silent float for eager's bool, before the fix)."""
    s = 0.0
    for row in m:
        s = bool(row.sum() > 0) if x.sum() > 0 else s
        if row.sum() > 100:
            return x, s
    return x + 1, s


@pytest.mark.parametrize("fn", [bool_over_a_float_beside_a_first_name, number_made_a_tensor_beside_a_first_name,
                                int_made_a_float_in_a_while_beside_a_first_name,
                                bool_over_a_float_with_a_return_inside], ids=lambda f: f.__name__)
@pytest.mark.parametrize("order", [1, -1], ids=["true_side_first", "zero_trips_first"])
def test_a_loop_that_also_first_assigns_a_name_decides_its_numbers(fn, order):
    """Zero trips (eager's UnboundLocalError for `v`), one and several, both
    sides of the `if` in the loop: eager's values and Python types."""
    static = d2s.declarative(fn)
    for rows, sign in ((1, 1.0), (3, -1.0), (0, 1.0), (3, 1.0), (1, -1.0), (0, -1.0))[::order]:
        x, m = torch.ones(3) * sign, torch.arange(rows * 3.0).reshape(rows, 3) - 1
        try:
            want = fn(x, m)
        except UnboundLocalError:  # `v` after zero trips
            with pytest.raises(Exception) as raised:
                static(x, m)
            assert "UnboundLocalError" in repr(raised.value) or isinstance(raised.value, UnboundLocalError)
            continue
        _same(static(x, m), want)
    ops = [{op.type for b in c.main_program.blocks for op in b.ops} for c in static.program_cache]
    assert any("while" in o for o in ops)


def optional_term(x):
    """`extra` is the int 0 or a float32 tensor, and only meets float32
    tensors: one value serves both paths exactly (and an exported program
    holds both sides)."""
    extra = 0
    if x.sum() > 0:
        extra = torch.sum(x * 2)
    return x.sum() + extra + x


def type_of_it(x):
    s = 1
    if x.sum() > 0:
        s = x.sum()
    return x * 1, type(s) is int, isinstance(s, torch.Tensor)


def test_a_value_that_shows_no_difference_is_one_program():
    static = d2s.declarative(optional_term)
    for sign in (1.0, -1.0, 1.0):
        x = torch.ones(3) * sign
        _same(static(x), optional_term(x))
    assert len(static.program_cache) == 1
    assert "cond" in {op.type for b in static.concrete_program.main_program.blocks for op in b.ops}


@pytest.mark.parametrize("first", [1.0, -1.0], ids=["tensor_path_first", "number_path_first"])
def test_type_and_isinstance_are_eagers_on_each_path(first):
    static = d2s.declarative(type_of_it)
    for sign in (first, -first, first):
        x = torch.ones(3) * sign
        _same(static(x), type_of_it(x))


def number_or_tensor_of_another_rank(x, m):
    """0.0 or a (3,) tensor: no one value; one side converted, the other a
    decision, where replay cannot tell the side (the length of a list a
    tensor `if` appends to) too: a run taking the other side corrects it."""
    out = []
    for r in m:
        if r.sum() > 0:
            out.append(r)
    return x + (torch.stack(out).sum(0) if len(out) > 0 else 0.0)


@pytest.mark.parametrize("first", [1.0, -1.0], ids=["rows_kept_first", "none_kept_first"])
def test_a_number_and_a_tensor_of_another_rank(first):
    static = d2s.declarative(number_or_tensor_of_another_rank)
    for sign in (first, -first, first):
        x, m = torch.ones(3), torch.ones(2, 3) * sign
        _same(static(x, m), number_or_tensor_of_another_rank(x, m))
    assert len({id(c.decisions) for c in static.program_cache}) == 1
    assert all("cond" in {op.type for b in c.main_program.blocks for op in b.ops} for c in static.program_cache)


def number_in_a_loop(x, n):
    """The side of the `if` changes from trip to trip: one value of the
    tensor's dtype on every path (documented), one program."""
    s = 0.5
    for i in range(n):
        s = x.sum() if x.sum() > i else 0.5
    return x * s


@pytest.mark.parametrize("n", [0, 1, 3])
def test_where_the_side_is_not_known_the_number_takes_the_tensors_dtype(n):
    static = d2s.declarative(number_in_a_loop)
    for sign in (1.0, -1.0):
        x, count = torch.ones(3) * sign, torch.tensor(n)
        _same(static(x, count), number_in_a_loop(x, count))
    assert len(static.program_cache) == 1
    assert "while" in {op.type for b in static.concrete_program.main_program.blocks for op in b.ops}


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_a_saved_model_holds_both_sides(fn, tmp_path):
    """`jit.save` with an input_spec traces the side its examples do not take
    (d2s/save_paths.py), each `if` of one line on its own (`max(..), min(..)`)."""
    static = d2s.declarative(fn, input_spec=[d2s.InputSpec([3], torch.float32)])
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for sign in (2.0, -1.0, 0.5):
        x = torch.ones(3) * sign
        _same(loaded(x), fn(x))


def test_a_saved_model_without_examples_refuses_the_side_it_does_not_hold(tmp_path):
    static = d2s.declarative(float_literal_or_tensor)
    static(torch.ones(3))
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    _same(loaded(torch.ones(3) * 2), float_literal_or_tensor(torch.ones(3) * 2))
    with pytest.raises(DecisionFailed, match="these inputs take the other side"):
        loaded(-torch.ones(3))


def returned_from_the_trip_that_makes_it_a_tensor(x):
    """`s` is 0.0 in the first trip, a tensor after it: returned from the
    first trip it is the float (it came back as `tensor(0.)`)."""
    s = 0.0
    for v in x:
        if v > 5:
            return s
        s = s + v
    return s


@pytest.mark.parametrize("values", [[9.0, 1.0], [1.0, 9.0], [1.0, 2.0], []])
def test_a_loop_variable_returned_where_its_type_varies_is_refused_at_the_return(values):
    static = d2s.declarative(returned_from_the_trip_that_makes_it_a_tensor)
    with pytest.raises(d2s.ConversionError, match=r"'s' is a Python number on some paths and a tensor") as err:
        static(torch.tensor(values))
    assert err.value.filename == __file__
    assert err.value.lineno == returned_from_the_trip_that_makes_it_a_tensor.__code__.co_firstlineno + 8


@pytest.mark.parametrize("number", [0.5, 2.0], ids=["half", "whole"])
def test_a_float_beside_an_int_tensor_in_a_program_no_trace_decides_is_refused(number):
    """`d2s.cond` in a static program: the literal took the int64 dtype, and
    a run taking that side gave 0 for 0.5."""
    import runtime
    program = runtime.Program()
    with runtime.program_guard(program):
        i = runtime.data("i", [3], dtype="int64")
        with pytest.raises(d2s.ConversionError, match=r"has dtype int64 in the true branch but float64"):
            d2s.cond(i.sum() > 0, lambda: i.sum(), lambda: number)
