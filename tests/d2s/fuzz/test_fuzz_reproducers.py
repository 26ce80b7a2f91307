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
    # Seed 7, program 3740: `(a - b)` in a tensor `if` test and again in its branch; merging the two
    # (runtime/passes/cse.py) summed x's gradient contributions in another order (1 ulp off).
    "shared_subexpression_keeps_gradient_order": (dict(grad=True), """
        def f(x, m, n):
            a = x * 1.0
            b = torch.zeros_like(x)
            t = x.sum()
            if (a - b).max() > 0.0:
                t = a.sum()
                b = torch.tanh(a - b)
            b = b * 2.0 if a.sum() > -0.5 else b + 1.0
            return a + b + t
        """, ("cond",)),
    # A tensor loop appends to a list in one branch: the list of the other branch becomes a tensor array.
    "list_in_one_branch_tensor_array_in_other": ({}, """
        def f(x, m, n):
            a = x * 1.0
            ys = [x]
            zs = []
            if a.sum() > 2.5:
                pass
            else:
                for i1 in range(n):
                    ys.append(a * -1.0)
                    zs.append(a)
            return a + torch.stack(ys).sum(0) + len(zs)
        """, ("cond", "while")),
    "tensor_array_in_true_branch_list_in_false": ({}, """
        def f(x, m, n):
            a = x * 1.0
            zs = []
            if not a.sum() > -0.5:
                for row in m:
                    zs.append(row * a)
            else:
                a = a + 1.0
            return a + len(zs)
        """, ("cond", "while")),
    # An array with no element yet on one path (a `continue` before any append) merges with a filled one.
    "empty_and_filled_tensor_arrays_merge": ({}, """
        def f(x, m, n):
            a = x * 1.0
            zs = []
            for row in m:
                if row.sum() > 2.5:
                    continue
                w = 0
                while w < 3 and a.sum() < 1.0:
                    w += 1
                    zs.append(a)
            return a + len(zs)
        """, ("cond", "while")),
    # After an `if` whose branches all return, `ys` is read through convert_load: its append in
    # the loop must still make it a loop variable (a tensor array).
    "append_after_branches_that_all_return": ({}, """
        def f(x, m, n):
            a = x * 1.0
            ys = [x]
            if a.sum() > 1.0:
                if a.sum() > 2.0:
                    return a
                else:
                    return a * 2.0
            for row in m:
                ys.append(a * -1.0)
            return a + torch.stack(ys).sum(0)
        """, ("cond", "while")),
    # Same root through a Python if whose other branches return: the append was done at build time.
    "append_after_python_if_with_returns": ({}, """
        def f(x, m, n):
            a = x * 1.0
            k = 0
            zs = []
            if k % 2 == 0:
                pass
            elif k > 0:
                return a + k + len(zs)
            else:
                return a + k + len(zs)
            w = 0
            while w < 2 and a.sum() < -2.0:
                w += 1
                zs.append(a)
            return a + k + len(zs)
        """, ("while",)),
    # Seed 11, program 3262: `len(ys)` before and after an append in a tensor branch were merged by
    # runtime/passes/cse.py (array_length of the same array), so the inner `if` saw the old length.
    "length_after_append_in_branch": ({}, """
        def f(x, m, n):
            a = x * 1.0
            s = 0.0
            ys = [x]
            for i2, row3 in zip(range(n), m):
                ys.append(a * 2.0)
            if len(ys) > 1:
                pass
            else:
                ys.append(a * 0.5)
                if len(ys) > 1:
                    s = s + -0.5
            return a + s + torch.stack(ys).sum(0)
        """, ("cond", "while")),
    # `y = n * 1` is integer arithmetic that runtime/passes/scalars.py ran as a Python int, but the
    # loop test writes it in place: the int never changed and the loop never ended.
    "counter_bumped_in_place_by_the_loop_test": ({}, """
        def f(x, m, n):
            a = x * 1.0
            w = n * 1
            while w.add_(1) < 3:
                if a.sum() > w:
                    break
                a = a + 1.0
            return a + w
        """, ("cond", "while")),
    # Seed w5, program 163: `for e in a` read `a.select(0, ctr)` per step, so `a`'s gradient was summed one
    # step at a time; eager iterates `a.unbind(0)` (one node). runtime/passes/loop_slices.py unbinds once.
    "gradient_of_the_elements_a_loop_walks": (dict(grad=True, rows=1), """
        def f(x, m, n):
            a = x * 1.0
            b = torch.zeros_like(x)
            s = 0.0
            for e2 in a:
                v5 = torch.tanh(a)
                b = b * 0.5 + v5
                s = s + e2
            return a + b + s
        """, ("while",)),
    # A dict changed in place in a tensor loop and in a tensor branch (a program error before).
    "dict_changed_in_loop_and_branch": ({}, """
        def f(x, m, n):
            a = x * 1.0
            dd = {"u": x * 1.0, "c": 0}
            for row in m:
                if row.sum() > 0:
                    dd["u"] = dd["u"] + row
                    dd["c"] = dd["c"] + 1
                else:
                    dd["u"] *= 0.5
            return a + dd["u"] + dd["c"]
        """, ("cond", "while")),
    # Seed final26, program 735: the `if not do_return` that return lowering puts around a loop's `else`
    # had no `else: do_return = True`, so its other side looked live and `ok` "undefined" there.
    "return_in_loop_else_then_name_read_in_body": ({}, """
        def f(x, m, n):
            a = x * 1.0
            t = x.sum()
            s = 0.0
            ok = (x > 0).any()
            w1 = 0
            while w1 < n:
                w1 += 1
                for row in m:
                    pass
                else:
                    ok = (a > -0.5).any()
                    if s < -2.0:
                        return a
                if t < -0.5:
                    if ok:
                        a = a + 1.0
            return a
        """, ("cond", "while")),
    # Seed final26, program 1170: a body that always raises, traced again (a list became a tensor
    # array), read the item its first trace wrote (`nest['l'][0]`): a value of a discarded block.
    "raising_body_retraced_reads_no_stale_item": ({}, """
        def f(x, m, n):
            a = x * 1.0
            b = torch.zeros_like(x)
            ws = []
            nest = {'l': [x * 0.5, 0]}
            w = 0
            while w < 1 and a.sum() < 1.0:
                w += 1
                nest['l'][0] = nest['l'][0] + b
                ws.append(a + b)
                assert False, 'fuzz: the loop ran'
            return a + len(ws) * 3 + nest['l'][0]
        """, ("while",)),
    # Seed nov27, program 2998: a loop body that raises on every path (it reads `v6`, which no path
    # binds), then a read of `v8`, first assigned after that raise: the read raised while converting,
    # for every input, where eager raises `v6` in the loop's first trip (a raise op, then one for `v8`).
    "read_after_a_loop_whose_body_always_raises": ({}, """
        def f(x, m, n):
            a = x * 1.0
            b = torch.zeros_like(x)
            t = x.sum()
            k = 0
            s = 0.0
            w2 = 0
            while w2 < n:
                w2 += 1
                if k == 1 or s > -2.0:
                    pass
                else:
                    v6 = b + 2.5
                b = b * 0.5 + v6
                v8 = a * 1.5
            t = t + v8.sum()
            return a + b + t + k + s
        """, ("while",)),
    # Seed nov26c, program 731: a tensor `assert`, then a read of `v7`, which no path binds: the
    # read failed the conversion with its UnboundLocalError for every input, where eager raises the
    # AssertionError first for inputs that fail the assert (an assert op, then a raise op).
    "tensor_assert_before_a_read_no_path_binds": ({}, """
        def f(x, m, n):
            a = x * 1.0
            t = x.sum()
            s = 0.0
            for c1 in (2.0, 1.5):
                if s < -0.5:
                    v7 = x * 1.5
                else:
                    assert t < 0.5, 'fuzz: t is too big'
                t = t + v7.sum()
            return a + t
        """, ("assert",)),
    # s30c-315: `for e2 in a` over a tensor whose trips also write a tensor in place; the executor
    # sliced the rows one select per trip there (eager: one unbind), and `a - b` read beside them
    # made autograd sum a's gradient in another order (1 ulp off; runtime/passes/loop_slices.py).
    "loop_rows_beside_an_in_place_write": (dict(grad=True), """
        def f(x, m, n):
            a = x * 1.0
            b = torch.zeros_like(x)
            s = 0.0
            for e2 in a:
                s = s + e2
                w3 = n * 1
                while w3.add_(1) < 4:
                    pass
                b = torch.tanh(a - b)
            return a + b + s
        """, ("while",)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reproducer_matches_eager(name):
    options, text, ops = CASES[name]
    program = fuzz_programs.SourceProgram(textwrap.dedent(text).lstrip(), ops=ops, **options)
    outcome = fuzz_runner.run(program)
    assert outcome.kind == "pass", f"{outcome.kind} at {outcome.stage}: {outcome.detail}\n{outcome.message}"


# Programs kept whole, by seed and index: shrinking them loses what made them fail.
SEEDED = [
    # Nested tensor `if`s (an `elif` chain with returns, lists grown under them): each enclosing
    # `if`'s retry traced the inner ones again, and each relearned which lists become tensor
    # arrays, so the conversion took 2**depth traces (over 60 s of CPU; now about 2 s).
    ("nov26f", 713),
]


@pytest.mark.parametrize("seed, index", SEEDED)
def test_seeded_program_matches_eager(seed, index):
    outcome = fuzz_runner.run(fuzz_programs.generate(f"{seed}-{index}"))
    assert outcome.kind == "pass", f"{outcome.kind} at {outcome.stage}: {outcome.detail}\n{outcome.message}"
