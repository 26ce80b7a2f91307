"""Random programs written the way PyTorch users write them, for differential fuzzing.

A program is a small tree of statements (`Simple`, `If`, `Loop`) inside one
function ``f(x, m, n)``: ``x`` a float vector, ``m`` a float matrix whose rows
loops walk, ``n`` a 0-d int64 tensor used as a trip count. The function starts
by defining its state (tensors ``a``, ``b``, ``t``, ``acc``, ``g``, Python
numbers ``k``, ``s``, lists ``ys``, ``zs``, ``ws``) and returns one float tensor
combining all of it, so every statement can touch any state and every path
reaches the same return.

The statements cover what docs/syntax_and_limitations.md lists as supported:
nested ``if``/``elif``/``else`` on tensors and on Python values, ternaries,
``and``/``or``/``not``, ``while`` with ``break``/``continue``, ``for`` over
``range(tensor)``, tensor rows, ``enumerate``, Python ranges, lists, tuples
and tuples of functions (unrolled, also when a tensor ends them), loop
``else``, early ``return`` in branches and loops, Python accumulators, list
``append`` then ``torch.stack``/``len``, tensors grown with ``torch.cat``,
augmented assignment, in-place ops and calls to helper functions that have
control flow of their own, locals first assigned in every arm of an ``if``
(or in the arms that do not return/break/continue, or in all arms but one: eager then raises
UnboundLocalError on a path that skips it) and read after it, `int()`/`float()` of tensors, `len`/`.shape`,
`assert`s that hold and `raise`/`assert` checks that fail on some inputs,
`zip`, a dict changed in place and a tuple rebuilt, `any`/`all`/`max`/`min`
of tensors, `or` as a value, keyword arguments, attributes of a local object
and items of containers in containers written in place, items of a list of
fixed length reassigned, names first assigned
in a loop body and read after the loop, loop bodies that always raise, a matrix
made column- or row-major under tensor control flow whose strides are read, `requires_grad`
of values a path makes without gradients.

`generate(seed)` is deterministic: the same seed gives the same program on
every machine. The tree keeps what the runner and the minimiser need: which
statements are tensor-dependent control flow (their program must hold a
``cond``/``while`` op) and how to delete or hoist parts of it.
"""

import random
import re

# Constants that programs compare against and scale by; halves keep sums exact.
CONSTS = ["-2.0", "-0.5", "0.0", "1.0", "2.5"]
SCALES = ["0.5", "-1.0", "2.0", "1.5"]

# Every state variable: its initial definition and its term in the returned value.
STATE = {
    "a": ("a = x * 1.0", "a"),
    "b": ("b = torch.zeros_like(x)", "b"),
    "t": ("t = x.sum()", "t"),
    "acc": ("acc = torch.zeros(3)", "acc"),
    "g": ("g = x[:1]", "g.sum()"),
    "k": ("k = 0", "k"),
    "s": ("s = 0.0", "s"),
    "ys": ("ys = [x]", "torch.stack(ys).sum(0)"),
    "zs": ("zs = []", "len(zs)"),
    "ws": ("ws = []", "len(ws) * 3"),  # a second empty list: two lists are two objects
    "ok": ("ok = (x > 0).any()", None),  # a condition kept in a variable; only tests read it
    "dd": ("dd = {'u': x * 1.0, 'c': 0}", "dd['u'] + dd['c']"),  # a dict changed in place
    "h": ("h = (x * 1.0, x * 0.5)", "h[0] * h[1]"),  # a tuple rebuilt
    "ob": ("ob = Obj(x * 1.0)", "ob.v + ob.n"),  # attributes of a local object written in place
    "nest": ("nest = {'l': [x * 0.5, 0], 'd': {'w': x * 1.0}}",  # containers in containers
             "nest['l'][0] + nest['l'][1] + nest['d']['w']"),
    # a list whose items are reassigned and whose length stays: carried item by item
    "hs": ("hs = [x * 1.0, 0.5, [x * 0.0]]", "hs[0] + hs[1] + hs[2][0]"),
    # a matrix whose layout statements change (row- or column-major); its strides are read
    "q": ("q = m * 1.0", "q.sum(0) + q.stride(0) + q.stride(1) * 0.5"),
}

HELPERS = '''
class Obj:
    def __init__(self, v):
        self.v = v
        self.n = 0


def mix(u, v):
    if u.sum() > v.sum():
        return u - v * 0.5
    return u + v


def clip(u, lim):
    while u.abs().max() > lim:
        u = u * 0.5
    return u


def walk(mat, u):
    out = u
    for r in mat:
        if r.sum() < 0:
            continue
        out = out + r * 0.5
    return out


def pick(u, mat):
    for r in mat:
        if (r * u).sum() > 1.0:
            return u + r * 0.5
    return u


def nested(u, v, mat):
    if v.sum() > u.sum():
        return clip(u - v, 2.0)
    w = pick(u, mat)
    if w.max() > 2.0:
        return mix(w, v)
    return w * 0.5
'''

TENSOR_TESTS = [
    "a.sum() > {c}", "b.mean() < {c}", "(a - b).max() > {c}", "t > {c}", "(a > {c}).any()",
    "x.sum() > {c} and b.sum() < {d}", "a.min() < {c} or not b.sum() > {d}", "not a.sum() > {c}",
    "ok", "ok and t > {c}", "not ok or k > {i}",
    "a.sum() > {c} and k > {i}", "k > {i} or t < {c}",
    # Tests with effects: evaluated exactly as often as Python evaluates them.
    "acc.add_(0.5).sum() > {c}", "a.sum() > {c} and acc.add_(1.0).sum() > {d}",
    "(b < {c}).all() or acc.mul_({s}).sum() < {d}",
    # Chained comparisons: the middle operand evaluated once, the last one only where Python does.
    "{c} < a.sum() < 6.0", "-3.0 <= (a - b).max() < {c} + 3.0 > t",
    # any()/all() over Python tuples and tensor elements: Python's answer and order.
    "any(v.sum() > {c} for v in (a, b))", "all(v > {c} for v in a) or t < {d}",
]
PYTHON_TESTS = ["k > {i}", "k % 2 == 0", "len(ys) > {i}", "s < {c}", "k == {i} or s > {c}"]

# Statements, by kind; `grad_ok` kinds keep eager autograd valid when x requires grad.
ASSIGNS = [
    "a = a + x", "a = (a + b) * {s}", "b = torch.tanh(a - b)", "a = torch.add(a, b, alpha={s})",
    "b = b * {s} + 1.0", "a, b = b, a", "t = a.sum()", "t = t + b.max()", "a = torch.where(a > {c}, a, b)",
    "b = torch.sort(a).values", "a = a + t", "b = torch.maximum(a, b) - {c}",
    "ok = (a > {c}).any() and (b < {d}).all()", "ok = not ok", "ok = ok or t > {c}",
    # `with`: the ops inside run without autograd, as eagerly.
    "with torch.no_grad(): b = b * {s} + a", "with torch.no_grad(): t = t + a.max()",
    # max()/min() of tensors pick as Python does; `or` as a value is Python's `a if a else b`.
    "t = max(t, a.max())", "t = min(t, b.sum() * {s})", "t = t + (a.sum() or b.sum())",
]
PY_ASSIGNS = ["k = k + 1", "k += 2", "s = s + {c}", "s = s * {s}", "s += float(a.max())", "k = k * 2 if k < 4 else k - 1",
              "k = k + int(n)", "k = k + len(m) + x.shape[0]", "assert len(ys) > 0, 'ys is empty'",
              "assert (a.abs() >= 0).all(), 'a has a negative magnitude'",
              # .item(), bool(t), .size()/len() of tensors: numbers the program reads when it runs
              # (a float is a double, as in Python), and they are Python numbers to isinstance;
              # the last two meet tensors (eager's wrapped-number promotion).
              "s = s + (a > {c}).float().sum().item()", "k = k + (b < {c}).sum().item()",
              "s = s * 0.5 + b.mean().item() / 3.0", "s = s + k / 3", "t = t + s * {s}", "a = a * (s / 7.0)",
              "k = k + int(bool((a > {c}).any()))", "k = k + m.size(1) - len(x)",
              "k = k + (1 if isinstance(s, float) and isinstance(k, int) else 5)"]
AUG = ["a += b", "b *= {s}", "t += a.sum()", "a -= {c}"]
INPLACE = ["acc.add_(a)", "acc.mul_({s})", "acc.add_(b * {s})"]
TERNARY = ["b = b * {s} if a.sum() > {c} else b + 1.0", "a = a - 1.0 if t < {c} else a * {s}",
           "t = t * 2.0 if (b > {c}).all() else t - 1.0"]
# Checks that fail on some inputs: the program raises them only on the paths that take them.
CHECKS = ["if a.sum() > {c} + 5.0: raise ValueError('fuzz: a.sum() is too big')",
          "assert t < {c} + 6.0, 'fuzz: t is too big'", "if k > 6: raise ValueError('fuzz: k is too big')",
          "assert (b > -9.0).all(), 'fuzz: b is too small'"]
CONTAINERS = ["dd['u'] = dd['u'] + a", "dd['c'] = dd['c'] + 1", "h = (h[1], h[0] + a * {s})",
              "a = a + h[0] - dd['u']", "dd['u'] = torch.tanh(dd['u'] + h[1])"]
LISTS = ["ys.append(a * {s})", "zs.append(b)", "a = a + torch.stack(ys).mean(0)", "k = k + len(zs)",
         "b = b + torch.cat(ys).view(-1, 3).sum(0) * {s}", "ws.append(a + b)", "k = k + len(ws) - len(zs)"]
# Items of a list reassigned, its length kept (`hs[layer] = cell(x, hs[layer])`).
FIXED_LISTS = ["hs[0] = hs[0] + a", "hs[1] = hs[1] * {s}", "hs[2][0] = torch.tanh(hs[2][0] + b)",
               "b = b + hs[0] * {s} + hs[1]"]
# Writes to an object's attributes and to items of containers in containers (no name rebound).
# `ob = Obj(...)` rebinds the name to a new object: carried as its parts.
OBJECTS = ["ob.v = ob.v + a", "ob.n = ob.n + 1", "ob.v = torch.tanh(ob.v) * {s}", "a = a + ob.v",
           "ob = Obj(ob.v * {s} + a)",
           "nest['l'][0] = nest['l'][0] + b", "nest['l'][1] = nest['l'][1] + 1",
           "nest['d']['w'] = nest['d']['w'] * {s} + a", "b = b + nest['d']['w'] * {s}"]
# Layouts: a matrix made column-major or row-major (eager's elementwise kernels keep
# their input's layout) and its strides read, as Longformer's windows read them.
LAYOUTS = ["q = q.t().contiguous().t()", "q = q.contiguous()", "q = q * {s} + a", "q = torch.tanh(q) - b",
           "q = q.t().t() * {s}", "q = q.clone()", "q = torch.where(q > {c}, q, m)",
           "q = q.transpose(0, 1).reshape(3, -1).transpose(0, 1)", "q = torch.zeros_like(q) + q",
           "k = k + q.stride(0) - q.stride(1)", "k = k + int(q.is_contiguous())",
           "a = a + q.as_strided((3,), (q.stride(1),)) * {s}", "a = a + q.flatten()[:3]",
           "t = t + q.unsqueeze(0).stride(1) * {s}"]
LAYOUTS_INPLACE = ["q.mul_({s})", "q.t().add_({c})"]
# `requires_grad` read of values a path may make without gradients (`with torch.no_grad():`
# statements above, `.detach()`), as a number and as a Python test.
FLAGS = ["k = k + int(b.requires_grad)", "k = k + int(a.requires_grad) * 2", "s = s + (1.5 if t.requires_grad else 0.5)",
         "b = b.detach() * {s}", "t = t.detach() + 1.0"]
# Python numbers of another type on one path (an int, a bool where `s` is a float): Python's
# value keeps its type on each path.
NUMBER_TYPES = ["s = 2 if a.sum() > {c} else s", "s = bool(t > {c}) if a.sum() > {d} else s",
                # a Python number on one path, a tensor on the other (its type and dtype by path)
                "s = t * {s} if a.sum() > {c} else s", "s = max(t, {c})", "s = min(s, a.sum()) + 0.1"]
LAYOUT_TERNARY = ["q = q.t().contiguous().t() if t > {c} else q", "q = q.contiguous() if a.sum() > {c} else q * {s}"]
# A name first assigned in a loop's body and read after the loop (unbound after zero trips).
LOOP_LOCAL_VALUES = ["a * {s}", "b + {c}", "torch.tanh(a) + t"]
LOOP_LOCAL_USES = ["a = a + {v}", "t = t + {v}.sum()"]
# A loop body that raises on every trip it takes (raised when a run takes a trip).
LOOP_RAISES = ["raise ValueError('fuzz: the loop ran')", "assert False, 'fuzz: the loop ran'",
               "k = k + [1, 2, 3][k + 9]"]
GROW = ["g = torch.cat([g, a[:1]])", "t = t + g.sum()"]
# A local first assigned in the arms of an `if` and read right after it: defined on every path
# that reaches the read (an arm that returns, breaks or continues need not define it).
LOCAL_VALUES = ["a * {s}", "b + {c}", "torch.tanh(a)", "a - b", "x * {s}"]
LOCAL_USES = ["a = a + {v}", "b = b * 0.5 + {v}", "t = t + {v}.sum()"]
CALLS = ["a = mix(a, b)", "b = clip(b + a, 3.0)", "b = clip(b - a, lim={s} + 2.0)", "a = walk(m, a)", "b = (lambda u: u * {s} + 1.0)(b)",
         "a = pick(a, m)", "b = nested(a, b, m)"]
# Augmented assignment through aliases and views: in place, as in eager (`{n}`: a fresh name).
# `g` is a view of the input `x` until `torch.cat` makes it new: `g += ...` writes `x` too.
ALIASES = ["{n} = a; {n} *= {s}", "{n} = a[1:]; {n} += b[1:]", "{n} = a[1]; {n} += t", "{n} = acc[:2]; {n}.mul_({s})",
           "{n} = t; t += {c}; a = a + {n}", "g += {c}", "{n} = b; b = b + 1.0; {n} -= a"]
# Statements that use a loop's target, by target kind.
TARGET_USES = {
    "index": ["a = a + {v}", "t = t + {v}", "k = k + {v}"],
    # `for i in range(n)` (n <= 3): `x[i]` slices the input per trip, as the user wrote it, where
    # other statements read `x` whole (the executor's one-`unbind` slicing must keep eager's gradient).
    "counter": ["a = a + {v}", "t = t + {v}", "k = k + {v}", "t = t + x[{v}]", "a = a + x[{v}] * {s}"],
    "row": ["a = a + {v}", "b = b + {v} * {s}", "ys.append({v})", "t = t + {v}.sum()"],
    "row_inplace": ["{v} *= {s}"],
    "scale": ["a = a * {v}", "s = s + {v}"],
    "fn": ["a = {v}(a)", "b = {v}(b) + {c}", "t = t + {v}(a).sum()"],
    # (not `a += e` in `for e in a`: eager refuses an in-place op on overlapping memory)
    "elem": ["t = t + {v}", "a = a + {v}", "s = s + {v}", "b += {v} * 0.5"],
}


class Simple:
    """One line: an assignment, a call, `break`, `continue` or `return`."""

    def __init__(self, kind, text):
        self.kind, self.text = kind, text

    def blocks(self):
        return []

    def render(self, out, indent):
        self.line = len(out) + 1
        out.append(" " * indent + self.text)

    def copy(self):
        return Simple(self.kind, self.text)


class If:
    """``if test:`` body, else orelse (an `If` alone in orelse renders as ``elif``)."""

    def __init__(self, test, body, orelse, tensor):
        self.kind = "if_tensor" if tensor else "if_python"
        self.test, self.body, self.orelse, self.tensor = test, body, orelse, tensor

    def blocks(self):
        return [self.body, self.orelse]

    def render(self, out, indent, keyword="if"):
        self.line = len(out) + 1
        out.append(" " * indent + f"{keyword} {self.test}:")
        render_block(self.body, out, indent + 4)
        if len(self.orelse) == 1 and isinstance(self.orelse[0], If):
            self.orelse[0].render(out, indent, "elif")
        elif self.orelse:
            out.append(" " * indent + "else:")
            render_block(self.orelse, out, indent + 4)

    def copy(self):
        return If(self.test, copy_block(self.body), copy_block(self.orelse), self.tensor)


class Loop:
    """A ``for`` or ``while`` loop. `init` lines come before the header, `step`
    lines start the body (a while counter moves first so `continue` cannot skip it)."""

    def __init__(self, kind, init, header, step, body, orelse, tensor):
        self.kind, self.init, self.header, self.step = kind, init, header, step
        self.body, self.orelse, self.tensor = body, orelse, tensor

    def blocks(self):
        return [self.body, self.orelse]

    def render(self, out, indent):
        pad = " " * indent
        out.extend(pad + line for line in self.init)
        self.line = len(out) + 1
        out.append(pad + self.header)
        out.extend(" " * (indent + 4) + line for line in self.step)
        if self.body or not self.step:
            render_block(self.body, out, indent + 4)
        if self.orelse:
            out.append(pad + "else:")
            render_block(self.orelse, out, indent + 4)

    def copy(self):
        return Loop(self.kind, self.init, self.header, self.step, copy_block(self.body), copy_block(self.orelse),
                    self.tensor)


def render_block(stmts, out, indent):
    if not stmts:
        out.append(" " * indent + "pass")
    for stmt in stmts:
        stmt.render(out, indent)


def copy_block(stmts):
    return [s.copy() for s in stmts]


def walk(stmts):
    """Every statement of a block, depth first."""
    for stmt in stmts:
        yield stmt
        for block in stmt.blocks():
            yield from walk(block)


class Program:
    """A generated function: its state variables, its body, whether `x` requires grad."""

    def __init__(self, seed, state, body, rows, grad, pair=False):
        self.seed, self.state, self.body, self.rows, self.grad = seed, state, body, rows, grad
        self.pair = pair  # return (tensor, k, s) rather than one tensor

    def copy(self):
        return Program(self.seed, list(self.state), copy_block(self.body), self.rows, self.grad, self.pair)

    def return_text(self):
        total = " + ".join(STATE[v][1] for v in self.state if STATE[v][1])
        if not self.pair:
            return f"return {total}"
        # (the Python numbers too: a number comes back as one, of eager's type)
        numbers = ", ".join(v for v in ("k", "s") if v in self.state)
        return f"return {total}, {numbers}" if numbers else f"return {total}"

    def source(self):
        """The module text; also records each statement's line number."""
        out = ["import torch", ""] + HELPERS.strip("\n").split("\n") + ["", "", "def f(x, m, n):"]
        out.extend("    " + STATE[v][0] for v in self.state)
        for stmt in walk(self.body):
            if isinstance(stmt, Simple) and stmt.kind == "return":
                stmt.text = self.return_text()
        render_block(self.body, out, 4)
        out.append("    " + self.return_text())
        return "\n".join(out) + "\n"

    def function_source(self):
        """The source of `f` alone (what a reproducer shows; helpers are fixed)."""
        text = self.source()
        return text[text.index("def f("):]

    def used_names(self):
        words = set()
        for stmt in walk(self.body):
            if isinstance(stmt, Simple) and stmt.kind == "return":
                continue  # returns spell out all the state; they use what the rest uses
            for text in _texts(stmt):
                words.update(re.findall(r"[A-Za-z_]\w*", text))
        return words

    def tensor_control_flow(self):
        """(kind, line) of each tensor-dependent `if`/ternary/loop; lines valid after source()."""
        found = []
        for stmt in walk(self.body):
            if getattr(stmt, "tensor", False):
                found.append(("cond" if isinstance(stmt, If) else "while", stmt.line))
            elif isinstance(stmt, Simple) and stmt.kind == "ternary_tensor":
                found.append(("cond", stmt.line))
        return found


def _texts(stmt):
    if isinstance(stmt, Simple):
        return [stmt.text]
    if isinstance(stmt, If):
        return [stmt.test]
    return list(stmt.init) + [stmt.header] + list(stmt.step)


class _Generator:
    def __init__(self, rng, grad, top, depth, unbound=None):
        self.rng, self.grad, self.top, self.depth = rng, grad, top, depth
        self.names = 0
        # Choices added after programs were first generated draw from this
        # stream of their own, so the other choices of a seed stay the same.
        self.unbound = unbound or random.Random(0)

    def fresh(self, prefix):
        self.names += 1
        return f"{prefix}{self.names}"

    def fill(self, template, **extra):
        r = self.rng
        return template.format(c=r.choice(CONSTS), d=r.choice(CONSTS), s=r.choice(SCALES), i=r.randint(0, 3),
                               **extra)

    def test(self, tensor, targets):
        r = self.rng
        if tensor:
            pool = TENSOR_TESTS + [f"{v}.sum() > {{c}}" for v, kind in targets if kind == "row"]
        else:
            pool = PYTHON_TESTS
        return self.fill(r.choice(pool))

    def simple(self, targets, branch):
        r = self.rng
        if self.unbound.random() < 0.08:  # (a stream of its own: other seeds' programs stay the same)
            pools = [("layout", LAYOUTS), ("ternary_tensor", LAYOUT_TERNARY), ("flag", FLAGS),
                     ("ternary_tensor", NUMBER_TYPES)]
            if not self.grad:
                pools.append(("layout_inplace", LAYOUTS_INPLACE))
            kind, pool = self.unbound.choice(pools)
            return Simple(kind, self.fill(self.unbound.choice(pool)))
        lists = LISTS  # (appended under a tensor `if` too: a tensor array)
        groups = [("assign", ASSIGNS, 5), ("python", PY_ASSIGNS, 3), ("ternary_tensor", TERNARY, 2),
                  ("list", lists, 2), ("grow", GROW, 1), ("call", CALLS, 1), ("container", CONTAINERS, 1),
                  ("check", CHECKS, 1), ("object", OBJECTS, 2), ("fixed_list", FIXED_LISTS, 1)]
        if not self.grad:
            groups += [("aug", AUG, 2), ("inplace", INPLACE, 1), ("alias", ALIASES, 1)]
        if targets:
            groups.append(("target", None, 3))
        kind, pool, _ = r.choices(groups, weights=[w for *_, w in groups])[0]
        if kind == "target":
            v, target_kind = r.choice(targets)
            kinds = [target_kind] + (["row_inplace"] if target_kind == "row" and not self.grad else [])
            kind = r.choice(kinds)
            uses = [u for u in TARGET_USES[kind] if not (self.grad and "+=" in u)] or ["a = a + {v}"]
            return Simple(kind, self.fill(r.choice(uses), v=v))
        return Simple(kind, self.fill(r.choice(pool), n=self.fresh("al")))

    def block(self, depth, in_loop, targets, branch=False):
        """Statements at `depth`; `branch`: directly under a tensor `if` (no loop in between)."""
        r = self.rng
        stmts = []
        for _ in range(r.randint(1, 3 if depth else self.top)):
            choices = ["simple"] * 4
            if depth < self.depth:
                choices += ["if_tensor"] * 3 + ["if_python"] + ["loop"] * 2
            if depth:
                choices += ["return"]
            if in_loop:
                choices += ["break", "continue"]
            what = r.choice(choices)
            if what == "simple":
                stmts.append(self.simple(targets, branch))
            elif what.startswith("if"):
                stmts.append(self.if_stmt(what == "if_tensor", depth, in_loop, targets, branch))
                if r.random() < 0.25:
                    stmts.append(self.local_in_arms(stmts[-1]))
            elif what == "loop":
                stmts.append(self.loop(depth, targets, branch))
                if stmts[-1].tensor and r.random() < 0.25:
                    stmts.append(self.loop_local(stmts[-1]))
            else:
                exit_ = Simple(what, "return" if what == "return" else what)
                if r.random() < 0.7:  # usually guarded, as users write it
                    stmts.append(If(self.test(r.random() < 0.7, targets), [exit_], [], True))
                    stmts[-1].tensor = _is_tensor_test(stmts[-1].test)
                    stmts[-1].kind = "if_tensor" if stmts[-1].tensor else "if_python"
                else:
                    stmts.append(exit_)
                    break
        return stmts

    def if_stmt(self, tensor, depth, in_loop, targets, branch):
        r = self.rng
        test = self.test(tensor, targets)
        branch = branch or bool(_TENSOR_NAMES.search(test))  # some operand may be a tensor
        body = self.block(depth + 1, in_loop, targets, branch)
        roll = r.random()
        if roll < 0.35:
            orelse = []
        elif roll < 0.55:
            orelse = [self.if_stmt(r.random() < 0.6, depth + 1, in_loop, targets, branch)]
        else:
            orelse = self.block(depth + 1, in_loop, targets, branch)
        return If(test, body, orelse, _is_tensor_test(test))

    def local_in_arms(self, if_stmt):
        """Define a fresh local at the end of every arm of `if_stmt` (before an arm's final exit, or
        after it: dead code), or sometimes of every arm but one (Python's scoping: a path that skips it
        and reads it raises UnboundLocalError, and so must the program), and return the statement after
        the `if` that reads it."""
        r = self.rng
        v = self.fresh("v")
        arms = [if_stmt.body, if_stmt.orelse]
        while len(arms[-1]) == 1 and isinstance(arms[-1][0], If):  # `elif` chains: each arm, and the last else
            arms[-1:] = [arms[-1][0].body, arms[-1][0].orelse]
        skipped = self.unbound.randrange(len(arms)) if self.unbound.random() < 0.3 else None
        for i, arm in enumerate(arms):
            define = Simple("local", self.fill(f"{v} = {r.choice(LOCAL_VALUES)}"))
            at = len(arm)
            if arm and isinstance(arm[-1], Simple) and arm[-1].kind in ("return", "break", "continue") \
                    and r.random() < 0.5:
                at -= 1
            if i != skipped:  # (the choices above are drawn all the same: the stream stays the same)
                arm.insert(at, define)
        return Simple("local", self.fill(r.choice(LOCAL_USES), v=v))

    def loop(self, depth, targets, branch):
        r = self.rng
        kind = r.choice(["range_tensor", "rows", "enumerate", "zip", "elems", "while_tensor", "while_and",
                         "range_python", "list_python", "fns", "while_python", "while_effect", "while_ternary",
                         "while_inplace"])
        init, step, new_targets = [], [], []
        if kind == "range_tensor":
            v = self.fresh("i")
            header, new_targets = f"for {v} in range(n):", [(v, "counter")]
        elif kind == "rows":
            v = self.fresh("row")
            header, new_targets = f"for {v} in m:", [(v, "row")]
        elif kind == "enumerate":
            i, v = self.fresh("j"), self.fresh("row")
            header, new_targets = f"for {i}, {v} in enumerate(m):", [(i, "index"), (v, "row")]
        elif kind == "elems":  # the 0-d elements of a vector the body may change
            v = self.fresh("e")
            header, new_targets = f"for {v} in {r.choice(['x', 'a', 'b'])}:", [(v, "elem")]
        elif kind == "zip":
            i, v = self.fresh("i"), self.fresh("row")
            header, new_targets = f"for {i}, {v} in zip(range(n), m):", [(i, "counter"), (v, "row")]
        elif kind == "range_python":
            v = self.fresh("i")
            header, new_targets = f"for {v} in range({r.randint(0, 3)}):", [(v, "index")]
        elif kind == "list_python":
            v = self.fresh("c")
            items = r.choice(["[{}, {}]", "({}, {})"]).format(r.choice(SCALES), r.choice(SCALES))
            header, new_targets = f"for {v} in {items}:", [(v, "scale")]
        elif kind == "fns":  # Python objects (functions) as items: unrolled, also when a tensor ends it
            v = self.fresh("fn")
            header, new_targets = f"for {v} in (torch.tanh, {r.choice(['torch.relu', 'torch.sigmoid'])}):", [(v, "fn")]
        elif kind == "while_inplace":  # a 0-d tensor counter the test itself bumps in place
            w = self.fresh("w")
            init, header = [f"{w} = n * 1"], f"while {w}.add_(1) < {r.randint(1, 4)}:"
        else:
            w = self.fresh("w")
            init, step = [f"{w} = 0"], [f"{w} += 1"]
            bound = {"while_tensor": "n", "while_python": str(r.randint(0, 3))}.get(kind)
            if bound:
                header = f"while {w} < {bound}:"
            elif kind == "while_effect":  # a test with an effect, before or after the counter's test
                effect = self.fill("acc.add_(1.0).sum() < {c} + 6.0")
                header = self.fill(r.choice([f"while {effect} and {w} < {{i}}:", f"while {w} < {{i}} and {effect}:"]))
            elif kind == "while_ternary":
                header = self.fill(r.choice([f"while {w} < ({{i}} if a.sum() > {{c}} else n):",
                                             f"while ({w} if t > {{c}} else {w} + 1) < {{i}}:"]))
            else:
                header = self.fill(f"while {w} < {{i}} and a.sum() < {{c}}:")
            new_targets = [(w, "index")]
        # `while w < 0 and ...` is decided by Python (the tensor operand never runs).
        tensor = kind in ("range_tensor", "rows", "enumerate", "zip", "elems", "while_tensor", "while_ternary",
                          "while_inplace") or (
            kind in ("while_and", "while_effect") and not header.startswith(f"while {init[0].split()[0]} < 0 "))
        # Appends in a tensor loop make a tensor array, whatever encloses the loop.
        body = self.block(depth + 1, True, targets + new_targets, branch and not tensor)
        if tensor and r.random() < 0.08:
            body.append(Simple("check", r.choice(LOOP_RAISES)))
        orelse = self.block(depth + 1, False, targets, branch) if r.random() < 0.15 else []
        return Loop(kind, init, header, step, body, orelse, tensor)

    def loop_local(self, loop):
        """Define a fresh local in `loop`'s body (first assigned there) and
        return the statement after the loop that reads it: eager raises
        UnboundLocalError when the loop made no trip."""
        v = self.fresh("v")
        # Before the body's first exit: an assignment after it is dead code
        # (Python then has no binding for the name at all).
        # (Not with a body that raises on every trip: docs/syntax_and_limitations.md.)
        exits = [i for i, stmt in enumerate(loop.body)
                 if isinstance(stmt, Simple) and stmt.kind in ("return", "break", "continue", "check")]
        if any(isinstance(stmt, Simple) and stmt.text in LOOP_RAISES for stmt in loop.body):
            return Simple("local", "pass")
        loop.body.insert(self.rng.randint(0, exits[0] if exits else len(loop.body)),
                         Simple("local", self.fill(f"{v} = {self.rng.choice(LOOP_LOCAL_VALUES)}")))
        return Simple("local", self.fill(self.rng.choice(LOOP_LOCAL_USES), v=v))


_TENSOR_NAMES = re.compile(r"\b(a|b|t|x|ok|acc|row\d+|e\d+)\b")


def _is_tensor_test(test):
    """Whether a generated test is decided by a tensor: its first operand (later
    operands of `and`/`or` may be short-circuited by Python) names a tensor."""
    first = re.split(r" and | or ", test)[0]
    return bool(_TENSOR_NAMES.search(first))


def generate(seed, top=5, depth=3):
    """The program for `seed` (an int or a string): same seed, same program.
    `top`: at most this many statements at the top level; `depth`: nesting of `if`s and loops."""
    rng = random.Random(seed)
    grad = rng.random() < 0.3
    gen = _Generator(rng, grad, top, depth, random.Random(f"{seed}/unbound"))
    body = gen.block(0, False, [])
    program = Program(seed, list(STATE), body, rows=rng.randint(1, 3), grad=grad, pair=rng.random() < 0.2)
    program.state = [v for v in STATE if v in program.used_names() or v in ("a",)]
    return program


class SourceProgram:
    """A hand-written (or minimised) function `f(x, m, n)` for the runner:
    `ops` are the control-flow op types its program must hold."""

    def __init__(self, text, rows=2, grad=False, ops=()):
        self.text, self.rows, self.grad, self.ops = text, rows, grad, ops
        self.body, self.state = [], re.findall(r"^    (\w+) = ", text, re.M)

    def source(self):
        return "import torch\n\n" + self.text

    def function_source(self):
        return self.text

    def tensor_control_flow(self):
        return [(kind, None) for kind in self.ops]
