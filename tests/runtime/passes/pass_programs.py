"""Small declarative functions with `cond` and `while`, shared by the pass tests."""

import torch

import d2s


def ops_text(program):
    """Block headers and op lines: the part of `to_string()` a pass changes."""
    lines = []
    for block in program.blocks:
        lines.append(f"block {block.idx}")
        lines += [f"  {op.to_string()}" for op in block.ops]
    return "\n".join(lines) + "\n"


@d2s.declarative
def count_until(x, n):
    """A counted loop with an early `break`: counter, length and break flag
    are CPU scalars; `unused` is dead code."""
    i = 0
    while i < n:
        x = x * 0.5
        i += 1
        if x.sum() < 1:
            break
    unused = torch.tanh(x)
    return x, i


def traced(fn, *args):
    fn(*args)
    concrete = fn.concrete_program
    return (concrete.main_program, [v.name for v in concrete.inputs], [v.name for v in concrete.fetch_vars])


def scaled_branches():
    """A hand-built program: a float `fill_constant` read by arithmetic in
    both branches of a `cond` and in a `while` body, one read by `torch.stack`
    (which may return... a fresh tensor too, but is not in the list: kept)."""
    import runtime
    from ops.framework import fill_constant

    program = runtime.Program()
    with runtime.program_guard(program):
        x = runtime.data("x", [3])
        half = fill_constant(0.5, torch.float32)
        kept = fill_constant(2.0, torch.float32)
        y = d2s.cond(x.sum() > 0, lambda: x * half, lambda: x - half)
        (z,) = d2s.while_loop(lambda v: v.sum() < 100, lambda v: [v + half + 1], [y])
        w = torch.stack([z, kept.expand(3)])
    return program, ["x"], [w.name]


@d2s.declarative
def positive_rows_sum(x, n):
    """Rows `x[t]` read by the counter inside a `cond` inside a `while`."""
    acc = torch.zeros(x.shape[1])
    for t in range(n):
        if x[t].sum() > 0:
            acc = acc + x[t]
    return acc


@d2s.declarative
def repeated_sums(x):
    """`x.sum()` three times: before a `cond`, in its branch, and in a `while` body
    (which ends: it adds at least 1 per trip)."""
    s = x.sum()
    if x.sum() > 0:
        y = x * x.sum()
    else:
        y = x - s
    while y.sum() < 10:
        y = y + x.sum().abs() + 1
    return y


@d2s.declarative
def frozen_scale(x, w):
    with torch.no_grad():
        a = w * 2
        b = a + 1
        c = b.tanh()
    return x * c


@d2s.declarative
def tanh_twice(x):
    """`tanh(x)` before a `cond` and again in its branch."""
    t = torch.tanh(x)
    if t.sum() > 0:
        y = torch.tanh(x) * 2.0
    else:
        y = x - 1.0
    return y + t


@d2s.declarative
def shrink_steps(x, n):
    """Fresh temporaries in block 0, in both branches of a `cond` and in a
    `while` body; `y` itself (defined outside each sub-block) is never
    written in place."""
    y = torch.tanh(x * 2.0)
    if y.sum() > 0:
        y = y * 0.5 + 1.0
    else:
        y = y - 1.0
    i = 0
    while i < n:
        y = torch.relu(y - 0.1) * y
        i += 1
    return y + x


class LinearSteps(torch.nn.Module):
    """A Linear in block 0, in a `cond` branch and in a `while` body (the
    last on a 1-d input: left as `linear`)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 2, bias=False)

    def forward(self, x, n):
        y = self.fc(x)
        if y.sum() > 0:
            y = self.fc(y)
        i = 0
        while i < n:
            y = torch.tanh(self.fc(y))
            i += 1
        return self.head(y), self.fc(y[0])


@d2s.declarative
def bump_until(x, n):
    """A counter made by arithmetic, then written in place by the loop test
    itself (`y.add_(1)`), and one read through a view that the body writes."""
    y = n * 1
    k = n + 0
    view = k.view(1)
    while y.add_(1) < 5:
        view.add_(2)
        if y == 3:
            break
    return x + y + k


@d2s.declarative
def rows_total(x):
    """A loop over the rows of `x`: `x.select(0, ctr)` each step."""
    total = torch.zeros(3)
    for row in x:
        total = total + torch.tanh(row)
    return total


@d2s.declarative(optimize="fast")
def scaled_walk(x, w, n):
    """A `while` whose body computes `w * 2.0` and `(w * 2.0).tanh()`
    (invariant: `w` is not changed by the loop) next to `y`-dependent ops,
    and a `cond` in the body reading the invariant value."""
    i = 0
    y = x
    while i < n:
        s = w * 2.0
        t = s.tanh()
        y = y * t + 1.0
        if y.sum() > 100:
            y = y - s
        i += 1
    return y


@d2s.declarative
def two_lists(x, n):
    """Two lists `[x]` appended in one tensor loop: two `array_from_list(x)`,
    the same op with the same input, making two different lists."""
    hs = [x]
    cs = [x]
    for t in range(n):
        x = x + 1
        hs.append(x)
        cs.append(x * 2)
    return torch.stack(hs), torch.stack(cs)


@d2s.declarative
def two_empty_lists(x, n):
    """The same with `[]`: two `array_create()` (n >= 1: eager cannot stack an empty list)."""
    hs = []
    cs = []
    for t in range(n):
        x = x + 1
        hs.append(x)
        cs.append(x * 2)
    return torch.stack(hs), torch.stack(cs)


def lists_per_trip(x, n, m):
    """A list made in each trip of a tensor loop and appended in an inner
    one: the `array_create` reads nothing the loop changes, yet each trip's
    `[]` is a new list."""
    total = x * 0
    for i in range(n):
        inner = []
        for j in range(m):
            inner.append(x * j)
        total = total + len(inner)
    return total
