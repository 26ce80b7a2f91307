"""What d2s can reach (a script, never a test): d2s against hand-written
straight-line Python calling the very kernels d2s's generated code calls,
no modules, no wrappers, and against the same calls in C++.

The default level keeps each kernel (results bit-identical to eager). The
middle column is the floor of calling those kernels from Python, one binding
call per op; native segments (runtime/native) make the same ATen calls from
C++, so d2s runs below it. The right column is the kernels' own time: the
same ATen calls in a C++ loop with no Python between them
(`floor_ref.cpp`, built on first use with the native extension's compiler
and flags, cached beside its library), autograd recording as in eager.

Every row has `d2s fast` beside `d2s default`. The training step
(speed.py's: zero_grad, forward, backward, SGD's update) is a row too: its
d2s columns are the declarative model stepped by eager code (speed.py also
times the step as one d2s.Graph program); its by-hand and C++ steps make
the forward's calls, run eager's backward through the autograd engine and
SGD's update kernels, so the C++ column is the step's kernels with eager's
autograd and no Python at all.

    OMP_NUM_THREADS=1 python benchmarks/floor.py [--rounds 11] [--no-grad]

Same method as benchmarks/speed.py: interleaved slices, fastest slice per
round, median speedup over eager across rounds.
"""

import argparse
import hashlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import d2s  # noqa: E402
import speed  # noqa: E402
from models import GreedyDecoder  # noqa: E402

_linear = torch._C._nn.linear  # what F.linear is


def deep_residual_by_hand(model):
    weights = [(layer.weight, layer.bias) for layer in model.layers]

    def run(x):
        for w, b in weights:
            x = x + torch.tanh(_linear(x, w, b))
        return x * 0.5 if x.mean() > 0 else x - 1.0
    return run


def decoder_by_hand(model):
    cell, out, table = model.cell, model.out, model.embed.weight

    def run(h, max_len):
        token = torch.zeros(h.shape[0], dtype=torch.long)
        done = torch.zeros(h.shape[0], dtype=torch.bool)
        tokens, step, n = [], 0, int(max_len)
        while step < n:
            h = torch.gru_cell(torch.embedding(table, token, -1, False, False), h, cell.weight_ih, cell.weight_hh,
                               cell.bias_ih, cell.bias_hh)
            token = _linear(h, out.weight, out.bias).argmax(-1)
            tokens.append(token)
            done = done | (token == model.eos)
            step += 1
            if done.all():
                break
        return torch.stack(tokens, 1), step
    return run


def lstm_loop_by_hand(model):
    cell = model.cell

    def run(x, length):
        h = torch.zeros(x.shape[0], model.hidden)
        c = torch.zeros(x.shape[0], model.hidden)
        steps = x.unbind(1)
        for t in range(int(length)):
            h, c = torch.lstm_cell(steps[t], (h, c), cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
        return h
    return run


def conv_by_hand(model):
    def run(x):
        x = torch.max_pool2d(torch.relu(torch.conv2d(x, model.conv1.weight, model.conv1.bias, 1, 1)), 2)
        x = torch.max_pool2d(torch.relu(torch.conv2d(x, model.conv2.weight, model.conv2.bias, 1, 1)), 2)
        return _linear(x.flatten(1), model.fc.weight, model.fc.bias)
    return run


def mlp_step_by_hand(model, lr=0.01):
    """speed.py's training step with SGD(lr) (no momentum), its calls by hand."""
    pairs = [(layer.weight, layer.bias) for layer in (model.net[0], model.net[2], model.net[4])]
    params = [t for pair in pairs for t in pair]

    def run(x, y):
        for p in params:
            p.grad = None
        h = torch.relu(_linear(torch.relu(_linear(x, *pairs[0])), *pairs[1]))
        loss = torch._C._nn.cross_entropy_loss(_linear(h, *pairs[2]), y, None, 1, -100, 0.0)
        loss.backward()
        with torch.no_grad():  # SGD.step's single-tensor path on the CPU
            for p in params:
                p.add_(p.grad, alpha=-lr)
        return loss
    return run


def cpp_reference():
    """The floor_ref extension, compiled with runtime/native's command once
    per source, torch and Python (cached in runtime/native's cache dir)."""
    from runtime import native
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "floor_ref.cpp")
    with open(source, "rb") as f:
        key = hashlib.sha256(b"\0".join([f.read(), torch.__version__.encode(), sys.version.encode()])).hexdigest()[:20]
    target = os.path.join(native.cache_dir(), f"d2s_floor-{key}.so")
    if not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        print("[floor] compiling floor_ref.cpp (once)", file=sys.stderr, flush=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
        os.close(fd)
        done = subprocess.run(native._command(source, tmp), capture_output=True, text=True)
        if done.returncode != 0:
            os.remove(tmp)
            raise RuntimeError("compiling benchmarks/floor_ref.cpp failed:\n" + done.stderr[-4000:])
        os.replace(tmp, target)
    spec = importlib.util.spec_from_file_location("d2s_floor", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpp_loops(ref):
    """name -> (model -> the C++ reference as a callable like the model)."""
    def lstm(m):
        ws = [m.cell.weight_ih, m.cell.weight_hh, m.cell.bias_ih, m.cell.bias_hh]
        return lambda x, length: ref.lstm_loop(x, int(length), m.hidden, ws)

    def deep(m):
        ws = [t for layer in m.layers for t in (layer.weight, layer.bias)]
        return lambda x: ref.deep_residual(x, ws)

    def dec(m):
        ws = [m.embed.weight, m.cell.weight_ih, m.cell.weight_hh, m.cell.bias_ih, m.cell.bias_hh, m.out.weight,
              m.out.bias]
        return lambda h, max_len: ref.decoder(h, int(max_len), m.eos, ws)

    def conv(m):
        ws = [m.conv1.weight, m.conv1.bias, m.conv2.weight, m.conv2.bias, m.fc.weight, m.fc.bias]
        return lambda x: ref.conv_net(x, ws)

    def mlp(m, lr=0.01):
        ws = [t for layer in (m.net[0], m.net[2], m.net[4]) for t in (layer.weight, layer.bias)]
        return lambda x, y: ref.mlp_step(x, y, lr, ws)

    return {"LSTMCell loop, tensor length 48": lstm, "24 Linear+tanh+residual, tensor if": deep,
            "GRU greedy decoder, while+break": dec, "conv net, batch 32": conv, "MLP training step": mlp}


def _stepping(lr=0.01):
    """model -> a step function like speed.py's training step (SGD(lr)),
    called with the batch (the by-hand and C++ steps take it the same way)."""
    def make(model):
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        return lambda x, y: speed._training_step(model, opt, x, y)()
    return make


def workloads():
    torch.manual_seed(0)
    lstm = speed.LSTMLoop()
    x, length = torch.randn(4, 48, 32), torch.tensor(48)
    torch.manual_seed(0)
    deep = speed.DeepResidual()
    xd = torch.randn(8, 64)
    torch.manual_seed(1)
    dec = GreedyDecoder()
    hd, max_len = torch.randn(3, 32), torch.tensor(16)
    torch.manual_seed(0)
    conv = speed.ConvNet()
    xc = torch.randn(32, 3, 32, 32)
    torch.manual_seed(0)
    mlp = speed.MLPLoss()
    xm, ym = torch.randn(16, 64), torch.randint(0, 10, (16,))
    return {
        "LSTMCell loop, tensor length 48": (lstm, speed.LSTMLoop, lstm_loop_by_hand, (x, length)),
        "24 Linear+tanh+residual, tensor if": (deep, speed.DeepResidual, deep_residual_by_hand, (xd,)),
        "GRU greedy decoder, while+break": (dec, GreedyDecoder, decoder_by_hand, (hd, max_len)),
        "conv net, batch 32": (conv, speed.ConvNet, conv_by_hand, (xc,)),
        "MLP training step": (mlp, speed.MLPLoss, mlp_step_by_hand, (xm, ym)),
    }


def main():
    args = speed.parse_and_set_up(argparse.ArgumentParser(description=__doc__.splitlines()[0]), rounds=11)
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds"
          f"{', under torch.no_grad()' if args.no_grad else ''}; speedup over eager: median [25th-75th]")
    names = ["d2s default", "d2s fast", "same kernels by hand", "same kernels in C++"]
    loops = cpp_loops(cpp_reference())
    print(f"{'workload':38s}" + "".join(f"{n:>24s}" for n in names))
    for name, (eager, cls, by_hand, inputs) in workloads().items():
        training = name == "MLP training step"
        if training and args.no_grad:
            continue  # a training step needs autograd
        wrap = _stepping() if training else (lambda model: model)
        models = {"eager": eager, "d2s default": d2s.declarative(speed._copy(cls, eager)),
                  "d2s fast": d2s.declarative(speed._copy(cls, eager), optimize="fast"),
                  "same kernels by hand": None, "same kernels in C++": None}
        # Each contender steps its own copy of the weights (a training step updates them).
        contenders = {n: wrap(m) for n, m in models.items() if m is not None}
        contenders["same kernels by hand"] = by_hand(speed._copy(cls, eager) if training else eager)
        contenders["same kernels in C++"] = loops[name](speed._copy(cls, eager) if training else eager)
        # The same results (a training step's first loss: the weights are
        # equal before it), or the comparison means nothing; the fast level's
        # up to rounding (its LSTM loop is one fused torch.lstm).
        expected = _tensors(wrap(speed._copy(cls, eager))(*inputs))
        for n, fn in contenders.items():
            same = (lambda a, b: torch.allclose(a, b, atol=1e-6)) if n == "d2s fast" else torch.equal
            assert all(same(a, b) for a, b in zip(_tensors(fn(*inputs)), expected)), (name, n)
        ratios, _ = speed.bench_workload(lambda fn: (lambda: fn(*inputs)), contenders, args.rounds, args.budget)
        cells = [f"{statistics.median(ratios[n]):5.2f}x [{speed._quantile(ratios[n], .25):4.2f}-"
                 f"{speed._quantile(ratios[n], .75):4.2f}]" for n in names]
        print(f"{name:38s}" + "".join(f"{c:>24s}" for c in cells), flush=True)


def _tensors(result):
    return [r for r in (result if isinstance(result, tuple) else (result,)) if isinstance(r, torch.Tensor)]


if __name__ == "__main__":
    main()
