"""A saved digits classifier runs with no model source: a fresh interpreter
that cannot import this test module (or any model code) loads it and gets
the eager outputs; in this process the executor matches eager bit for bit."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import runtime
from ops.capture import CaptureMode
from runtime import Executor, load_inference_model, save_inference_model


class Digits(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.fc = nn.Linear(16 * 5 * 5, 10)

    def forward(self, image):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(image))), 2)
        x = F.avg_pool2d(F.relu(self.conv2(x)), 2)
        return F.softmax(self.fc(x.flatten(1)), dim=-1)


def _trained_digits():
    torch.manual_seed(0)
    net = Digits()
    with torch.no_grad():  # non-trivial batch-norm running statistics
        for _ in range(3):
            net(torch.randn(8, 1, 28, 28) * 2 + 0.5)
    return net.eval()


SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    try:
        import test_subprocess_load  # noqa: F401
    except ImportError:
        pass
    else:
        sys.exit("the test module must not be importable here")
    import d2s  # the public API; importing it fills the op table the loader checks against
    program, feeds, fetches = d2s.load_inference_model(sys.argv[1], d2s.Executor())
    (probs,) = d2s.Executor().run(program, feed={feeds[0]: np.load(sys.argv[2])}, fetch_list=fetches)
    np.save(sys.argv[3], probs)
    print(feeds, [v.name for v in fetches])
""")


def test_saved_classifier_runs_in_a_fresh_process_without_model_source(tmp_path):
    net = _trained_digits()
    program = runtime.Program()
    with runtime.program_guard(program):
        image = runtime.data("image", [None, 1, 28, 28])
        with CaptureMode():
            probs = net(image)
    model_dir = tmp_path / "digits"
    save_inference_model(str(model_dir), ["image"], [probs], Executor(), program)

    images = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        eager = net(images)

    # Same process: the loaded program runs the very kernels eager runs.
    loaded, feeds, fetches = load_inference_model(str(model_dir), Executor())
    (static,) = Executor().run(loaded, feed={"image": images}, fetch_list=fetches, return_numpy=False)
    assert torch.equal(static.detach(), eager)

    # Fresh interpreter, cwd and sys.path away from the tests and the model class.
    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "run_model.py").write_text(SCRIPT)
    np.save(work / "images.npy", images.numpy())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "run_model.py", str(model_dir), "images.npy", "probs.npy"],
        cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"['image'] ['{probs.name}']"
    np.testing.assert_allclose(np.load(work / "probs.npy"), eager.numpy(), rtol=1e-5, atol=1e-6)
