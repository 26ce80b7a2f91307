"""What a program returns besides tensors: sizes are fetchable variables of
the program (get_program, the Executor, a saved model), a data pointer is
refused at the user's line, never a placeholder object."""

import re

import numpy as np
import pytest
import torch

import d2s
from runtime.ir import Variable


def grown(x):
    y = x
    while y.sum() < 10:
        y = torch.cat([y, y])
    return y.shape[0]


def grown_pair(x):
    y = x
    while y.sum() < 10:
        y = torch.cat([y, y])
    return y * 2, y.size(0) + 1


def _program_ops(program):
    return [op.type for block in program.blocks for op in block.ops]


@pytest.mark.parametrize("fn", [grown, grown_pair])
def test_a_returned_size_is_a_fetchable_variable(fn, tmp_path):
    tr = d2s.ProgramTranslator()
    main, _, inputs, outputs = tr.get_program(d2s.declarative(fn), torch.ones(1, 2))
    assert "while" in _program_ops(main)
    fetch = list(outputs) if isinstance(outputs, tuple) else [outputs]
    assert all(isinstance(v, Variable) for v in fetch)  # never a torch.SymInt
    exe = d2s.Executor(d2s.CPUPlace())
    d2s.save_inference_model(str(tmp_path / "m"), [inputs[0].name], fetch, exe, main_program=main)
    loaded, feeds, targets = d2s.load_inference_model(str(tmp_path / "m"), exe)
    # zero trips (sum >= 10 already), one trip, several trips: one program
    for x in (torch.full((1, 2), 6.0), torch.full((1, 2), 3.0), torch.full((1, 2), 0.5)):
        expected = fn(x)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for program, names, fetch_list in ((main, [inputs[0].name], fetch), (loaded, feeds, targets)):
            got = exe.run(program, feed={names[0]: x.numpy()}, fetch_list=fetch_list)
            for g, e in zip(got, expected):
                np.testing.assert_array_equal(np.asarray(g), np.asarray(e))
        got = d2s.declarative(fn)(x)
        got = got if isinstance(got, tuple) else (got,)
        assert [type(g) for g in got] == [type(e) for e in expected]
        for g, e in zip(got, expected):
            assert torch.equal(g, e) if isinstance(e, torch.Tensor) else g == e


def returns_address(x):
    y = x + 1
    return y, x.data_ptr()


def test_a_returned_data_pointer_is_refused_at_the_users_line():
    with pytest.raises(d2s.ConversionError, match=r"`data_ptr\(\)` of tensor `x` is returned, but the address "
                                                  r"exists only while the program runs") as info:
        d2s.declarative(returns_address)(torch.ones(2))
    assert info.value.filename == __file__
    assert info.value.lineno == returns_address.__code__.co_firstlineno + 2
    assert re.search(r"return y, x\.data_ptr\(\)", str(info.value))
