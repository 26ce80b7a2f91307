"""Speed benchmark (a script, never a test): eager vs d2s vs peers, one run.

For five workloads it prints the speedup over eager of: d2s at the default
level, d2s at the fast level (`optimize="fast"`), TorchScript and
torch.compile (inductor) where they run, and then the cache-hit overhead of a
declarative call over calling its compiled function directly, for modules
with 1, 10 and 100 submodules. The training step is measured twice: a
declarative model stepped by eager code (`opt.zero_grad()`, `loss.backward()`,
`opt.step()`), and the whole step as one program (`d2s.Graph` with the
optimizer added, at each level), both against the eager step.

    OMP_NUM_THREADS=1 python benchmarks/speed.py [--rounds 21] [--no-compile] [--no-grad] [--device cuda]

`--device cuda` runs the five workloads on the GPU (models and inputs moved
there, loop bounds kept as CPU tensors as a host-side count would be); each
timed slice ends with `torch.cuda.synchronize()`, so a time is the wall time
of the launches and of the kernels they queued, whichever is longer. The
loaded-model rows and the cache-hit overhead are CPU-only and skipped there.
A sixth column there is `d2s.cuda_graph` of the default-level model: it
replays CUDA graphs for calls under `--no-grad` whose program reads no GPU
value on the host; elsewhere it reads "plain" with the ratio of its plain
declarative calls.

`--no-grad` runs every contender (eager included) under `torch.no_grad()`,
as inference code does; there d2s calls run the variant that reuses dead
temporaries in place (the training step, which needs autograd, is skipped).

Method: one thread; every contender is warmed up, then the contenders run
interleaved, round after round (a round times `calls` calls of each), so
machine noise hits them alike. A speedup is eager time / contender time of
the same round, each contender timed by its fastest slice of the round (load
from other processes only adds time); the table shows the median over rounds
and, in brackets, the 25th-75th percentile spread. Ratios are what to read: the absolute times
depend on the machine and its load.
"""

import argparse
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import d2s  # noqa: E402
from models import GreedyDecoder  # noqa: E402


# -- the five workloads ------------------------------------------------------------------

class LSTMLoop(nn.Module):
    """An LSTMCell applied step by step, `for t in range(length)` with a tensor length."""

    def __init__(self, inp=32, hidden=64):
        super().__init__()
        self.hidden = hidden
        self.cell = nn.LSTMCell(inp, hidden)

    def forward(self, x, length):
        h = torch.zeros(x.shape[0], self.hidden, device=x.device)
        c = torch.zeros(x.shape[0], self.hidden, device=x.device)
        for t in range(length):
            h, c = self.cell(x[:, t], (h, c))
        return h


class DeepResidual(nn.Module):
    """24 small Linear + tanh + residual layers, with one tensor `if`."""

    def __init__(self, depth=24, width=64):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        if x.mean() > 0:
            x = x * 0.5
        else:
            x = x - 1.0
        return x


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class MLPLoss(nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, 10))

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


class TrainStep(d2s.Graph):
    """The training step below as one program (d2s.Graph): zero_grad,
    forward, backward and SGD's update."""

    def __init__(self, model, lr=0.01, optimize=None):
        super().__init__(optimize=optimize)
        self.model = model
        self.add_optimizer(torch.optim.SGD(model.parameters(), lr=lr))

    def build(self, x, y):
        loss = self.model(x, y)
        loss.backward()
        return loss


def _copy(module_cls, eager):
    other = module_cls()
    other.load_state_dict(eager.state_dict())
    return other.to(next(eager.parameters()).device)


def _training_step(model, opt, x, y):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss
    return step


# -- contenders ----------------------------------------------------------------------------

def _declarative(module, optimize):
    if optimize == "default":
        return d2s.declarative(module)
    try:
        return d2s.declarative(module, optimize=optimize)
    except TypeError:
        return None  # this d2s has no fast level


def _scripted(module):
    try:
        return torch.jit.script(module)
    except Exception:  # noqa: BLE001 - "does not run" is a result here
        return None


def _compiled(module, use_compile):
    if not use_compile:
        return None
    return torch.compile(module)


def _graphed(module, workload):
    """`d2s.cuda_graph` of the default-level model: calls under no_grad on
    CUDA arguments replay a graph where that is exact; the others run as
    plain declarative calls (the table says which)."""
    if "training" in workload or not hasattr(d2s, "cuda_graph"):
        return None  # a training step records autograd: no graph
    return d2s.cuda_graph(d2s.declarative(module))


def workloads(use_compile, device="cpu"):
    """name -> (make_call(model) -> zero-arg callable, {contender: model or None})."""
    out = {}

    def on(*made):
        moved = tuple(m.to(device) for m in made)
        return moved if len(moved) > 1 else moved[0]

    torch.manual_seed(0)
    lstm = on(LSTMLoop())
    x, length = on(torch.randn(4, 48, 32)), torch.tensor(48)
    out["LSTMCell loop, tensor length 48"] = (
        lambda m: (lambda: m(x, length)), lstm, LSTMLoop)

    torch.manual_seed(0)
    deep = on(DeepResidual())
    xd = on(torch.randn(8, 64))
    out["24 Linear+tanh+residual, tensor if"] = (lambda m: (lambda: m(xd)), deep, DeepResidual)

    torch.manual_seed(1)
    dec = on(GreedyDecoder())
    hd, max_len = on(torch.randn(3, 32)), torch.tensor(16)
    out["GRU greedy decoder, while+break"] = (lambda m: (lambda: m(hd, max_len)), dec, GreedyDecoder)

    torch.manual_seed(0)
    conv = on(ConvNet())
    xc = on(torch.randn(32, 3, 32, 32))
    out["conv net, batch 32"] = (lambda m: (lambda: m(xc)), conv, ConvNet)

    torch.manual_seed(0)
    mlp = on(MLPLoss())
    xm, ym = on(torch.randn(16, 64), torch.randint(0, 10, (16,)))
    out["MLP training step"] = (
        lambda m: _training_step(m, torch.optim.SGD(m.parameters(), lr=0.01), xm, ym), mlp, MLPLoss)
    # The same step with the optimizer inside the program: d2s columns are
    # TrainStep graphs at each level; eager is the eager step above.
    out["MLP training step, d2s.Graph"] = (
        lambda m: (lambda: m(xm, ym)) if isinstance(m, d2s.Graph) else
        _training_step(m, torch.optim.SGD(m.parameters(), lr=0.01), xm, ym), mlp, MLPLoss)

    result = {}
    for name, (make_call, eager, cls) in out.items():
        if name.endswith("d2s.Graph"):
            eager = _copy(cls, eager)  # its own weights: each step updates them
            result[name] = (make_call, {
                "eager": eager, "d2s default": TrainStep(_copy(cls, eager), optimize="default"),
                "d2s fast": TrainStep(_copy(cls, eager), optimize="fast"), "TorchScript": None,
                "torch.compile": None})
            continue
        contenders = {
            "eager": eager,
            "d2s default": _declarative(_copy(cls, eager), "default"),
            "d2s fast": _declarative(_copy(cls, eager), "fast"),
            "TorchScript": _scripted(_copy(cls, eager)),
            "torch.compile": _compiled(_copy(cls, eager), use_compile),
        }
        if device == "cuda":
            contenders["d2s CUDA graph"] = _graphed(_copy(cls, eager), name)
        result[name] = (make_call, contenders)
    return result


# -- timing ----------------------------------------------------------------------------------

def _no_sync():
    pass


# torch.cuda.synchronize under --device cuda: a slice's time includes the kernels it queued.
_sync = _no_sync


def per_call(fn, calls):
    _sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync()
    return (time.perf_counter() - start) / calls


def _quantile(values, q):
    values = sorted(values)
    pos = q * (len(values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _warm(fn, tries=3):
    """Run `fn` a few times; None if it fails (the contender does not run)."""
    try:
        for _ in range(tries):
            fn()
        return fn
    except Exception as exc:  # noqa: BLE001
        return f"fails: {type(exc).__name__}"


def bench_workload(make_call, contenders, rounds, budget):
    calls = {}
    notes = {}
    for name, model in contenders.items():
        if model is None:
            notes[name] = "n/a"
            continue
        fn = _warm(make_call(model))
        if isinstance(fn, str):
            notes[name] = fn
        else:
            calls[name] = fn
    # A round is `chunks` slices of about budget/chunks seconds of eager
    # time each; inside a round the contenders alternate slice by slice and
    # each keeps its fastest slice: on a shared machine, load from elsewhere
    # only ever adds time, so the fastest slice is the least disturbed one.
    chunks = 8
    n = max(1, int(budget / chunks / max(per_call(calls["eager"], 3), 1e-6)))
    ratios = {name: [] for name in calls}
    for _ in range(rounds):
        times = dict.fromkeys(calls, float("inf"))
        for _ in range(chunks):
            for name, fn in calls.items():
                times[name] = min(times[name], per_call(fn, n))
        for name, t in times.items():
            ratios[name].append(times["eager"] / t)
    return ratios, notes


def cache_hit_overhead(rounds, calls=2000):
    """Microseconds a declarative call adds over the compiled function, by submodule count."""

    class Wide(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.blocks = nn.ModuleList(nn.ReLU() for _ in range(n - 1))

        def forward(self, x):
            return x + 1

    rows = {}
    x = torch.randn(2)
    for n in (1, 10, 100):
        model = d2s.declarative(Wide(n))
        model(x)
        concrete = model.forward.concrete_program
        entry = concrete.compiled
        params = [concrete.main_program.bound[p] for p in entry.param_names]
        direct = lambda: entry.fn(x, *params)  # noqa: E731
        full = lambda: model(x)  # noqa: E731
        diffs = []
        for _ in range(rounds):
            full_t = direct_t = float("inf")
            for _ in range(10):
                full_t = min(full_t, per_call(full, calls // 10))
                direct_t = min(direct_t, per_call(direct, calls // 10))
            diffs.append((full_t - direct_t) * 1e6)
        rows[n] = diffs
    return rows


# -- a saved model, loaded in a fresh process -------------------------------------------------

LOADED = {"24 Linear+tanh+residual, tensor if": (DeepResidual, (8, 64)), "conv net, batch 32": (ConvNet, (32, 3, 32, 32))}


def loaded_rows(rounds, budget, no_grad):
    """Save each LOADED model with jit.save, then in a fresh process time it
    loaded with `jit.load(optimize=level)` against the declarative model at
    that level (and eager), interleaved: yields (workload, {level: ratios of
    declarative time / loaded time})."""
    import json
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, (cls, shape)) in enumerate(LOADED.items()):
            torch.manual_seed(0)
            model = cls()
            torch.save(model.state_dict(), os.path.join(tmp, f"{i}.pt"))
            d2s.jit.save(d2s.declarative(_copy(cls, model)), os.path.join(tmp, str(i)),
                         input_spec=[torch.randn(*shape)])
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--loaded-child", tmp,
                               "--rounds", str(rounds), "--budget", str(budget)] + ["--no-grad"] * no_grad,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the loading process failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.splitlines()[-1])


def loaded_child(tmp, rounds, budget):
    """The fresh process of `loaded_rows`: prints its result as one JSON line."""
    import json
    out = {}
    for i, (name, (cls, shape)) in enumerate(LOADED.items()):
        eager = cls()
        eager.load_state_dict(torch.load(os.path.join(tmp, f"{i}.pt")))
        x = torch.randn(*shape)
        contenders = {"eager": eager}
        for level in ("default", "fast"):
            contenders[f"declarative {level}"] = d2s.declarative(_copy(cls, eager), optimize=level)
            contenders[f"loaded {level}"] = d2s.jit.load(os.path.join(tmp, str(i)), optimize=level)
        ratios, _ = bench_workload(lambda m: (lambda: m(x)), contenders, rounds, budget)
        # (eager / loaded time) / (eager / declarative time), round by round
        out[name] = {level: [a / b for a, b in zip(ratios[f"loaded {level}"], ratios[f"declarative {level}"])]
                     for level in ("default", "fast")}
    print(json.dumps(out))


def parse_and_set_up(parser, rounds):
    """Add the options the benchmark scripts share, parse them, and set up
    one thread, no warnings and the grad mode asked for."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--budget", type=float, default=0.02, help="seconds of eager time per round")
    parser.add_argument("--no-grad", action="store_true", help="run every contender under torch.no_grad()")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if args.no_grad:
        torch.set_grad_enabled(False)
    return args


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow to compile)")
    parser.add_argument("--only", default="", help="run only workloads whose name contains this")
    parser.add_argument("--loaded-child", default="", help=argparse.SUPPRESS)  # loaded_rows' fresh process
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the workloads run")
    args = parse_and_set_up(parser, rounds=21)
    if args.loaded_child:
        return loaded_child(args.loaded_child, args.rounds, args.budget)
    global _sync
    if args.device == "cuda":
        _sync = torch.cuda.synchronize
        print(f"device: {torch.cuda.get_device_name()}")
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} interleaved rounds"
          f"{', under torch.no_grad()' if args.no_grad else ''}; "
          "speedup over eager: median [25th-75th percentile]")
    names = ["d2s default", "d2s fast", "TorchScript", "torch.compile"]
    if args.device == "cuda":
        names.append("d2s CUDA graph")
        print("d2s CUDA graph: d2s.cuda_graph of the default level; 'plain' where its calls run without a graph "
              "(grad mode on, a CPU argument, a GPU value read on the host)")
    print(f"{'workload':38s}" + "".join(f"{n:>22s}" for n in names))
    for wname, (make_call, contenders) in workloads(not args.no_compile, args.device).items():
        if args.only and args.only not in wname or args.no_grad and "training" in wname:
            continue
        ratios, notes = bench_workload(make_call, contenders, args.rounds, args.budget)
        graphed = contenders.get("d2s CUDA graph")
        if graphed is not None and "d2s CUDA graph" in ratios and not graphed.replays:
            r = ratios.pop("d2s CUDA graph")
            notes["d2s CUDA graph"] = f"plain {statistics.median(r):4.2f}x"
        cells = []
        for name in names:
            if name in ratios:
                r = ratios[name]
                cells.append(f"{statistics.median(r):5.2f}x [{_quantile(r, .25):4.2f}-{_quantile(r, .75):4.2f}]")
            else:
                cells.append(notes.get(name, "n/a")[:21])
        print(f"{wname:38s}" + "".join(f"{c:>22s}" for c in cells), flush=True)
    if args.device != "cpu":
        return
    print("\nsaved with jit.save, loaded in a fresh process (jit.load(optimize=level)), vs the declarative model "
          "in that process: declarative time / loaded time (>= 0.95: within 5%)")
    for wname, by_level in loaded_rows(args.rounds, args.budget, args.no_grad).items():
        if args.only and args.only not in wname:
            continue
        cells = "".join(f"{statistics.median(r):5.2f}x [{_quantile(r, .25):4.2f}-{_quantile(r, .75):4.2f}]".rjust(22)
                        for r in by_level.values())
        print(f"{wname + ', loaded':38s}{cells}", flush=True)
    print("\ncache-hit overhead over calling the compiled function (us per call, median [25th-75th]):")
    for n, diffs in cache_hit_overhead(args.rounds).items():
        print(f"  {n:4d} submodules: {statistics.median(diffs):6.2f} us "
              f"[{_quantile(diffs, .25):.2f}-{_quantile(diffs, .75):.2f}]  "
              f"(target <= {2 + 0.05 * n:.2f} us)")


if __name__ == "__main__":
    main()
