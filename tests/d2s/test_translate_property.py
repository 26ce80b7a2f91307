"""Property: for random small functions, declarative == eager on random inputs.

Functions are assembled from a tiny statement language of our own (below):
assignments, ``if`` on tensor and Python conditions (with ``and``/``or``/
``not`` and ternaries), ``while`` over a tensor bound, ``for`` over a tensor
range, a Python range and the rows of a tensor, ``break``, ``continue`` and
``return`` anywhere. Each function is written to a real file (conversion
needs source), built once from the first input and then run on others, which
take other paths.
"""

import importlib.util
import itertools
import os
import tempfile

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import d2s

_COUNTER = itertools.count()
_DIR = tempfile.mkdtemp(prefix="d2s_property_")


# -- the statement language ---------------------------------------------------------------------

class Block:
    def __init__(self, stmts):
        self.stmts = stmts

    def lines(self, indent):
        out = []
        for s in self.stmts:
            out += s.lines(indent)
        return out or [" " * indent + "pass"]


class Line:
    def __init__(self, text):
        self.text = text

    def lines(self, indent):
        return [" " * indent + self.text]


class If:
    def __init__(self, test, body, orelse):
        self.test, self.body, self.orelse = test, body, orelse

    def lines(self, indent):
        out = [" " * indent + f"if {self.test}:"] + self.body.lines(indent + 4)
        if self.orelse is not None:
            out += [" " * indent + "else:"] + self.orelse.lines(indent + 4)
        return out


class While:
    def __init__(self, counter, body):
        self.counter, self.body = counter, body

    def lines(self, indent):
        pad = " " * indent
        # The counter moves first, so `continue` cannot skip it.
        return ([pad + f"{self.counter} = 0", pad + f"while {self.counter} < n:",
                 " " * (indent + 4) + f"{self.counter} += 1"] + self.body.lines(indent + 4))


class For:
    def __init__(self, target, iterable, body):
        self.target, self.iterable, self.body = target, iterable, body

    def lines(self, indent):
        return [" " * indent + f"for {self.target} in {self.iterable}:"] + self.body.lines(indent + 4)


TENSOR_TESTS = ["a.sum() > {c}", "b.mean() < {c}", "(a - b).max() > {c}", "a.sum() > {c} and b.sum() < {d}",
                "a.min() < {c} or not b.sum() > {d}"]
PYTHON_TESTS = ["k > {i}", "k % 2 == 0"]
ASSIGNS = ["a = (a + x) * 0.5", "a = a - b", "b = torch.tanh(a + b)", "a = a + 1", "k = k + 1",
           "b = b * 0.5 if a.sum() > {c} else b + 1", "a = a + {c}"]
CONSTS = [-2.0, -0.5, 0.0, 1.0, 3.0]


@st.composite
def blocks(draw, depth=0, in_loop=False, counters=None):
    counters = counters if counters is not None else itertools.count()
    stmts = []
    for _ in range(draw(st.integers(1, 3))):
        kinds = ["assign"] * 3
        if depth < 2:
            kinds += ["if", "if", "pyif", "while", "while", "for_range", "for_range", "for_py", "for_rows"]
        kinds += (["return"] if depth > 0 else []) + (["break", "continue"] if in_loop else [])
        kind = draw(st.sampled_from(kinds))
        fill = dict(c=draw(st.sampled_from(CONSTS)), d=draw(st.sampled_from(CONSTS)), i=draw(st.integers(0, 3)))
        if kind == "assign":
            stmts.append(Line(draw(st.sampled_from(ASSIGNS)).format(**fill)))
        elif kind in ("if", "pyif"):
            test = draw(st.sampled_from(TENSOR_TESTS if kind == "if" else PYTHON_TESTS)).format(**fill)
            body = draw(blocks(depth + 1, in_loop, counters))
            orelse = draw(st.one_of(st.none(), blocks(depth + 1, in_loop, counters)))
            stmts.append(If(test, body, orelse))
        elif kind == "while":
            stmts.append(While(f"w{next(counters)}", draw(blocks(depth + 1, True, counters))))
        elif kind.startswith("for"):
            iterable = {"for_range": "range(n)", "for_py": "range(2)", "for_rows": "m"}[kind]
            target = f"r{next(counters)}"
            body = draw(blocks(depth + 1, True, counters))
            use = Line(f"a = a + {target}" if kind != "for_rows" else f"b = b + {target} * 0.5")
            stmts.append(For(target, iterable, Block([use] + body.stmts)))
        elif kind == "return":
            stmts.append(Line("return a + b + k"))
            break
        else:
            stmts.append(Line(kind))
            break
    return Block(stmts)


def make_function(body):
    lines = ["import torch", "", "", "def generated(x, m, n):", "    a = x * 1", "    b = x * 0 + 1", "    k = 0"]
    lines += body.lines(4) + ["    return a + b + k", ""]
    path = os.path.join(_DIR, f"generated_{next(_COUNTER)}.py")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    spec = importlib.util.spec_from_file_location(f"d2s_generated_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generated, "\n".join(lines)


values = st.floats(-3, 3, allow_nan=False, width=32)
inputs = st.tuples(st.lists(values, min_size=3, max_size=3), st.lists(values, min_size=6, max_size=6),
                   st.integers(0, 3))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=blocks(), args=st.lists(inputs, min_size=3, max_size=3))
def test_random_functions_match_eager(body, args):
    fn, source = make_function(body)
    static = d2s.declarative(fn)
    for xs, ms, n in args:
        x, m, n = torch.tensor(xs), torch.tensor(ms).reshape(2, 3), torch.tensor(n)
        eager = fn(x, m, n)
        result = static(x, m, n)
        assert torch.equal(result, eager), f"\n{source}\ninputs: {xs} {ms} {int(n)}\n{eager} != {result}"
    assert len(static.program_cache) == 1
