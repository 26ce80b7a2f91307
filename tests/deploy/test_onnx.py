"""`d2s.onnx.export`: cond -> If, while -> Loop. Each model is exported once
(dynamic dimensions symbolic), passes onnx.checker's full check, and
onnxruntime matches eager PyTorch on inputs taking every branch and trip
count: the quickstart model, the GRU greedy decoder with `break`, the LSTM
tagger looping over a tensor length, the digits classifier at batch sizes
1 and 7; from a declarative module, a TranslatedLayer and a saved
directory, and through `python -m d2s export-onnx`."""

import copy
import os
import sys

import numpy as np
import pytest
import torch

import d2s

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from quickstart import GatedRefiner  # noqa: E402
from models import GreedyDecoder, LSTMTagger  # noqa: E402
from mnist import MNIST  # noqa: E402
import exported_writes  # noqa: E402


def _export(eager, spec, tmp_path, how="module"):
    path = str(tmp_path / "model.onnx")
    static = d2s.declarative(copy.deepcopy(eager))
    if how == "module":
        model = d2s.onnx.export(static, path, input_spec=spec)
    else:
        d2s.jit.save(static, str(tmp_path / "saved"), input_spec=spec)
        source = d2s.jit.load(str(tmp_path / "saved")) if how == "translated" else str(tmp_path / "saved")
        model = d2s.onnx.export(source, path)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    return model, ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def _op_types(graph):
    types = set()
    for node in graph.node:
        types.add(node.op_type)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                types |= _op_types(attr.g)
    return types


def _check(session, feeds, expected):
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, {n: np.asarray(v) for n, v in zip(names, feeds)})
    expected = expected if isinstance(expected, (list, tuple)) else [expected]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = torch.as_tensor(e).detach().numpy()
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


# refine_bias 3.0: the state stays large, the loop runs all 4 trips
@pytest.mark.parametrize("how, refine_bias", [("module", None), ("translated", None), ("directory", None),
                                              ("module", 3.0)])
def test_quickstart_model_every_branch_and_trip_count(tmp_path, how, refine_bias):
    torch.manual_seed(0)
    eager = GatedRefiner().eval()
    if refine_bias is not None:
        with torch.no_grad():
            eager.refine.bias.fill_(refine_bias)
    model, session = _export(eager, [d2s.InputSpec([None, 8])], tmp_path, how)
    assert {"If", "Loop"} <= _op_types(model.graph)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # a symbolic batch dimension
    inputs = [torch.randn(4, 8) * 3, torch.randn(4, 8) * 0.05, -torch.ones(4, 8), torch.ones(1, 8) * 0.01,
              torch.randn(7, 8)]
    trips, branches = set(), set()
    for x in inputs:
        h = torch.tanh(eager.encode(x))
        steps = 0
        while h.abs().mean() > 0.2 and steps < 4:
            h, steps = 0.5 * torch.tanh(eager.refine(h)), steps + 1
        trips.add(steps)
        branches.add(bool(h.mean() > 0))
        with torch.no_grad():
            _check(session, [x], eager(x))
    if refine_bias is None:
        assert trips >= {0, 1} and branches == {True, False}
    else:
        assert trips >= {0, 4}


def _gru_session(eager, path):
    """The decoder exported with a dynamic batch and a max_len input."""
    path.mkdir()
    model, session = _export(eager, [d2s.InputSpec([None, 32]), d2s.InputSpec([], "int64")], path)
    assert {"If", "Loop"} <= _op_types(model.graph)  # `if done.all(): break` inside the while
    return session


@pytest.mark.parametrize("eos_bias, max_len, batch, steps", [
    (-5.0, 1, 1, 1),    # one trip, no break, a batch of one
    (-5.0, 6, 3, 6),    # runs to max_len
    (50.0, 6, 5, 1),    # every sequence emits eos at once: break after the first trip
])
def test_gru_greedy_decoder_with_break(tmp_path, eos_bias, max_len, batch, steps):
    # (no zero-trip case: eager's torch.stack of no tokens raises)
    torch.manual_seed(1)
    eager = GreedyDecoder(eos=1).eval()
    with torch.no_grad():
        eager.out.bias[1] = eos_bias
    session = _gru_session(eager, tmp_path / "m")
    h = torch.randn(batch, 32)
    with torch.no_grad():
        tokens, n = eager(h, torch.tensor(max_len))
    assert n == steps
    _check(session, [h, np.array(max_len)], [tokens, torch.tensor(n)])


def test_lstm_tagger_loops_over_a_tensor_length(tmp_path):
    torch.manual_seed(2)
    eager = LSTMTagger().eval()
    model, session = _export(eager, [d2s.InputSpec([None, None], "int64"), d2s.InputSpec([], "int64")], tmp_path)
    assert "Loop" in _op_types(model.graph)
    tokens = torch.randint(0, 50, (3, 9))
    with torch.no_grad():
        for length in (1, 4, 9):
            _check(session, [tokens, np.array(length)], eager(tokens, torch.tensor(length)))
        short = torch.randint(0, 50, (2, 2))
        _check(session, [short, np.array(2)], eager(short, torch.tensor(2)))


@pytest.mark.parametrize("batch", [1, 7])
def test_digits_classifier(tmp_path, batch):
    torch.manual_seed(3)
    eager = MNIST(batch_norm=True).eval()
    _, session = _export(eager, [d2s.InputSpec([None, 1, 28, 28])], tmp_path)
    x = torch.rand(batch, 1, 28, 28)
    with torch.no_grad():
        _check(session, [x], eager(x))


@d2s.declarative
def _clipped_sum(x, limit):
    total = x.sum() * 0
    i = 0
    while i < x.shape[0]:
        if total > limit:
            break
        total = total + x[i].abs().sum()
        i += 1
    return total, i


def test_a_declarative_function_with_break_in_a_loop_over_rows(tmp_path):
    path = str(tmp_path / "f.onnx")
    d2s.onnx.export(_clipped_sum, path, input_spec=[d2s.InputSpec([None, 3]), d2s.InputSpec([], "float32")])
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = torch.arange(12.0).reshape(4, 3)
    trips = set()
    for rows, limit in [(4, 100.0), (4, 5.0), (1, 0.0), (0, 1.0), (4, -1.0)]:
        total, i = _clipped_sum.dygraph_function(x[:rows], torch.tensor(limit))
        trips.add(int(i))
        _check(session, [x[:rows], np.array(limit, dtype="float32")], [total, torch.tensor(i)])
    assert trips == {0, 1, 2, 4}


@d2s.declarative
def _mixed_dtypes(ids, x):
    return ids < 2.5, x > ids, ids * 0.5 + x, ids / 2, (ids == 3) | (x.sum(1, keepdim=True) > 0)


def test_type_promotion_follows_torch(tmp_path):
    path = str(tmp_path / "mixed.onnx")
    d2s.onnx.export(_mixed_dtypes, path, input_spec=[d2s.InputSpec([None, 3], "int64"), d2s.InputSpec([None, 3])])
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ids, x = torch.tensor([[1, 2, 3], [3, 4, 0]]), torch.tensor([[2.5, 1.0, 3.5], [-9.0, 4.0, 0.25]])
    _check(session, [ids, x], _mixed_dtypes.dygraph_function(ids, x))


def test_an_op_torch_onnx_cannot_translate_names_the_op_and_the_line(tmp_path):
    @d2s.declarative
    def uses_cummax(x):
        y = torch.relu(x)
        return torch.cummax(y, 0)[0]  # torch.onnx has no ONNX function for aten.cummax

    with pytest.raises(d2s.onnx.ExportError, match=r"cannot export op 'torch.cummax' to ONNX: torch.onnx has no "
                                                   r"ONNX function for aten.cummax.*test_onnx.py\", line \d+: "
                                                   r"return torch.cummax"):
        d2s.onnx.export(uses_cummax, str(tmp_path / "m.onnx"), input_spec=[d2s.InputSpec([None])])
    assert not (tmp_path / "m.onnx").exists()


def test_a_program_converted_for_a_non_contiguous_layout_is_refused(tmp_path):
    @d2s.declarative
    def window(x):
        s = x.stride()
        return x.as_strided((2, 2), (s[0], s[1])) * 1.0

    window(torch.arange(8.0).view(4, 2).t())  # strides (1, 2): the program reads them
    with pytest.raises(d2s.onnx.ExportError, match=r"non-contiguous layout of 'x' \(strides \(1, 2\)\)"):
        d2s.onnx.export(window, str(tmp_path / "m.onnx"))
    assert not (tmp_path / "m.onnx").exists()


def test_a_program_reading_a_contiguous_inputs_strides_exports(tmp_path):
    """Strides read from a contiguous input of static sizes: every ONNX
    input is dense, so its check is no check (it was refused as
    "non-contiguous" while its strides, (4, 1), were contiguous ones)."""
    class Window(torch.nn.Module):
        def forward(self, x):
            s = x.stride()
            return x.as_strided((2, 2), (s[0], s[1])) * 1.0 + s[0]

    x = torch.arange(8.0).view(2, 4)
    _, session = _export(Window(), [d2s.InputSpec([2, 4])], tmp_path)
    for feed in (x, -x):
        _check(session, [feed], Window()(feed))


def layouts_of_the_path(x):
    if x.sum() > 0:
        y = x.t()
    else:
        y = x.t().contiguous()
    return y * 1.0 + y.stride(0)


def test_strides_of_a_value_of_the_paths_layout_are_refused(tmp_path):
    """The program answered one side's strides (and checks them when it
    runs); an ONNX model could neither, and would give that answer on the
    other side too: refused at the read."""
    static = d2s.declarative(layouts_of_the_path)
    static(torch.rand(2, 4))
    with pytest.raises(d2s.onnx.ExportError, match=r"reads the strides of tensor `y`, whose layout depends on the "
                                                   r"path.*test_onnx.py\", line \d+: return y \* 1.0"):
        d2s.onnx.export(static, str(tmp_path / "m.onnx"))
    assert not (tmp_path / "m.onnx").exists()


def test_dropout_in_training_mode_is_refused(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    with pytest.raises(d2s.onnx.ExportError, match="'torch.nn.functional.dropout' to ONNX: it draws random numbers.*export the model in eval mode"):
        d2s.onnx.export(d2s.declarative(model), str(tmp_path / "m.onnx"), input_spec=[d2s.InputSpec([None, 4])])


def test_export_onnx_command(tmp_path, capsys):
    from d2s.__main__ import main
    torch.manual_seed(0)
    eager = GatedRefiner().eval()
    d2s.jit.save(d2s.declarative(copy.deepcopy(eager)), str(tmp_path / "saved"),
                 input_spec=[d2s.InputSpec([None, 8])])
    assert main(["export-onnx", str(tmp_path / "saved"), str(tmp_path / "q.onnx")]) == 0
    lines = capsys.readouterr().out.splitlines()
    # A line per stage: large models take a while.
    assert lines[0].startswith("loading ") and lines[1].startswith("program: ")
    assert any(line.startswith("exported ops ") and line.endswith("with torch.onnx") for line in lines)
    assert lines[-2].startswith("checking the ONNX model") and lines[-1].startswith("wrote ")
    session = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 8)
    with torch.no_grad():
        _check(session, [x], eager(x))
    assert main(["export-onnx", str(tmp_path / "nowhere"), str(tmp_path / "x.onnx")]) == 2
    assert capsys.readouterr().err.startswith("error: invalid model: ")


class _Blocks(torch.nn.Module):
    """The ops the first real models (timm, transformers) stopped at when
    d2s had its own op table: in-place relu, hardswish, silu, transpose,
    permute, expand, arange; behind a data-dependent branch."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = torch.nn.functional.relu(self.conv(x), inplace=True)
        y = torch.nn.functional.hardswish(y) + torch.nn.functional.silu(y)
        tokens = y.flatten(2).transpose(1, 2)                    # [batch, h*w, 8]
        positions = torch.arange(tokens.shape[1]).float()[None, :, None]
        tokens = self.proj(tokens) + positions.expand(tokens.shape[0], -1, 8)
        if x.mean() > 0:
            tokens = tokens.permute(0, 2, 1)
        else:
            tokens = -tokens.permute(0, 2, 1)
        return tokens


@pytest.mark.parametrize("batch", [1, 5])
def test_ops_of_real_models_go_through_torch_onnx(tmp_path, batch):
    torch.manual_seed(4)
    eager = _Blocks().eval()
    model, session = _export(eager, [d2s.InputSpec([None, 3, None, 6])], tmp_path)
    assert "If" in _op_types(model.graph)
    branches = set()
    for x in (torch.randn(batch, 3, 4, 6) + 1, torch.randn(batch, 3, 5, 6) - 2):
        with torch.no_grad():
            branches.add(bool(x.mean() > 0))
            _check(session, [x], eager(x))
    assert len(branches) == 2


@d2s.declarative
def _collect(x, n):
    rows = []
    i = 0
    while i < n:
        rows.append(x * i)
        i += 1
    return torch.stack(rows, 1)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_a_list_collecting_loop(tmp_path, n):
    path = str(tmp_path / "c.onnx")
    model = d2s.onnx.export(_collect, path, input_spec=[d2s.InputSpec([None, 3]), d2s.InputSpec([], "int64")])
    assert {"Loop", "SequenceInsert", "ConcatFromSequence"} <= _op_types(model.graph)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 4):
        x = torch.randn(batch, 3)
        _check(session, [x, np.array(n)], _collect.dygraph_function(x, torch.tensor(n)))


def test_a_saved_decoder_through_the_command_line(tmp_path, capsys):
    from d2s.__main__ import main
    torch.manual_seed(1)
    eager = GreedyDecoder(eos=1).eval()
    d2s.jit.save(d2s.declarative(copy.deepcopy(eager)), str(tmp_path / "saved"),
                 input_spec=[d2s.InputSpec([None, 32]), d2s.InputSpec([], "int64")])
    assert main(["export-onnx", str(tmp_path / "saved"), str(tmp_path / "d.onnx")]) == 0
    session = ort.InferenceSession(str(tmp_path / "d.onnx"), providers=["CPUExecutionProvider"])
    h = torch.randn(2, 32)
    with torch.no_grad():
        tokens, n = eager(h, torch.tensor(4))
    _check(session, [h, np.array(4)], [tokens, torch.tensor(n)])


@d2s.declarative
def _batch_inside_loop(x, n):
    batch = x.shape[0]  # a size read before the loop, used inside it
    h = torch.zeros(batch, 3)
    i = 0
    while i < n:
        h = h + torch.ones(batch, 3) * x
        i += 1
    return h


@pytest.mark.parametrize("batch, n", [(1, 0), (4, 1), (6, 3)])
def test_a_size_used_inside_a_loop_keeps_the_batch_dynamic(tmp_path, batch, n):
    path = str(tmp_path / "b.onnx")
    d2s.onnx.export(_batch_inside_loop, path, input_spec=[d2s.InputSpec([None, 3]), d2s.InputSpec([], "int64")])
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = torch.randn(batch, 3)
    _check(session, [x, np.array(n)], _batch_inside_loop.dygraph_function(x, torch.tensor(n)))


@d2s.declarative
def _twice(x):
    y = torch.relu(x)
    return y, y, x, x


def test_a_value_returned_twice_is_two_outputs(tmp_path):
    path = str(tmp_path / "t.onnx")
    model = d2s.onnx.export(_twice, path, input_spec=[d2s.InputSpec([None, 3])])
    assert len({o.name for o in model.graph.output}) == 4
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = torch.randn(2, 3)
    _check(session, [x], _twice.dygraph_function(x))


@d2s.declarative
def _write_through_a_view(x):
    row = x[0]
    if x.sum() > 0:
        row.add_(1)  # eager: x changes too
    return x


def test_an_in_place_write_to_a_view_across_a_branch_is_refused(tmp_path):
    with pytest.raises(d2s.onnx.ExportError, match=r"'torch.Tensor.add_' .*shares memory with a view"):
        d2s.onnx.export(_write_through_a_view, str(tmp_path / "v.onnx"), input_spec=[d2s.InputSpec([None, 3])])


@pytest.mark.parametrize("fn, op_type", exported_writes.CASES, ids=lambda c: getattr(c, "__name__", c))
def test_an_in_place_write_inside_a_branch_or_loop_comes_out_of_it(tmp_path, fn, op_type):
    static = d2s.declarative(fn)
    path = str(tmp_path / "w.onnx")
    model = d2s.onnx.export(static, path, input_spec=[d2s.InputSpec([None, 3])])
    assert {"cond": "If", "while": "Loop"}[op_type] in _op_types(model.graph)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for x in exported_writes.inputs():
        _check(session, [x.numpy()], fn(x.clone()))


def test_a_model_writing_its_own_state_is_refused(tmp_path):
    static = d2s.declarative(exported_writes.CountsCalls())
    with pytest.raises(d2s.onnx.ExportError, match=r"'torch.Tensor.add_' .*writes the model's state 'count'"):
        d2s.onnx.export(static, str(tmp_path / "c.onnx"), input_spec=[d2s.InputSpec([None, 3])])


@pytest.mark.parametrize("source", ["declarative", "saved", "loaded"])
@pytest.mark.parametrize("exporter", ["onnx", "torch.export"])
def test_a_model_carrying_state_between_calls_is_refused(tmp_path, source, exporter):
    # (Exported, it kept the state as it was at export: every run started there.)
    static = d2s.declarative(exported_writes.CarriesState())
    static(torch.ones(1, 3))
    obj = static
    if source != "declarative":
        d2s.jit.save(static, str(tmp_path / "m"), input_spec=[d2s.InputSpec([1, 3])])
        obj = str(tmp_path / "m") if source == "saved" else d2s.jit.load(str(tmp_path / "m"))
    message = r"carries module state from one call to the next \(`(CarriesState\.)?h`"
    with pytest.raises(ValueError, match=message):
        if exporter == "onnx":
            d2s.onnx.export(obj, str(tmp_path / "c.onnx"), input_spec=[d2s.InputSpec([1, 3])]
                            if source == "declarative" else None)
        else:
            d2s.export(obj, input_spec=[d2s.InputSpec([1, 3])] if source == "declarative" else None)


@pytest.mark.parametrize("rnn, bidirectional", [(torch.nn.LSTM, False), (torch.nn.GRU, True)])
def test_a_multi_layer_rnn_over_a_dynamic_length(tmp_path, rnn, bidirectional):
    torch.manual_seed(5)
    # dropout: aten ops that may draw, but not in eval mode
    eager = rnn(4, 8, num_layers=2, dropout=0.3, batch_first=True, bidirectional=bidirectional).eval()
    # Batch and length dynamic: the whole op becomes ONNX's LSTM / GRU
    # (runtime/onnx_rnn.py), not steps unrolled for one length.
    model, session = _export(eager, [d2s.InputSpec([None, None, 4])], tmp_path)
    assert {"LSTM", "GRU"} & _op_types(model.graph)
    for shape in ((2, 6, 4), (5, 2, 4), (3, 11, 4)):
        x = torch.randn(*shape)
        with torch.no_grad():
            _check(session, [x], torch.utils._pytree.tree_leaves(eager(x)))  # LSTM: out, (h, c)


def test_an_lstm_with_projections_over_a_dynamic_length_is_refused(tmp_path):
    eager = torch.nn.LSTM(4, 8, proj_size=3, batch_first=True).eval()  # ONNX's LSTM has no projection
    with pytest.raises(d2s.onnx.ExportError, match=r"torch.export failed: .*size\(\)\[1\]"):  # the length
        _export(eager, [d2s.InputSpec([None, None, 4])], tmp_path)


@d2s.declarative
def _clip_in_place(boxes):
    boxes = boxes.clamp_(min=0)  # writes the input, then views of it, all in one region
    boxes[:, 0] = boxes[:, 0].clamp(max=3)
    return boxes


def test_in_place_writes_and_views_within_one_region(tmp_path):
    path = str(tmp_path / "clip.onnx")
    d2s.onnx.export(_clip_in_place, path, input_spec=[d2s.InputSpec([None, 4])])
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = torch.randn(5, 4) * 5
    _check(session, [x], _clip_in_place.dygraph_function(x.clone()))


@d2s.declarative
def _attention(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)  # dropout_p=0: draws nothing


def test_scaled_dot_product_attention_without_dropout(tmp_path):
    path = str(tmp_path / "a.onnx")
    d2s.onnx.export(_attention, path, input_spec=[d2s.InputSpec([None, 2, 5, 8])] * 3)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    q, k, v = (torch.randn(3, 2, 5, 8) for _ in range(3))
    _check(session, [q, k, v], _attention.dygraph_function(q, k, v))


@d2s.declarative
def _constant():
    return 4


def test_a_program_without_tensor_results_is_refused(tmp_path):
    assert _constant() == 4
    with pytest.raises(d2s.onnx.ExportError, match="computes no tensor"):
        d2s.onnx.export(_constant, str(tmp_path / "c.onnx"))


@d2s.declarative
def _squeezes(m, q):
    both = torch.cat([m, q], dim=2)
    return both.squeeze(1), both[:, :1].squeeze(1)  # a dimension of 4: kept, as torch does; of 1: removed


def test_squeeze_of_a_dimension_that_is_not_one(tmp_path):
    # torch.onnx's own function emits a Squeeze ONNX refuses for the first (onnx_translations.py)
    path = str(tmp_path / "s.onnx")
    d2s.onnx.export(_squeezes, path, input_spec=[d2s.InputSpec([None, 4, 4])] * 2)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        m, q = torch.randn(batch, 4, 4), torch.randn(batch, 4, 4)
        _check(session, [m, q], list(_squeezes.dygraph_function(m, q)))


@d2s.declarative
def _experts(x, w, offs):
    return torch._grouped_mm(x, w, offs=offs)  # a mixture of experts' matmul (transformers' Mixtral)


def test_an_op_traced_as_an_empty_tensor_is_refused_by_torch_export(tmp_path):
    # (16-byte aligned strides: sizes of 4 and 8 floats.) ONNX has its own
    # lowering (a Loop over the experts); a torch.export trace would hold an
    # empty tensor as its value.
    x, w, offs = torch.randn(8, 4), torch.randn(2, 4, 8), torch.tensor([3, 8], dtype=torch.int32)
    torch.testing.assert_close(_experts(x, w, offs), _experts.dygraph_function(x, w, offs))
    d2s.onnx.export(_experts, str(tmp_path / "e.onnx"))
    session = ort.InferenceSession(str(tmp_path / "e.onnx"), providers=["CPUExecutionProvider"])
    _check(session, [x, w, offs], _experts.dygraph_function(x, w, offs))
    with pytest.raises(d2s.ExportError, match=r"'torch._grouped_mm'.*empty tensor"):
        d2s.export(_experts)


def _finite_rows(x):
    x = torch.relu(x)
    return x[torch.isfinite(x).all(dim=1)]  # as many rows as the mask selects


@pytest.mark.parametrize("spec", [None, [d2s.InputSpec([None, 4])]])
def test_a_mask_selecting_rows(tmp_path, spec):
    # The selected count's range (at most the rows there are) is a fact torch derives, not an assumption.
    static = d2s.declarative(_finite_rows)
    static(torch.rand(4, 4))
    path = str(tmp_path / "m.onnx")
    d2s.onnx.export(static, path, input_spec=spec)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    bad = torch.tensor([[1.0, float("inf"), 0, 0], [1, 2, 3, 4], [float("nan"), 0, 0, 0], [-1, -2, 0, 1]])
    for x in (torch.rand(4, 4), bad, torch.full((4, 4), float("nan"))):  # 4, 2 and 0 rows
        _check(session, [x], _finite_rows(x))


@d2s.declarative
def _numpy_scaled(x, length):
    # NumPy computes these in eager, and in the program when it runs; the
    # ONNX model computes them with torch's functions (runtime/traced_numpy.py)
    return x / np.sqrt(length) + np.maximum(x, 0.5) * np.multiply(length, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])  # int64: NumPy's sqrt gives float64
def test_numpy_ufuncs_export_as_torch_computes_them(tmp_path, dtype):
    path = str(tmp_path / "n.onnx")
    length = (torch.rand(2, 3) * 5 + 1).to(dtype)
    d2s.onnx.export(_numpy_scaled, path, input_spec=[d2s.InputSpec([None, 3]), d2s.InputSpec([None, 3], dtype)])
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    # Batches of 2 and more: two separate `None` batch dimensions broadcast
    # against each other, and whether the trace assumes they are not 1 depends
    # on what the process traced before (seen in the whole file, not alone).
    for batch in (2, 4):
        x, length = torch.rand(batch, 3), (torch.rand(batch, 3) * 5 + 1).to(dtype)
        _check(session, [x, length], _numpy_scaled.dygraph_function(x, length))


@d2s.declarative
def _numpy_compared(x):
    return x * np.greater(x, 0.5)  # eager wraps NumPy's bool result as uint8: no torch form here


def test_a_numpy_ufunc_without_a_torch_form_is_refused(tmp_path):
    x = torch.rand(2, 3)
    torch.testing.assert_close(_numpy_compared(x), _numpy_compared.dygraph_function(x))
    with pytest.raises(d2s.onnx.ExportError, match=r"'numpy.greater'.*NumPy computes it outside torch.*test_onnx.py"):
        d2s.onnx.export(_numpy_compared, str(tmp_path / "n.onnx"))


@pytest.mark.parametrize("spec", [True, False], ids=["input_spec", "latest_call"])
def test_a_module_with_a_fused_inference_kernel_exports_its_unfused_path(tmp_path, spec):
    """Without gradients nn.TransformerEncoderLayer's program calls torch's
    fused kernel, which ONNX has no translation for: the export traces the
    path torch's exporters take instead, also when the program of the latest
    call (made without gradients) is the one exported."""
    torch.manual_seed(0)
    eager = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    static = d2s.declarative(copy.deepcopy(eager))
    x = torch.randn(2, 5, 16)
    path = str(tmp_path / "model.onnx")
    with torch.no_grad():
        if spec:
            d2s.onnx.export(static, path, input_spec=[d2s.InputSpec([None, None, 16])])
        else:
            static(x)
            d2s.onnx.export(static, path)
        want = eager(x)
    _check(ort.InferenceSession(path, providers=["CPUExecutionProvider"]), [x], want)


@pytest.mark.parametrize("how", ["translated", "directory"])
def test_a_model_saved_without_gradients_exports_its_general_path(tmp_path, how):
    """Saved from a call without gradients, the main program calls the fused
    kernel; the export takes the path saved for calls with gradients."""
    torch.manual_seed(0)
    eager = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        d2s.jit.save(copy.deepcopy(eager), str(tmp_path / "saved"), input_spec=[d2s.InputSpec([None, None, 16])])
        source = d2s.jit.load(str(tmp_path / "saved")) if how == "translated" else str(tmp_path / "saved")
        d2s.onnx.export(source, str(tmp_path / "model.onnx"))
        want = eager(x)
    _check(ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"]), [x], want)


class GroupedExperts(torch.nn.Module):
    """A mixture of experts as transformers writes it for `torch._grouped_mm`:
    rows sorted by expert, offsets the cumulative counts (int32)."""

    def __init__(self, experts=3):
        super().__init__()
        torch.manual_seed(0)
        self.experts = experts
        self.weight = torch.nn.Parameter(torch.randn(experts, 8, 4))

    def forward(self, x, route):
        order = route.argsort()  # ties in any order: each row's result is its own, scattered back
        counts = torch.nn.functional.one_hot(route, self.experts).sum(0)
        offs = counts.cumsum(0).to(torch.int32)
        out = torch._grouped_mm(x[order], self.weight, offs=offs)
        return torch.zeros(x.shape[0], 4).index_add(0, order, out)


def test_a_mixture_of_experts_grouped_mm_is_a_loop_over_the_experts(tmp_path):
    # torch.onnx has no function for torch._grouped_mm (transformers' Mixtral,
    # Qwen-MoE, OLMoE, gpt-oss, DeepSeek-V3): d2s writes it as a Loop.
    eager = GroupedExperts().eval()
    model, session = _export(eager, [d2s.InputSpec([None, 8]), d2s.InputSpec([None], "int64")], tmp_path)
    assert {"Loop", "MatMul", "ConcatFromSequence"} <= _op_types(model.graph)
    for route in ([0, 2, 1, 0, 2, 2], [1, 1, 1], [2, 0, 2, 0, 0, 2, 1, 1]):  # an expert with no rows too
        route = torch.tensor(route)
        x = torch.randn(len(route), 8)
        names = [i.name for i in session.get_inputs()]
        got = session.run(None, {n: v.numpy() for n, v in zip(names, (x, route))})[0]
        np.testing.assert_allclose(got, eager(x, route).detach().numpy(), rtol=1e-5, atol=1e-6)
