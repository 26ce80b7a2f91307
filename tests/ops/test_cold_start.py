"""The first conversion in a process does not load torch's compiler stack
(ops/cold_start.py), and leaves torch as it found it."""

import os
import subprocess
import sys
import textwrap

import torch

import d2s
from ops import cold_start

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Static shapes, a loop over a tensor length with a 0-d index and a list
# (the LSTM tagger), a data-dependent `while` with `break` (the decoder), and
# a matmul with two dynamic dimensions: each converts without torch._dynamo.
_FRESH_PROCESS = textwrap.dedent("""
    import sys
    import torch
    sys.path[:0] = [".", "examples"]
    import d2s
    from models import GreedyDecoder, LSTMTagger
    from quickstart import GatedRefiner
    from torch.fx.experimental import symbolic_shapes
    from ops import cold_start

    listed = symbolic_shapes.uninteresting_files
    for model, args in [(GatedRefiner(), (torch.randn(4, 8),)),
                        (LSTMTagger(), (torch.randint(0, 50, (8, 5)), torch.tensor(5))),
                        (GreedyDecoder(), (torch.randn(8, 32), torch.tensor(6)))]:
        model.eval()
        want = model(*args)
        got = d2s.declarative(model)(*args)
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        assert all(torch.equal(torch.as_tensor(a), torch.as_tensor(b)) for a, b in zip(want, got))

    def matmul(y, w):
        return y @ w

    static = d2s.declarative(matmul, input_spec=[d2s.InputSpec([None, 3]), d2s.InputSpec([None, None])])
    y, w = torch.randn(5, 3), torch.randn(3, 7)
    assert torch.equal(static(y, w), y @ w)
    assert "torch._dynamo" not in sys.modules, "the first conversions imported torch._dynamo"
    # torch is left as it was: no cached "disabled" function, its own file list.
    assert not [fn for fn in cold_start._find_wrapped() if "__dynamo_disable" in getattr(fn, "__dict__", {})]
    assert symbolic_shapes.uninteresting_files is listed
    print("ok")
""")


def test_first_conversions_do_not_import_torch_dynamo(tmp_path):
    script = tmp_path / "fresh.py"  # a file: d2s converts functions from their source
    script.write_text(_FRESH_PROCESS)
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_dynamo_free_leaves_torch_as_it_was():
    wrapped = cold_start._find_wrapped()
    assert wrapped  # this torch wraps functions with _disable_dynamo as cold_start expects
    before = {id(fn): dict(fn.__dict__) for fn in wrapped}
    if "torch._dynamo" not in sys.modules:
        with cold_start.dynamo_free():
            assert all(fn.__dict__.get("__dynamo_disable") in (fn, None) for fn in wrapped)
    assert {id(fn): dict(fn.__dict__) for fn in wrapped} == before


def test_a_conversion_after_torch_dynamo_is_loaded_still_infers_shapes():
    # Other tests may have imported torch._dynamo: then dynamo_free changes nothing.
    def f(x):
        return torch.nn.functional.linear(x, torch.ones(2, 3)) + 1

    x = torch.randn(4, 3)
    static = d2s.declarative(f, input_spec=[d2s.InputSpec([None, 3])])
    assert torch.equal(static(x), f(x))
    assert "float32[s0, 2]" in static.concrete_program.main_program.to_string()
