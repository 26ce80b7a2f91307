"""runtime/effects.py: the facts of one op in a program, asked by every
pass, by pruning and by the translator."""

import pytest
import torch
import torch.nn.functional as F

import d2s
from runtime import effects


def _ops(fn, *args):
    static = d2s.declarative(fn)
    static(*args)
    program = static.concrete_program.main_program
    return program, [op for block in program.blocks for op in block.ops]


def _attention(p=None):
    def fn(q):
        if p is None:
            return F.scaled_dot_product_attention(q, q, q)
        return F.scaled_dot_product_attention(q, q, q, dropout_p=p)
    return fn


@pytest.mark.parametrize("fn, draws", [
    (_attention(), False), (_attention(0.0), False), (_attention(0.25), True),
    (lambda q: F.dropout(q, 0.5, training=False), False), (lambda q: F.dropout(q, 0.5, training=True), True),
    (lambda q: F.dropout(q, 0.0, training=True), True),  # dropout's own `p` is not read: it still counts
    (lambda q: torch.rand_like(q), True), (lambda q: q.tanh(), False)])
def test_draws_reads_the_constant_arguments(fn, draws):
    _, ops = _ops(fn, torch.randn(1, 2, 3, 4))
    (op,) = [op for op in ops if op.type not in ("check_modes", "check_python_values")]  # p: a closure cell
    assert effects.draws(op) is draws
    assert effects.is_pure(op) is not draws


def _branch_and_loop(x, n):
    if x.sum() > 0:
        y = x * 2
    else:
        y = x - 1
    i = 0
    while i < n:
        y = y + 1
        i += 1
    y.add_(1)
    return y[0]


def test_names_in_attributes_come_from_the_op_types_declaration():
    _, ops = _ops(_branch_and_loop, torch.ones(3), torch.tensor(2))
    cond = next(op for op in ops if op.type == "cond")
    loop = next(op for op in ops if op.type == "while")
    assert effects.var_attr_names(cond) == cond.attrs["true_outs"] + cond.attrs["false_outs"]
    assert effects.var_attr_names(loop) == [*loop.attrs["loop_vars"], loop.attrs["cond_out"],
                                            *loop.attrs["body_outs"]]
    calls = [op for op in ops if "args" in op.attrs]
    assert calls and all(effects.var_attr_names(op) == [] for op in calls)


def test_in_place_writes_and_aliases():
    program, ops = _ops(_branch_and_loop, torch.ones(3), torch.tensor(2))
    add_ = next(op for op in ops if op.type == "torch.Tensor.add_")
    loop = next(op for op in ops if op.type == "while")
    assert effects.written_in_place(add_) == add_.input("X")[0]
    assert all(effects.written_in_place(op) is None for op in ops if op is not add_)
    assert effects.writes_tensors(program.blocks) and not effects.writes_tensors([loop.attrs["body_block"]])
    # The while's output may be its initial value (no trips): one group.
    groups = effects.alias_groups(program)
    assert set(loop.input("Init")) | set(loop.output("Out")) <= groups[loop.output("Out")[0]]
    reads, writes, outlives = effects.footprint(add_, groups)
    assert add_.input("X")[0] in writes and not outlives
    assert not effects.is_pure(add_)
    assert effects.is_pure(loop)  # its blocks only add and compare
