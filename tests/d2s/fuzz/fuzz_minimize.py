"""Shrink a failing program while it keeps failing the same way.

Greedy delta debugging over the statement tree: delete one statement, replace
an ``if`` or a loop by one of its blocks, or drop an ``else``; keep the change
when the runner's outcome keeps the same class (`Outcome.klass`), and start
over until no change helps. State variables no statement uses any more leave
the function's prologue and its returned value.
"""

import time

import fuzz_programs
import fuzz_runner


def _slots(program):
    """(block, index) of every statement, depth first (the order `fuzz_programs.walk` visits)."""
    out = []

    def visit(block):
        for i, stmt in enumerate(block):
            out.append((block, i))
            for child in stmt.blocks():
                visit(child)
    visit(program.body)
    return out


def _prune_state(program):
    used = program.used_names()
    program.state = [v for v in program.state if v in used or v == "a"]
    return program


def variants(program):
    """Smaller programs, most shrinking first."""
    count = len(_slots(program))
    for k in range(count):
        candidate = program.copy()
        block, i = _slots(candidate)[k]
        del block[i]
        yield _prune_state(candidate)
    for k in range(count):
        stmt = _slots(program)[k][0][_slots(program)[k][1]]
        for which in range(len(stmt.blocks())):
            candidate = program.copy()
            block, i = _slots(candidate)[k]
            inner = block[i].blocks()[which]
            if inner:
                block[i:i + 1] = inner
                yield _prune_state(candidate)
            if which == 1 and inner:
                candidate = program.copy()
                block, i = _slots(candidate)[k]
                del block[i].blocks()[1][:]
                yield _prune_state(candidate)


def minimize(program, outcome, budget_s=60.0, max_tries=400):
    """The smallest program found whose outcome has `outcome.klass`; -> (program, outcome)."""
    deadline = time.monotonic() + budget_s
    tries = 0
    best, best_outcome = program, outcome
    improved = True
    while improved and tries < max_tries and time.monotonic() < deadline:
        improved = False
        for candidate in variants(best):
            if tries >= max_tries or time.monotonic() >= deadline:
                break
            tries += 1
            got = fuzz_runner.run(candidate)
            if got.klass == outcome.klass:
                best, best_outcome, improved = candidate, got, True
                break
    return best, best_outcome


def size(program):
    return len(list(fuzz_programs.walk(program.body)))
