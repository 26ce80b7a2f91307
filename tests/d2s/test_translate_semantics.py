"""Declarative == eager for the Python-semantics cases in semantics_cases.py:
one program, built from the first arguments, serves every path, and holds
the graph ops it should. Where eager raises, the program raises the same
exception type with the same message (followed by where it was raised)."""

import pytest
import torch

import d2s

from semantics_cases import CASES, positives
from test_translate_control_flow import all_op_types, assert_same


def _copy(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("fn,arg_sets,ops,no", CASES, ids=[c[0].__name__ for c in CASES])
def test_declarative_matches_eager(fn, arg_sets, ops, no):
    static = d2s.declarative(fn)
    for args in arg_sets:
        try:
            eager = fn(*_copy(args))
        except Exception as exc:  # noqa: BLE001 - the program must raise the same
            with pytest.raises(type(exc)) as info:
                static(*_copy(args))
            assert str(info.value).startswith(str(exc)), (str(info.value), str(exc))
            continue
        assert_same(eager, static(*_copy(args)))
    # One program per distinct Python-valued arguments (those are in the cache key).
    python_args = {tuple(a for a in args if not isinstance(a, torch.Tensor)) for args in arg_sets}
    assert len(static.program_cache) <= len(python_args)
    if not len(static.program_cache):  # every call raised while the program was built, as eager raised
        assert not ops
        return
    types = all_op_types(static.program_cache.last.main_program)
    assert ops <= types, f"missing {ops - types}; program has {sorted(types)}"
    assert not (no & types), f"unexpected {no & types}"


class _Doubler(torch.nn.Module):
    def forward(self, x):
        return x * 2


class _Child(_Doubler):
    def forward(self, x):
        if x.sum() > 0:
            x = super().forward(x)
        for i in range(2):
            x = super().forward(x) + i
        return x


def test_zero_argument_super_inside_branches_and_loops():
    module = _Child()
    static = d2s.declarative(module)
    for x in (torch.ones(3), -torch.ones(3)):
        assert torch.equal(static(x), module(x))
    program = d2s.ProgramTranslator().get_program(module.forward, torch.ones(3))[0]
    assert "cond" in all_op_types(program)


def _list_or_default(x):
    kept = positives(x)
    return kept or [x]                           # the list itself on one path


def _list_and_default(x):
    kept = positives(x)
    return kept and x


def _max_of_run_time_sizes(x):
    return max(x[:1], x[1:])


@pytest.mark.parametrize("fn,specs,line", [
    (_list_or_default, None, "return kept or [x]"),
    (_list_and_default, None, "return kept and x"),
    (_max_of_run_time_sizes, [d2s.InputSpec([None], "float32")], "return max(x[:1], x[1:])"),
])
def test_values_one_program_value_cannot_be_are_refused_at_the_line(fn, specs, line):
    """Eager's value is a list on one path and another object on the other
    (`kept or [x]`), or depends on sizes only a run knows: refused where the
    user wrote it, never a program that returns something else."""
    static = d2s.declarative(fn, input_spec=specs)
    with pytest.raises(d2s.ConversionError, match="line") as info:
        static(torch.tensor([1.0, -2.0, 3.0]))
    assert line in str(info.value)


def _identity_after_a_loop(x):
    y = x
    while y.sum() < 10:
        y = y * 2
    return x + 1 if y is x else y                # `y is x` after zero trips only


def _id_after_a_branch(x):
    y = x
    if x.sum() > 0:
        y = x * 2
    return x if id(y) == id(x) else y


@pytest.mark.parametrize("fn,line", [
    (_identity_after_a_loop, "return x + 1 if y is x else y"),
    (_id_after_a_branch, "return x if id(y) == id(x) else y"),
])
def test_identity_a_run_decides_otherwise_is_refused_at_the_line(fn, line):
    with pytest.raises(d2s.ConversionError, match="line") as info:
        d2s.declarative(fn)(torch.tensor([1.0, -2.0, 3.0]))
    assert line in str(info.value)


def _ranks_differ(x):
    if x.sum() > 0:
        y = x.sum(0)                             # rank 1 here, rank 2 on the other path
    else:
        y = x
    return y * 2


def _dtypes_differ(x):
    y = x.long() if x.sum() > 0 else x           # int64 here, float32 on the other path
    return y + 1


def _same_tensors_test(q, k):
    if torch.equal(q, k):                        # MultiheadAttention-style `qkv_same`
        out = q.chunk(2, dim=-1)[0]
    else:
        out = torch.stack([q, k])
    return out


@pytest.mark.parametrize("fn, arg_sets", [
    (_ranks_differ, [(torch.ones(2, 3),), (-torch.ones(2, 3),), (torch.full((2, 3), 2.0),)]),
    (_dtypes_differ, [(torch.ones(3),), (-torch.ones(3),), (torch.full((3,), 0.5),)]),
    (_same_tensors_test, [(torch.ones(2, 4), torch.ones(2, 4)), (torch.ones(2, 4), torch.zeros(2, 4))]),
])
def test_a_value_of_two_dtypes_or_ranks_converts_each_side_a_run_takes(fn, arg_sets):
    """One program cannot hold both (was a ConversionError): the `if` converts
    the side the inputs take, the other side is a decision check, and a run
    that takes it converts again (one program per side, saved ones too)."""
    static = d2s.declarative(fn)
    for args in arg_sets:
        assert_same(fn(*_copy(args)), static(*_copy(args)))
    assert len(static.program_cache) == 2
    for concrete in static.program_cache:
        assert {"cond", "decision_failed"} <= all_op_types(concrete.main_program)
