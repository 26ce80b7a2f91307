"""Names bound on only one path of an `if` on a tensor and read after it
(issue 21): Python's scoping, staged. Such a name is an output of the `cond`
op with a placeholder on the path that does not bind it, plus a second
output saying whether it is bound; a read where a run left it unbound
raises eager's UnboundLocalError, a read on a path that bound it gives the
value. Each case: eager == declarative == the Executor on zero, one and
several rows and on both sides of every `if`, with ONE program (the row
count is an InputSpec None dimension) holding the ops. The first input takes
a path that leaves the name unbound, so the program is built from that path."""

import pytest
import torch

import d2s

from test_translate_control_flow import all_op_types
from unbound_names import MIXED, NEG3, ROWS0, ROWS1, ROWS3, ROWS_EVERY, check_program, check_run, outcome


def tensor_on_the_true_path(x):
    if x.sum() > 0:
        y = x + 1
    return y


def tensor_on_the_false_path(x):
    if x.sum() > 0:
        pass
    else:
        y = x * 2
    return y


def int_on_one_path(x):
    if x.sum() > 0:
        k = 3
    return x * k if isinstance(k, int) else -x


def float_on_one_path(x):
    if x.sum() > 0:
        s = 0.5
    return x * s


def nested_ifs(x):
    if x.sum() > -100:
        if x.sum() > 0:
            y = x[:, :1] * 3
    return y


def nested_ifs_on_both_outer_paths(x):
    if x.sum() > 2:
        if x.max() > 3:
            y = x * 3
    else:
        if x.sum() < -2:
            y = x * 4
    return y


def elif_chain(x):
    if x.sum() > 2:
        y = x
    elif x.sum() > 0:
        y = -x
    return y


def elif_chain_whose_middle_arm_does_not_bind(x):
    if x.sum() > 2:
        y = x * 2
    elif x.sum() > -2:
        pass
    else:
        y = x * 5
    return y


def then_a_loop(x):
    if x.sum() > 0:
        v = x.sum() * 0
    for row in x:
        v = v + row.sum()
    return v


def then_a_while(x):
    if x.sum() > 0:
        v = x.sum()
    i = torch.tensor(0)
    while i < x.shape[0]:
        v = v * 2
        i = i + 1
    return x.sum() + 1 if x.shape[0] == 0 else v


def then_an_if_that_reads_it_on_one_path(x):
    if x.sum() > 0:
        y = x * 2
    if x.shape[0] > 2:
        out = y.sum()
    else:
        out = x.sum()
    return out


def read_only_on_the_path_that_bound_it(x):
    if x.sum() > 0:
        y = x * 2
    if x.sum() > 0:
        return y
    return x


def then_rebound_on_every_path(x):
    if x.sum() > 0:
        y = x * 2
    if x.shape[0] > 1:
        y = x
    else:
        y = x * 0
    return y


def returned_with_other_values(x):
    if x.sum() > 0:
        y = x.sum()
    return x * 2, y


def in_a_python_range_loop(x):
    for i in range(2):
        if x.sum() > i * 3:
            y = x + i
    return y


def bound_before_the_if_in_a_later_iteration(x):
    # The second iteration's `if` (the same code, traced again) has `y`
    # bound before it.
    for i in range(3):
        if x.sum() > i:
            y = x + i
        y = y * 2
    return y


def first_assigned_by_a_loop_in_one_branch(x):
    # Was a silent wrong result: zero trips of the loop returned the placeholder.
    if x.sum() >= 0:
        for row in x:
            v = row * 2
    else:
        v = -torch.ones(2)
    return v


def after_a_tensor_break(x):
    i = 0
    while i < 3:
        if x.sum() > 0:
            if x.max() > 4:
                break
            j = x.sum() * i
        i += 1
    return j


def tensor_loop_in_a_python_loop_a_tensor_break_ends(x):
    # Each iteration after the tensor `break` is a `cond` whose false side
    # (the iteration skipped) leaves `v` as it was before it: unbound first.
    for c in (1.0, 2.0, 3.0):
        if x.sum() > c:
            break
        for row in x:
            v = row * c
    return v


def tensor_loop_in_a_python_loop_a_tensor_return_ends(x):
    # Was a silent wrong result: zeros for zero rows, where eager raises.
    for c in (1.0, 2.0, 3.0):
        if x.sum() > c:
            return x[0] * c
        for row in x:
            v = row * c
    return v


SMALL = torch.tensor([[0.25, 0.25], [0.25, 0.0]])
EVERY = ROWS_EVERY + [SMALL]

CASES = [
    (tensor_on_the_true_path, EVERY, ("cond",)),
    (tensor_on_the_false_path, EVERY, ("cond",)),
    (int_on_one_path, EVERY, ("cond",)),
    (float_on_one_path, EVERY, ("cond",)),
    (nested_ifs, EVERY, ("cond",)),
    (nested_ifs_on_both_outer_paths, EVERY + [torch.ones(3, 2), -torch.ones(3, 2), -ROWS1], ("cond",)),
    (elif_chain, EVERY, ("cond",)),
    (elif_chain_whose_middle_arm_does_not_bind, EVERY, ("cond",)),
    (then_a_loop, EVERY + [torch.zeros(2, 2)], ("cond", "while")),
    (then_a_while, EVERY + [torch.zeros(2, 2)], ("cond", "while")),
    (then_an_if_that_reads_it_on_one_path, EVERY + [torch.ones(2, 2)], ("cond",)),
    (read_only_on_the_path_that_bound_it, EVERY, ("cond",)),
    (then_rebound_on_every_path, EVERY, ("cond",)),
    (returned_with_other_values, EVERY, ("cond",)),
    (in_a_python_range_loop, EVERY, ("cond",)),
    (bound_before_the_if_in_a_later_iteration, EVERY, ("cond",)),
    (first_assigned_by_a_loop_in_one_branch, EVERY + [torch.zeros(0, 2) - 1], ("cond", "while")),
    (after_a_tensor_break, EVERY + [torch.ones(2, 2) * 5], ("cond", "while")),
    (tensor_loop_in_a_python_loop_a_tensor_break_ends, EVERY + [torch.ones(1, 2) * 0.75], ("cond", "while")),
    (tensor_loop_in_a_python_loop_a_tensor_return_ends, EVERY + [torch.ones(1, 2) * 1.25], ("cond", "while")),
]

# Every path that reads the name bound it first.
NEVER_READ_UNBOUND = (read_only_on_the_path_that_bound_it, then_rebound_on_every_path)


SPEC = [d2s.InputSpec([None, 2], torch.float32)]


@pytest.mark.parametrize("fn, inputs, ops", CASES, ids=[c[0].__name__ for c in CASES])
def test_bound_as_python_binds_it_on_every_path(fn, inputs, ops):
    static = d2s.declarative(fn, input_spec=SPEC)
    outcomes = set()
    for x in inputs:
        outcomes.add(type(outcome(fn, x)) is UnboundLocalError)
        check_program(static, fn, x)
    # The inputs take a path that binds the name and one that does not (which,
    # but for two cases, then reads it).
    assert outcomes == ({False} if fn in NEVER_READ_UNBOUND else {True, False})
    assert len(static.program_cache) == 1
    assert set(ops) <= all_op_types(static.program_cache.last.main_program)


@pytest.mark.parametrize("fn", [tensor_on_the_true_path, elif_chain, returned_with_other_values])
def test_a_saved_program_checks_the_flag_itself(fn, tmp_path):
    static = d2s.declarative(fn, input_spec=SPEC)
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for x in EVERY:
        check_run(loaded, fn, x)


def scaled_on_one_path(x, w):
    if x.sum() > 0:
        y = x * w
    return (y * y).sum()


@pytest.mark.parametrize("x", [ROWS1, ROWS3, MIXED + 2])
def test_gradients_flow_from_the_path_that_bound_it_only(x):
    w = torch.tensor([2.0, -1.0])
    static = d2s.declarative(scaled_on_one_path)
    grads = []
    for fn in (scaled_on_one_path, static):
        leaf = w.clone().requires_grad_()
        fn(x, leaf).backward()
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1])
    with pytest.raises(UnboundLocalError, match="'y'"):
        static(-x, w.clone().requires_grad_())
    assert len(static.program_cache) == 1


def with_a_value_no_program_merges(x):
    # `m` is None on one path and a tensor on the other (and not tested with
    # `is None`): a program converts the side its inputs take, the other side
    # is a decision check (d2s/decisions.py), so `y` is bound in one program
    # and unbound in the other.
    m = None
    if x.sum() > 0:
        y = x + 1
        m = x * 2
    return x * 2, y, m


@pytest.mark.parametrize("inputs", [[NEG3, ROWS3, MIXED, ROWS1], [ROWS3, NEG3, ROWS1, ROWS0]])
def test_an_if_converted_for_one_side_binds_the_name_on_that_side_only(inputs):
    static = d2s.declarative(with_a_value_no_program_merges, input_spec=SPEC)
    for x in inputs:
        check_run(static, with_a_value_no_program_merges, x)


def string_on_one_path(x):
    if x.sum() > 0:
        tag = "big"
    return x if tag == "big" else -x


def none_on_one_path(x):
    if x.sum() > 0:
        mask = None
    return x if mask is None else -x


def tuple_on_one_path(x):
    if x.sum() > 0:
        pair = (x, x * 2)
    return pair[0]


def tuple_on_the_false_path(x):
    if x.sum() > 0:
        y = x + 1
    else:
        pair = (x, x * 2)
    return pair[1] if x.sum() <= 0 else y


def tuple_read_on_the_unbound_path(x):
    if x.sum() > 0:
        x = x + 1
    else:
        pair = {"a": (x, x * 2)}
    return pair["a"][1]


def list_on_one_path(x):
    if x.sum() > 0:
        parts = [x, x * 2]
    return parts[0]


def string_after_a_tensor_break(x):
    i = 0
    while i < 3:
        if x.sum() > 0:
            if x.max() > 4:
                break
            j = "no break"
        i += 1
    return x if j == "no break" else -x


def string_or_a_loop_first_tensor(x):
    if x.sum() > 0:
        for row in x:
            v = row * 2
    else:
        v = "negative"
    return x if v == "negative" else v


@pytest.mark.parametrize("fn", [string_on_one_path, none_on_one_path, tuple_on_one_path, list_on_one_path,
                                tuple_on_the_false_path, tuple_read_on_the_unbound_path,
                                string_or_a_loop_first_tensor])
@pytest.mark.parametrize("order", [[ROWS3, NEG3, MIXED, ROWS1], [NEG3, ROWS3, ROWS0, MIXED]])
def test_a_value_no_op_output_can_leave_unset_converts_the_side_taken(fn, order):
    # A string, None, tuple or list has no op output to carry with a bound
    # flag: the `if` is converted for the side the inputs take, bound or
    # unbound there as eager has it, the other side when a run takes it
    # (tuples of `nonzero(as_tuple=True)` in Longformer's and LED's global
    # attention). Before, the conversion was refused.
    static = d2s.declarative(fn, input_spec=SPEC)
    raised = {check_run(static, fn, x) for x in order}
    # Both sides taken, one of them reading the unbound name (a positive sum
    # has rows: the loop binds `v` on every run that reaches it).
    assert raised == ({False} if fn in (string_or_a_loop_first_tensor, tuple_on_the_false_path) else {True, False})
    # A program per side, but for a side whose run raises while converting (as eager).
    assert len(static.program_cache) == 2 - (True in raised)
    assert all({"cond", "decision_failed"} <= all_op_types(c.main_program) for c in static.program_cache)


@pytest.mark.parametrize("fn, name, assigned, what, text", [
    (string_after_a_tensor_break, "j", "j = ", "str", "is assigned at line {}, after the `break` at line"),
])
def test_a_value_no_op_output_can_leave_unset_after_a_jump_is_refused_at_the_users_line(fn, name, assigned, what,
                                                                                          text):
    import inspect
    lines, first = inspect.getsourcelines(fn)
    line = first + next(i for i, source in enumerate(lines) if assigned in source)
    with pytest.raises(d2s.ConversionError) as info:
        d2s.declarative(fn, input_spec=SPEC)(ROWS3)
    message = str(info.value)
    assert f"{name!r} {text.format(line)}" in message
    assert f"a name left unbound on one path must hold a tensor or a number on the others, and {name!r} holds " \
           f"a value of type `{what}` there" in message
    assert info.value.filename == __file__
