"""The control-flow and Python-semantics cases on a CUDA device.

Every case of cf_cases.py and semantics_cases.py runs eagerly and under
`@declarative` with its tensor arguments on the GPU, one program serving
every path, in two ways a user runs on a GPU:

- `moved`: the arguments are moved; tensors the function makes without a
  device stay on the CPU, eagerly and in the program alike (where eager
  then raises for mixing devices, the program raises the same type);
- `default device`: the calls run under `with torch.device("cuda")`, so the
  tensors the function makes land on the GPU too, in the program as eagerly.

Results must be equal (`torch.equal`) and on the same device: the same
kernels run in the same order. Skipped without a CUDA device.
"""

import pytest
import torch

import d2s

import cf_cases
import semantics_cases
from test_translate_control_flow import all_op_types, assert_same

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEVICE = "cuda"

CASES = [(fn, sets, ops, no, close) for fn, sets, ops, no, close in cf_cases.CASES]
CASES += [(fn, sets, ops, no, False) for fn, sets, ops, no in semantics_cases.CASES]


def _moved(args):
    return tuple(a.detach().clone().to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)


def _same_devices(eager, static):
    if isinstance(eager, (tuple, list)):
        for a, b in zip(eager, static):
            _same_devices(a, b)
    elif isinstance(eager, torch.Tensor):  # (a Python number may come back as a 0-d tensor: assert_same)
        assert static.device == eager.device, (static.device, eager.device)


def _run(fn, args, default_device):
    if default_device:
        with torch.device(DEVICE):
            return fn(*args)
    return fn(*args)


# Known gaps, each a clear error at the user's line (never a wrong result);
# strict: a fix makes the case pass, and then it must leave this list.
# (None now: `total = 0` then `total += x.mean()` in a tensor loop with a GPU `x`
# was one until its loop variable started on the program's device, while_op.py.)
KNOWN_GAPS = {}


def _gap(fn, default_device):
    reason = KNOWN_GAPS.get((fn.__name__, default_device))
    return [pytest.mark.xfail(reason=reason, strict=True, raises=RuntimeError)] if reason else []


@pytest.mark.parametrize("fn,arg_sets,ops,no,close,default_device", [
    pytest.param(fn, sets, ops, no, close, dd, marks=_gap(fn, dd),
                 id=f"{fn.__name__}-{'default device' if dd else 'moved'}")
    for fn, sets, ops, no, close in CASES for dd in (False, True)])
def test_declarative_matches_eager_on_cuda(fn, arg_sets, ops, no, close, default_device):
    static = d2s.declarative(fn)
    ran = False
    for args in arg_sets:
        try:
            eager = _run(fn, _moved(args), default_device)
        except Exception as exc:  # noqa: BLE001 - the program must raise the same
            with pytest.raises(type(exc)):
                _run(static, _moved(args), default_device)
            continue
        got = _run(static, _moved(args), default_device)
        assert_same(eager, got, close)
        _same_devices(eager, got)
        ran = True
    if ran and static.program_cache.last is not None:
        types = all_op_types(static.program_cache.last.main_program)
        assert ops <= types, f"missing {ops - types}; program has {sorted(types)}"
        assert not (no & types), f"unexpected {no & types}"
