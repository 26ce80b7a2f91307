"""Minimised fuzzer reproducers of fixed translator defects, run like fuzzed programs.

Each case is a function `f(x, m, n)` found by tools/fuzz_translator.py and
shrunk; fuzz_runner checks it eagerly, declaratively and through the
Executor on inputs that take all of its paths, with one program.
"""

import textwrap

import pytest

import fuzz_programs
import fuzz_runner

CASES = {
    # float() of a tensor is a Python number eagerly: no gradient flows through it.
    "float_cast_has_no_gradient": (dict(grad=True), """
        def f(x, m, n):
            a = x * 1.0
            s = 0.0
            s += float(a.max())
            if a.sum() > s:
                a = a * float(a.min())
            return a + s
        """, ("cond",)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reproducer_matches_eager(name):
    options, text, ops = CASES[name]
    program = fuzz_programs.SourceProgram(textwrap.dedent(text).lstrip(), ops=ops, **options)
    outcome = fuzz_runner.run(program)
    assert outcome.kind == "pass", f"{outcome.kind} at {outcome.stage}: {outcome.detail}\n{outcome.message}"
