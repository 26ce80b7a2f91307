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
