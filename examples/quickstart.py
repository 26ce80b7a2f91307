"""d2s quickstart: an ordinary PyTorch model with data-dependent control flow,
run eagerly, then as a static program; trained both ways; saved, and run again
by a fresh `python -m d2s run` process that has none of this source.

    python examples/quickstart.py
"""

import copy
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s


class GatedRefiner(nn.Module):
    """Refines its hidden state while the state is still large (a loop whose
    trip count depends on the data), and picks one of two heads by the sign
    of the mean activation (a branch that depends on the data)."""

    def __init__(self, features=8, hidden=16, classes=3):
        super().__init__()
        self.encode = nn.Linear(features, hidden)
        self.refine = nn.Linear(hidden, hidden)
        self.positive_head = nn.Linear(hidden, classes)
        self.negative_head = nn.Linear(hidden, classes)

    def forward(self, x):
        h = torch.tanh(self.encode(x))
        steps = 0
        while h.abs().mean() > 0.2 and steps < 4:
            h = 0.5 * torch.tanh(self.refine(h))
            steps += 1
        if h.mean() > 0:
            out = self.positive_head(h)
        else:
            out = self.negative_head(h)
        return out


def banner(text):
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def main():
    torch.manual_seed(0)
    eager = GatedRefiner()
    static = d2s.declarative(copy.deepcopy(eager))   # same weights, forward now declarative

    inputs = [torch.randn(4, 8) * 3, torch.randn(4, 8) * 0.05, -torch.ones(4, 8)]

    banner("1. eager and declarative agree on every input (one program serves them all)")
    for x in inputs:
        want, got = eager(x), static(x)
        print(f"  eager {want[0].detach().numpy().round(4)}   static {got[0].detach().numpy().round(4)}   "
              f"bit-identical: {torch.equal(want, got)}")
        assert torch.equal(want, got)
    assert len(static.forward.program_cache) == 1

    banner("2. the converted source")
    print(d2s.ProgramTranslator().get_code(static.forward))

    banner("3. the program (cond and while ops with their sub-blocks)")
    program = static.forward.concrete_program.main_program
    print(program.to_string())

    banner("4. training both ways: equal losses step for step")
    target = torch.tensor([0, 1, 2, 0])
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_s = torch.optim.SGD(static.parameters(), lr=0.1)
    for step in range(5):
        x = inputs[step % len(inputs)]
        losses = []
        for model, opt in ((eager, opt_e), (static, opt_s)):
            loss = F.cross_entropy(model(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        print(f"  step {step}: eager loss {losses[0]:.6f}   static loss {losses[1]:.6f}")
        assert losses[0] == losses[1]

    banner("5. save, then run in a fresh process with no model source")
    static.eval()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "refiner")
        d2s.jit.save(static, model_dir, input_spec=[d2s.InputSpec([None, 8], "float32", name="x")])
        x = inputs[0].numpy()
        np.save(os.path.join(tmp, "x.npy"), x)
        out_dir = os.path.join(tmp, "out")
        subprocess.run([sys.executable, "-m", "d2s", "inspect", model_dir], check=True, cwd=tmp)
        subprocess.run([sys.executable, "-m", "d2s", "run", model_dir, "--input", f"x={tmp}/x.npy",
                        "--output-dir", out_dir], check=True, cwd=tmp)
        (result_file,) = os.listdir(out_dir)
        reloaded = np.load(os.path.join(out_dir, result_file))
        with torch.no_grad():
            want = eager(inputs[0]).numpy()
        print(f"  fresh process output matches eager: {np.allclose(reloaded, want, rtol=1e-5, atol=1e-6)}")
        assert np.allclose(reloaded, want, rtol=1e-5, atol=1e-6)
    print("\nquickstart OK")


if __name__ == "__main__":
    main()
