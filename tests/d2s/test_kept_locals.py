"""A name assigned only in unreachable code (after a `return`, `break` or
`continue` in the same block) is still one of the function's locals, as
Python's compiler decides: a read raises eager's UnboundLocalError, never a
global of the same name (d2s/transformers/kept_locals.py). Each case: eager
== declarative == the Executor on inputs that reach the read and inputs
that do not, with one program holding the ops."""

import pytest
import torch

import d2s

from test_translate_control_flow import all_op_types
from unbound_names import check_program

# Globals named like the locals below: a converted function that lost the
# locals read these (the same shape: no error, a silent wrong value).
y = torch.full((2,), 100.0)
v = torch.full((2,), 100.0)
w = torch.full((2,), 100.0)


def after_return_under_a_tensor_if(x):
    if x.sum() > 0:
        return x
        y = x * 3
    return y


def after_continue_in_a_loop_over_rows(x):
    t = torch.zeros(2)
    for row in x:
        if (row > 2.5).any():
            continue
            v = row * 2.0
        t = t + v
    return t


def after_break_in_a_tensor_while(x):
    i = torch.zeros((), dtype=torch.long)
    t = torch.zeros(2)
    while i < x.shape[0]:
        if x[i].sum() > 0:
            break
            w = x[i]
        t = t + x[i]
        i += 1
    return t + w if t.sum() < -2 else t


POS, NEG = torch.tensor([[1.0, 2.0]]), torch.tensor([[-1.0, -2.0]])
BIG, SMALL = torch.tensor([[3.0, 3.0], [3.0, 4.0]]), torch.tensor([[3.0, 3.0], [0.0, 1.0]])
CASES = [
    (after_return_under_a_tensor_if, [POS, NEG], ["cond"]),
    (after_continue_in_a_loop_over_rows, [BIG, SMALL, torch.zeros(0, 2)], ["while", "cond"]),
    (after_break_in_a_tensor_while, [POS, NEG, torch.zeros(0, 2)], ["while", "cond"]),
]


@pytest.mark.parametrize("fn, inputs, ops", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_name_only_unreachable_code_assigns_stays_local(fn, inputs, ops):
    static = d2s.declarative(fn, input_spec=[d2s.InputSpec([None, 2], torch.float32)])
    reached_the_read = False
    for x in inputs:
        reached_the_read |= check_program(static, fn, x)
    assert reached_the_read
    assert len(static.program_cache) == 1
    assert set(ops) <= all_op_types(static.program_cache.last.main_program)


def test_the_converted_code_binds_the_lost_local_to_undefined():
    code = d2s.ProgramTranslator().get_code(after_return_under_a_tensor_if)
    assert "y = _d2s.Undefined('y')" in code or 'y = _d2s.Undefined("y")' in code
