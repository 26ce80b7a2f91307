"""Python semantics on tensors: each function reproduces one class of defect
the translator had (issue 8), in the form of cf_cases.py: argument tuples of
the same shapes that take different paths, and the graph ops the one
program built from the first of them must hold.
"""

import torch

from cf_cases import I, NEG, POS, T

CASES = []


def case(*arg_sets, ops=(), no=()):
    def register(fn):
        CASES.append((fn, [tuple(a) for a in arg_sets], set(ops), set(no)))
        return fn
    return register


LABEL = T(10.0, 20.0, 30.0)

# -- `.add` / `.sort` on a module are not mutations of a local list ------------------------


@case((POS, LABEL), (NEG, LABEL))
def torch_add_under_python_if(x, label):
    if label is not None:
        x = torch.add(x, label)
    return x


@case((POS,), (NEG,))
def torch_sort_in_unrolled_for(x):
    for _ in range(3):
        x, _indices = torch.sort(x, descending=True)
        x = x - 1
    return x


@case((POS,), (NEG,), ops={"cond"})
def torch_add_and_sort_under_tensor_if(x):
    if x.sum() > 0:
        x = torch.add(x, 1)
    else:
        x, _indices = torch.sort(x)
    return x


@case((POS,), (NEG,), ops={"while"})
def torch_add_in_tensor_while(x):
    while x.sum() < 20:
        x = torch.add(x, 1)
    return x


@case((POS, I(3)), (NEG, I(0)), ops={"while"})
def torch_sort_in_tensor_for(x, n):
    for _ in range(n):
        x, _indices = torch.sort(x * -1)
    return x


@case((POS,), (NEG,), ops={"cond"})
def inplace_add_under_tensor_if(x):
    y = x.clone()
    if x.sum() > 0:
        y.add_(1)
    return y


@case((POS,), (NEG,), ops={"while"})
def inplace_add_in_tensor_while(x):
    y = x.clone()
    while y.sum() < 20:
        y.add_(1)
    return y


@case((POS,), (NEG,))
def inplace_add_in_unrolled_for(x):
    y = x.clone()
    for _ in range(3):
        y.add_(torch.add(x, 1))
    return y


# -- augmented assignment and iteration: in place, on views, as in eager -----------------


@case((POS,), (NEG,))
def augassign_on_0d_view_changes_the_base(x):
    v = x.clone()
    s = v[1]
    s += x.sum()
    return v, s


@case((POS,), (NEG,))
def augassign_on_0d_tensor_changes_aliases(x):
    t = x.sum()
    same = t
    t += 1.0
    return same, t


@case((POS, I(3)), (NEG, I(0)), ops={"while"})
def augassign_on_loop_counter_leaves_copies_alone(x, n):
    i = 0
    last = 0
    while i < n:
        last = i
        i += 1
    return last, i


@case((POS.reshape(3, 1),), (NEG.reshape(3, 1),), ops={"while"})
def rows_are_views(y):
    y = y.clone()
    for row in y:
        row *= 2.0
    return y


@case((POS,), (NEG,), ops={"while"})
def rows_see_updates_of_the_tensor(x):
    s = torch.zeros(())
    for e in x:
        x += 1.0
        s = s + e
    return s, x


@case((POS,), (NEG,), ops={"cond"})
def item_is_a_python_number(x):
    s = x.sum().item()
    if isinstance(s, float) and not isinstance(s, torch.Tensor):
        s += 1
    if s > 0:
        x = x * s
    return x


@case((POS,), (NEG,), ops={"cond"})
def int_of_tensor_is_an_int(x):
    n = int(x.sum())
    same = n
    n += 1
    if isinstance(n, int) and n > 0:
        x = x + same
    return x
