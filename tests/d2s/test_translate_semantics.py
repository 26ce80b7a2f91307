"""Declarative == eager for the Python-semantics cases in semantics_cases.py:
one program, built from the first arguments, serves every path, and holds
the graph ops it should."""

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
        assert_same(fn(*_copy(args)), static(*_copy(args)))
    assert len(static.program_cache) == 1
    types = all_op_types(static.program_cache.last.main_program)
    assert ops <= types, f"missing {ops - types}; program has {sorted(types)}"
    assert not (no & types), f"unexpected {no & types}"
