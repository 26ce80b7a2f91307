"""`match` statements (Python 3.10+) in converted code: the patterns and
guards are Python's (a config string, a shape tuple, a Python value);
`return`, `break` and `continue` inside a case are lowered as inside an
`if` (they were refused: "`return` inside `Match` is not supported"), and a
tensor `if` or loop inside a case converts as anywhere else."""

import pytest
import torch

import d2s
from runtime.errors import ConversionError


def by_mode(x, mode):
    match mode:
        case "double":
            if x.sum() > 0:  # a tensor `if` inside a case
                return x * 2
            return x * 3
        case "neg" | "minus":
            return -x
        case _:
            pass
    return x + 1


def by_shape(x):
    match x.shape:
        case (n, d) if d > 2:
            return x.sum(0) * n
        case [n, *rest]:
            return x.reshape(n, -1).sum(1)
    return x


def first_positive(x):
    found = x[0] * 0
    for name in ("skip", "take", "stop", "later"):
        match name:
            case "skip":
                continue
            case "stop":
                break
        for row in x:  # a tensor loop inside the Python loop's body
            if row.sum() > 0:
                found = found + row
    return found


def capture_in_a_branch(x, pair):
    if x.sum() > 0:  # a name a pattern captures on one side of a tensor `if`
        match pair:
            case (a, _):
                pass
    else:
        a = 0.5
    return x * a


@pytest.mark.parametrize("fn, inputs, op", [
    (capture_in_a_branch, [(torch.ones(2), (3.0, 1)), (-torch.ones(2), (3.0, 1))], "cond"),
    (by_mode, [(torch.ones(3), "double"), (-torch.ones(3), "double"), (torch.ones(3), "minus"),
               (torch.ones(3), "other")], "cond"),
    (by_shape, [(torch.ones(2, 3),), (torch.ones(2, 2),), (torch.ones(4),)], None),
    (first_positive, [(torch.randn(3, 2),), (torch.randn(1, 2),)], "while")])
def test_match_converts_as_eager(fn, inputs, op):
    static = d2s.declarative(fn)
    types = set()
    for args in inputs:  # a Python argument (the mode) is part of the program's key
        assert torch.equal(static(*args), fn(*args))
        types |= {o.type for b in static.concrete_program.main_program.blocks for o in b.ops}
    assert op is None or op in types


def test_a_tensor_subject_meets_the_patterns_as_eagerly():
    def on_a_tensor(x):
        match x.sum():
            case 0:
                return x
        return x + 1

    with pytest.raises(ConversionError) as info:
        d2s.declarative(on_a_tensor)(torch.ones(2))
    assert info.value.filename == __file__
