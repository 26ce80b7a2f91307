"""Benchmark: eager PyTorch vs the same model captured into a Program.

A deep MLP of small layers (32 x Linear(64, 64) + ReLU, batch 8, CPU) is where
Python overhead dominates. Timings are interleaved (eager, compiled, run, ...)
in one process, repeated, and the median per call is reported, with autograd
off (torch.no_grad) and on.

    python examples/bench_executor.py [--rounds 15] [--calls 200]
"""

import argparse
import statistics
import time

import torch

import ops  # noqa: F401 - installs op capture on Variables
import runtime
from runtime.executor import resolve_persistables, run_compiled


def build(depth=32, width=64, batch=8):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    program = runtime.Program()
    with runtime.program_guard(program):
        x = runtime.data("x", [None, width])
        y = model(x)
    return model, program, y, torch.randn(batch, width)


def per_call(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def bench(rounds, calls, grad):
    model, program, y, x = build()
    exe = runtime.Executor()
    entry = exe.compiled(program, ["x"], [y.name])
    params = resolve_persistables(program, entry.param_names)
    variants = {
        "eager": lambda: model(x),
        "compiled fn": lambda: entry.fn(x, *params),
        "run_compiled": lambda: run_compiled(entry, [x] + params),
        "Executor.run": lambda: exe.run(program, feed={"x": x}, fetch_list=[y], return_numpy=False),
        "Executor.run numpy": lambda: exe.run(program, feed={"x": x.numpy()}, fetch_list=[y]),
    }
    # The same numbers, so the comparison is between equal work.
    with torch.no_grad():
        assert torch.equal(variants["eager"](), variants["compiled fn"]()[0])
    times = {k: [] for k in variants}
    ctx = torch.enable_grad if grad else torch.no_grad
    with ctx():
        for fn in variants.values():
            per_call(fn, calls // 4)  # warm-up
        for _ in range(rounds):
            for name, fn in variants.items():
                times[name].append(per_call(fn, calls))
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)  # small ops: keep thread-pool noise out of the numbers
    for grad in (False, True):
        med = bench(args.rounds, args.calls, grad)
        base = med["eager"]
        print(f"\nautograd {'on' if grad else 'off (no_grad)'}: median of {args.rounds} rounds x {args.calls} calls")
        for name, t in med.items():
            print(f"  {name:20s} {t * 1e6:9.1f} us/call   {t / base:5.2f}x eager")


if __name__ == "__main__":
    main()
