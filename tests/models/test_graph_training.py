"""d2s.Graph trains like the eager loop: the tutorials' digits classifier
(two conv-pool blocks, classifier, `if label is not None`) and a model with a
data-dependent `while`, step for step, with torch.optim optimizers; printing,
state dict round trip, and saving the inference part for a fresh process."""

import copy
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn

import d2s
from digits_steps import digit_batches, eager_steps
from mnist import MNIST, loss_fn

STEPS = 10
BATCH = 16
OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
}


class TrainGraph(d2s.Graph):
    def __init__(self, model, optimizer, lr_scheduler=None):
        super().__init__()
        self.model = model
        self.add_optimizer(optimizer, lr_scheduler=lr_scheduler)

    def build(self, x, y):
        probs, acc = self.model(x, y)
        loss = loss_fn(probs, y)
        loss.backward()
        return loss


@pytest.fixture(scope="module")
def data():
    return digit_batches(STEPS, BATCH)


def _graph_steps(graph, batches):
    losses = []
    for step, (x, y) in enumerate(batches):
        torch.manual_seed(100 + step)
        losses.append(graph(x, y).detach())
    return torch.stack(losses)


def _assert_same_parameters(a, b):
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("optimizer, variant", [("sgd", {}), ("adam", {"dropout": 0.3, "batch_norm": True})],
                         ids=["sgd", "adam-dropout+batchnorm"])
def test_digits_graph_matches_eager_step_by_step(data, optimizer, variant):
    torch.manual_seed(0)
    eager = MNIST(**variant)
    model = copy.deepcopy(eager)
    graph = TrainGraph(model, OPTIMIZERS[optimizer](model.parameters()))
    eager_losses, _ = eager_steps(eager, OPTIMIZERS[optimizer](eager.parameters()), data, seed=100)
    graph_losses = _graph_steps(graph, data)
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-5, atol=0)
    assert eager_losses[-1] < eager_losses[0]
    _assert_same_parameters(eager, model)
    for (name, b), (_, c) in zip(eager.named_buffers(), model.named_buffers()):
        torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    # one program, holding forward, backward and the optimizer's step
    assert len(graph._build_fn.program_cache) == 1
    types = [op.type for op in graph.program.global_block().ops]
    assert types[-2:] == ["tensor_backward", "optimizer_step"]
    assert "optimizer_zero_grad" in types


class Looper(nn.Module):
    """A `while` whose trip count comes from the input, and an `if` on the data."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x, n):
        h = torch.tanh(self.a(x))
        i = 0
        while i < n:
            h = 0.5 * torch.tanh(self.b(h)) + h
            i += 1
        if h.mean() > 0:
            h = h * 2.0
        return self.head(h)


class LoopGraph(d2s.Graph):
    def __init__(self, model, optimizer, lr_scheduler=None):
        super().__init__()
        self.model = model
        self.loss_fn = nn.CrossEntropyLoss()
        self.add_optimizer(optimizer, lr_scheduler=lr_scheduler)

    def build(self, x, n, y):
        loss = self.loss_fn(self.model(x, n), y)
        loss.backward()
        return loss


LOOP_OPTIMIZERS = {
    "momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
}


def _loop_batches():
    gen = torch.Generator().manual_seed(5)
    trips = [0, 3, 1, 0, 2, 4]  # trip count 0 leaves `b` without a gradient: no update, like eager
    return [(torch.randn(5, 6, generator=gen) * (1 if i % 2 else -1), torch.tensor(n),
             torch.randint(0, 3, (5,), generator=gen)) for i, n in enumerate(trips)]


@pytest.mark.parametrize("optimizer", sorted(LOOP_OPTIMIZERS))
def test_while_model_graph_matches_eager_for_every_trip_count(optimizer):
    torch.manual_seed(1)
    eager = Looper()
    model = copy.deepcopy(eager)
    make = LOOP_OPTIMIZERS[optimizer]
    eager_opt, graph_opt = make(eager.parameters()), make(model.parameters())
    eager_sched = torch.optim.lr_scheduler.StepLR(eager_opt, step_size=2, gamma=0.5)
    graph = LoopGraph(model, graph_opt, torch.optim.lr_scheduler.StepLR(graph_opt, step_size=2, gamma=0.5))
    loss_fn_ = nn.CrossEntropyLoss()
    for x, n, y in _loop_batches():
        loss = loss_fn_(eager(x, n), y)
        eager_opt.zero_grad()
        loss.backward()
        eager_opt.step()
        eager_sched.step()
        torch.testing.assert_close(graph(x, n, y), loss, rtol=1e-5, atol=1e-7)
        _assert_same_parameters(eager, model)
    assert graph_opt.param_groups[0]["lr"] == eager_opt.param_groups[0]["lr"]
    torch.testing.assert_close(graph_opt.state_dict()["state"], eager_opt.state_dict()["state"])
    assert len(graph._build_fn.program_cache) == 1
    types = [op.type for block in graph.program.blocks for op in block.ops]
    assert "while" in types and "cond" in types


def test_print_before_and_after_the_first_call(data):
    torch.manual_seed(0)
    model = MNIST()
    graph = TrainGraph(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    before = repr(graph)
    assert "not built yet" in before and "SGD(lr=0.1, momentum=0.9, weight_decay=0) over 6 parameters" in before
    assert "(model): MNIST(" in before and "Conv2d(1, 20" in before and "program:" not in before
    graph(*data[0])
    after = repr(graph)
    assert "built" in after and "not built" not in after
    assert "input x: float32[16, 1, 28, 28] (data)" in after and "input y: int64[16] (data)" in after
    assert "program:" in after and "optimizer_step(<SGD#" in after and "backward(" in after
    assert graph.program.to_string().splitlines()[0] in after


def test_state_dict_round_trip_resumes_training(data, tmp_path):
    torch.manual_seed(0)

    def make():
        model = MNIST()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        return TrainGraph(model, opt, torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9))

    graph = make()
    _graph_steps(graph, data[:3])
    torch.save(graph.state_dict(), tmp_path / "ckpt.pt")
    expected = _graph_steps(graph, data[3:6])

    torch.manual_seed(123)  # other initial weights: everything must come from the checkpoint
    resumed = make()
    resumed.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    assert torch.equal(_graph_steps(resumed, data[3:6]), expected)
    _assert_same_parameters(graph, resumed)
    with pytest.raises(ValueError, match="not a d2s.Graph state dict"):
        resumed.load_state_dict(resumed.model.state_dict())


FRESH = textwrap.dedent("""
    import sys
    import numpy as np
    import torch
    try:
        import mnist  # noqa: F401
    except ImportError:
        pass
    else:
        sys.exit("the model's source must not be importable here")
    import d2s
    layer = d2s.jit.load(sys.argv[1])
    np.save(sys.argv[3], layer(torch.from_numpy(np.load(sys.argv[2]))).detach().numpy())
""")


def test_jit_save_of_a_training_graph_serves_the_model_in_a_fresh_process(data, tmp_path):
    torch.manual_seed(0)
    model = MNIST(dropout=0.3)
    graph = TrainGraph(model, torch.optim.SGD(model.parameters(), lr=0.1))
    _graph_steps(graph, data[:2])
    d2s.jit.save(graph, str(tmp_path / "served"), input_spec=[d2s.InputSpec([None, 1, 28, 28])])
    assert model.training  # saved in eval mode, the graph's mode restored
    model.eval()
    images = data[2][0]
    with torch.no_grad():
        expected = model(images)

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "serve.py").write_text(FRESH)
    np.save(work / "images.npy", images.numpy())
    root = os.path.dirname(os.path.dirname(os.path.abspath(d2s.__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    result = subprocess.run([sys.executable, "serve.py", str(tmp_path / "served"), "images.npy", "out.npy"],
                            cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(work / "out.npy"), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_example_script_runs(capsys):
    import graph_mnist
    assert graph_mnist.main(["--steps", "2", "--batch-size", "4"])
    out = capsys.readouterr().out
    assert "not built yet" in out and "parameters equal to eager's: True" in out
