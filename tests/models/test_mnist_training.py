"""The tutorial's digits classifier trains the same eagerly and declaratively.

Eager and declarative copies start from the same weights, see the same
batches and (for dropout) the same random seed before every step; losses,
accuracies and parameters must agree step by step. Also: train/eval select
separate cached programs, batch-norm running statistics are updated in place
like eager, dropout draws the same random numbers, and gradients through
`cond` and `while` match eager for every branch and trip count.
"""

import copy
import os

import pytest
import torch
import torch.nn as nn

import d2s
from digits_steps import digit_batches, eager_steps
from mnist import MNIST, synthetic_digits

STEPS = 10
BATCH = 16


@pytest.fixture(scope="module")
def data():
    return digit_batches(STEPS, BATCH)


def _pair(seed=0, **kwargs):
    torch.manual_seed(seed)
    eager = MNIST(**kwargs)
    static = d2s.declarative(copy.deepcopy(eager))
    return eager, static


def _optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=1e-3)


@pytest.mark.parametrize("optimizer, variant", [
    ("sgd", {}),
    ("adam", {}),
    ("adam", {"dropout": 0.3}),
    ("sgd", {"batch_norm": True}),
    ("adam", {"dropout": 0.2, "batch_norm": True}),
], ids=["sgd-plain", "adam-plain", "adam-dropout", "sgd-batchnorm", "adam-dropout+batchnorm"])
def test_training_matches_eager_step_by_step(data, optimizer, variant):
    eager, static = _pair(**variant)
    eager_loss, eager_acc = eager_steps(eager, _optimizer(optimizer, eager.parameters()), data, seed=100)
    static_loss, static_acc = eager_steps(static, _optimizer(optimizer, static.parameters()), data, seed=100)

    torch.testing.assert_close(static_loss, eager_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(static_acc, eager_acc, rtol=1e-5, atol=0)
    assert eager_loss[-1] < eager_loss[0]  # it does learn
    for (name, p), (static_name, q) in zip(eager.named_parameters(), static.named_parameters()):
        assert name == static_name
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    for (name, b), (_, c) in zip(eager.named_buffers(), static.named_buffers()):
        torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    # one program served all ten training steps
    assert len(static.forward.program_cache) == 1


@pytest.mark.parametrize("batch_norm", [False, True])
def test_train_and_eval_select_separate_cached_programs(data, batch_norm):
    eager, static = _pair(dropout=0.5, batch_norm=batch_norm)
    x, y = data[0]
    cache = static.forward.program_cache

    eager.train()
    static.train()
    for model in (eager, static):  # the same batch-norm statistics in both
        torch.manual_seed(1)
        model(x, y)
    assert len(cache) == 1
    train_program = static.forward.concrete_program

    eager.eval()
    static.eval()
    static_probs, static_acc = static(x, y)
    assert len(cache) == 2
    assert static.forward.concrete_program is not train_program
    eager_probs, eager_acc = eager(x, y)
    # eval: no dropout, running statistics; equal to eager eval
    torch.testing.assert_close(static_probs, eager_probs, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(static_acc, eager_acc)
    torch.testing.assert_close(static(x), eager(x), rtol=1e-5, atol=1e-7)
    assert len(cache) == 3  # label=None is another program

    # back to train mode: the first program again, no rebuild
    static.train()
    static(x, y)
    assert len(cache) == 3
    assert static.forward.concrete_program is train_program


def test_batch_norm_running_stats_updated_in_place_like_eager(data):
    eager, static = _pair(batch_norm=True)
    mean, var = static.norm.running_mean, static.norm.running_var
    before = mean.clone()
    eager.train()
    static.train()
    for step, (x, y) in enumerate(data[:3]):
        with torch.no_grad():
            eager(x, y)
            static(x, y)
        torch.testing.assert_close(static.norm.running_mean, eager.norm.running_mean, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(static.norm.running_var, eager.norm.running_var, rtol=1e-5, atol=1e-7)
        assert int(static.norm.num_batches_tracked) == int(eager.norm.num_batches_tracked) == step + 1
    # the very tensors the module holds were updated (no rebinding)
    assert static.norm.running_mean is mean and static.norm.running_var is var
    assert not torch.equal(mean, before)

    # eval mode reads, and does not update, the statistics
    eager.eval()
    static.eval()
    snapshot = mean.clone()
    torch.testing.assert_close(static(data[0][0]), eager(data[0][0]), rtol=1e-5, atol=1e-7)
    assert torch.equal(static.norm.running_mean, snapshot)
    assert int(static.norm.num_batches_tracked) == 3


def test_dropout_draws_the_same_random_numbers(data):
    eager, static = _pair(dropout=0.5)
    eager.train()
    static.train()
    x = data[0][0]
    outs = {}
    for seed in (7, 8):
        torch.manual_seed(seed)
        eager_out = eager(x)
        torch.manual_seed(seed)
        static_out = static(x)
        torch.testing.assert_close(static_out, eager_out, rtol=1e-5, atol=1e-7)
        torch.manual_seed(seed)
        assert torch.equal(static(x), static_out)  # same seed, same mask
        outs[seed] = static_out
    assert not torch.allclose(outs[7], outs[8])  # and dropout is really on


# -- gradients through cond and while ------------------------------------------------------

class Branchy(nn.Module):
    """`if` on a tensor mean and a `while` over a tensor count."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)

    def forward(self, x, n):
        if x.mean() > 0:
            h = torch.tanh(self.a(x))
        else:
            h = torch.sigmoid(self.b(x)) * 2.0
        i = 0
        while i < n:
            h = 0.5 * torch.tanh(self.b(h)) + h
            i += 1
        return h.sum() + h.pow(2).mean()


CASES = [(1.0, 0), (1.0, 3), (-1.0, 1), (-1.0, 4), (1.0, 2), (-1.0, 0)]


def _case(sign, n):
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(n)).abs() * sign
    return x.requires_grad_(True), torch.tensor(n)


@pytest.mark.parametrize("first", range(len(CASES)), ids=[f"built-from-{'pos' if s > 0 else 'neg'}-n{n}"
                                                        for s, n in CASES])
def test_gradients_through_cond_and_while_match_eager(first):
    torch.manual_seed(0)
    eager = Branchy()
    static = d2s.declarative(copy.deepcopy(eager))
    order = CASES[first:] + CASES[:first]  # the program is built from case `first`, reused for the rest
    for sign, n in order:
        x_eager, count = _case(sign, n)
        x_static = x_eager.detach().clone().requires_grad_(True)
        eager.zero_grad()
        static.zero_grad()
        out_eager = eager(x_eager, count)
        out_static = static(x_static, count)
        torch.testing.assert_close(out_static, out_eager, rtol=1e-5, atol=1e-6)
        out_eager.backward()
        out_static.backward()
        torch.testing.assert_close(x_static.grad, x_eager.grad, rtol=1e-5, atol=1e-6)
        for (name, p), (_, q) in zip(eager.named_parameters(), static.named_parameters()):
            if p.grad is None:  # a layer the taken path does not use
                assert q.grad is None or not q.grad.any(), name
            else:
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"sign {sign}, n {n}, {name}: {m}")
    assert len(static.forward.program_cache) == 1
    ops = [op.type for block in static.forward.concrete_program.main_program.blocks for op in block.ops]
    assert "cond" in ops and "while" in ops


class CumulativeNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4, momentum=None)  # cumulative moving average: 1 / num_batches_tracked

    def forward(self, x):
        return self.bn(self.fc(x))


def test_batch_norm_cumulative_average_is_refused_not_frozen():
    """BatchNorm(momentum=None) turns `num_batches_tracked`, which the program
    updates in place, into a Python float; freezing its build-time value would
    make the running statistics drift from eager, so it is an error at the line."""
    torch.manual_seed(0)
    static = d2s.declarative(CumulativeNorm())
    with pytest.raises(d2s.ConversionError, match="known only when the program runs") as err:
        static(torch.randn(8, 4))
    assert err.value.filename == __file__


# -- the example script ------------------------------------------------------------------------

def _write_idx(path, array, gz):
    import gzip
    import struct
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    opener = gzip.open if gz else open
    with opener(str(path) + (".gz" if gz else ""), "wb") as f:
        f.write(header + array.astype("uint8").tobytes())


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_example_reads_idx_files_and_runs_end_to_end(tmp_path, gz, capsys):
    import mnist
    images, labels = synthetic_digits(96, seed=4)
    raw = (images.squeeze(1) * 255).round().numpy()
    for split, (n0, n1) in {"train": (0, 64), "test": (64, 96)}.items():
        image_file, label_file = mnist.IDX_FILES[split]
        _write_idx(tmp_path / image_file, raw[n0:n1], gz)
        _write_idx(tmp_path / label_file, labels[n0:n1].numpy(), gz)
    got_images, got_labels = mnist.load_mnist(str(tmp_path), "train")
    assert got_images.shape == (64, 1, 28, 28) and torch.equal(got_labels, labels[:64])
    torch.testing.assert_close(got_images, torch.from_numpy(raw[:64]).unsqueeze(1) / 255.0)

    status = mnist.main(["--data-dir", str(tmp_path), "--epochs", "1", "--batch-size", "32",
                         "--save-dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert status == 0
    assert "64 train / 32 test images" in out
    assert sorted(os.listdir(tmp_path / "out")) == ["mnist_infer", "mnist_with_acc"]
    assert "probabilities equal eager: True" in out
