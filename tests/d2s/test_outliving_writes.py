"""Python objects that outlive a declarative call (globals and closure
cells its code reads) written while it was traced (issue 21,
d2s/python_writes.py). A program never replays Python, so such a write
would happen once, at build time, and never again: each is refused at the
line of the write, naming the object as the user wrote it, and every
object is left as it was before the trace. Reading such objects, or writing
objects the function makes itself, still converts. The arguments' own
objects are written after each run as eager writes them: the same writes
are checked against eager at the end of this file and in
test_argument_writes.py."""

import collections

import pytest
import torch

import d2s
from runtime.errors import ConversionError


class Counter:
    def __init__(self):
        self.count = 0
        self.inner = Counter.Inner()

    class Inner:
        def __init__(self):
            self.seen = []


COUNTS = {"calls": 0}
HISTORY = []


def attr_counter(x, o):
    o.count += 1  # line: attr_counter
    return x + 1


def nested_attr_append(x, o):
    o.inner.seen.append(x.shape[0])  # line: nested_attr_append
    return x * 2


def dict_item(x, d):
    d["n"] = d["n"] + 1  # line: dict_item
    return x - 1


def dict_tensor_item(x, state):
    state["h"] = state["h"] + x  # line: dict_tensor_item
    return state["h"] * 2


def list_append(x, lst):
    lst.append(1)  # line: list_append
    return x + 1


def global_counter(x, unused):
    COUNTS["calls"] += 1  # line: global_counter
    return x + 1


def _bump():
    HISTORY.append("called")  # line: _bump


def global_in_helper(x, unused):
    _bump()
    return x + 1


def make_closure_counter():
    box = [0]

    def closure_counter(x, unused):
        box[0] += 1  # line: closure_counter
        return x + 1
    return closure_counter, box


def _line(marker):
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# line: {marker}"))


@pytest.mark.parametrize("fn, make, name", [
    (global_counter, lambda: None, "`COUNTS['calls']`"),
    (global_in_helper, lambda: None, "`HISTORY`"),
])
def test_a_write_that_outlives_the_call_is_refused_at_its_line(fn, make, name):
    obj = make()
    before = repr(vars(obj) if hasattr(obj, "__dict__") else obj), dict(COUNTS), list(HISTORY)
    with pytest.raises(ConversionError) as info:
        d2s.declarative(fn)(torch.ones(3), obj)
    marker = "_bump" if fn is global_in_helper else fn.__name__
    assert info.value.filename == __file__ and info.value.lineno == _line(marker)
    assert name in str(info.value)
    # Nothing the refused trace wrote stays behind.
    assert (repr(vars(obj) if hasattr(obj, "__dict__") else obj), dict(COUNTS), list(HISTORY)) == before


SEEN, RECENT, ORDER = set(), collections.deque(maxlen=4), collections.OrderedDict()


def set_add(x, unused):
    SEEN.add(len(SEEN))  # line: set_add
    return x + 1


def deque_append(x, unused):
    RECENT.append(x.shape[0])  # line: deque_append
    return x + 1


def ordered_move(x, unused):
    ORDER.move_to_end("a")  # line: ordered_move
    return x + 1


@pytest.mark.parametrize("fn, name", [(set_add, "`SEEN`"), (deque_append, "`RECENT`"),
                                      (ordered_move, "`ORDER`")])
def test_sets_deques_and_ordered_dicts_written_are_refused(fn, name):
    # Containers besides lists and dicts: their writes went unseen (silently
    # made once, at build time).
    SEEN.clear(), RECENT.clear(), ORDER.clear()
    ORDER.update(a=1, b=2)
    with pytest.raises(ConversionError) as info:
        d2s.declarative(fn)(torch.ones(3), None)
    assert info.value.lineno == _line(fn.__name__) and name in str(info.value)
    assert (SEEN, list(RECENT), list(ORDER)) == (set(), [], ["a", "b"])


def test_a_closure_cell_written_is_refused_and_restored():
    fn, box = make_closure_counter()
    with pytest.raises(ConversionError, match="`box` of an enclosing function") as info:
        d2s.declarative(fn)(torch.ones(3), None)
    assert info.value.lineno == _line("closure_counter")
    assert box == [0]


def reads_only(x, o, d):
    if o.count > 0 and d["n"] > 0:
        return x + o.count + COUNTS["calls"]
    return x - len(HISTORY)


def writes_its_own(x, o, d):
    mine = {"n": d["n"]}
    box = Counter()
    # A tensor from the start: `0` would be a number on the paths where no
    # row is positive (eager gives back `0`), a tensor elsewhere, which d2s refuses.
    box.count = x.new_zeros(())
    for row in x:
        if row.sum() > 0:
            box.count = box.count + row.sum()
            mine["n"] = mine["n"] + 1
    return box.count, mine["n"]


@pytest.mark.parametrize("count", [0, 1])
def test_reading_outer_objects_and_writing_its_own_objects_converts(count):
    o, d = Counter(), {"n": count}
    o.count = count
    assert torch.equal(d2s.declarative(reads_only)(torch.ones(3), o, d), reads_only(torch.ones(3), o, d))
    static = d2s.declarative(writes_its_own)
    for x in (torch.tensor([[1.0, 2.0], [-3.0, 1.0]]), torch.zeros(0, 2), torch.ones(3, 2)):
        got, want = static(x, o, d), writes_its_own(x, o, d)
        assert [float(v) for v in got] == [float(v) for v in want]
    assert vars(o)["count"] == count and d == {"n": count}


class CountsCalls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.sizes = []
        self.hidden = None

    @d2s.declarative
    def forward(self, x):
        self.calls += 1  # line: CountsCalls
        return x + 1


class KeepsSizes(CountsCalls):
    @d2s.declarative
    def forward(self, x):
        self.sizes.append(x.shape[0])  # line: KeepsSizes
        return x + 1


class KeepsHidden(CountsCalls):
    @d2s.declarative
    def forward(self, x):
        # A tensor kept on the module is carried across calls (d2s/module_state.py).
        self.hidden = x * 2 if self.hidden is None else self.hidden + x
        return self.hidden


# (`self.calls += 1`, a plain value, is replayed after each run: test_module_attr_writes.py.)
@pytest.mark.parametrize("cls, name", [(KeepsSizes, "`self.sizes`")])
def test_a_python_list_on_a_module_written_is_refused_at_its_line(cls, name):
    model = cls()
    with pytest.raises(ConversionError) as info:
        model(torch.ones(3))
    assert name in str(info.value) and "reached from the module `self`" in str(info.value)
    assert info.value.lineno == _line(cls.__name__)
    assert model.calls == 0 and model.sizes == []


def test_a_tensor_kept_on_a_module_is_still_carried():
    model, eager = KeepsHidden(), KeepsHidden()
    for _ in range(3):
        assert torch.equal(model(torch.ones(3)), KeepsHidden.forward.__d2s_unwrap__()(eager, torch.ones(3)))


# -- iterators that outlive the call: a draw is a change no walk of contents sees ---------------

BATCHES = iter([1.0, 2.0, 3.0])
STEPS = [iter(range(5))]


class Drawing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.draws = (n for n in range(5))

    def forward(self, x, where):
        if where == "module":
            return x * next(self.draws)
        if where == "global":
            return x * next(BATCHES)
        if where == "in a global list":
            return x * next(STEPS[0])
        # The function's own iterators are its own: a fresh one on every call.
        return x * next(self.parameters()).sum() + next(iter([x.sum()]))


@pytest.mark.parametrize("where", ["module", "global", "in a global list"])
def test_next_on_an_iterator_that_outlives_the_call_is_refused(where):
    model = d2s.declarative(Drawing())
    with pytest.raises(ConversionError, match="outlives the call") as info:
        model(torch.ones(2), where)
    assert info.value.filename == __file__


class Looping(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.draws = (n for n in range(5))

    def forward(self, x, where):
        if where == "a for over a global":
            for b in BATCHES:
                x = x * b
        elif where == "a for over a module's generator":
            for n in self.draws:
                x = x + n
        elif where == "a for over a global list's item":
            for n in STEPS[0]:
                x = x + n
        elif where == "list()":
            x = x * len(list(BATCHES))
        elif where == "zip()":
            for i, b in zip(range(2), BATCHES):
                x = x + b
        elif where == "sum() of a generator":
            x = x + sum(self.draws)
        else:  # the function's own iterators, and a global list (not an iterator)
            for p in self.parameters():
                x = x + p.sum()
            for i, n in zip(range(2), iter(SIZES)):
                x = x * n
        if x.sum() > 0:  # a tensor `if` after the loop: both sides
            x = x + 1
        return x


SIZES = [1.0, 2.0, 3.0]


@pytest.mark.parametrize("where", ["a for over a global", "a for over a module's generator",
                                   "a for over a global list's item"])
def test_a_for_loop_over_an_iterator_that_outlives_the_call_is_refused_at_its_line(where):
    model = d2s.declarative(Looping())
    with pytest.raises(ConversionError, match="this loop draws from `.*`, a .* that outlives the call") as info:
        model(torch.ones(2), where)
    assert info.value.filename == __file__


@pytest.mark.parametrize("where", ["list()", "zip()", "sum() of a generator"])
def test_any_other_draw_from_an_iterator_that_outlives_the_call_is_refused(where, monkeypatch):
    monkeypatch.setitem(globals(), "BATCHES", iter([1.0, 2.0, 3.0]))  # a draw cannot be undone: one per test
    model = d2s.declarative(Looping())
    with pytest.raises(ConversionError, match=r"`Looping.forward` draws from `(BATCHES|self.draws)`") as info:
        model(torch.ones(2), where)
    assert info.value.filename == __file__


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_for_loops_over_the_functions_own_iterators_convert(sign):
    eager, static = Looping(), d2s.declarative(Looping())
    static.load_state_dict(eager.state_dict())
    x = sign * torch.ones(2) * 10
    assert torch.equal(static(x, "own"), eager(x, "own"))
    program = static.forward.get_concrete_program(x, "own").main_program
    assert "cond" in {op.type for block in program.blocks for op in block.ops}


def test_next_on_the_functions_own_iterators_converts():
    eager, static = Drawing(), d2s.declarative(Drawing())
    static.load_state_dict(eager.state_dict())
    for x in (torch.ones(2), -torch.ones(2)):
        assert torch.equal(static(x, "own"), eager(x, "own"))


# -- helpers the walk before the trace does not reach: watched from their first call ---------

LOG = []
MEMO = {}


class Registry:
    seen = []  # a class attribute filled through the class


def _logs(x):
    LOG.append("called")  # eager appends on every call; a program would have appended once
    return x * 2


def _registers(x):
    Registry.seen.append(1)
    return x * 2


def _memoizes(x):
    n = x.shape[0]
    if n not in MEMO:
        MEMO[n] = torch.ones(n) * 3  # a graph value left in the user's dict after a refusal, before
    return x * MEMO[n]


class Tool:
    def __init__(self, fn):
        self.fn = fn


def _through_a_tool(x, tool):
    y = tool.fn(x)  # the helper is reached through an argument, not named by the code
    if y.sum() > 0:
        y = y + 1
    return y


TICKS = iter(range(100))


def _draws_with_next(x):
    return x * next(TICKS)  # a global iterator of a helper reached through an object


def _draws_with_list(x):
    return x * sum(list(zip(range(2), TICKS))[0])


@pytest.mark.parametrize("helper", [_draws_with_next, _draws_with_list])
def test_a_draw_by_a_helper_reached_through_an_object_is_refused(helper):
    # The program would hold what the trace drew and repeat it on every run.
    static = d2s.declarative(_through_a_tool)
    with pytest.raises(ConversionError, match="TICKS"):
        static(torch.ones(3), Tool(helper))


@pytest.mark.parametrize("helper, written", [(_logs, "LOG"), (_registers, "Registry.seen"), (_memoizes, "MEMO")])
def test_a_write_by_a_helper_reached_through_an_object_is_refused_and_undone(helper, written):
    static = d2s.declarative(_through_a_tool)
    with pytest.raises(ConversionError) as info:
        static(torch.ones(3), Tool(helper))
    assert info.value.filename == __file__
    assert written.split(".")[0] in str(info.value)
    assert LOG == [] and Registry.seen == [] and MEMO == {}  # as before the call


@pytest.mark.parametrize("fn, make", [
    (attr_counter, Counter),
    (nested_attr_append, Counter),
    (dict_item, lambda: {"n": 0}),
    (dict_tensor_item, lambda: {"h": torch.zeros(3)}),
    (list_append, list),
])
def test_the_arguments_objects_are_written_as_eager_writes_them(fn, make):
    # Once refused here; now every run leaves the caller's object as eager's
    # call does (d2s/argument_writes.py), call after call.
    static = d2s.declarative(fn)
    mine, theirs = make(), make()
    for _ in range(3):
        got, want = static(torch.ones(3), mine), fn(torch.ones(3), theirs)
        assert torch.equal(got, want)
        assert _contents(mine) == _contents(theirs)


def _contents(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.tolist())
    if isinstance(value, dict):
        return {k: _contents(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_contents(v) for v in value]
    if hasattr(value, "__dict__"):
        return (type(value).__name__, _contents(vars(value)))
    return value
