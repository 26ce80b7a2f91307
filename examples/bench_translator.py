"""Benchmark (not a test): conversion time, and time per call of declarative
vs eager, for the LSTM tagger and the GRU greedy decoder.

    python examples/bench_translator.py

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
    """name -> (make the declarative model, its first call's arguments)."""
    def quickstart():
        from quickstart import GatedRefiner
        return d2s.declarative(GatedRefiner()), (torch.randn(4, 8),)

    def tagger():
        return declarative_copy(LSTMTagger, LSTMTagger()), (torch.randint(0, 50, (8, 32)), torch.tensor(32))

    def decoder():
        return declarative_copy(GreedyDecoder, GreedyDecoder()), (torch.randn(8, 32), torch.tensor(24))

    return {"quickstart GatedRefiner": quickstart, "LSTM tagger": tagger, "greedy decoder": decoder}


def cold_conversion(name):
    """In this (fresh) process: the first conversion's time for model `name`."""
    torch.manual_seed(0)
    static, args = _cold_models()[name]()
    start = time.perf_counter()
    static(*args)
    print(f"{time.perf_counter() - start:.4f}")


_IMPORT_TORCH = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"


def cold_conversion_times():
    """Each model's first conversion, each in a fresh interpreter (torch and
    d2s imported, nothing converted yet): what a user's first call costs.
    `import torch` in a fresh interpreter is timed too, as the machine's
    yardstick (the ratio is what compares across machines and loads)."""
    out = subprocess.run([sys.executable, "-c", _IMPORT_TORCH], check=True, capture_output=True, text=True)
    times = {"(reference) import torch": float(out.stdout.split()[-1])}
    for name in _cold_models():
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--cold", name], check=True,
                             capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
        times[name] = float(out.stdout.split()[-1])
    return times


def main():
    print("first conversion in a fresh process (cold):")
    for name, seconds in cold_conversion_times().items():
        print(f"  {name:24s} {seconds * 1e3:7.1f} ms")
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
    if len(sys.argv) == 3 and sys.argv[1] == "--cold":
        cold_conversion(sys.argv[2])
    else:
        main()
