"""Recurrent modules with a run-time batch and no hidden state given: torch's
own forward builds the zero state from `input.size(0)` (a SymInt while
tracing). Saved with `InputSpec([None, ...])`, reloaded in a fresh process
without the model code, and run at batch 1, 7 and 64 with eager's results."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import torch
import torch.nn as nn

import d2s

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCHES = (1, 7, 64)

# name -> (module, input spec, batch dimension, input shape with B for the batch)
MODELS = {
    "lstm": (lambda: nn.LSTM(4, 6, batch_first=True), [None, 5, 4], 0, ("B", 5, 4)),
    "gru": (lambda: nn.GRU(4, 6, num_layers=2), [5, None, 4], 1, (5, "B", 4)),
    "lstm_cell": (lambda: nn.LSTMCell(4, 6), [None, 4], 0, ("B", 4)),
    "gru_cell": (lambda: nn.GRUCell(4, 6), [None, 4], 0, ("B", 4)),
}

LOADER = textwrap.dedent("""
    import sys
    import numpy as np
    import torch
    import d2s
    base = sys.argv[1]
    def flat(out):  # the loaded model returns eager's structure: (out, (h, c)) for an LSTM
        return [leaf for o in out for leaf in flat(o)] if isinstance(out, (list, tuple)) else [out]
    for name in sys.argv[2:]:
        model = d2s.jit.load(f"{base}/{name}")
        for b in (1, 7, 64):
            out = model(torch.from_numpy(np.load(f"{base}/{name}_x{b}.npy")))
            for i, o in enumerate(flat(out)):
                np.save(f"{base}/{name}_y{b}_{i}.npy", o.detach().numpy())
""")


def _flat(out):
    if isinstance(out, (list, tuple)):
        return [leaf for o in out for leaf in _flat(o)]
    return [out]


def test_rnn_modules_with_a_run_time_batch_save_reload_and_run_in_a_fresh_process(tmp_path):
    torch.manual_seed(0)
    want = {}
    for name, (make, spec, _, shape) in MODELS.items():
        module = make().eval()
        static = d2s.declarative(module)
        for b in BATCHES:
            x = torch.randn([b if d == "B" else d for d in shape])
            np.save(tmp_path / f"{name}_x{b}.npy", x.numpy())
            with torch.no_grad():
                want[name, b] = [t.numpy() for t in _flat(module(x))]
                # One program, converted once, serves every batch in this process too.
                got = [t.numpy() for t in _flat(static(x))]
            assert all(np.array_equal(w, g) for w, g in zip(want[name, b], got)), (name, b)
        d2s.jit.save(static, str(tmp_path / name), input_spec=[d2s.InputSpec(spec)])
        text = (tmp_path / name / "program.json").read_text()
        assert '"s0"' in text  # the batch is saved as a symbol
    script = tmp_path / "load.py"
    script.write_text(LOADER)
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, str(script), str(tmp_path)] + list(MODELS), check=True, cwd=tmp_path, env=env)
    for (name, b), outs in want.items():
        for i, w in enumerate(outs):
            got = np.load(tmp_path / f"{name}_y{b}_{i}.npy")
            np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6, err_msg=f"{name} batch {b} output {i}")
