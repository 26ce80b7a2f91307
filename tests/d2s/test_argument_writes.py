"""Objects passed as arguments that a declarative function changes in place
(d2s/argument_writes.py): after every run the caller's objects hold what
eager's call leaves in them: a key/value cache that starts empty and grows,
a state object a tensor `if` or `while` writes, lists, dicts, sets, deques
and OrderedDicts, new objects appended, Python values. Each case runs the
same calls eagerly and under `@declarative` on objects of its own and
compares results and objects after every call; the programs hold the
`cond`/`while` the case is about. Gradients flow through written state,
a returned argument is the caller's object, and saving refuses by name."""

import collections
import dataclasses
import inspect

import pytest
import torch

import d2s
from runtime.errors import ConversionError


class Layer:
    """Like transformers' DynamicLayer: empty until its first update."""

    def __init__(self):
        self.keys = None
        self.is_initialized = False

    def update(self, k):
        if not self.is_initialized:
            self.keys = k[:, :0]
            self.is_initialized = True
        self.keys = torch.cat([self.keys, k], 1)
        return self.keys


class KVCache:
    def __init__(self, n=2):
        self.layers = [Layer() for _ in range(n)]
        self.score = torch.zeros(())


def step(x, cache):
    total = x
    for i, layer in enumerate(cache.layers):
        keys = layer.update(x[:, None] * (i + 1))
        total = total + keys.mean(1)
    if total.sum() > 0:  # a tensor `if` writing the caller's cache on both sides
        cache.score = cache.score + total.sum()
    else:
        cache.score = cache.score - 1
    return total


def _contents(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.tolist())
    if isinstance(value, dict):
        return (type(value).__name__, [(k, _contents(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple, collections.deque)):
        return (type(value).__name__, [_contents(v) for v in value])
    if isinstance(value, set):
        return ("set", sorted(value))
    if hasattr(value, "__dict__"):
        return (type(value).__name__, _contents(vars(value)))
    return value


def _ops(static):
    programs = list(static.program_cache) or [static.concrete_program]
    return {op.type for c in programs for b in c.main_program.blocks for op in b.ops}


def test_an_empty_cache_filled_and_grown_is_the_callers_after_every_call():
    static = d2s.declarative(step)
    xs = [torch.ones(2, 3), -torch.ones(2, 3) * 4, torch.arange(6.).reshape(2, 3)]
    for sequence in range(3):
        mine, theirs = KVCache(), KVCache()
        programs = len(static.program_cache)
        for x in xs:  # both sides of the `if`; the keys grow one step a call
            got, want = static(x, mine), step(x, theirs)
            assert torch.equal(got, want)
            assert _contents(mine) == _contents(theirs)
        # The first empty cache was keyed by its identity (its program served
        # that call only); from the second on, a new empty cache of the same
        # shape is keyed by structure: the third needs no program.
        if sequence == 2:
            assert len(static.program_cache) == programs
    assert "cond" in _ops(static)


class State:
    def __init__(self, h):
        self.h = h
        self.trips = []


def roll(x, n, state):
    i = 0
    while i < n:  # a tensor loop writing the caller's state every trip
        state.h = torch.tanh(state.h + x)
        i += 1
    return state.h * 2


@pytest.mark.parametrize("trips", [0, 1, 3])
def test_a_while_loop_writes_the_callers_state(trips):
    static = d2s.declarative(roll)
    for n in (trips, 2):
        mine, theirs = State(torch.zeros(3)), State(torch.zeros(3))
        for _ in range(2):
            x, count = torch.tensor([0.5, -1.0, 2.0]), torch.tensor(n)
            assert torch.equal(static(x, count, mine), roll(x, count, theirs))
            assert torch.equal(mine.h, theirs.h)
    assert len(static.program_cache) == 1  # one program for every trip count
    assert "while" in _ops(static)


def appends(x, history, seen, log, table):
    y = x * 2
    history.append(y)
    seen.add(len(seen))
    log.append(x.sum())
    table[len(table)] = y
    table.move_to_end(0)
    return y


def test_lists_sets_deques_and_ordered_dicts_are_written():
    static = d2s.declarative(appends)
    mine = [], set(), collections.deque(maxlen=2), collections.OrderedDict()
    theirs = [], set(), collections.deque(maxlen=2), collections.OrderedDict()
    for k in range(3):
        x = torch.full((2,), float(k))
        assert torch.equal(static(x, *mine), appends(x, *theirs))
        assert _contents(mine) == _contents(theirs)


@dataclasses.dataclass
class Output:
    y: torch.Tensor
    cache: KVCache


def returns_cache(x, cache):
    cache.layers[0].update(x[:, None])
    return Output(x + 1, cache), cache


def test_a_returned_argument_is_the_callers_object():
    static = d2s.declarative(returns_cache)
    cache = KVCache()
    for _ in range(2):
        out, same = static(torch.ones(2, 3), cache)
        assert same is cache and out.cache is cache
        assert cache.layers[0].keys.shape == (2, same.layers[0].keys.shape[1], 3)


def grows(x, cache):
    cache.layers.append(Layer())
    cache.layers[-1].update(x[:, None])
    return x * 2


def test_new_objects_are_new_on_every_run():
    static = d2s.declarative(grows)
    mine, theirs = KVCache(0), KVCache(0)
    for _ in range(3):
        static(torch.ones(1, 2), mine)
        grows(torch.ones(1, 2), theirs)
    assert _contents(mine) == _contents(theirs)
    assert len({id(layer) for layer in mine.layers}) == 3


class Cell(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, state):
        state.h = torch.tanh(self.lin(x) + state.h)
        if state.h.sum() > 0:
            state.h = state.h * 2
        return state.h.sum()


def test_gradients_flow_through_the_written_state():
    torch.manual_seed(0)
    eager = Cell()
    model = d2s.declarative(Cell())
    model.load_state_dict(eager.state_dict())
    grads = []
    for m in (eager, model):
        state = State(torch.zeros(3))
        loss = sum(m(x, state) for x in (torch.ones(3), -torch.ones(3) * 3, torch.ones(3)))
        loss.backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def counts(x, o):
    o.calls += 1  # a Python value read and written: every call's own
    return x + o.calls


class Calls:
    def __init__(self):
        self.calls = 0
        self.h = torch.zeros(2)


def test_python_values_follow_every_call():
    static = d2s.declarative(counts)
    mine, theirs = Calls(), Calls()
    for _ in range(3):
        assert torch.equal(static(torch.ones(2), mine), counts(torch.ones(2), theirs))
    assert mine.calls == theirs.calls == 3


@pytest.mark.parametrize("save", ["jit", "onnx"])
def test_saving_a_program_that_writes_its_arguments_is_refused(tmp_path, save):
    static = d2s.declarative(step)
    static(torch.ones(2, 3), KVCache())
    with pytest.raises(ValueError, match="changes its argument `cache") as caught:
        if save == "jit":
            d2s.jit.save(static, str(tmp_path / "m"))
        else:
            d2s.onnx.export(static, str(tmp_path / "m.onnx"))
    assert f'File "{__file__}", line {_line_of(step, "cache.score = cache.score + total.sum()")}' in str(caught.value)


def _line_of(fn, text):
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


class Deep:
    def __init__(self, depth):
        self.t = torch.zeros(2)
        self.inner = Deep(depth - 1) if depth else None


def writes_deep(x, o):
    o.inner.inner.inner.inner.inner.inner.inner.t = x * 2  # deeper than d2s follows
    return x + 1


def test_a_write_too_deep_to_follow_is_refused_at_its_line():
    with pytest.raises(ConversionError, match="changes its argument `o.inner") as caught:
        d2s.declarative(writes_deep)(torch.ones(2), Deep(9))
    assert (caught.value.filename, caught.value.lineno) == (__file__, _line_of(writes_deep, "deeper than d2s"))


class TwoLists:
    def __init__(self):
        self.a, self.b = [], []
        self.t = torch.zeros(2)


def appends_one_item_twice(x, lists):
    item = [x * 3]  # a new object: one object in both lists, and the one returned
    lists.a.append(item)
    lists.b.append(item)
    if x.sum() > 0:
        lists.t = lists.t + x
    return item


def test_a_new_object_written_into_two_places_is_one_object():
    static = d2s.declarative(appends_one_item_twice)
    for x in (torch.ones(2), -torch.ones(2), torch.ones(2)):
        mine, theirs = TwoLists(), TwoLists()
        got, want = static(x, mine), appends_one_item_twice(x, theirs)
        for lists, returned in ((mine, got), (theirs, want)):
            assert lists.a[0] is lists.b[0] is returned
        assert torch.equal(mine.a[0][0], theirs.a[0][0]) and torch.equal(mine.t, theirs.t)
    assert "cond" in {op.type for op in static.concrete_program.main_program.global_block().ops}
