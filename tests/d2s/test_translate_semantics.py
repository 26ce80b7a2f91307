"""Declarative == eager for the Python-semantics cases in semantics_cases.py:
one program, built from the first arguments, serves every path, and holds
the graph ops it should. Where eager raises, the program raises the same
exception type with the same message (followed by where it was raised)."""

import pytest
import torch

import d2s

from semantics_cases import CASES
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
