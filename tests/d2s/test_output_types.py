"""Returned values keep the user's own types (DESIGN: "Inputs and outputs are
pytrees of the user's own types") and hold each run's tensors, never the
trace's Variables (issue 22, classes 1 and 3): dataclasses, dict
subclasses, named tuples, classes registered with torch.utils._pytree, and
plain objects such as a key/value cache; from memory and from a saved model,
and as plain data in a process that lacks the defining module."""

import collections
import dataclasses
import json
import os
import subprocess
import sys
from typing import Optional

import pytest
import torch
import torch.utils._pytree as pytree

import d2s
from runtime.errors import ConversionError, ModelFormatError
from runtime.ir import Variable


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    hidden: Optional[torch.Tensor] = None
    label: str = "out"


class Record(collections.OrderedDict):
    """A dict subclass as transformers' ModelOutput is (without its registration)."""


class Registered:
    """A class its package registers with torch.utils._pytree."""

    def __init__(self, a, b):
        self.a, self.b = a, b


pytree.register_pytree_node(Registered, lambda r: ([r.a, r.b], ["a", "b"]),
                            lambda values, keys: Registered(*values))


class Layer:
    def __init__(self, keys, values):
        self.keys, self.values = keys, values


class Cache:
    """Like transformers' DynamicCache: a plain object holding layer objects."""

    def __init__(self):
        self.layers = []
        self.device = torch.device("cpu")

    def update(self, k, v):
        self.layers.append(Layer(k, v))


Pair = collections.namedtuple("Pair", "first second")


def _make(kind, y, z):
    if kind == "dataclass":
        return Output(y, z)
    if kind == "dict_subclass":
        r = Record()
        r["y"], r["z"] = y, z
        return r
    if kind == "registered":
        return Registered(y, [z, 3])
    if kind == "cache":
        c = Cache()
        c.update(y, z)
        c.update(z, y)
        return c
    return Pair(y, {"z": z})


def _tensors(value):
    """The tensors and graph values reachable from `value`, in order."""
    if isinstance(value, (torch.Tensor, Variable)):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if hasattr(value, "__dict__"):
        return [t for v in vars(value).values() for t in _tensors(v)]
    return []


def _same(a, b):
    assert type(a) is type(b)
    ta, tb = _tensors(a), _tensors(b)
    assert len(ta) == len(tb) > 0
    for x, y in zip(ta, tb):
        assert type(x) is torch.Tensor and type(y) is torch.Tensor
        assert torch.equal(x, y)


KINDS = ["dataclass", "dict_subclass", "registered", "cache", "namedtuple"]


def branchy(x, kind):
    if x.sum() > 0:  # a tensor condition: both paths in one program
        y = x * 2
    else:
        y = x - 1
    return _make(kind, y, x + 1)


@pytest.mark.parametrize("kind", KINDS)
def test_returned_types_hold_the_runs_tensors(kind):
    static = d2s.declarative(branchy)
    for x in (torch.ones(3), -torch.ones(3), torch.arange(3.0)):
        _same(static(x, kind), branchy(x, kind))
    assert len(static.program_cache) == 1
    assert "cond" in [op.type for op in static.concrete_program.main_program.global_block().ops]


def test_a_transformers_style_model_output_attribute_access():
    static = d2s.declarative(branchy)
    out = static(torch.ones(2), "dataclass")
    assert torch.equal(out.logits, torch.full((2,), 2.0)) and out.label == "out"
    cache = static(torch.ones(2), "cache")
    assert torch.equal(cache.layers[1].values, torch.full((2,), 2.0)) and cache.device == torch.device("cpu")


class Slotted:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def test_an_object_that_cannot_be_rebuilt_is_refused_by_name():
    @d2s.declarative
    def f(x):
        return Slotted(x * 2)

    with pytest.raises(ConversionError, match="inside a Slotted"):
        f(torch.ones(2))


class Model(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        return branchy(x, self.kind)


@pytest.mark.parametrize("kind", ["dataclass", "dict_subclass", "registered", "cache"])
def test_saved_model_returns_the_types_where_they_are_loaded(tmp_path, kind):
    model = Model(kind)
    d2s.jit.save(model, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for x in (torch.ones(3), -torch.ones(4)):
        _same(loaded(x), model(x))


PLAIN = {
    # What each kind is in a process that lacks this test module (docs/deployment.md).
    "dataclass": ("dict", ["logits", "hidden", "label"]),
    "dict_subclass": ("dict", ["y", "z"]),
    "registered": ("dict", ["a", "b"]),
    "cache": ("dict", ["layers", "device"]),
}


@pytest.mark.parametrize("kind", sorted(PLAIN))
def test_saved_model_gives_plain_data_without_the_defining_module(tmp_path, kind):
    d2s.jit.save(Model(kind), str(tmp_path / "m"), input_spec=[d2s.InputSpec([None])])
    script = (
        "import sys, json, torch, d2s\n"
        "out = d2s.jit.load(sys.argv[1])(-torch.ones(3))\n"
        "assert 'tests' not in ' '.join(sys.modules)\n"
        "print(json.dumps([type(out).__name__, list(out) if isinstance(out, dict) else None,"
        " type(out['layers'][0]).__name__ if 'layers' in out else None]))\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "m")], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=root), cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    kind_name, keys, layer = json.loads(result.stdout.strip().splitlines()[-1])
    assert [kind_name, keys] == list(PLAIN[kind])
    assert layer == ("dict" if kind == "cache" else None)


def _with_outputs(directory, outputs):
    path = os.path.join(directory, "program.json")
    with open(path) as f:
        doc = json.load(f)
    assert "outputs" in doc
    doc["outputs"] = outputs
    with open(path, "w") as f:
        json.dump(doc, f)


def _object(name, attrs):
    return {"object": name, "attrs": attrs, "items": None, "complete": True}


@pytest.mark.parametrize("name", [
    "subprocess.Popen",  # imported, but has __del__: never made from a file
    "os.system",         # not a class
    "collections.abc.Callable",
    "no_such_module.Cls",
])
def test_a_loaded_type_name_outside_the_rules_gives_plain_data(tmp_path, name):
    import subprocess  # noqa: F401 - imported, as in a process that uses it
    d2s.jit.save(Model("dataclass"), str(tmp_path / "m"), input_spec=[d2s.InputSpec([None])])
    _with_outputs(tmp_path / "m", _object(name, [["args", {"fetch": 0}]]))
    out = d2s.jit.load(str(tmp_path / "m"))(torch.ones(2))
    assert type(out) is dict and list(out) == ["args"] and type(out["args"]) is torch.Tensor


@pytest.mark.parametrize("node", [
    _object("not a name!", []),
    _object("x.Y", [["a"]]),
    {"pytree": "x.Y", "keys": ["a"], "items": []},
    {"object": "x.Y", "attrs": [], "items": None},
    {"device": 3},
])
def test_a_malformed_output_node_is_refused_at_load(tmp_path, node):
    d2s.jit.save(Model("dataclass"), str(tmp_path / "m"), input_spec=[d2s.InputSpec([None])])
    _with_outputs(tmp_path / "m", node)
    with pytest.raises(ModelFormatError):
        d2s.jit.load(str(tmp_path / "m"))


# -- the same types as arguments ---------------------------------------------------------

def reads(x, value):
    if x.sum() > 0:
        y = x * 2
    else:
        y = x - 1
    return y + _tensors(value)[0], type(value).__name__


@pytest.mark.parametrize("kind", KINDS)
def test_arguments_of_user_types_are_fed_not_frozen(kind):
    # Their tensors are feeds: a new object or new tensors in the same object
    # give that call's values (they were constants of the first program).
    static = d2s.declarative(reads)
    value = _make(kind, torch.ones(3), torch.zeros(3))
    for x in (torch.ones(3), -torch.ones(3)):
        for scale in (1.0, 5.0):
            value = _make(kind, torch.full((3,), scale), torch.zeros(3))
            got, want = static(x, value), reads(x, value)
            assert got[1] == want[1] == type(value).__name__ and torch.equal(got[0], want[0])
    assert len(static.program_cache) == 1
    assert "cond" in [op.type for op in static.concrete_program.main_program.global_block().ops]


def grows(x, cache):
    cache.update(x, x)
    return x * 2


def _filled():
    cache = Cache()
    cache.update(torch.ones(2), torch.ones(2))
    return cache


@pytest.mark.parametrize("make", [Cache, _filled])
def test_an_argument_changed_in_place_is_the_callers_after_each_run(make):
    # Eager adds to the caller's cache; so does each run of the program
    # (d2s/argument_writes.py), with that run's tensors and never a graph value.
    static, mine, theirs = d2s.declarative(grows), make(), make()
    for x in (torch.ones(2), torch.full((2,), 3.0)):
        assert torch.equal(static(x, mine), grows(x, theirs))
        assert [(type(layer), layer.keys.tolist(), layer.values.tolist()) for layer in mine.layers] == \
            [(type(layer), layer.keys.tolist(), layer.values.tolist()) for layer in theirs.layers]


@dataclasses.dataclass
class _Held:
    t: torch.Tensor


def returns_one_object_twice(x):
    ys = [x * 2]
    if x.sum() > 0:  # both sides of a tensor `if`
        ys.append(x + 1)
        held = _Held(x - 1)
    else:
        ys.append(x - 1)
        held = _Held(x + 1)
    return ys, ys, held, [held, {"same": ys}]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_an_object_returned_twice_is_one_object(sign):
    """`return ys, ys` gives one list in two places in eager code; the
    program rebuilds each such node once per run, so appending to one shows
    in the other, as eager's (two copies diverged silently)."""
    static = d2s.declarative(returns_one_object_twice)
    for x in (torch.ones(2) * sign, torch.ones(2) * -sign):
        want, got = returns_one_object_twice(x), static(x)
        for out in (want, got):
            ys, again, held, (held_again, box) = out
            assert ys is again and box["same"] is ys and held is held_again
        assert all(torch.equal(a, b) for a, b in zip(got[0], want[0])) and torch.equal(got[2].t, want[2].t)
    assert "cond" in {op.type for op in static.concrete_program.main_program.global_block().ops}
    first, second = static(torch.ones(2)), static(torch.ones(2))
    assert first[0] is not second[0]  # each run's own objects


def test_a_saved_model_returns_one_object_where_the_function_did(tmp_path):
    static = d2s.declarative(returns_one_object_twice)
    x = torch.ones(2)
    static(x)
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for x in (torch.ones(2), -torch.ones(2)):
        ys, again, held, (held_again, box) = loaded(x)
        assert ys is again and box["same"] is ys and held is held_again
        want = returns_one_object_twice(x)
        assert all(torch.equal(a, b) for a, b in zip(ys, want[0]))


@pytest.mark.parametrize("outputs, match", [
    ({"same": 0}, "names no shared node"),
    ({"tuple": [{"same": 0}, {"shared": 0, "node": {"fetch": 0}}]}, "names no shared node"),
    ({"shared": 1, "node": {"fetch": 0}}, "is not number 0"),
    ({"shared": 0, "node": {"list": [{"same": 0}]}}, "names no shared node"),  # a node inside itself
])
def test_a_malformed_shared_node_is_refused_at_load(tmp_path, outputs, match):
    d2s.jit.save(Model("dataclass"), str(tmp_path / "m"), input_spec=[d2s.InputSpec([None])])
    _with_outputs(tmp_path / "m", outputs)
    with pytest.raises(ModelFormatError, match=match):
        d2s.jit.load(str(tmp_path / "m"))
