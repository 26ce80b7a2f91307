"""Python numbers of two types on the two paths of a tensor `if`
(ops/control_flow/merge.py `_merge_number_types`).

A literal used to take the other side's dtype: `return 0.5` after a path
returning `7` came back as `0`, `k = 3` beside a run-time bool as `True`.
Now each path keeps its value's type where the side the inputs take is
known (the other side is a decision), and where it is not, both widen.
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
    literal and the float widen to float (the value kept)."""
    s = 0.0
    for v in x:
        s = 2 if v > 0.5 else s
    return x * 1, s


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


@pytest.mark.parametrize("values", [[0.1, 0.2, 0.3], [0.9, 0.1, 0.2], [0.9, 0.9, 0.9]])
def test_a_literal_and_a_float_widen_where_the_side_is_not_known(values):
    static = d2s.declarative(widened_in_a_loop)
    x = torch.tensor(values)
    got, want = static(x), widened_in_a_loop(x)
    assert got[1] == want[1] and isinstance(got[1], float)
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
