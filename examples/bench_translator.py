"""Benchmark (not a test): conversion time, and time per call of declarative
vs eager, for the LSTM tagger and the GRU greedy decoder.

    python examples/bench_translator.py
    python examples/bench_translator.py --cold [ROUNDS]     (only the cold-process table)

Both run in the same process, interleaved, median of several rounds after a
warm-up; the ratio is what to read (the machines are noisy).
"""

import os
import statistics
import subprocess
import sys
import time

import torch

import d2s
from models import GreedyDecoder, LSTMTagger, declarative_copy


def per_call(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def compare(name, eager_call, static_call, calls=20, rounds=9):
    for _ in range(3):
        eager_call()
        static_call()
    eager_t, static_t = [], []
    for _ in range(rounds):
        eager_t.append(per_call(eager_call, calls))
        static_t.append(per_call(static_call, calls))
    e, s = statistics.median(eager_t), statistics.median(static_t)
    print(f"  {name:34s} eager {e * 1e6:9.1f} us   declarative {s * 1e6:9.1f} us   ratio {s / e:5.2f}x")


def conversion_time(model_cls, *args):
    torch.manual_seed(0)
    eager = model_cls()
    static = declarative_copy(model_cls, eager)
    start = time.perf_counter()
    static(*args)
    return eager, static, time.perf_counter() - start


def _cold_models():
    """name -> a function making (the eager model, its first call's arguments)."""
    def quickstart():
        from quickstart import GatedRefiner
        return GatedRefiner(), (torch.randn(4, 8),)

    def tagger():
        return LSTMTagger(), (torch.randint(0, 50, (8, 32)), torch.tensor(32))

    def decoder():
        return GreedyDecoder(), (torch.randn(8, 32), torch.tensor(24))

    return {"quickstart GatedRefiner": quickstart, "LSTM tagger": tagger, "greedy decoder": decoder}


# One cold process: import torch (timed), then d2s (timed), then the first
# call of one model, eager or declarative; or torch's first meta-kernel call.
# The first declarative call is what a user waits for: the source converted,
# the function traced (shape inference on meta/fake tensors), the program
# verified, optimised and compiled, and run once on the arguments.
_COLD_CHILD = """
import sys, time
def clock():
    return time.perf_counter(), time.process_time()
start = clock()
import torch
imported_torch = clock()
import d2s
imported_d2s = clock()
what, name = sys.argv[1], sys.argv[2]
stages = [start, imported_torch, imported_d2s]
if what == "meta":
    # torch's own first calls of Python meta kernels (what shape inference
    # runs on): linear imports sympy; then tanh, whose type-promotion wrapper
    # imports torch._dynamo (which d2s's inference avoids, ops/cold_start.py).
    x, w = torch.empty(4, 8, device="meta"), torch.empty(16, 8, device="meta")
    stages.append(clock())
    torch.nn.functional.linear(x, w)
    stages.append(clock())
    torch.tanh(x)
else:
    from bench_translator import _cold_models
    torch.manual_seed(0)
    model, args = _cold_models()[name]()
    model = d2s.declarative(model) if what == "d2s" else model
    stages.append(clock())
    model(*args)
stages.append(clock())
for a, b in zip(stages, stages[1:]):
    print(b[0] - a[0], b[1] - a[1])
"""


def _cold_run(what, name=""):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.path.dirname(here),
                                                       os.environ.get("PYTHONPATH", "")]))
    # One thread per process: on a shared machine a kernel's parallel region
    # waits for descheduled threads (measured: 16 ms per LSTM cell call under
    # load), which times the machine, not the conversion. Eager pays it too.
    env.setdefault("OMP_NUM_THREADS", "1")
    out = subprocess.run([sys.executable, "-c", _COLD_CHILD, what, name], check=True, capture_output=True,
                         text=True, cwd=here, env=env)
    values = [float(v) for v in out.stdout.split()]
    return list(zip(values[::2], values[1::2]))  # (wall, CPU) per stage


def cold_conversion_times(rounds=5):
    """Medians over `rounds` fresh interpreters per row, interleaved so
    that load changes hit every row alike: `import torch`, torch's first
    meta-kernel call, and per model its first eager call and its first
    declarative call (conversion + tracing + compilation + one run).
    Returns {row: (wall seconds, CPU seconds of the process)}: on a shared
    machine the CPU time is the steadier of the two."""
    samples = {}
    for _ in range(rounds):
        torch_import, _, _, meta, dynamo = _cold_run("meta")
        samples.setdefault("import torch", []).append(torch_import)
        samples.setdefault("torch: first meta linear (imports sympy)", []).append(meta)
        samples.setdefault("torch: then meta tanh (imports torch._dynamo)", []).append(dynamo)
        for name in _cold_models():
            _, _, _, eager = _cold_run("eager", name)
            _, d2s_import, _, first = _cold_run("d2s", name)
            samples.setdefault("import d2s (after torch)", []).append(d2s_import)
            samples.setdefault(f"{name}: first eager call", []).append(eager)
            samples.setdefault(f"{name}: first declarative call", []).append(first)
    return {row: tuple(statistics.median(t[i] for t in times) for i in (0, 1)) for row, times in samples.items()}


def print_cold(rounds=5):
    print(f"cold process (median of {rounds} fresh interpreters per row; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', '1')}):")
    times = cold_conversion_times(rounds)
    cpu_0 = times["import torch"][1]
    print(f"  {'':48s} {'wall':>9s} {'CPU':>9s}   CPU / import torch's CPU")
    for row, (wall, cpu) in times.items():
        print(f"  {row:48s} {wall * 1e3:6.0f} ms {cpu * 1e3:6.0f} ms   {cpu / cpu_0:5.2f}")


def main():
    print_cold()
    torch.set_num_threads(1)
    tokens = torch.randint(0, 50, (8, 32))
    length = torch.tensor(32)
    tagger, static_tagger, t1 = conversion_time(LSTMTagger, tokens, length)
    h = torch.randn(8, 32)
    max_len = torch.tensor(24)
    decoder, static_decoder, t2 = conversion_time(GreedyDecoder, h, max_len)
    print("conversion + tracing + compilation (first call, warm process):")
    print(f"  LSTM tagger      {t1 * 1e3:7.1f} ms")
    print(f"  greedy decoder   {t2 * 1e3:7.1f} ms")
    for grad in (False, True):
        print(f"time per call, autograd {'on' if grad else 'off'}:")
        with torch.set_grad_enabled(grad):
            compare("LSTM tagger (32 steps, batch 8)", lambda: tagger(tokens, length),
                    lambda: static_tagger(tokens, length))
            compare("greedy decoder (24 steps, batch 8)", lambda: decoder(h, max_len),
                    lambda: static_decoder(h, max_len))


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--cold":
        print_cold(int(sys.argv[2]) if len(sys.argv) > 2 else 5)
    else:
        main()
