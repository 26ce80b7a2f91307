"""Digits classifier: train eagerly and with @d2s.declarative side by side, save, load, evaluate.

The model is the one from PaddlePaddle's imperative-programming tutorial:
two conv-pool blocks (5x5 conv + relu + 2x2 max-pool) and a Linear classifier
with softmax. Its `forward(inputs, label=None)` has a Python `if` on an
argument: called with a label it also returns the batch accuracy.

    python examples/mnist.py                        # built-in synthetic digits, offline
    python examples/mnist.py --data-dir ~/mnist     # real MNIST IDX files (optionally .gz)
    python examples/mnist.py --epochs 3 --batch-size 32 --limit 2000

Both copies start from the same weights and see the same batches, so their
losses and accuracies agree (bit for bit on CPU with the default executor).
The declarative model is then saved twice -- with `d2s.jit.save` for
inference (`label=None`) and with `ProgramTranslator().save_inference_model`
after a labelled call (fetching both outputs) -- and loaded back with
`d2s.jit.load`, which needs none of this file's code.
"""

import argparse
import copy
import gzip
import os
import struct
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s


# -- the model -------------------------------------------------------------------------

class SimpleImgConvPool(nn.Module):
    """conv (5x5) -> relu -> max-pool (2x2)."""

    def __init__(self, in_channels, out_channels, filter_size=5, pool_size=2):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, filter_size)
        self.pool_size = pool_size

    def forward(self, inputs):
        x = F.relu(self.conv(inputs))
        return F.max_pool2d(x, self.pool_size)


class MNIST(nn.Module):
    """Two conv-pool blocks and a softmax classifier. With a label it also
    returns the accuracy of the batch (a 0-d float tensor)."""

    def __init__(self, dropout=0.0, batch_norm=False):
        super().__init__()
        self.conv_pool_1 = SimpleImgConvPool(1, 20)
        self.conv_pool_2 = SimpleImgConvPool(20, 50)
        self.norm = nn.BatchNorm2d(50) if batch_norm else nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.pool_2_shape = 50 * 4 * 4
        self.fc = nn.Linear(self.pool_2_shape, 10)

    def forward(self, inputs, label=None):
        x = self.conv_pool_1(inputs)
        x = self.conv_pool_2(x)
        x = self.norm(x)
        x = x.reshape(-1, self.pool_2_shape)
        x = self.dropout(x)
        x = F.softmax(self.fc(x), dim=-1)
        if label is not None:
            acc = (x.argmax(-1) == label).float().mean()
            return x, acc
        else:
            return x


def loss_fn(probs, label):
    """Cross entropy of softmax outputs (what the tutorial's cross_entropy does)."""
    return F.nll_loss(torch.log(probs.clamp_min(1e-12)), label)


# -- data ------------------------------------------------------------------------------

IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _open_idx(data_dir, name):
    for candidate in (name, name + ".gz", name.replace("-idx", ".idx"), name.replace("-idx", ".idx") + ".gz"):
        path = os.path.join(data_dir, candidate)
        if os.path.isfile(path):
            return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    raise FileNotFoundError(f"{data_dir}: no {name} (or {name}.gz); download MNIST's four IDX files there")


def read_idx(data_dir, name):
    """One IDX file as a numpy array (magic 0x0803 images, 0x0801 labels)."""
    with _open_idx(data_dir, name) as f:
        zero, dtype_code, ndim = struct.unpack(">HBB", f.read(4))
        if zero != 0 or dtype_code != 0x08:
            raise ValueError(f"{name}: not an unsigned-byte IDX file")
        dims = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        data = np.frombuffer(f.read(), dtype=np.uint8)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{name}: truncated ({data.size} bytes for shape {list(dims)})")
    return data.reshape(dims)


def load_mnist(data_dir, split):
    images_name, labels_name = IDX_FILES[split]
    images = read_idx(data_dir, images_name).astype(np.float32) / 255.0
    labels = read_idx(data_dir, labels_name).astype(np.int64)
    return torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels)


# Seven-segment strokes: (row0, col0, row1, col1) in a 20x12 glyph box.
SEGMENTS = {
    "a": (0, 0, 2, 12), "b": (0, 10, 10, 12), "c": (10, 10, 20, 12), "d": (18, 0, 20, 12),
    "e": (10, 0, 20, 2), "f": (0, 0, 10, 2), "g": (9, 0, 11, 12),
}
DIGIT_SEGMENTS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]


def synthetic_digits(n, seed):
    """`n` procedurally drawn 28x28 digits (seven-segment glyphs with random
    position, stroke intensity, slant and noise): deterministic for a seed,
    learnable, and needing no download."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n)
    images = np.zeros((n, 28, 28), dtype=np.float32)
    rows = np.arange(28)[:, None]
    for i, digit in enumerate(labels):
        top, left = rng.integers(2, 7), rng.integers(4, 13)
        slant = rng.uniform(-0.15, 0.15)
        glyph = np.zeros((28, 28), dtype=np.float32)
        for seg in DIGIT_SEGMENTS[digit]:
            r0, c0, r1, c1 = SEGMENTS[seg]
            intensity = rng.uniform(0.6, 1.0)
            for r in range(top + r0, min(top + r1, 28)):
                shift = int(round(slant * (r - top - 10)))
                lo, hi = max(left + c0 + shift, 0), min(left + c1 + shift, 28)
                glyph[r, lo:hi] = np.maximum(glyph[r, lo:hi], intensity)
        noise = rng.normal(0.0, 0.15, size=(28, 28)).astype(np.float32)
        images[i] = np.clip(glyph + noise + 0.02 * (rows % 3 == digit % 3), 0.0, 1.0)
    return torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def batches(images, labels, batch_size, seed):
    """The same shuffled batches for every caller with the same seed."""
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    for start in range(0, len(images), batch_size):
        idx = order[start:start + batch_size]
        yield images[idx], labels[idx]


# -- training --------------------------------------------------------------------------

def progress(done, total, text, width=24):
    if not sys.stdout.isatty():  # logs and pipes get the per-epoch lines only
        return
    filled = int(width * done / max(total, 1))
    bar = "#" * filled + "." * (width - filled)
    line = f"  [{bar}] {done:>4}/{total} {text}"
    # The finished bar is wiped so that the epoch's summary line replaces it.
    sys.stdout.write("\r" + (" " * len(line) + "\r" if done == total else line))
    sys.stdout.flush()


def train_side_by_side(eager, static, train, epochs, batch_size, lr=1e-3):
    """Train both models on identical batches; returns per-epoch stats."""
    opt_eager = torch.optim.Adam(eager.parameters(), lr=lr)
    opt_static = torch.optim.Adam(static.parameters(), lr=lr)
    images, labels = train
    n_batches = (len(images) + batch_size - 1) // batch_size
    history = []
    print(f"{'epoch':>5}  {'eager loss':>10} {'eager acc':>9}   {'static loss':>11} {'static acc':>10}   "
          f"{'eager s':>7} {'static s':>8}")
    for epoch in range(epochs):
        eager.train()
        static.train()
        totals = np.zeros(4)
        seconds = np.zeros(2)
        for step, (x, y) in enumerate(batches(images, labels, batch_size, seed=epoch)):
            for k, (model, opt) in enumerate(((eager, opt_eager), (static, opt_static))):
                start = time.perf_counter()
                probs, acc = model(x, y)
                loss = loss_fn(probs, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                seconds[k] += time.perf_counter() - start
                totals[2 * k:2 * k + 2] += (loss.item() * len(x), acc.item() * len(x))
            seen = min((step + 1) * batch_size, len(images))
            progress(step + 1, n_batches, f"loss {totals[0] / seen:.4f} | {totals[2] / seen:.4f}")
        mean = totals / len(images)
        history.append(mean)
        print(f"{epoch:>5}  {mean[0]:>10.4f} {mean[1]:>9.4f}   {mean[2]:>11.4f} {mean[3]:>10.4f}   "
              f"{seconds[0]:>7.2f} {seconds[1]:>8.2f}")
    return history


@torch.no_grad()
def evaluate(model, test, batch_size=256):
    """Accuracy of a model that returns probabilities for `model(images)`."""
    images, labels = test
    correct = 0
    for start in range(0, len(images), batch_size):
        probs = model(images[start:start + batch_size])
        correct += int((probs.argmax(-1) == labels[start:start + batch_size]).sum())
    return correct / len(images)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", help="directory with MNIST's IDX files (default: synthetic digits)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None,
                        help="use at most this many training images (default: 1536 synthetic, all of MNIST)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-dir", help="where to save the models (default: a temporary directory)")
    args = parser.parse_args(argv)

    if args.data_dir:
        train, test = load_mnist(args.data_dir, "train"), load_mnist(args.data_dir, "test")
        source = f"MNIST from {args.data_dir}"
    else:
        limit = args.limit or 1536
        train, test = synthetic_digits(limit, seed=args.seed), synthetic_digits(512, seed=args.seed + 1)
        source = "synthetic seven-segment digits"
    if args.limit:
        train = (train[0][:args.limit], train[1][:args.limit])
        test = (test[0][:max(args.limit // 4, 1)], test[1][:max(args.limit // 4, 1)])
    print(f"data: {source}: {len(train[0])} train / {len(test[0])} test images")

    torch.manual_seed(args.seed)
    eager = MNIST()
    static = d2s.declarative(copy.deepcopy(eager))   # same initial weights, forward is now a static program
    train_side_by_side(eager, static, train, args.epochs, args.batch_size, args.lr)

    eager.eval()
    static.eval()
    eager_acc, static_acc = evaluate(eager, test), evaluate(static, test)
    print(f"test accuracy: eager {eager_acc:.4f}, declarative {static_acc:.4f}")
    print(f"programs built for forward: {len(static.forward.program_cache)} "
          "(one per train/eval mode, label or not, and batch size)")

    save_dir = args.save_dir or tempfile.mkdtemp(prefix="d2s-mnist-")
    infer_dir = os.path.join(save_dir, "mnist_infer")
    both_dir = os.path.join(save_dir, "mnist_with_acc")

    # 1. Inference program (label=None), one program for every batch size.
    d2s.jit.save(static, infer_dir, input_spec=[d2s.InputSpec([None, 1, 28, 28], "float32")])
    # 2. The program of the latest labelled call, keeping both outputs.
    images, labels = test
    static(images[:64], labels[:64])
    d2s.ProgramTranslator().save_inference_model(both_dir, fetch=[0, 1])
    print(f"saved: {infer_dir} and {both_dir}")

    loaded = d2s.jit.load(infer_dir)
    loaded_acc = evaluate(loaded, test)
    print(f"loaded (jit.save) test accuracy: {loaded_acc:.4f}")
    with_acc = d2s.jit.load(both_dir)
    probs, acc = with_acc(images[:64], labels[:64])
    print(f"loaded (save_inference_model) feeds {with_acc.feed_names}: batch accuracy {float(acc):.4f}, "
          f"probabilities equal eager: {torch.allclose(probs, eager(images[:64]), atol=1e-6)}")
    if abs(loaded_acc - eager_acc) > 1e-9:
        print("warning: the loaded model's accuracy differs from eager", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
