"""Lists a tensor loop writes by index and whose length it keeps
(`hs[layer] = cell(x, hs[layer])`): carried item by item, each item a loop
variable of its own shape, dtype or kind, the same list object after the
loop. These were refused ("list `acc` is a tensor array ... it has no
method `__setitem__`"). A body that changes a list's length, or indexes it
by a tensor, still makes it a tensor array (the loop is traced again)."""

import copy

import pytest
import torch
from torch import nn

import d2s


def two_accumulators(x, n):
    acc = [torch.zeros(3), torch.zeros(2, dtype=torch.int64)]  # items of two shapes and dtypes
    i = 0
    while i < n:
        acc[0] = acc[0] + x
        acc[1] = acc[1] * 2 + 1
        i += 1
    return acc[0], acc[1]


def nested_and_numbers(x, n):
    st = [x.sum(), 0, [x.clone(), torch.zeros((), dtype=torch.int64)]]
    while st[0] < n:
        st[0] = st[0] + 1.5
        st[1] = st[1] + 1  # a Python int before the loop
        st[2][1] = st[2][1] + 2  # a list in the list
        st[2][0] = st[2][0] * 2
    return st


def fixed_beside_appended(x, n):
    hs = [torch.zeros(2, 4), torch.zeros(2, 4)]
    outs = []  # appended: a tensor array beside the items of `hs`
    i = 0
    while i < n:
        hs[0] = torch.tanh(x + hs[0])
        hs[1] = torch.tanh(hs[0] @ torch.ones(4, 4) + hs[1])
        outs.append(hs[1])
        i += 1
    return hs, len(outs)


def same_list_after(x, n):
    acc = [x, x * 0]
    alias_free = acc  # noqa: F841 - read only after the loop, the list object itself
    for _ in range(n):
        acc[1] = acc[1] + acc[0]
    return acc is alias_free, acc


def until_a_tensor_break(x, limit):
    acc = [x, x * 0]
    for _ in range(10):
        if acc[1].sum() > limit:
            break
        acc[1] = acc[1] + acc[0]
    return acc


def over_rows(x):
    acc = [torch.zeros(3), torch.full((3,), -1e9)]
    for row in x:
        acc[0] = acc[0] + row
        acc[1] = torch.maximum(acc[1], row)
    return acc


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _op_types(static):
    return {op.type for block in static.concrete_program.main_program.blocks for op in block.ops}


@pytest.mark.parametrize("fn, make", [
    (two_accumulators, lambda k: (torch.randn(3), torch.tensor(k))),
    (nested_and_numbers, lambda k: (torch.rand(3), torch.tensor(float(k + 1)))),
    (fixed_beside_appended, lambda k: (torch.randn(2, 4), torch.tensor(k))),
    (same_list_after, lambda k: (torch.randn(3), torch.tensor(k))),
    (until_a_tensor_break, lambda k: (torch.rand(3), torch.tensor(k * 1.5 - 0.5))),
])
def test_lists_of_fixed_length_are_carried_by_item(fn, make):
    static = d2s.declarative(fn)
    for trips in (0, 1, 4):  # zero, one and several trips, one program
        torch.manual_seed(trips)
        args = make(trips)
        assert _same(static(*args), fn(*args))
    assert len(static.program_cache) == 1
    types = _op_types(static)
    assert "while" in types
    if fn is not fixed_beside_appended:
        assert not any(t.startswith("array_") for t in types)  # items, not a tensor array


@pytest.mark.parametrize("rows", [0, 1, 5])
def test_a_loop_over_rows_writes_items(rows):
    static = d2s.declarative(over_rows)
    x = torch.randn(rows, 3)
    assert _same(static(x), over_rows(x))
    assert "while" in _op_types(static) or rows == 0


def grows(x, n):
    toks = [x]
    while len(toks) < n:  # the length changes: a tensor array
        toks.append(toks[-1] * 2)
    return torch.stack(toks)


def read_by_a_tensor_index(x, n):
    acc = [x, x * 2, x * 3]
    i = torch.tensor(0)
    s = torch.zeros_like(x)
    while i < n:
        s = s + acc[i]  # indexed by a tensor: only a tensor array can be read so
        i += 1
    return s


@pytest.mark.parametrize("fn", [grows, read_by_a_tensor_index])
def test_lists_the_body_cannot_keep_as_items_become_arrays(fn):
    static = d2s.declarative(fn)
    for k in (0, 1, 3):
        x, n = torch.randn(2), torch.tensor(k)
        assert _same(static(x, n), fn(x, n))
    assert len(static.program_cache) == 1
    assert "array_read" in _op_types(static)


class StackedDecoder(nn.Module):
    """A greedy decoder over stacked GRU cells, one hidden state per layer in a list."""

    def __init__(self):
        super().__init__()
        self.cells = nn.ModuleList([nn.GRUCell(4, 4), nn.GRUCell(4, 4)])
        self.out = nn.Linear(4, 4)

    def forward(self, x, steps):
        hs = [torch.zeros(x.shape[0], 4), torch.zeros(x.shape[0], 4)]
        total = torch.zeros(x.shape[0], 4)
        t = 0
        while t < steps:
            inp = x
            for layer, cell in enumerate(self.cells):
                hs[layer] = cell(inp, hs[layer])
                inp = hs[layer]
            x = torch.tanh(self.out(inp))
            total = total + x
            t += 1
        return total, hs[0], hs[1]


def test_a_stacked_decoder_trains_and_reloads(tmp_path):
    torch.manual_seed(0)
    eager = StackedDecoder()
    model = d2s.declarative(copy.deepcopy(eager))
    for steps in (0, 1, 3):
        x = torch.randn(2, 4)
        got, want = model(x, torch.tensor(steps)), eager(x, torch.tensor(steps))
        assert _same(list(got), list(want))
        if steps:
            sum(t.sum() for t in got).backward()
            sum(t.sum() for t in want).backward()
            for (name, p), q in zip(model.named_parameters(), eager.parameters()):
                assert torch.equal(p.grad, q.grad), name
    assert len(model.forward.program_cache) == 1
    path = str(tmp_path / "decoder")
    d2s.jit.save(model, path, input_spec=[d2s.InputSpec([None, 4]), d2s.InputSpec([], torch.int64)])
    loaded = d2s.jit.load(path)
    x = torch.randn(3, 4)
    with torch.no_grad():
        want = list(eager(x, torch.tensor(2)))
        assert _same(list(loaded(x, torch.tensor(2))), want)
        # No tensor array: the loop goes to torch.export's while_loop too.
        exported = d2s.export(path).module()
        assert _same(list(exported(x, torch.tensor(2))), want)
