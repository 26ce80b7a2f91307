"""Hostile model directories: each is refused with ModelFormatError by
`jit.load`, `load_inference_model` and `python -m d2s inspect` (exit 2, one
line), and nothing is compiled, bound or run first."""

import json
import os
import re

import pytest
import torch
import torch.nn as nn

import d2s
import runtime
from d2s.__main__ import main
from runtime import Executor, ModelFormatError, load_inference_model
from runtime.attrs import InputRef
from runtime.optable import get_op_def
from runtime.format_rules import LoadLimits


class Refiner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        i = 0
        while h.sum() > 1 and i < 5:
            h = h * 0.5
            i += 1
        if h.mean() > 0:
            y = h + 1
        else:
            y = h - 1
        return y


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hostile") / "model"
    d2s.jit.save(d2s.declarative(Refiner()), str(path), input_spec=[d2s.InputSpec([None, 4])])
    return path


def _ops(doc, op_type):
    return [op for b in doc["program"]["blocks"] for op in b["ops"] if op["type"] == op_type]


def _vars(doc):
    return [v for b in doc["program"]["blocks"] for v in b["vars"]]


def _block_of(doc, name):
    return next(b for b in doc["program"]["blocks"] if any(v["name"] == name for v in b["vars"]))


def _rename(doc, old, new):
    """Rename variable `old` everywhere it appears (declarations, slots, attributes)."""
    text = json.dumps(doc)
    doc.clear()
    doc.update(json.loads(text.replace(json.dumps(old), json.dumps(new))))


def _rename_data(new):
    return lambda doc: _rename(doc, "x", new)


def _call_attr(key, value):
    def edit(doc):
        doc["program"]["blocks"][0]["ops"][0]["attrs"][key] = value
    return edit


def _op_attr(op_type, key, value, index=None):
    """Set attribute `key` of the first `op_type` op (or item `index` of it)."""
    def edit(doc):
        attrs = _ops(doc, op_type)[0]["attrs"]
        if index is None:
            attrs[key] = value
        else:
            attrs[key]["$tuple"][index] = value
    return edit


def _extra_arg(op_type, value):
    return lambda doc: _ops(doc, op_type)[0]["attrs"]["args"]["$tuple"].append(value)


def _as_op(op_type, args, outputs=None):
    """The first `fill_constant` (no inputs) made an `op_type` op calling `args`."""
    def edit(doc):
        op = _ops(doc, "fill_constant")[0]
        op["type"] = op_type
        op["attrs"] = {"args": {"$tuple": args}, "kwargs": {}, "out": {"$out": 0} if outputs is None else None}
        if outputs is not None:
            op["outputs"] = {"Out": outputs}
    return edit


def _dim(value):
    def edit(doc):
        _vars(doc)[0]["shape"][0] = value  # x: ["s0", 4]
    return edit


def _cond(fn):
    return lambda doc: fn(_ops(doc, "cond")[0], doc)


def _while(fn):
    return lambda doc: fn(_ops(doc, "while")[0], doc)


def _other_branch(op, doc):
    op["attrs"]["false_outs"] = list(op["attrs"]["true_outs"])


def _fewer_init(op, doc):
    op["inputs"]["Init"] = op["inputs"]["Init"][:-1]


def _unused_vars(doc):
    vars_ = doc["program"]["blocks"][0]["vars"]
    template = vars_[0]
    vars_ += [dict(template, name=f"unused_{i}", is_data=False) for i in range(2000)]


def _body_out_from_cond_block(op, doc):
    cond_block = doc["program"]["blocks"][op["attrs"]["cond_block"]["$block"]]
    op["attrs"]["body_outs"][0] = cond_block["vars"][0]["name"]


def _loop_var_outside_body(op, doc):
    op["attrs"]["loop_vars"][0] = "x"


def _two_conditions(op, doc):
    op["inputs"]["Cond"] = op["inputs"]["Cond"] * 2


def _collide(doc):
    name = doc["program"]["blocks"][0]["vars"][0]["name"]  # x
    extra = dict(doc["program"]["blocks"][0]["vars"][1])
    extra["name"] = "fc_weight"
    doc["program"]["blocks"][0]["vars"].append(extra)
    assert name == "x"


HOSTILE = {
    # Ops the passes make (runtime/optable.py `internal`) are not in the loader's allowlist.
    "an internal op of the passes": (lambda d: d["program"]["blocks"][0]["ops"][0].update(type="fused_rnn_loop"),
                                     "op type 'fused_rnn_loop' is not a registered d2s op"),
    "a custom autograd.Function op": (lambda d: d["program"]["blocks"][0]["ops"][0].update(type="autograd_function"),
                                      "a live Python object"),
    "device os.system": (_call_attr("kwargs", {"device": {"$device": "os.system"}}), "is not a device"),
    "tensor type os.system": (_call_attr("kwargs", {"dtype": {"$tensor_type": "os.system"}}),
                              "malformed attribute"),
    "return type reaching a helper": (
        _call_attr("out", {"$return_type": "pytree_register_structseq", "items": [{"$out": 0}]}),
        "unknown return type"),
    "false_outs naming the other branch": (_cond(_other_branch), "which block"),
    "cond with emptied true_outs": (_cond(lambda op, d: op["attrs"].update(true_outs=[])),
                                    "'true_outs' has 0 name(s) but the op has 1 Out outputs"),
    "cond with two conditions": (_cond(_two_conditions), "exactly one Cond input"),
    "while with fewer Init than Out": (_while(_fewer_init), "Init inputs"),
    "while body_outs from the cond block": (_while(_body_out_from_cond_block), "'body_outs' names"),
    "loop variable outside the body": (_while(_loop_var_outside_body), "is read before any op of block 1 writes it"),
    "cond_out not a name": (_while(lambda op, d: op["attrs"].update(cond_out=["a"])), "'cond_out'"),
    "block reference in a call": (_call_attr("args", {"$tuple": [{"$in": 0}, {"$block": 1}]}),
                                  "holds a block reference"),
    "unknown attribute": (_call_attr("exec", "print(1)"), "unknown attribute 'exec'"),
    "args not a tuple": (_call_attr("args", "x"), "'args' must be a tuple"),
    "autocast device os.system": (_call_attr("autocast", [["os.system", "bfloat16", True]]),
                                  "attribute 'autocast' entry"),
    "autocast unknown dtype": (_call_attr("autocast", [["cpu", "os.system", True]]), "unknown dtype"),
    "autocast not a list": (_call_attr("autocast", "cpu"), "'autocast' must be a list"),
    "program autocast device os.system": (lambda d: d.update(autocast=[["os.system", "bfloat16", True]]),
                                          "\"autocast\" entry"),
    "program autocast turned off": (lambda d: d.update(autocast=[["cpu", "bfloat16", False]]),
                                    "\"autocast\" must list each device type"),
    "program autocast twice": (lambda d: d.update(autocast=[["cpu", "bfloat16", True]] * 2),
                               "\"autocast\" must list each device type"),
    "out holding a constant": (_call_attr("out", {"$tuple": [{"$out": 0}, 7]}), "may only hold output"),
    "name with ../": (_rename_data("../../etc/passwd"), "is not a valid variable name"),
    "name with a newline": (_rename_data("x\nfetches:\n  evil"), "is not a valid variable name"),
    "name with NUL": (_rename_data("x\x00y"), "is not a valid variable name"),
    "name with right-to-left override": (_rename_data("x\u202eyxt"), "is not a valid variable name"),
    "name with a space": (_rename_data("x y"), "is not a valid variable name"),
    "overlong name": (_rename_data("x" * 300), "is 300 characters long"),
    "names colliding once sanitised": (_collide, "'fc.weight' and 'fc_weight' are the same once sanitised"),
    "producer with a newline": (lambda d: d["producer"].update(d2s="0.1\nfetches:"), "short printable"),
    "unknown mode": (lambda d: d.update(mode="os.system"), '"mode" must be "train" or "eval"'),
    "alternate of the same mode": (lambda d: _alternate(d, "eval", "eval"), "the mode other than"),
    "both_modes not a bool": (lambda d: d.update(both_modes="yes"), '"both_modes" must be true or false'),
    "both_modes with an alternate": (lambda d: (_alternate(d, "eval", "train"), d.update(both_modes=True)),
                                     '"both_modes" must be true or false, and false with an "alternate"'),
    "one_mode not a text": (lambda d: d.update(mode="eval", one_mode={"$device": "cpu"}), '"one_mode" must be a short'),
    "one_mode without a mode": (lambda d: d.update(one_mode="no train mode"), '"one_mode" must be a short'),
    "one_mode with an alternate": (lambda d: (_alternate(d, "eval", "train"), d.pop("both_modes", None),
                                                d.update(one_mode="why")),
                                   'and without "alternate"'),
    "alternate with a hostile op": (lambda d: _alternate(d, "eval", "train", op_type="os.system"),
                                    "alternate: invalid program: block 0, op 0: op type 'os.system'"),
    "state name with ../": (lambda d: d.update(state={"parameters": ["../x"], "buffers": []}),
                            "is not a valid variable name"),
    "state not a dict of two lists": (lambda d: d.update(state={"parameters": "fc.weight"}), '"state" must be'),
    # A state entry [key, name]: PyTorch's key (any printable text) and the tensor's checked variable name.
    "state key with a newline": (lambda d: d.update(state={"parameters": [["fc\nweight", "fc.weight"]],
                                                           "buffers": []}), "is not a valid state-dict key"),
    "state key with a direction override": (
        lambda d: d.update(state={"parameters": [["fc.\u202eweight", "fc.weight"]], "buffers": []}),
        "is not a valid state-dict key"),
    "state key with an empty part": (lambda d: d.update(state={"parameters": [["fc..weight", "fc.weight"]],
                                                               "buffers": []}), "is not a valid state-dict key"),
    "state key not a string": (lambda d: d.update(state={"parameters": [[{"$device": "cpu"}, "fc.weight"]],
                                                         "buffers": []}), "a state-dict key must be a string"),
    "state entry of three": (lambda d: d.update(state={"parameters": [["a", "b", "fc.weight"]], "buffers": []}),
                             "a variable name must be a non-empty string"),
    "state name with / beside a key": (lambda d: d.update(state={"parameters": [["fc-1.weight", "fc/weight"]],
                                                                 "buffers": []}), "is not a valid variable name"),
    "state key listed twice": (lambda d: d.update(state={"parameters": [["k", "fc.weight"], ["k", "fc.bias"]],
                                                         "buffers": []}), "lists the key"),
    "state tensor both parameter and buffer": (
        lambda d: d.update(state={"parameters": [["a", "fc.weight"]], "buffers": [["b", "fc.weight"]]}),
        "is both a parameter and a buffer"),
    "state naming a tensor the file lacks": (
        lambda d: d.update(state={"parameters": [["fc-1.weight", "fc.weight_9"]], "buffers": []}),
        "missing parameter(s) ['fc.weight_9']"),
    "outputs naming a fetch it lacks": (lambda d: d.update(outputs={"tuple": [{"fetch": 0}, {"fetch": 1}]}),
                                        "fetch index 1 is not one of the 1 fetches"),
    "outputs with an unknown node": (lambda d: d.update(outputs={"eval": "os.system"}), "unknown output node"),
    "outputs holding an object": (lambda d: d.update(outputs={"const": {"$device": "cpu"}}),
                                  "is not a number, string, bool or null"),
    "outputs with a namedtuple named by code": (
        lambda d: d.update(outputs={"namedtuple": "os.system", "fields": ["a"], "items": [{"fetch": 0}]}),
        "a namedtuple needs an identifier name"),
    "outputs nested without end": (lambda d: d.update(outputs=_nested(200)), "deeper than 64"),
    "state update of a data variable": (lambda d: d.update(state_updates=[["x", 0]]),
                                        "not a persistable variable of the global block"),
    "state update from another shape": (lambda d: d.update(state_updates=[["fc.weight", 0]]),
                                        "from a fetch of another dtype or shape"),
    "state update from a fetch it lacks": (lambda d: d.update(state_updates=[["fc.weight", 3]]),
                                           "is not a [name, fetch index] pair"),
    # Calls checked against the kernel's torch signature (runtime/signatures.py).
    "dtype holding a device": (_op_attr("fill_constant", "args", {"$device": "cpu"}, 1),
                               "argument 'dtype' takes a dtype, got device(type='cpu')"),
    "dtype holding a string": (_op_attr("fill_constant", "args", "float32", 1),
                               "argument 'dtype' takes a dtype, got 'float32'"),
    "dtype holding a layout": (_op_attr("fill_constant", "args", {"$layout": "strided"}, 1),
                               "argument 'dtype' takes a dtype, got torch.strided"),
    "a __class__ keyword": (_op_attr("torch.nn.functional.linear", "kwargs", {"__class__": 1}),
                            "keyword '__class__' is not an argument of any torch function"),
    "a keyword the function does not take": (
        _op_attr("torch.nn.functional.linear", "kwargs", {"weights": {"$in": 1}}),
        "keyword 'weights' is not an argument of this function (it takes bias, input, weight)"),
    "too many positional arguments": (_extra_arg("torch.nn.functional.linear", 7),
                                      "4 positional arguments, but this function takes 3"),
    "a dtype where a tensor goes": (_op_attr("torch.nn.functional.linear", "args", {"$dtype": "float32"}, 2),
                                    "argument 'bias' takes no dtype, got torch.float32"),
    "a method's dtype keyword holding a string": (_op_attr("torch.Tensor.sum", "kwargs", {"dtype": "float64"}),
                                                  "argument 'dtype' takes a dtype, got 'float64'"),
    "a layout keyword holding a memory format": (
        _op_attr("torch.Tensor.sum", "kwargs", {"layout": {"$memory_format": "channels_last"}}),
        "argument 'layout' takes a layout, got torch.channels_last"),
    "a d2s op called with an extra keyword": (_op_attr("fill_constant", "kwargs", {"device": "cpu"}),
                                              "got an unexpected keyword argument 'device'"),
    # Binding-only keywords (`nonzero`'s `as_tuple`) go to their own functions only, and take no closed kinds.
    "nonzero's as_tuple given to sum": (_op_attr("torch.Tensor.sum", "kwargs", {"as_tuple": True}),
                                        "keyword 'as_tuple' is not an argument of this function"),
    "sparse check_invariants given to sum": (_op_attr("torch.Tensor.sum", "kwargs", {"check_invariants": True}),
                                             "keyword 'check_invariants' is not an argument of this function"),
    # d2s ops whose arguments come from a closed set: refused at load, not when the op runs.
    "a clock that time does not have": (_as_op("host_clock", ["system"]),
                                        "host_clock reads one of the clocks"),
    "a raise of a builtin that is no exception": (_as_op("raise", ["exec", "print(1)"], outputs=[]),
                                                  "raise takes the name of a builtin exception class"),
    "a raise of an unknown name": (_as_op("raise", ["NoSuchError", "boom"], outputs=[]),
                                   "raise takes the name of a builtin exception class"),
    # Variable shapes: ints in 0..2**40, -1, or size expressions of symbols.
    "a dimension 'nan'": (_dim("nan"), "bad dimension "),
    "a dimension 'inf'": (_dim("inf"), "bad dimension "),
    "a dimension '-inf'": (_dim("-inf"), "bad dimension "),
    "a dimension of code": (_dim("__import__(os)"), "bad dimension "),
    "a dimension naming a word": (_dim("s0 + batch"), "bad dimension "),
    "a dimension calling through math.": (_dim("math.os.system(s0)"), "bad dimension "),
    "a dimension with a float": (_dim("math.ceil(1.5)"), "bad dimension "),
    "a dimension of 2**62": (_dim(2**62), "bad dimension 4611686018427387904"),
    "a dimension of -2": (_dim(-2), "bad dimension -2"),
    "a float dimension": (_dim(2.5), "bad dimension 2.5"),
}


def _nested(depth):
    node = {"fetch": 0}
    for _ in range(depth):
        node = {"list": [node]}
    return node


def _alternate(doc, mode, other, op_type=None):
    alternate = json.loads(json.dumps({k: doc[k] for k in ("feed", "fetch", "program")}))
    if op_type:
        alternate["program"]["blocks"][0]["ops"][0]["type"] = op_type
    doc.update(mode=mode, alternate=dict(alternate, mode=other))


def _write(path, doc):
    (path / "program.json").write_text(json.dumps(doc))


def _hostile_copy(saved, tmp_path, edit):
    path = tmp_path / "hostile"
    path.mkdir()
    doc = json.loads((saved / "program.json").read_text())
    edit(doc)
    _write(path, doc)
    (path / "params.safetensors").write_bytes((saved / "params.safetensors").read_bytes())
    return path


def _refused_everywhere(path, message, forbid_execution, capsys):
    forbid_execution()
    with pytest.raises(ModelFormatError, match=re.escape(message)):
        load_inference_model(str(path), Executor())
    with pytest.raises(ModelFormatError, match=re.escape(message)):
        d2s.jit.load(str(path))
    capsys.readouterr()
    assert main(["inspect", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: invalid model: ") and captured.err.count("\n") == 1
    assert message in captured.err


def test_the_unedited_model_loads_and_runs(saved):
    layer = d2s.jit.load(str(saved))
    assert layer(torch.ones(2, 4)).shape == (2, 4)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_directory_is_refused_before_anything_runs(saved, tmp_path, forbid_execution, capsys, case):
    edit, message = HOSTILE[case]
    _refused_everywhere(_hostile_copy(saved, tmp_path, edit), message, forbid_execution, capsys)


def test_an_oversized_program_json_is_refused_without_reading_it(saved, tmp_path, monkeypatch, forbid_execution,
                                                                 capsys):
    path = _hostile_copy(saved, tmp_path, lambda d: None)
    with open(path / "program.json", "r+b") as f:  # sparse: 200 MB on paper, nothing to read
        f.truncate(200 * 2**20)
    monkeypatch.setattr(json, "loads", lambda *a, **k: pytest.fail("the file was parsed"))
    _refused_everywhere(path, "exceeds the limit of 67,108,864 (LoadLimits.max_file_bytes", forbid_execution, capsys)


def test_too_many_variables_are_refused_before_building_any(saved, tmp_path, monkeypatch, forbid_execution, capsys):
    path = _hostile_copy(saved, tmp_path, _unused_vars)
    monkeypatch.setattr(runtime.format_rules, "DEFAULT_LIMITS", LoadLimits(max_vars=1000))
    monkeypatch.setattr(runtime.ir.Block, "create_var", lambda *a, **k: pytest.fail("a variable was built"))
    _refused_everywhere(path, "number of variables: 2,0", forbid_execution, capsys)


def test_limits_can_be_raised_for_one_load(saved, tmp_path):
    path = _hostile_copy(saved, tmp_path, lambda d: None)
    size = os.path.getsize(path / "program.json")
    with pytest.raises(ModelFormatError, match="max_file_bytes"):
        load_inference_model(str(path), Executor(), limits=LoadLimits(max_file_bytes=size - 1))
    load_inference_model(str(path), Executor(), limits=LoadLimits(max_file_bytes=size))


def test_inspect_prints_names_escaped():
    from d2s.__main__ import _shown
    assert _shown("x\nfetches:") == "'x\\nfetches:'"
    assert _shown("a\u202eb") == "'a\\u202eb'"
    assert _shown("encode.weight") == "encode.weight"


def test_naming_rules_bind_files_not_programs_in_memory(tmp_path):
    program = d2s.Program()
    with d2s.program_guard(program):
        x = d2s.data("my input", [2])
    copy = program.clone()  # a copy of an in-memory program keeps any name
    assert "my input" in copy.global_block().vars
    with pytest.raises(ModelFormatError, match="'my input' is not a valid variable name"):
        d2s.save_inference_model(str(tmp_path / "m"), ["my input"], [x], Executor(), program)
    assert not (tmp_path / "m").exists()  # never writes what loading would refuse



@pytest.mark.parametrize("op_type, args, ok", [
    ("assert", (InputRef(0), "sum {0} over {1:>4} rows {{x}}", "tn", InputRef(1), InputRef(2)), True),
    ("raise", ("ValueError", "low sum {0!r:.2f}", "n", InputRef(0)), True),
    # A message a run formats names its values by position only: a loaded
    # `{0.__class__...}` would read attributes of the run's values into the text.
    ("assert", (InputRef(0), "{0.__class__.__init__}", "t", InputRef(1)), False),
    ("raise", ("ValueError", "{0[0]}", "t", InputRef(0)), False),
    ("raise", ("ValueError", "{1}", "t", InputRef(0)), False),
    ("assert", (InputRef(0), "{0:{1}}", "tt", InputRef(1), InputRef(2)), False),
    ("assert", (InputRef(0), "{0}", "x", InputRef(1)), False),
])
def test_a_loaded_messages_template_is_checked_before_it_runs(op_type, args, ok):
    problem = get_op_def(op_type).check_args(args, {})
    assert (problem is None) == ok, problem
