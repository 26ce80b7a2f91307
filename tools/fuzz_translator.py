"""Differential fuzzing of the translator: random programs, eager vs declarative vs Executor.

    nice -n 10 env OMP_NUM_THREADS=1 python tools/fuzz_translator.py --count 1000 --seed 0 --jobs 2 --out fuzz-out

Generates `--count` programs (tests/d2s/fuzz/fuzz_programs.py; program i of
seed S is the same everywhere), runs each (tests/d2s/fuzz/fuzz_runner.py),
prints the counts by outcome, then minimises one program per distinct failure
(tests/d2s/fuzz/fuzz_minimize.py) and prints the reproducers; with `--out`
each reproducer is also written there as a runnable file. Exit status 1 when
any program gave a wrong result or crashed. See docs/fuzzing.md.
"""

import argparse
import collections
import multiprocessing
import os
import sys
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "d2s", "fuzz")]

import fuzz_minimize  # noqa: E402
import fuzz_programs  # noqa: E402
import fuzz_runner  # noqa: E402

FAILURES = ("wrong", "crash")


def _pool(jobs, **kwargs):
    # Fresh interpreters: a forked child of a process that imported torch can
    # find modules half-initialised ("partially initialized module").
    return multiprocessing.get_context("spawn").Pool(jobs, **kwargs)


def hash_seed(seed):
    """The PYTHONHASHSEED of the run's workers: fixed by the run's seed, so that
    anything that depends on the order of a set of strings is the same when the
    run, its minimiser or a reproducer runs the program again."""
    return str(zlib.crc32(str(seed).encode()) % 4294967295)


_history = []  # in a worker: the programs it ran, in order (a failure may need them to reproduce)


def program_seed(seed, index):
    return f"{seed}-{index}"


def _run_one(args):
    seed, index = args
    program = fuzz_programs.generate(program_seed(seed, index))
    outcome = fuzz_runner.run(program)
    before = list(_history)
    _history.append(index)
    return (index, outcome.kind, outcome.signature, outcome.klass, outcome.message, fuzz_minimize.size(program),
            before if outcome.kind in FAILURES else None)


def _minimize_one(args):
    """In a fresh worker: the failure of program `index` alone, else after the
    programs its worker ran before it; then shrunk. -> (index, signature,
    message, reproducer text or None, how it reproduced)."""
    seed, index, budget, klass, before = args
    program = fuzz_programs.generate(program_seed(seed, index))
    outcome = fuzz_runner.run(program)
    if outcome.klass != klass:
        # Not alone: state left by earlier programs in the worker (caches, the
        # heap) is part of the failure. Replay them, then report without
        # shrinking (a smaller program runs in another state).
        for earlier in before:
            fuzz_runner.run(fuzz_programs.generate(program_seed(seed, earlier)))
        outcome = fuzz_runner.run(program)
        how = (f"it fails again after the {len(before)} programs its worker ran before it ({before[:3]}...)"
               if outcome.klass == klass else
               f"nor after the {len(before)} programs its worker ran before it")
        return index, outcome.signature, outcome.message, None, how
    small, small_outcome = fuzz_minimize.minimize(program, outcome, budget_s=budget)
    return index, small_outcome.signature, small_outcome.message, reproducer(small, small_outcome, seed, index), "alone"


def reproducer(program, outcome, seed, index):
    """A runnable file: the program, its outcome, and the inputs that show it."""
    source = program.source()
    fn, path, _ = fuzz_runner.load(program)
    try:
        inputs, _ = fuzz_runner.choose_inputs(fn, program, path)
    except Exception:
        inputs = []
    lines = [f"# d2s fuzz reproducer: program {index} of seed {seed!r}, minimised",
             f"# outcome: {outcome.kind} at {outcome.stage}: {outcome.detail}",
             f"# the run's workers had PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', 'random')}"]
    lines += ["# " + line for line in outcome.message.splitlines()[:12]]
    lines += [source, "", "if __name__ == '__main__':", "    import d2s", "    static = d2s.declarative(f)",
              "    inputs = ["]
    for args, *_ in inputs:
        x, m, n = args
        lines.append(f"        (torch.tensor({x.tolist()}, requires_grad={x.requires_grad}), "
                     f"torch.tensor({m.tolist()}), torch.tensor({int(n)})),")
    # The gradient too (the runner compares it exactly): the weighted sum the
    # runner differentiates, for each side on fresh copies of the inputs.
    lines += ["    ]", "", "    def show(fn, args):",
              "        args = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)",
              "        out = fn(*args)",
              "        first = out[0] if isinstance(out, tuple) and out else out",
              "        grad = None",
              "        if args[0].requires_grad and isinstance(first, torch.Tensor) and first.requires_grad:",
              "            weights = torch.arange(1.0, 1.0 + first.numel()).reshape(first.shape)",
              "            grad = torch.autograd.grad((first * weights).sum(), [args[0]], allow_unused=True)[0]",
              "        return out, grad",
              "", "    torch.set_printoptions(precision=10)",
              "    for args in inputs:",
              "        for name, fn in (('eager      ', f), ('declarative', static)):",
              "            out, grad = show(fn, args)",
              "            print(name, out, 'grad', grad)"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="number of programs")
    parser.add_argument("--seed", default="0", help="seed of the run (program i uses '<seed>-<i>')")
    parser.add_argument("--start", type=int, default=0, help="index of the first program")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--out", help="directory for the minimised reproducers")
    parser.add_argument("--minimize-seconds", type=float, default=60.0, help="time budget per failure")
    parser.add_argument("--max-minutes", type=float, help="stop starting programs after this long; "
                        "the counts then cover the programs run")
    parser.add_argument("--per-class", type=int, default=3, help="programs shrunk per class of wrong results")
    parser.add_argument("--no-minimize", action="store_true", help="only count outcomes")
    parser.add_argument("--optimize", choices=("default", "fast"), default="default",
                        help="the level declarative calls compile at (fast: floats compared up to rounding)")
    parser.add_argument("--device", default="cpu", help="where programs run: each runs under "
                        "`with torch.device(DEVICE)` (cuda: its tensors on the GPU, the Executor at CUDAPlace)")
    args = parser.parse_args(argv)

    # Workers are spawned with this environment: a run, its minimiser and
    # `PYTHONHASHSEED=... python reproducer.py` see sets of strings in one order.
    os.environ.setdefault("PYTHONHASHSEED", hash_seed(args.seed))
    os.environ["D2S_FUZZ_OPTIMIZE"] = fuzz_runner.LEVEL = args.optimize
    os.environ["D2S_FUZZ_DEVICE"] = fuzz_runner.DEVICE = args.device
    print(f"workers run with PYTHONHASHSEED={os.environ['PYTHONHASHSEED']}", flush=True)
    started = time.monotonic()
    counts, groups, done = run_programs(args, started)
    print(f"\n{done} programs of {args.count} (seed {args.seed!r}) in {time.monotonic() - started:.0f}s")
    for kind in ("pass", "wrong", "crash", "refused", "invalid"):
        print(f"  {kind:8} {counts[kind]}")
    print("\nrefusals (documented ConversionErrors):")
    for signature, members in sorted(groups.items(), key=lambda g: -len(g[1])):
        if signature[0] == "refused":
            print(f"  {len(members):5}  {signature[2]}")
    invalid = sum(len(m) for s, m in groups.items() if s[0] == "invalid")
    if invalid:
        print(f"\n{invalid} programs failed eagerly (generator defects): "
              + "; ".join(sorted({s[2] for s in groups if s[0] == "invalid"})))
    failing = [(klass, sorted(members)) for klass, members in groups.items() if klass[0] in FAILURES]
    failing.sort(key=lambda g: -len(g[1]))
    print(f"\n{len(failing)} failure classes")
    for klass, members in failing:
        print(f"  {len(members):5}  {' / '.join(klass)}   e.g. program {members[0][1]}")
    if failing and not args.no_minimize:
        print_reproducers(args, failing)
    return 1 if failing else 0


def run_programs(args, started):
    """-> (counts by outcome, programs by class, number run); stops early at --max-minutes."""
    work = [(args.seed, i) for i in range(args.start, args.start + args.count)]
    counts, groups = collections.Counter(), collections.defaultdict(list)
    deadline = started + args.max_minutes * 60 if args.max_minutes else None
    done = 0
    pool = _pool(args.jobs, maxtasksperchild=200)
    try:
        for index, kind, signature, klass, message, size, before in pool.imap_unordered(_run_one, work):
            done += 1
            counts[kind] += 1
            groups[klass if kind in FAILURES else signature].append((size, index, message, before))
            if kind in FAILURES or kind == "invalid":
                print(f"program {index}: {' / '.join(signature)}", flush=True)
            if done % 100 == 0:
                print(f"[{done}/{args.count}] {dict(counts)} {time.monotonic() - started:.0f}s", flush=True)
            if deadline and time.monotonic() > deadline:
                break
    finally:
        pool.terminate()
    return counts, groups, done


def print_reproducers(args, failing):
    """Shrink programs of each failure class; print (and write to --out) one per distinct failure."""
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    # A class of wrong results can have several causes: shrink a few of its programs.
    tasks = [(args.seed, index, args.minimize_seconds, klass, before) for klass, members in failing
             for _, index, _, before in members[:args.per_class if klass[0] == "wrong" else 1]]
    seen = {}
    # One fresh interpreter per failure: whether it reproduces alone is part of the report.
    with _pool(args.jobs, maxtasksperchild=1) as pool:
        for index, signature, message, text, how in pool.imap(_minimize_one, tasks):
            if how != "alone":
                print(f"\n===== program {index} does not fail alone in a fresh worker; {how} "
                      f"(PYTHONHASHSEED={os.environ['PYTHONHASHSEED']}): a failure that depends on the "
                      f"process's state\n{message}", flush=True)
                continue
            if signature in seen:
                print(f"\n(program {index} minimises to the same failure as program {seen[signature]})")
                continue
            seen[signature] = index
            name = f"{len(seen):02d}-{signature[0]}-{signature[1]}.py"
            print(f"\n===== {name}: {' / '.join(signature)}\n{text}", flush=True)
            if args.out:
                with open(os.path.join(args.out, name), "w") as f:
                    f.write(text)


if __name__ == "__main__":
    sys.exit(main())
