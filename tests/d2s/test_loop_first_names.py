"""Names first assigned in a loop over a tensor, then assigned again by a
later tensor loop or on one path of a tensor `if` (issue 21): Python's
scoping, staged. Each name carries whether it is bound (a flag per name,
through `cond` outputs and `while` loop variables); a read where a run
left it unbound raises eager's UnboundLocalError. Each case: eager ==
declarative == the Executor on zero, one and several rows and on both
branches, with ONE program (the row count is an InputSpec None dimension)
holding the ops."""

import pytest
import torch

import d2s

from test_translate_control_flow import all_op_types
from unbound_names import ROWS3, ROWS_EVERY, check_program


def then_if_on_one_path(x):
    for row in x:
        v = row * 2
    if v.sum() > 0:
        v = v + 1
    return v


def then_if_on_the_other_path(x):
    for row in x:
        v = row * 2
    if x.sum() > 0:
        pass
    else:
        v = x.sum() + row
    return v


def then_if_assigning_before_any_read(x):
    for row in x:
        v = row * 2
    if x.sum() > 0:
        v = x[0] + 1
    return v


def then_nested_if_on_one_path(x):
    for row in x:
        v = row * 2
    if x.sum() > -100:
        if x.sum() > 0:
            v = x[0] + 1
    return v


def then_a_second_for(x):
    for row in x:
        v = row * 2
    for row in x:
        v = v + row
    return v


def then_a_while(x):
    for row in x:
        v = row * 2
    i = torch.tensor(0)
    while i < x.shape[0] - 1:
        v = v + 1
        i = i + 1
    return v


def nested_loops(x):
    for row in x:
        for _e in row:
            v = row * 2
        x = x + v.sum()
    return x


def on_one_path_in_the_loop(x):
    for row in x:
        if row.sum() > 2:
            v = row
    return v


def number_on_one_path_in_the_loop(x):
    for row in x:
        if row.sum() > 2:
            k = 1
    return x * k


def item_read_on_one_path_in_the_loop(x):
    # issue 21: `y = feats["key"][-2]` under `if i > 1` in a loop over a tensor
    feats = {"key": [x.sum(), x.sum() * 2, x.sum() * 3]}
    i = torch.tensor(0)
    for _row in x:
        if i > 1:
            y = feats["key"][-2]
        i = i + 1
    return y


def then_a_second_loop_on_one_path(x):
    for row in x:
        v = row
    for row in x:
        if row.sum() < 5:
            v = row * 10
    return v


EVERY = ROWS_EVERY

CASES = [
    (then_if_on_one_path, EVERY, ("while", "cond")),
    (then_if_on_the_other_path, EVERY, ("while", "cond")),
    (then_if_assigning_before_any_read, EVERY, ("while", "cond")),
    (then_nested_if_on_one_path, EVERY, ("while", "cond")),
    (then_a_second_for, EVERY, ("while",)),
    (then_a_while, EVERY, ("while",)),
    (nested_loops, EVERY, ("while",)),
    (then_a_second_loop_on_one_path, EVERY + [torch.tensor([[3.0, 3.0]])], ("while", "cond")),
    (on_one_path_in_the_loop, EVERY + [torch.tensor([[3.0, 0.0], [0.0, 0.0]])], ("while", "cond")),
    (item_read_on_one_path_in_the_loop, EVERY + [torch.ones(4, 2)], ("while", "cond")),
    (number_on_one_path_in_the_loop, EVERY + [torch.tensor([[3.0, 0.0], [0.0, 0.0]])], ("while", "cond")),
]


@pytest.mark.parametrize("fn, inputs, ops", CASES, ids=[c[0].__name__ for c in CASES])
def test_bound_as_python_binds_it_on_every_path(fn, inputs, ops):
    static = d2s.declarative(fn, input_spec=[d2s.InputSpec([None, 2], torch.float32)])
    for x in inputs:
        check_program(static, fn, x)
    assert len(static.program_cache) == 1
    assert set(ops) <= all_op_types(static.program_cache.last.main_program)


def string_on_one_path_in_the_loop(x):
    for row in x:
        if row.sum() > 2:
            tag = "big"
    return x if tag == "big" else -x


def test_a_python_string_first_assigned_on_one_path_in_the_loop_is_refused_at_the_users_line():
    # A Python value that is not a number has no op output to carry its flag.
    with pytest.raises(d2s.ConversionError, match=r"'tag' is first assigned inside a loop over a tensor, on one "
                                                  r"path of this `if` on a tensor, to a Python value") as info:
        d2s.declarative(string_on_one_path_in_the_loop,
                        input_spec=[d2s.InputSpec([None, 2], torch.float32)])(ROWS3)
    assert info.value.filename == __file__
