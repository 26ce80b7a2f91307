"""Control-flow functions for the declarative == eager tests.

Each case is a plain function plus several argument tuples of the same shapes
that take *different* paths through it (both branches, 0/1/many iterations,
break taken or not, early return or not), and the op types its program must
(and must not) contain. One program, built from the first arguments, must
serve them all.
"""

import torch
import torch.nn.functional as F
from torch import nn

CASES = []


def case(*arg_sets, ops=(), no=(), close=False):
    def register(fn):
        CASES.append((fn, [tuple(a) for a in arg_sets], set(ops), set(no), close))
        return fn
    return register


def T(*values):
    return torch.tensor(values, dtype=torch.float32)


def I(value):
    return torch.tensor(value, dtype=torch.int64)


POS, NEG, MIX = T(1.0, 2.0, 3.0), T(-1.0, -2.0, -3.0), T(-4.0, 0.5, 2.0)
SMALL, BIG = T(0.1, 0.2, 0.3), T(5.0, 6.0, 7.0)

# -- if / elif / else -----------------------------------------------------------------------


@case((POS,), (NEG,), ops={"cond"})
def if_else(x):
    if x.sum() > 0:
        y = x + 1
    else:
        y = x - 1
    return y


@case((POS,), (NEG,), ops={"cond"})
def if_without_else(x):
    y = x * 3
    if x.mean() > 0:
        y = y * 2
    return y


@case((POS,), (NEG,), (MIX,), (T(0.0, 0.0, 0.0),), ops={"cond"})
def if_elif_else(x):
    s = x.sum()
    if s > 1:
        y = x * 2
    elif s < -1:
        y = -x
    else:
        y = x + 100
    return y


@case((POS, SMALL), (POS, BIG), (NEG, SMALL), (NEG, BIG), ops={"cond"})
def nested_if(x, y):
    if x.sum() > 0:
        if y.sum() > 3:
            z = x * y
        else:
            z = x + y
    else:
        if y.max() > 1:
            z = x - y
        else:
            z = x / (y + 1)
    return z


@case((POS,), (NEG,), ops={"cond"})
def python_condition_inside(x):
    # x.shape[0] is known while converting: that `if` stays Python.
    if x.shape[0] == 3:
        if x.sum() > 0:
            x = x * 10
    else:
        x = x * 0
    return x


@case((POS, BIG), (NEG, SMALL), ops={"cond"})
def several_outputs(x, y):
    a = x
    b = y
    if (x * y).sum() > 0:
        a = x + y
        b = x - y
        c = a * b
    else:
        a = x * y
        c = a
    return a, b, c


@case((POS,), (NEG,), ops={"cond"})
def python_numbers_merge(x):
    if x.sum() > 0:
        k = 2
        scale = 0.5
    else:
        k = 3
        scale = 1.5
    return x * k + scale


@case((POS,), (NEG,), ops={"cond"})
def branch_temporaries(x):
    y = x
    if x.sum() > 0:
        t = x * 2
        u = t + 1
        y = u * t
    return y


@case((POS,), (NEG,), ops={"cond"})
def same_python_value_both_branches(x):
    mode = "mul"
    if x.sum() > 0:
        y = x + 1
        mode = "mul"
    else:
        y = x - 1
    if mode == "mul":
        y = y * 2
    return y


@case((POS,), (NEG,), ops={"cond"})
def ternary(x):
    return x * 2 if x.sum() > 0 else x / 2


@case((POS,), (NEG,), (MIX,), ops={"cond"})
def nested_ternary(x):
    s = x.sum()
    y = x + 1 if s > 1 else (x - 1 if s < -1 else x * 0)
    return y


@case((POS,), (NEG,), no={"cond"})
def python_ternary(x):
    n = 2 if x.shape[0] > 2 else 5
    return x * n


@case((POS,), (SMALL,), (NEG,), ops={"cond"})
def and_condition(x):
    if x.sum() > 0 and x.max() > 2:
        return x * 2
    return x


@case((POS,), (SMALL,), (NEG,), ops={"cond"})
def or_condition(x):
    if x.sum() < 0 or x.max() < 1:
        x = x + 10
    return x


@case((POS,), (NEG,), ops={"cond"})
def not_condition(x):
    if not x.sum() > 0:
        x = -x
    return x


@case((POS,), (NEG,), ops={"cond"})
def python_and_tensor(x):
    if x.shape[0] == 3 and x.sum() > 0:
        x = x * 4
    return x


@case((POS,), (NEG,), no={"cond"})
def python_or_short_circuit(x):
    # The Python side decides: the tensor side is never evaluated.
    if x.shape[0] == 3 or x.sum() > 0:
        x = x * 4
    return x


@case((SMALL,), (POS,), (BIG,), ops={"cond"})
def chained_comparison(x):
    s = x.sum()
    if 0 < s < 5:
        x = x * 100
    return x


@case((POS,), (NEG,), ops={"torch.logical_and", "torch.logical_or", "torch.logical_not"}, no={"cond"})
def logical_values(x):
    a = x.sum() > 0
    b = x.max() > 2
    both = a and b
    either = a or b
    return both, either, not a


# -- early return -------------------------------------------------------------------------


@case((POS,), (NEG,), ops={"cond"})
def early_return(x):
    if x.sum() > 0:
        return x * 2
    x = x - 1
    return x


@case((POS,), (NEG,), ops={"cond"})
def return_in_both_branches(x):
    if x.sum() > 0:
        return x + 1
    else:
        return x - 1


# POS.clone(): one tensor passed twice would key a program of its own (`x is y`).
@case((POS, POS.clone()), (POS, NEG), (NEG, POS), ops={"cond"})
def return_in_nested_if(x, y):
    z = x + y
    if x.sum() > 0:
        if y.sum() > 0:
            return z * 2
        z = z + 5
    return z


@case((POS,), (NEG,), (MIX,), ops={"cond"})
def return_in_elif_chain(x):
    s = x.sum()
    if s > 1:
        return x * 2
    elif s < -1:
        return x * 3
    return x * 4


@case((POS,), (NEG,), ops={"cond"})
def return_tuple_early(x):
    if x.sum() > 0:
        return x, x * 2
    return x * 3, x * 4


@case((POS,), (NEG,), ops={"cond"})
def python_early_return_then_tensor_if(x):
    if x.shape[0] != 3:
        return x
    if x.sum() > 0:
        return x * 2
    return x * 5


# -- while ------------------------------------------------------------------------------


@case((SMALL,), (BIG,), (POS,), ops={"while"})
def while_tensor_condition(x):
    while x.sum() < 10:
        x = x * 2
    return x


@case((POS, I(0)), (POS, I(1)), (POS, I(4)), ops={"while"})
def while_counter(x, n):
    i = 0
    s = x * 0
    while i < n:
        s = s + x
        i += 1
    return s, i


@case((POS, I(10)), (POS, I(2)), (BIG, I(10)), ops={"while"})
def while_compound_condition(x, n):
    i = 0
    s = x * 0
    while i < n and s.sum() < 20:
        s = s + x
        i = i + 1
    return s


@case((POS, I(0), I(3)), (POS, I(2), I(2)), (POS, I(3), I(1)), ops={"while"})
def nested_while(x, n, m):
    i = 0
    s = x * 0
    while i < n:
        j = 0
        while j < m:
            s = s + x * (i + 1)
            j += 1
        i += 1
    return s


@case((POS, I(5), T(100.0)), (POS, I(5), T(7.0)), (POS, I(0), T(7.0)), ops={"while", "cond"})
def while_break(x, n, limit):
    i = 0
    s = x * 0
    while i < n:
        s = s + x
        if s.sum() > limit:
            break
        i += 1
    return s, i


@case((POS, I(6)), (POS, I(1)), (POS, I(0)), ops={"while", "cond"})
def while_continue(x, n):
    i = 0
    s = x * 0
    while i < n:
        i += 1
        if i % 2 == 0:
            continue
        s = s + x * i
    return s


@case((POS, I(8), T(30.0)), (POS, I(8), T(1000.0)), (NEG, I(3), T(0.0)), ops={"while", "cond"})
def while_break_and_continue(x, n, limit):
    i = 0
    s = x * 0
    while i < n:
        i = i + 1
        if i == 2:
            continue
        s = s + x * i
        if s.sum() > limit:
            break
    return s


@case((SMALL,), (BIG,), ops={"while", "cond"})
def while_true_break(x):
    while True:
        x = x * 2
        if x.sum() > 20:
            break
    return x


@case((POS, I(5)), (SMALL, I(5)), (POS, I(0)), ops={"while", "cond"})
def return_inside_while(x, n):
    i = 0
    while i < n:
        x = x * 2
        if x.sum() > 20:
            return x + 1000
        i += 1
    return x


# A container returned from inside a tensor loop: the loop carries the
# return value as one placeholder per item (it starts unbound).
@case((POS, I(5)), (SMALL, I(5)), (POS, I(0)), (SMALL, I(2)), ops={"while", "cond"})
def return_tuple_inside_while(x, n):
    i = 0
    h = x * 1
    while i < n:
        h = h * 2
        if h.sum() > 20:
            return h, x + i
        i += 1
    return h * 0, x


@case((POS, I(5)), (SMALL, I(5)), (POS, I(0)), (SMALL, I(2)), ops={"while", "cond"})
def return_tuple_variable_inside_while(x, n):
    i = 0
    pair = (x, x * 2)
    while i < n:
        pair = (pair[0] + 1, pair[1] * 2)
        if pair[0].sum() > 10:
            return pair
        i += 1
    return pair


@case((POS, I(5)), (SMALL, I(5)), (POS, I(0)), (NEG, I(3)), ops={"while", "cond"})
def return_dict_inside_for_range(x, n):
    state = {"h": x * 0, "c": x * 0}
    for i in range(n):
        state = {"h": state["h"] + x, "c": state["c"] * 0.5 + i}
        if state["h"].sum() > 5:
            return {"h": state["h"], "c": state["c"], "step": x * i}
    return {"h": x, "c": -x, "step": x * 0}


@case((POS,), (NEG,), ops={"cond"}, no={"while"})
def python_while_with_tensor_if(x):
    i = 0
    while i < 3:
        if x.sum() > 0:
            x = x + i
        else:
            x = x - i
        i += 1
    return x


ROW, NEG_ROW = torch.tensor([[1.0, 2.0]]), torch.tensor([[-1.0, -2.0]])


# A dimension of size 1: the body's `x[i - 1]` is traced with a value made
# up for `i` (it changes every trip), which must be a valid index there.
@case((ROW, I(0)), (NEG_ROW, I(0)), (ROW, I(1)), ops={"while", "cond"})
def while_counter_indexes_size_one(x, i):
    acc = x[0] * 0
    while i < x.shape[0]:
        i = i + 1
        if x[i - 1].sum() < 0:
            continue
        acc = acc + x[i - 1]
    return acc


@case((ROW,), (NEG_ROW,), (ROW * 0.1,), ops={"while", "cond"})
def return_from_range_loop_size_one(x):
    for i in range(x.shape[0]):
        if x[i].sum() > 1:
            return x[i], i
    return x[0] * 0, -1


@case((POS, I(3)), (POS, I(0)), ops={"while"})
def while_else(x, n):
    i = 0
    while i < n:
        x = x + 1
        i += 1
    else:
        x = x * 10
    return x


@case((POS, I(5), T(8.0)), (POS, I(5), T(100.0)), ops={"while", "cond"})
def while_else_with_break(x, n, limit):
    i = 0
    while i < n:
        x = x + 1
        if x.sum() > limit:
            break
        i += 1
    else:
        x = x * 10
    return x


@case((POS, I(1)), (POS, I(3)), (POS, I(0)), ops={"while"})
def growing_tensor(x, n):
    y = x
    i = 0
    while i < n:
        y = torch.cat([y, x * i])
        i += 1
    return y


@case((POS, I(4)), (NEG, I(4)), (POS, I(0)), ops={"while", "cond"})
def if_in_while_updates_loop_var(x, n):
    i = 0
    acc = x * 0
    while i < n:
        if acc.sum() >= 0:
            acc = acc + x
        else:
            acc = acc - x
        i += 1
    return acc


# -- for --------------------------------------------------------------------------------


@case((POS, I(0)), (POS, I(1)), (POS, I(5)), ops={"while"})
def for_range_tensor(x, n):
    s = x * 0
    for i in range(n):
        s = s + x * i
    return s


@case((POS, I(1)), (POS, I(4)), ops={"while"})
def for_range_start_stop(x, n):
    s = x * 0
    for i in range(1, n):
        s = s + i
    return s


@case((POS, I(0)), (POS, I(7)), ops={"while"})
def for_range_step(x, n):
    s = x * 0
    for i in range(0, n, 2):
        s = s + i
    return s


@case((torch.arange(12.0).reshape(4, 3),), (-torch.arange(12.0).reshape(4, 3),), ops={"while"})
def for_over_tensor_rows(x):
    s = x[0] * 0
    for row in x:
        s = s + row * 2
    return s


@case((torch.arange(12.0).reshape(4, 3),), (torch.ones(4, 3),), ops={"while"})
def for_enumerate_tensor(x):
    s = x[0] * 0
    for i, row in enumerate(x):
        s = s + row * i
    return s


@case((torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)), (torch.ones(2, 3), torch.zeros(2, 3)), ops={"while"})
def for_zip_tensors(x, y):
    s = x[0] * 0
    for a, b in zip(x, y):
        s = s + a * b
    return s


@case((torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)), (torch.ones(2, 3), torch.full((2, 3), 5.0)),
      ops={"cond"}, no={"while"})
def zip_of_tensors_as_python_items(h, c):
    # torchMoji's LSTM: `hidden = list(zip(*hidden))`, `h, c = zip(*pairs)`:
    # zip/enumerate of tensors used as Python items (not by a `for`) iterate
    # the rows in Python, as eagerly (they were a graph iterable: a TypeError).
    if h.sum() > c.sum():
        rows = list(zip(*(h, c)))
        first, second = zip(*rows)
    else:
        first, second = tuple(c), tuple(h)
    scaled = tuple(i * r for i, r in enumerate(first))
    return torch.stack(scaled) + torch.stack(tuple(second))


@case((POS,), (NEG,), ops={"cond"}, no={"while"})
def for_python_range_unrolls(x):
    for i in range(3):
        if x.sum() > i:
            x = x + 1
    return x


@case((POS,), (NEG,), no={"while"})
def for_python_list_unrolls(x):
    for w in [1.0, 2.0, 3.0]:
        x = x * w
    return x


@case((POS, I(6), T(10.0)), (POS, I(6), T(1000.0)), (POS, I(0), T(1.0)), ops={"while", "cond"})
def for_break(x, n, limit):
    s = x * 0
    for i in range(n):
        s = s + x
        if s.sum() > limit:
            break
    return s


@case((POS, I(6)), (POS, I(0)), (NEG, I(3)), ops={"while", "cond"})
def for_continue(x, n):
    s = x * 0
    for i in range(n):
        if i % 3 == 1:
            continue
        s = s + x * i
    return s


@case((POS, I(6), T(10.0)), (POS, I(6), T(1000.0)), (POS, I(0), T(1.0)), ops={"while", "cond"})
def for_return_inside(x, n, limit):
    s = x * 0
    for i in range(n):
        s = s + x
        if s.sum() > limit:
            return s * 100
    return s


@case((POS, I(3), T(100.0)), (POS, I(3), T(5.0)), ops={"while", "cond"})
def for_else(x, n, limit):
    for i in range(n):
        x = x + 1
        if x.sum() > limit:
            break
    else:
        x = -x
    return x


@case((POS, I(2), I(3)), (POS, I(0), I(3)), (POS, I(3), I(0)), ops={"while"})
def nested_for(x, n, m):
    s = x * 0
    for i in range(n):
        for j in range(m):
            s = s + x * (i * 10 + j)
    return s


@case((POS, T(5.0)), (POS, T(1000.0)), (NEG, T(0.0)), ops={"while", "cond"})
def python_range_tensor_break(x, limit):
    # A tensor-dependent break turns the Python loop into a graph loop.
    s = x * 0
    for i in range(5):
        s = s + x * (i + 1)
        if s.sum() > limit:
            break
    return s


@case((POS, I(0)), (POS, I(1)), (POS, I(4)), ops={"while"})
def append_in_loop_then_stack(x, n):
    outs = [x]
    for i in range(n):
        outs.append(x * i)
    return torch.stack(outs), len(outs)


@case((torch.arange(12.0).reshape(4, 3),), (torch.ones(4, 3),), ops={"while"})
def append_rows_then_cat(x):
    outs = []
    for row in x:
        outs.append(row * 2)
    return torch.cat(outs, 0)


# torch.cat of a tensor array is `3 * L` long for L elements of 3 (not a size
# of its own, which `.view(-1, 3)` was refused on: "shape '[-1, 3]' is
# invalid for input of size s59"), and its length is read back at run time.
@case((POS, I(0)), (NEG, I(1)), (POS, I(4)), ops={"while", "cond"})
def cat_of_array_viewed_by_element(x, n):
    ys = [x]
    for i in range(n):
        if x.sum() > i:
            ys.append(x * i)
        else:
            ys.append(x - i)
    c = torch.cat(ys)
    rows = c.view(-1, 3)
    return rows.sum(0) * c.shape[0] + torch.zeros(c.shape[0] // 3, 2).sum(), rows.shape[0]


# Code after `for ...: ... else: return` is never reached, but after a tensor
# `return` the lowering converts it under a flag that may be a tensor; its
# `if`s need to know which arm always continues (was: "'v' is assigned in the
# false branch but not in the true branch", fuzz seed g1 #117).
@case((POS, I(2)), (MIX, I(2)), (NEG, I(0)), ops={"cond"})
def dead_code_after_loop_else_return(x, n):
    s = 0.0
    if x.sum() > 1.0:
        return x + s
    for c in (0.5, 0.5):
        s = s + c
    else:
        return x * s
    i = 0
    while i < n:
        i += 1
        if x.sum() < 1.0:
            if s < 0.0:
                continue
            continue
        else:
            v = x + 2.5
        x = x + v
    return x


@case((POS, I(3)), (NEG, I(3)), (POS, I(0)), ops={"while", "cond"})
def for_if_else_return_value(x, n):
    total = x.sum() * 0
    for i in range(n):
        total = total + (x.max() if x.sum() > 0 else x.min())
    return total


# -- builtins and tensor-to-Python conversions ----------------------------------------------


@case((POS,), (NEG,), ops={"cond"}, no={"while"})
def len_and_shape_unroll(x):
    s = x * 0
    for i in range(len(x)):
        s = s + x[i]
    for j in range(x.shape[0] - 1):
        if s.sum() > 0:
            s = s * 2
    return s


@case((POS,), (NEG,), ops={"cond"})
def int_float_casts(x):
    n = int(x.sum())
    f = float(x.max())
    if n > 2:
        return x * n + f
    return x - f


@case((POS,), (T(0.0, 0.0, 0.0),), ops={"cond"})
def bool_cast(x):
    if bool(x.any()):
        return x + 1
    return x - 1


@case((POS,), (NEG,), ops={"cond"})
def item_value(x):
    v = x.sum().item()
    if v > 0:
        return x * v
    return x


@case((POS,), (NEG,), ops={"cond"})
def isinstance_tensor(x):
    if isinstance(x, torch.Tensor):
        if x.sum() > 0:
            x = x * 2
    else:
        x = None
    return x


@case((POS,), (NEG,), ops={"cond", "print", "assert"})
def print_and_assert(x):
    assert x.abs().sum() > 0, "x is all zeros"
    if x.sum() > 0:
        print("positive sum:", x.sum())
        x = x + 1
    return x


@case((torch.ones(2, 3),), (-torch.ones(2, 3),), ops={"cond"})
def size_method(x):
    rows, cols = x.size()
    if x.sum() > 0:
        x = x * rows
    return x.reshape(cols, rows)


# -- calls: helpers, lambdas, closures, modules ------------------------------------------------


def _helper_with_branch(v):
    if v.sum() > 0:
        return v * 3
    return v * -3


@case((POS,), (NEG,), ops={"cond"})
def calls_user_function(x):
    return _helper_with_branch(x) + 1


@case((POS,), (NEG,), ops={"cond"})
def calls_lambda(x):
    f = lambda v: v * 2 if v.sum() > 0 else v * 4  # noqa: E731
    return f(x)


@case((POS,), (NEG,), ops={"cond"})
def calls_closure(x):
    scale = 3

    def inner(v):
        if v.sum() > 0:
            return v * scale
        return v

    return inner(x) + inner(-x)


@case((POS,), (NEG,), ops={"cond"})
def nonlocal_counter(x):
    count = 0

    def bump(v):
        nonlocal count
        count += 1
        return v + count

    x = bump(x)
    if x.shape[0] == 3:  # Python state changes under Python conditions only
        x = bump(x)
    if x.sum() > 0:
        x = x * count
    return x, count


def _defaults(x, k=2, *rest, scale=1.0, **options):
    if x.sum() > 0:
        x = x * k * scale
    return x + len(rest) + len(options)


@case((POS,), (NEG,), ops={"cond"})
def calls_with_defaults_and_varargs(x):
    return _defaults(x) + _defaults(x, 3, 4, 5, scale=0.5, extra=1)


OFFSET = 7.0


@case((POS,), (NEG,), ops={"cond"})
def reads_global(x):
    if x.sum() > 0:
        return x + OFFSET
    return x - OFFSET


class _Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        with torch.no_grad():
            self.lin.weight.copy_(torch.eye(3))
            self.lin.bias.zero_()

    def forward(self, x):
        h = self.lin(x)
        if h.sum() > 0:
            h = F.relu(h)
        else:
            h = torch.tanh(h)
        return h


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.gates = nn.ModuleList([_Gate(), _Gate()])

    def forward(self, x, n):
        for gate in self.gates:  # unrolled: a Python ModuleList
            x = gate(x)
        i = 0
        while i < n:
            x = self.step(x)
            i += 1
        return x

    def step(self, x):
        return x * 0.5 + 1


_STACK = _Stack()


@case((POS, I(2)), (NEG, I(0)), (MIX, I(3)), ops={"cond", "while"}, close=True)
def module_with_control_flow(x, n):
    return _STACK(x, n)


@case((POS, I(3)), (POS, I(0)), (POS, I(1)), ops={"while"})
def counter_alias_is_not_mutated(x, n):
    i = 0
    last = 0
    while i < n:
        last = i
        i += 1
    return x * last


@case((POS,), (NEG,), ops={"cond"})
def inplace_update_of_tensor_alias(x):
    y = x * 1
    z = y
    if x.sum() > 0:
        y += 1
    return y, z


@case((POS,), (NEG,), ops={"cond"})
def tuple_state_in_branches(x):
    state = (x, x * 2)
    if x.sum() > 0:
        state = (state[1], state[0] + 1)
    return state[0] - state[1]


# -- combinations -----------------------------------------------------------------------------


@case((POS, I(5)), (NEG, I(5)), (MIX, I(0)), (BIG, I(2)), ops={"cond", "while"})
def loop_with_elif_break_continue_return(x, n):
    acc = x * 0
    i = 0
    while i < n:
        i += 1
        s = (acc + x).sum()
        if s > 30:
            return acc * -1
        elif s < -10:
            break
        elif i == 2:
            continue
        acc = acc + x
    return acc


@case((POS, I(3)), (NEG, I(4)), (POS, I(0)), ops={"cond", "while"})
def loop_counting_python_number(x, n):
    hits = 0
    for i in range(n):
        if (x * i).sum() > 2:
            hits = hits + 1
    return x * hits


@case((POS, I(4), I(2)), (NEG, I(4), I(9)), (POS, I(0), I(0)), ops={"cond", "while"})
def nested_loops_inner_break(x, n, stop):
    total = x * 0
    for i in range(n):
        j = 0
        while True:
            if j >= stop:
                break
            total = total + x
            j += 1
        total = total * 0.5
    return total


@case((POS,), (NEG,), (MIX,), ops={"cond"})
def deep_nesting_returns(x):
    a = x.sum()
    if a > 0:
        if x.max() > 2.5:
            if x.min() > 0.5:
                return x * 1
            return x * 2
        return x * 3
    elif x.min() < -2.5:
        return x * 4
    return x * 5


@case((POS, I(3)), (NEG, I(3)), (POS, I(0)), ops={"cond", "while"})
def annotated_names_in_branch_and_loop(x, n):
    """widedeep's `bias_log_posterior: Union[Tensor, float] = ...` in a branch."""
    if x.sum() > 0:
        term: torch.Tensor = x * 2
    else:
        term = x * 0.5
    i = 0
    while i < n:
        acc: float = term.sum()
        term = term + acc
        i += 1
    return term


@case((POS, I(3)), (NEG, I(1)), ops={"while"})
def number_accumulators_take_the_tensor_dtype(x, n):
    """yolact_edge: `loss = 0; for p in preds: loss += p.mean()` (the float
    tensor's dtype wins); `count += t` of an int tensor adds in place. (Zero
    trips keep the ints, a program of their own: tests/ops/test_number_or_tensor.py.)"""
    total = 0
    count = 0
    i = 0
    while i < n:
        total += x.mean() * i
        count += (x > 0).sum()
        i += 1
    return total, count
