"""A fixed-seed differential fuzzing run: no wrong result, no crash.

Each program (fuzz_programs.generate) runs eagerly, under @declarative and
through the Executor on one program built from its first input, on inputs
that take every path it has (fuzz_runner). The long run is
tools/fuzz_translator.py (docs/fuzzing.md).
"""

import pytest

import fuzz_programs
import fuzz_runner

SEED = "suite"
COUNT = 200
CHUNK = 20


@pytest.mark.parametrize("start", range(0, COUNT, CHUNK))
def test_programs_match_eager(start):
    failures = []
    for index in range(start, start + CHUNK):
        program = fuzz_programs.generate(f"{SEED}-{index}", top=3, depth=2)
        outcome = fuzz_runner.run(program)
        assert outcome.kind != "invalid", f"generator defect in program {index}: {outcome.detail}"
        if outcome.kind in ("wrong", "crash"):
            failures.append(f"program {index}: {outcome.kind} at {outcome.stage}: {outcome.detail}\n"
                            f"{outcome.message}\n{program.function_source()}")
    assert not failures, "\n".join(failures)


def _one_if(body, test="a.sum() > 0.5"):
    branch = fuzz_programs.If(test, body, [], tensor=True)
    program = fuzz_programs.Program("oracle", ["a"], [branch, fuzz_programs.Simple("return", "return a")],
                                    rows=2, grad=False)
    program.state = ["a"]
    return program


class _NoOps:
    blocks = []


@pytest.mark.parametrize("body, test, missing", [
    ([], "a.sum() > 0.5", None),  # `if ...: pass`: nothing to compute, a program may drop it
    ([fuzz_programs.Simple("local", "pass")], "a.sum() > 0.5", None),
    ([fuzz_programs.Simple("assign", "a = a + 1.0")], "a.sum() > 0.5", "cond"),
    ([], "acc.add_(0.5).sum() > 0.5", "cond"),  # the test writes: its op must stay
])
def test_ops_oracle_accepts_only_ifs_that_do_nothing(body, test, missing):
    program = _one_if(body, test)
    if "acc" in test:
        program.state = ["a", "acc"]
    fn, path, _ = fuzz_runner.load(program)
    inputs, _ = fuzz_runner.choose_inputs(fn, program, path)
    assert fuzz_runner._missing_ops(program, _NoOps(), fn, inputs, path) == missing


def test_a_program_that_spins_is_a_hang_by_cpu_time(monkeypatch):
    monkeypatch.setattr(fuzz_runner, "SECONDS_PER_PROGRAM", 1)
    program = fuzz_programs.SourceProgram("""
def f(x, m, n):
    while True:
        x = x + 0
    return x
""")
    outcome = fuzz_runner.run(program)
    assert (outcome.kind, outcome.stage) == ("crash", "hang") and "CPU time" in outcome.detail
