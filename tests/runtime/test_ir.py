"""IR invariants: names, blocks and parents, lookup, deterministic text."""

import pytest
import torch

import ops  # noqa: F401 - installs op capture on Variables
import runtime
from runtime.errors import ProgramError


def _program():
    p = runtime.Program()
    with runtime.program_guard(p):
        x = runtime.data("x", [None, 3])
        y = torch.relu(x) + 1
        z = y.sum(1)
    return p, x, y, z


def test_names_are_unique_across_blocks():
    p = runtime.Program()
    sub = p.create_block()
    names = {p.unique_name("tmp") for _ in range(3)}
    sub.create_var(name=p.unique_name("tmp"))
    p.global_block().create_var(name=p.unique_name("tmp"))
    assert len(names) == 3
    all_names = [n for b in p.blocks for n in b.vars]
    assert len(all_names) == len(set(all_names))
    with pytest.raises(ProgramError, match="already exists"):
        sub.create_var(name=next(iter(sub.vars)))


def test_unique_name_skips_names_taken_by_hand():
    p = runtime.Program()
    p.global_block().create_var(name="tmp_0")
    assert p.unique_name("tmp") == "tmp_1"


def test_create_block_parent_idx():
    p = runtime.Program()
    b1 = p.create_block()
    assert (b1.idx, b1.parent_idx, b1.parent) == (1, 0, p.global_block())
    b2 = p.create_block(b1.idx)
    assert (b2.idx, b2.parent_idx) == (2, 1)
    assert p.global_block().parent is None and p.global_block().parent_idx == -1


def test_find_var_through_parents_not_children():
    p = runtime.Program()
    outer = p.global_block().create_var(name="outer")
    b1 = p.create_block()
    inner = b1.create_var(name="inner")
    b2 = p.create_block(b1.idx)
    assert b2.find_var("outer") is outer and b2.find_var("inner") is inner
    assert b2.var("inner") is inner
    with pytest.raises(KeyError, match="not visible from block 0"):
        p.global_block().find_var("inner")


def test_variable_ir_view():
    p, x, y, z = _program()
    assert x.shape == (-1, 3) and x.dtype == torch.float32 and x.dtype_name == "float32"
    assert x.is_data and x.stop_gradient and x.ndim == 2 and x.dim() == 2
    assert z.shape == (-1,)
    assert p.data_vars() == [x]
    with pytest.raises(ValueError, match="bad dimension"):
        runtime.Variable(p.global_block(), "bad", [-2])
    with pytest.raises(ValueError, match="unknown dtype"):
        runtime.Variable(p.global_block(), "bad", [1], "float31")


def test_ops_record_input_and_output_names():
    p, x, y, z = _program()
    ops = p.global_block().ops
    assert [op.type for op in ops] == ["torch.relu", "torch.Tensor.__add__", "torch.Tensor.sum"]
    assert ops[0].input("X") == ["x"] and ops[-1].output("Out") == [z.name]
    assert ops[1].input_names == [ops[0].output_names[0]]
    assert ops[0].origin[0] == __file__


def test_to_string_is_deterministic_and_shows_structure():
    texts = {_program()[0].to_string() for _ in range(3)}
    assert len(texts) == 1
    text = texts.pop()
    assert "x: float32[-1, 3]" in text and "torch.relu" in text
    assert str(_program()[0]) == text


def test_program_version_changes_on_every_edit():
    p, x, y, z = _program()
    v = p._version
    p.global_block().create_var(name="extra")
    assert p._version > v
    v = p._version
    p.global_block().append_op("torch.relu", inputs={"X": [x]}, outputs={"Out": ["extra"]},
                               attrs={"args": (), "kwargs": {}, "out": None})
    assert p._version > v


def test_program_guard_restores_default_and_rejects_non_programs():
    before = runtime.default_main_program()
    p = runtime.Program()
    with pytest.raises(RuntimeError):
        with runtime.program_guard(p):
            assert runtime.default_main_program() is p
            raise RuntimeError
    assert runtime.default_main_program() is before
    with pytest.raises(TypeError):
        with runtime.program_guard("not a program"):
            pass


def test_lifted_parameter_is_bound_persistable_once():
    lin = torch.nn.Linear(3, 2)
    p = runtime.Program()
    with runtime.program_guard(p):
        x = runtime.data("x", [2, 3])
        lin(x)
        lin(x)
    persist = p.persistable_vars()
    assert len(persist) == 2  # weight and bias, lifted once although used twice
    assert {id(p.bound[v.name]) for v in persist} == {id(lin.weight), id(lin.bias)}
    assert all(not v.stop_gradient for v in persist)
