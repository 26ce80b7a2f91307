"""The first conversion in a process does not load torch's compiler stack
(ops/cold_start.py), and leaves torch as it found it."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import d2s
from ops import cold_start

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Static-graph code under program_guard (no trace around it: each op's
# inference is on its own), static shapes, a loop over a tensor length with a
# 0-d index and a list (the LSTM tagger), a data-dependent `while` with
# `break` (the decoder), and a matmul with two dynamic dimensions: each
# converts without torch._dynamo.
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
    # First, so that the symbolic-shape modules load inside one op's inference.
    main = d2s.Program()
    with d2s.program_guard(main):
        x = d2s.data("x", [None, 4])
        out = torch.nn.functional.linear(torch.tanh(x) + 1, torch.ones(3, 4))
    assert out.dims == ("s0", 3), out.dims
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
    assert not [fn for fn, _ in cold_start._find_wrapped() if "__dynamo_disable" in getattr(fn, "__dict__", {})]
    assert symbolic_shapes.uninteresting_files is listed
    print("ok")
""")


# In a process without torch._dynamo: entries nest (the last exit restores),
# a wrapper calls its function directly, torch's own disabled version once
# Dynamo is loaded (another thread compiling during a trace), and the file
# list is torch's, less Dynamo's own files. Then torch.compile and d2s side
# by side.
_PATCH_LIFETIME = textwrap.dedent("""
    import sys
    import torch
    sys.path[:0] = ["."]
    from torch.fx.experimental import symbolic_shapes
    from ops import cold_start

    calls = []
    def f(x):
        calls.append(x)
        return x + 1
    wrapper = torch._disable_dynamo(f)
    cold_start.add_wrapper(wrapper)
    listed = symbolic_shapes.uninteresting_files

    outer, inner = cold_start.dynamo_free(), cold_start.dynamo_free()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # another entry is still active: stays patched
    assert wrapper(1) == 2 and calls == [1]
    direct = f.__dict__["__dynamo_disable"]
    assert direct.fn is f and direct.disabled is None
    mine = symbolic_shapes.uninteresting_files()
    assert "torch._dynamo" not in sys.modules
    import torch._dynamo
    assert wrapper(2) == 3 and calls == [1, 2]
    assert direct.disabled._torchdynamo_disable and direct.disabled._torchdynamo_orig_callable is f
    assert symbolic_shapes.uninteresting_files() is listed()  # torch's own, now that Dynamo is loaded
    inner.__exit__(None, None, None)
    assert "__dynamo_disable" not in f.__dict__ and symbolic_shapes.uninteresting_files is listed

    import torch._dynamo.eval_frame, torch._dynamo.guards
    dynamo = torch._dynamo.guards.uninteresting_files() | {torch._dynamo.eval_frame.__file__}
    assert all(name.startswith(torch._dynamo.__path__[0]) for name in dynamo)
    assert mine == listed() - dynamo, (mine ^ (listed() - dynamo))

    # Then as for a user who compiled with torch.compile first: d2s patches
    # nothing in torch (Dynamo is loaded), converts with exact shapes, and the
    # compiled function, run again after the conversion, still matches eager.
    import d2s

    def g(x):
        return torch.nn.functional.linear(torch.tanh(x), torch.ones(2, 3)) * 2

    compiled = torch.compile(g, backend="eager")
    x = torch.randn(4, 3)
    assert torch.equal(compiled(x), g(x))
    static = d2s.declarative(g, input_spec=[d2s.InputSpec([None, 3])])
    assert torch.equal(static(x), g(x))
    assert "float32[s0, 2]" in static.concrete_program.main_program.to_string()
    with cold_start.dynamo_free():
        assert not cold_start._patched and symbolic_shapes.uninteresting_files is listed
    # Wrappers hold only torch's own disabled functions (it caches them as they run).
    assert not [fn for fn, _ in cold_start._find_wrapped()
                if isinstance(fn.__dict__.get("__dynamo_disable"), cold_start._Direct)]
    y = torch.randn(6, 3)
    assert torch.equal(compiled(y), g(y)) and torch.equal(static(y), g(y))
    print("ok")
""")


def _run_fresh(tmp_path, text):
    script = tmp_path / "fresh.py"  # a file: d2s converts functions from their source
    script.write_text(text)
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.parametrize("script", [_FRESH_PROCESS, _PATCH_LIFETIME], ids=["conversions", "patch-lifetime"])
def test_in_a_fresh_process(tmp_path, script):
    _run_fresh(tmp_path, script)


def test_dynamo_free_leaves_torch_as_it_was():
    wrapped = [fn for fn, _ in cold_start._find_wrapped()]
    assert wrapped  # this torch wraps functions with _disable_dynamo as cold_start expects
    before = {id(fn): dict(fn.__dict__) for fn in wrapped}
    if "torch._dynamo" not in sys.modules:
        with cold_start.dynamo_free():
            assert all(getattr(fn.__dict__.get("__dynamo_disable"), "fn", fn) is fn for fn in wrapped)
    assert {id(fn): dict(fn.__dict__) for fn in wrapped} == before


def test_a_conversion_after_torch_dynamo_is_loaded_still_infers_shapes():
    # Other tests may have imported torch._dynamo: then dynamo_free changes nothing.
    def f(x):
        return torch.nn.functional.linear(x, torch.ones(2, 3)) + 1

    x = torch.randn(4, 3)
    static = d2s.declarative(f, input_spec=[d2s.InputSpec([None, 3])])
    assert torch.equal(static(x), f(x))
    assert "float32[s0, 2]" in static.concrete_program.main_program.to_string()
