"""Which objects module state shares, as eager has them (d2s/module_state.py,
d2s/output_types.py).

- A value a forward both stores on its module and returns is one object
  (`self.cache = ys; return ys`): mutating what the call returned changes
  the module's attribute, as in eager. Every tree of a program indexes one
  list of fetches, and the returned value and the state written are
  rebuilt with one memo.
- Attributes that held one tensor when the program was converted (`self.b
  = self.a`, a global the module keeps too, a list holding a parameter) are
  one variable of the program; a run where they hold different tensors
  converts again rather than read one tensor for both.
- A registered buffer the forward replaces every call is keyed by its kind
  (shape, dtype), as a plain attribute is, not by its identity.
"""

import sys

import pytest
import torch

import d2s

from test_translate_control_flow import all_op_types


class Stores(torch.nn.Module):
    """Stores the value it returns; `kind` says what it is."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.cache = None

    def forward(self, x):
        ys = [x * 2]
        if x.sum() > 0:
            ys.append(x + 1)
        if self.kind == "tuple":
            value = (ys[0], ys[-1])
        elif self.kind == "dict":
            value = {"first": ys[0], "last": ys[-1]}
        else:
            value = ys
        self.cache = value
        return value, ys


@pytest.mark.parametrize("kind", ["list", "tuple", "dict"])
def test_a_stored_value_that_is_returned_is_one_object(kind):
    eager, static = Stores(kind), Stores(kind)
    static.forward = d2s.declarative(static.forward)
    for v in (1.0, -1.0, 2.0):  # both sides of the `if`, one program
        x = torch.full((2,), v)
        for m in (eager, static):
            value, ys = m(x)
            assert value is m.cache
            if kind == "list":
                assert value is ys
                value.append(None)  # seen through the module's attribute, as eager's
                assert m.cache[-1] is None
        values = [list(m.cache.values()) if kind == "dict" else m.cache for m in (eager, static)]
        assert len(values[0]) == len(values[1])
        assert all(torch.equal(a, b) for a, b in zip(*values) if a is not None)
    # (What the module holds keys its programs: a list of one tensor or two selects another.)
    assert all("cond" in all_op_types(c.main_program) for c in static.forward.program_cache)


class StoresTwice(torch.nn.Module):
    """One list a tensor `if` appends to (a list the program makes), stored
    in two attributes."""

    def __init__(self):
        super().__init__()
        self.a = self.b = None

    def forward(self, x):
        ys = [x * 2]
        if x.sum() > 0:
            ys.append(x + 1)
        self.a = ys
        self.b = ys
        return ys


def test_a_list_stored_twice_is_one_list():
    eager, static = StoresTwice(), StoresTwice()
    static.forward = d2s.declarative(static.forward)
    for v in (1.0, -1.0):
        x = torch.full((2,), v)
        for m in (eager, static):
            out = m(x)
            assert out is m.a and m.a is m.b
        assert [t.tolist() for t in eager.a] == [t.tolist() for t in static.a]
    assert all("cond" in all_op_types(c.main_program) for c in static.forward.program_cache)


MEAN = torch.ones(2)


class Aliased(torch.nn.Module):
    """State two attributes give: `how` says which two."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.lin = torch.nn.Linear(2, 2, bias=False)
        if how == "attributes":
            self.a = torch.zeros(2)
            self.b = self.a
        elif how == "global":
            self.a = MEAN
        elif how == "parameter list":
            self.weights = [self.lin.weight]

    def forward(self, x):
        if self.how == "attributes":
            y = x + self.a * 2 + self.b * 3
            self.a = y
            self.b = y
        elif self.how == "global":
            y = x * self.a + MEAN * 2
        else:
            y = self.lin(x) + x @ self.weights[0]
        if y.sum() > 0:
            y = y * 2
        return y

    def change(self):
        """What the caller does between calls: the two stop being one tensor."""
        if self.how == "attributes":
            self.a = torch.full((2,), 10.0)
        elif self.how == "global":
            sys.modules[__name__].MEAN = torch.full((2,), 5.0)
        else:
            self.weights = [torch.ones(2, 2)]


@pytest.mark.parametrize("how", ["attributes", "global", "parameter list"])
def test_attributes_that_held_one_tensor_are_read_apart_once_they_differ(how):
    results = []
    for declarative in (False, True):
        torch.manual_seed(0)
        m = Aliased(how)
        if declarative:
            m.forward = d2s.declarative(m.forward)
        out = []
        try:
            for step in range(4):
                out.append(m(torch.ones(2) * (1 - 2 * (step == 3))))  # the last call takes the other side
                if step == 1:
                    m.change()
        finally:
            sys.modules[__name__].MEAN = torch.ones(2)
        results.append(out)
        if declarative:
            assert all("cond" in all_op_types(c.main_program) for c in m.forward.program_cache)
    for a, b in zip(*results):
        assert torch.equal(a, b)


class Carried(torch.nn.Module):
    """A buffer carried from call to call that a tuple attribute holds too."""

    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(1, 2))
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x):
        h = self.lin(x) + self.h
        if h.sum() > 0:
            h = h * 2
        self.h = h
        self.pair = (h, h + 1)
        return self.pair


def test_a_saved_model_carries_state_another_attribute_holds_too(tmp_path):
    torch.manual_seed(0)
    eager = Carried()
    torch.manual_seed(0)
    static = Carried()
    static.forward = d2s.declarative(static.forward)
    inputs = [torch.full((1, 2), v) for v in (1.0, -1.0, 2.0)]
    for x in inputs:
        a, b = eager(x), static(x)
        assert static.pair is b and static.pair[0] is static.h
        assert all(torch.equal(p, q) for p, q in zip(a, b))
    d2s.jit.save(static, str(tmp_path / "m"), input_spec=[d2s.InputSpec([1, 2])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for x in reversed(inputs):  # the saved model goes on from the state it was saved with
        a, b = eager(x), loaded(x)
        assert all(torch.equal(p, q) for p, q in zip(a, b))


class WritesApart(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.zeros(2)
        self.b = self.a

    def forward(self, x):
        y = x + self.a + self.b * 2
        if y.sum() > 0:
            y = y * 2
        self.a = y
        self.b = y + 1
        return y


def test_saving_a_program_whose_aliased_state_came_apart_asks_for_a_call(tmp_path):
    static = WritesApart()
    static.forward = d2s.declarative(static.forward)
    x = torch.ones(2)
    static(x)  # converted while `a` and `b` were one tensor; they are two now
    with pytest.raises(ValueError, match="WritesApart.a.*call the model once"):
        d2s.jit.save(static, str(tmp_path / "m"))
    eager = WritesApart()
    eager(x)
    assert torch.equal(eager(x), static(x))  # converts again, reading them apart
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert torch.equal(eager(x), loaded(x))


class BufferState(torch.nn.Module):
    """A registered buffer the forward replaces every call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(2))

    def forward(self, x):
        h = self.h * 0.5 + x
        if h.sum() > 0:
            h = h + 1
        self.h = h
        return self.h


def test_a_buffer_replaced_every_call_keeps_one_program():
    eager, static = BufferState(), BufferState()
    static.forward = d2s.declarative(static.forward)
    for step, v in enumerate((1.0, -1.0, 2.0, -3.0, 1.0)):
        x = torch.full((2,), v)
        assert torch.equal(eager(x), static(x)) and torch.equal(eager.h, static.h)
        if step == 2:  # the caller replaces it: read as eager reads it
            eager.h = torch.full((2,), 7.0)
            static.h = torch.full((2,), 7.0)
    # (Its identity, new every call, was part of the key: a program per call.)
    assert len(static.forward.program_cache) == 1
    assert "cond" in all_op_types(static.forward.concrete_program.main_program)
