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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "d2s", "fuzz")]

import fuzz_minimize  # noqa: E402
import fuzz_programs  # noqa: E402
import fuzz_runner  # noqa: E402

FAILURES = ("wrong", "crash")


def program_seed(seed, index):
    return f"{seed}-{index}"


def _run_one(args):
    seed, index = args
    program = fuzz_programs.generate(program_seed(seed, index))
    outcome = fuzz_runner.run(program)
    return index, outcome.kind, outcome.signature, outcome.klass, outcome.message, fuzz_minimize.size(program)


def _minimize_one(args):
    seed, index, budget = args
    program = fuzz_programs.generate(program_seed(seed, index))
    outcome = fuzz_runner.run(program)
    small, small_outcome = fuzz_minimize.minimize(program, outcome, budget_s=budget)
    return index, small_outcome.signature, small_outcome.message, reproducer(small, small_outcome, seed, index)


def reproducer(program, outcome, seed, index):
    """A runnable file: the program, its outcome, and the inputs that show it."""
    source = program.source()
    fn, path, _ = fuzz_runner.load(program)
    try:
        inputs, _ = fuzz_runner.choose_inputs(fn, program, path)
    except Exception:
        inputs = []
    lines = [f"# d2s fuzz reproducer: program {index} of seed {seed!r}, minimised",
             f"# outcome: {outcome.kind} at {outcome.stage}: {outcome.detail}"]
    lines += ["# " + line for line in outcome.message.splitlines()[:12]]
    lines += [source, "", "if __name__ == '__main__':", "    import d2s", "    static = d2s.declarative(f)",
              "    inputs = ["]
    for args, *_ in inputs:
        x, m, n = args
        lines.append(f"        (torch.tensor({x.tolist()}, requires_grad={x.requires_grad}), "
                     f"torch.tensor({m.tolist()}), torch.tensor({int(n)})),")
    lines += ["    ]", "    for args in inputs:", "        print('eager      ', f(*args))",
              "        print('declarative', static(*args))"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="number of programs")
    parser.add_argument("--seed", default="0", help="seed of the run (program i uses '<seed>-<i>')")
    parser.add_argument("--start", type=int, default=0, help="index of the first program")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--out", help="directory for the minimised reproducers")
    parser.add_argument("--minimize-seconds", type=float, default=60.0, help="time budget per failure")
    parser.add_argument("--per-class", type=int, default=3, help="programs shrunk per class of wrong results")
    parser.add_argument("--no-minimize", action="store_true", help="only count outcomes")
    args = parser.parse_args(argv)

    started = time.monotonic()
    work = [(args.seed, i) for i in range(args.start, args.start + args.count)]
    counts, groups = collections.Counter(), collections.defaultdict(list)
    with multiprocessing.Pool(args.jobs, maxtasksperchild=200) as pool:
        for done, (index, kind, signature, klass, message, size) in enumerate(
                pool.imap_unordered(_run_one, work, chunksize=4), 1):
            counts[kind] += 1
            groups[klass if kind in FAILURES else signature].append((size, index, message))
            if done % 100 == 0:
                print(f"[{done}/{args.count}] {dict(counts)} {time.monotonic() - started:.0f}s", flush=True)
        print(f"\n{args.count} programs (seed {args.seed!r}) in {time.monotonic() - started:.0f}s")
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
        if args.no_minimize or not failing:
            return 1 if failing else 0
        if args.out:
            os.makedirs(args.out, exist_ok=True)
        # A class of wrong results can have several causes: shrink a few of its programs.
        tasks = [(args.seed, index, args.minimize_seconds) for klass, members in failing
                 for _, index, _ in members[:args.per_class if klass[0] == "wrong" else 1]]
        seen = {}
        for index, signature, message, text in pool.imap(_minimize_one, tasks):
            if signature in seen:
                print(f"\n(program {index} minimises to the same failure as program {seen[signature]})")
                continue
            seen[signature] = index
            name = f"{len(seen):02d}-{signature[0]}-{signature[1]}.py"
            print(f"\n===== {name}: {' / '.join(signature)}\n{text}")
            if args.out:
                with open(os.path.join(args.out, name), "w") as f:
                    f.write(text)
    return 1


if __name__ == "__main__":
    sys.exit(main())
