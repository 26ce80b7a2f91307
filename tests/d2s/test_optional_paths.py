"""`None` on one path of a tensor `if` and a value on the other, used after
`if b is not None:` (issue 21, TorchScript's Optional). One program cannot
hold both, so d2s converts the side each call takes (the other side a
`decision_failed` check) and keeps both programs (docs/syntax_and_limitations.md,
"Programs converted again"). Checked here: eager == declarative on both
paths in either order; each program, run by the Executor, is exact on the
side it holds and raises DecisionFailed naming the `if` on the other,
never a wrong value."""

import pytest
import torch

import d2s
from runtime.errors import DecisionFailed

from test_translate_control_flow import all_op_types


def int_or_none(x):
    b = None
    if x.sum() > 0:
        b = 2
    if b is not None:
        return x + b
    return x - 1


def tensor_or_none(x):
    b = x * 3 if x.sum() > 0 else None
    return x if b is None else x + b


POS, NEG = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-1.0, 0.0, -3.0])


@pytest.mark.parametrize("fn", [int_or_none, tensor_or_none])
@pytest.mark.parametrize("order", [[POS, NEG, POS, NEG], [NEG, POS, NEG, POS]])
def test_each_side_is_exact_and_each_program_refuses_the_other(fn, order):
    static = d2s.declarative(fn)
    for x in order:
        assert torch.equal(static(x), fn(x))
    programs = list(static.program_cache)
    assert len(programs) == 2
    served = []
    for concrete in programs:
        assert {"cond", "decision_failed"} <= all_op_types(concrete.main_program)
        for x in (POS, NEG):
            feed = {concrete.inputs[0].name: x}
            try:
                got = d2s.Executor().run(concrete.main_program, feed=feed, fetch_list=concrete.fetch_vars,
                                         return_numpy=False)[0]
            except DecisionFailed as exc:
                assert f"{__file__}:" in str(exc) and "side of the `if`" in str(exc)
                continue
            assert torch.equal(got, fn(x))
            served.append(float(x.sum()) > 0)
    assert sorted(served) == [False, True]  # each input served by exactly one program


def test_a_saved_program_refuses_the_path_it_does_not_hold(tmp_path):
    static = d2s.declarative(int_or_none)
    static(POS)
    d2s.jit.save(static, str(tmp_path / "f"))
    loaded = d2s.jit.load(str(tmp_path / "f"))
    assert torch.equal(loaded(POS), int_or_none(POS))
    with pytest.raises(DecisionFailed, match="save from inputs that take this side"):
        loaded(NEG)
