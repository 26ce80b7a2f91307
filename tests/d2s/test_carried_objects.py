"""User objects that a tensor loop or `if` rebinds (issue 22, part 4): a
loop body that makes a new output object every trip (`out = model(x)`
returning a dataclass or ModelOutput), a functional cache that returns a
new cache object with longer tensors, named tuples, classes registered with
torch.utils._pytree, objects nested in objects. Each is carried by the
`while` / `cond` op as its parts (its class and structure stay; its tensors
may grow) and comes back as the user's type holding the run's tensors. An
object the body changes in place stays the same object (its attributes are
carried: d2s/operators/effects.py). Every path, one program."""

import collections
import dataclasses

import pytest
import torch
import torch.utils._pytree as pytree

import d2s
from runtime.errors import ConversionError
from runtime.ir import Variable


@dataclasses.dataclass
class State:
    h: torch.Tensor
    label: str = "state"


class FunctionalCache:
    """A cache whose update returns a new cache (new lists, longer tensors)."""

    def __init__(self, keys, values):
        self.keys, self.values = keys, values

    def grown(self, k, v):
        return FunctionalCache([torch.cat([a, k], 0) for a in self.keys], [torch.cat([a, v], 0) for a in self.values])


Pair = collections.namedtuple("Pair", "first second")


class Registered:
    def __init__(self, a, b):
        self.a, self.b = a, b


pytree.register_pytree_node(Registered, lambda r: ([r.a, r.b], None), lambda values, _: Registered(*values))


@dataclasses.dataclass
class Outer:
    inner: State
    scale: torch.Tensor


def rebinds_a_dataclass(x, steps):
    s = State(x)
    i = 0
    while i < steps:
        s = State(torch.tanh(s.h + 1), s.label)
        i += 1
    return s


def grows_a_functional_cache(x, steps):
    cache = FunctionalCache([x, x * 2], [x + 1, x - 1])
    i = 0
    while i < steps:
        cache = cache.grown(x[:1] + i, x[:1] * i)
        i += 1
    return cache


def rebinds_a_named_tuple(x, steps):
    p = Pair(x, x * 2)
    i = 0
    while i < steps:
        p = Pair(p.first + p.second, p.second * 0.5)
        i += 1
    return p


def rebinds_a_registered_class(x, steps):
    r = Registered(x, x + 1)
    i = 0
    while i < steps:
        r = Registered(r.b, r.a * r.b)
        i += 1
    return r.a + r.b, r


def rebinds_nested_objects(x, steps):
    o = Outer(State(x), x.sum())
    i = 0
    while i < steps:
        o = Outer(State(o.inner.h * o.scale), o.scale * 0.5)
        i += 1
    return o


def breaks_out_with_an_object(x, steps):
    # The statements after the `break` run under a `cond` on the break flag:
    # `s` is a new object on one side and the loop's on the other.
    s = State(x)
    i = 0
    while i < steps:
        i += 1
        if s.h.sum() > 40:
            break
        s = State(s.h * 2)
    return s


def picks_an_object(x, label):
    s = State(x)
    if x.sum() > 0:
        s = State(x * 3, label)
    return s


def changes_an_object_in_place(x, steps):
    s = State(x)
    alias = s
    i = 0
    while i < steps:
        s.h = s.h * 2 + 1
        i += 1
    return s, alias.h


CASES = [rebinds_a_dataclass, grows_a_functional_cache, rebinds_a_named_tuple, rebinds_a_registered_class,
         rebinds_nested_objects, breaks_out_with_an_object, changes_an_object_in_place]


def _leaves(value):
    """Tensors (and graph values) reachable from `value`, in order."""
    if isinstance(value, (torch.Tensor, Variable)):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _leaves(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _leaves(v)]
    if hasattr(value, "__dict__"):
        return [t for v in vars(value).values() for t in _leaves(v)]
    return []


def _same(got, want):
    assert type(got) is type(want)
    a, b = _leaves(got), _leaves(want)
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert type(x) is torch.Tensor
        assert x.shape == y.shape and torch.equal(x, y)


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_every_trip_count_one_program(fn):
    static = d2s.declarative(fn, input_spec=[d2s.InputSpec([3]), d2s.InputSpec([], "int64")])
    for x in (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-1.0, 0.5, 2.0])):
        for steps in (0, 1, 4):
            _same(static(x, torch.tensor(steps)), fn(x, torch.tensor(steps)))
    assert len(static.program_cache) == 1
    assert "while" in [op.type for op in static.concrete_program.main_program.global_block().ops]


@pytest.mark.parametrize("label, programs", [("state", 1), ("positive", 2)])
def test_an_object_of_one_side_of_a_tensor_if(label, programs):
    # The same label on both sides: one `cond` merges the objects' tensors.
    # Labels that differ cannot be one program's value: a program per side
    # (d2s/decisions.py), each giving that side's object.
    static = d2s.declarative(picks_an_object, input_spec=[d2s.InputSpec([3])])
    for x in (torch.ones(3), -torch.ones(3), 2 * torch.ones(3)):
        got, want = static(x, label), picks_an_object(x, label)
        _same(got, want)
        assert got.label == want.label
    assert len(static.program_cache) == programs
    assert "cond" in [op.type for op in static.concrete_program.main_program.global_block().ops]


def test_an_object_changed_in_place_stays_one_object():
    # The loop writes `s.h`; `alias` is the same object, so it sees the writes.
    static = d2s.declarative(changes_an_object_in_place)
    s, seen = static(torch.ones(3), torch.tensor(3))
    assert torch.equal(s.h, torch.full((3,), 15.0)) and torch.equal(seen, s.h)


def test_a_saved_loop_gives_the_objects_back(tmp_path):
    static = d2s.declarative(rebinds_nested_objects)
    d2s.jit.save(static, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None]), d2s.InputSpec([], "int64")])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for n, steps in [(3, 0), (5, 2)]:
        x = torch.arange(1.0, n + 1)
        _same(loaded(x, torch.tensor(steps)), rebinds_nested_objects(x, torch.tensor(steps)))


class Grows:
    def __init__(self, h):
        self.h = h


def adds_an_attribute(x, steps):
    g = Grows(x)
    i = 0
    while i < steps:
        g = Grows(g.h + 1)
        g.extra = i
        i += 1
    return g.h


def changes_the_class(x, steps):
    s = State(x)
    i = 0
    while i < steps:
        s = Pair(s, i)
        i += 1
    return s


@pytest.mark.parametrize("fn, message", [
    (adds_an_attribute, r"loop variable 'g' is a Grows object with attributes \['h'\] before the loop but a "
                        r"Grows object with attributes \['h', 'extra'\] after one iteration"),
    (changes_the_class, r"loop variable 's' is a Python State that the loop body changes"),
])
def test_a_structure_the_loop_changes_is_refused_by_name(fn, message):
    with pytest.raises(ConversionError, match=message) as err:
        d2s.declarative(fn)(torch.ones(2), torch.tensor(2))
    assert err.value.filename == __file__


def picks_one_of_two(x):
    p, q = State(x), State(-x)
    if x.sum() > 0:
        s = p
    else:
        s = q
    s.h = s.h + 1  # eager changes p or q: a rebuilt `s` would change neither
    return p.h, q.h


def keeps_the_first_output(x, steps):
    out = State(x)
    first = out
    i = 0
    while i < steps:
        out = State(out.h * 2)
        i += 1
    out.h = out.h + 1  # after zero trips eager changes `first` too
    return first.h


def keeps_it_in_a_list(x):
    states = [State(x), State(-x)]
    s = State(x * 2)
    if x.sum() > 0:
        s = states[0]
    s.h = s.h + 1
    return states[0].h


@pytest.mark.parametrize("fn", [picks_one_of_two, keeps_it_in_a_list])
def test_an_object_another_name_holds_stays_that_object(fn):
    # Not taken apart: a program per side of the `if`, each binding the object itself.
    static = d2s.declarative(fn, input_spec=[d2s.InputSpec([2])])
    for x in (torch.ones(2), -torch.ones(2), torch.ones(2)):
        got, want = static(x), fn(x)
        assert all(torch.equal(a, b) for a, b in zip(got, want)) if isinstance(want, tuple) else torch.equal(got, want)
    assert len(static.program_cache) == 2


def test_a_loop_start_another_name_holds_is_refused_by_name():
    with pytest.raises(ConversionError, match="'first' is another name for the object 'out'") as err:
        d2s.declarative(keeps_the_first_output)(torch.ones(2), torch.tensor(2))
    assert err.value.filename == __file__


def rebinds_where_the_other_side_raises(x):
    s = State(x)
    if x.sum() > 0:
        s = State(x * 2)
    else:
        raise ValueError("negative")
    return s.h + 1


def test_an_object_made_on_the_only_side_that_falls_through():
    # The other side raises on every path: the object leaves the `if` as the
    # op's outputs (it held a value of its side's block, an invalid program).
    static = d2s.declarative(rebinds_where_the_other_side_raises)
    assert torch.equal(static(torch.ones(2)), torch.full((2,), 3.0))
    with pytest.raises(ValueError, match="negative"):
        static(-torch.ones(2))
    assert len(static.program_cache) == 1
