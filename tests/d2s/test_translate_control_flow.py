"""Declarative == eager for every control-flow case in cf_cases.py.

For each case the program is built from the first arguments and must give
the eager result for all the others (which take other paths), with a single
cache entry and the expected graph ops.
"""

import pytest
import torch

import d2s

from cf_cases import CASES


def all_op_types(program):
    return {op.type for block in program.blocks for op in block.ops}


def assert_same(eager, static, close=False):
    if isinstance(eager, dict):
        assert isinstance(static, dict) and list(static) == list(eager), (eager, static)
        for key in eager:
            assert_same(eager[key], static[key], close)
        return
    if isinstance(eager, (tuple, list)):
        assert isinstance(static, (tuple, list)) and len(eager) == len(static)
        for a, b in zip(eager, static):
            assert_same(a, b, close)
        return
    if isinstance(eager, torch.Tensor):
        assert isinstance(static, torch.Tensor), f"expected a tensor, got {static!r}"
        assert static.dtype == eager.dtype and static.shape == eager.shape, (eager, static)
        if close:
            torch.testing.assert_close(static, eager)
        else:
            assert torch.equal(static, eager), (eager, static)
        return
    # A Python number eagerly may be a 0-d tensor statically (it was carried by graph control flow).
    # Exactly: a Python float is a double in the program too.
    value = static.item() if isinstance(static, torch.Tensor) else static
    if close:
        assert value == pytest.approx(eager), (eager, static)
    else:
        assert value == eager and (type(value) is float or type(eager) is not float), (eager, static)


@pytest.mark.parametrize("fn,arg_sets,ops,no,close", CASES, ids=[c[0].__name__ for c in CASES])
def test_declarative_matches_eager(fn, arg_sets, ops, no, close):
    static = d2s.declarative(fn)
    for args in arg_sets:
        assert_same(fn(*args), static(*args), close)
    assert len(static.program_cache) == 1
    types = all_op_types(static.program_cache.last.main_program)
    assert ops <= types, f"missing {ops - types}; program has {sorted(types)}"
    assert not (no & types), f"unexpected {no & types}"


def test_case_count():
    assert len(CASES) >= 60
