"""`d2s.export`: a program as a torch.export.ExportedProgram with
`torch.cond` / `while_loop`. Its `.module()` and `torch.onnx.export` of it
match eager PyTorch on inputs taking every branch and trip count (the
quickstart model, a GRU decoder with `break` whose loop state keeps its
shape); checks of values raise where the program raises; tensor arrays and
growing loop state are refused with the reason."""

import copy
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

import d2s

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from quickstart import GatedRefiner  # noqa: E402
from models import GreedyDecoder  # noqa: E402
import exported_writes  # noqa: E402
from tests.d2s.test_decisions import attend  # noqa: E402


class ScoringDecoder(nn.Module):
    """GRU greedy decoding that keeps fixed-shape state: the hidden state,
    the last token, a per-sequence score and a step count; stops at
    `max_len` or, with `break`, once every sequence has produced `eos`."""

    def __init__(self, vocab=20, hidden=16, eos=1):
        super().__init__()
        self.eos = eos
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, h, max_len):
        token = torch.zeros(h.shape[0], dtype=torch.long)
        done = torch.zeros(h.shape[0], dtype=torch.bool)
        score = torch.zeros(h.shape[0])
        step = 0
        while step < max_len:
            h = self.cell(self.embed(token), h)
            logp = torch.log_softmax(self.out(h), -1)
            token = logp.argmax(-1)
            score = score + logp.max(-1).values * (~done).float()
            done = done | (token == self.eos)
            step += 1
            if done.all():
                break
        return h, score, step


def _ops(graph_module):
    """The call targets in the exported graph and its subgraphs."""
    names = set()
    for module in graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            names |= {n.target for n in module.graph.nodes if n.op == "call_function"}
    return names


def _onnx_session(exported):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    program = torch.onnx.export(exported, dynamo=True, verbose=False)
    return ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _same(got, want):
    got = got if isinstance(got, (list, tuple)) else [got]
    want = want if isinstance(want, (list, tuple)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = torch.as_tensor(w)
        g = torch.as_tensor(np.asarray(g))
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("refine_bias", [None, 3.0])  # 3.0: the state stays large, the loop runs 4 trips
def test_quickstart_round_trip_every_branch_and_trip_count(refine_bias):
    torch.manual_seed(0)
    eager = GatedRefiner().eval()
    if refine_bias is not None:
        with torch.no_grad():
            eager.refine.bias.fill_(refine_bias)
    exported = d2s.export(d2s.declarative(copy.deepcopy(eager)), input_spec=[d2s.InputSpec([None, 8])])
    assert isinstance(exported, torch.export.ExportedProgram)
    assert {torch.ops.higher_order.cond, torch.ops.higher_order.while_loop} <= _ops(exported.graph_module)
    module, session = exported.module(), _onnx_session(exported)
    trips, branches = set(), set()
    for x in [torch.randn(4, 8) * 3, torch.randn(4, 8) * 0.05, -torch.ones(4, 8), torch.ones(1, 8) * 0.01,
              torch.randn(7, 8)]:
        h = torch.tanh(eager.encode(x))
        steps = 0
        while h.abs().mean() > 0.2 and steps < 4:
            h, steps = 0.5 * torch.tanh(eager.refine(h)), steps + 1
        trips.add(steps)
        branches.add(bool(h.mean() > 0))
        with torch.no_grad():
            want = eager(x)
            _same(module(x), want)
        _same(session.run(None, {session.get_inputs()[0].name: x.numpy()}), want)
    if refine_bias is None:
        assert trips >= {0, 1} and branches == {True, False}
    else:
        assert trips >= {0, 4}


@pytest.fixture(scope="module")
def decoder():
    torch.manual_seed(1)
    eager = ScoringDecoder().eval()
    spec = [d2s.InputSpec([None, 16]), d2s.InputSpec([], "int64")]
    exported = d2s.export(d2s.declarative(copy.deepcopy(eager)), input_spec=spec)
    return eager, exported, exported.module(), _onnx_session(exported)


@pytest.mark.parametrize("eos_bias, max_len, batch, steps", [
    (-5.0, 0, 3, 0),     # no trip
    (-5.0, 1, 1, 1),     # one trip, batch of one
    (-5.0, 6, 3, 6),     # runs to max_len
    (50.0, 6, 5, 1),     # every sequence emits eos at once: break after the first trip
])
def test_gru_decoder_round_trip_with_break(decoder, eos_bias, max_len, batch, steps):
    eager, exported, _, _ = decoder
    with torch.no_grad():
        eager.out.bias[1] = eos_bias
        # The exported program holds the parameters as buffers: set the same bias there.
        for name, buf in exported.named_buffers():
            if name.endswith("out_bias"):
                buf[1] = eos_bias
    module, session = exported.module(), _onnx_session(exported)
    h = torch.randn(batch, 16)
    with torch.no_grad():
        want = eager(h, torch.tensor(max_len))
        assert want[2] == steps
        want = (want[0], want[1], torch.tensor(want[2]))
        _same(module(h, torch.tensor(max_len)), want)
    names = [i.name for i in session.get_inputs()]
    _same(session.run(None, dict(zip(names, [h.numpy(), np.array(max_len)]))), want)


def test_tensor_arrays_are_refused_with_the_reason():
    spec = [d2s.InputSpec([None, 32]), d2s.InputSpec([], "int64")]
    with pytest.raises(d2s.ExportError, match=r"tensor array \(a list appended in a loop\).*d2s.onnx.export"):
        d2s.export(d2s.declarative(GreedyDecoder().eval()), input_spec=spec)


@d2s.declarative
def _grows(x, n):
    out = x
    i = 0
    while i < n:
        out = torch.cat([out, x], 0)
        i += 1
    return out


def test_growing_loop_state_is_refused_with_the_reason():
    with pytest.raises(d2s.ExportError, match=r"loop variable 'out\w*' changes shape between trips .*while_loop"):
        d2s.export(_grows, input_spec=[d2s.InputSpec([None, 3]), d2s.InputSpec([], "int64")])


def _input_strides(x):
    return x * 1.0 + x.stride(0)


def _path_strides(x):
    y = x.t() if x.sum() > 0 else x.t().contiguous()
    return y * 1.0 + y.stride(0)


@pytest.mark.parametrize("fn", [_input_strides, _path_strides])
def test_a_program_that_read_strides_is_refused(fn):
    """An ExportedProgram keeps no strides: it could neither promise the
    layout of an input nor of a value whose layout depends on the path."""
    with pytest.raises(d2s.ExportError, match=r"reads strides and was converted for one layout of"):
        d2s.export(d2s.declarative(fn), input_spec=[d2s.InputSpec([2, 4])])


@d2s.declarative
def _write_through_a_view(x):
    row = x[0]
    if x.sum() > 0:
        row.add_(1)  # eager: x changes too
    return x


def test_an_in_place_write_to_a_view_across_a_branch_is_refused():
    with pytest.raises(d2s.ExportError, match=r"'torch.Tensor.add_': it writes .*shares memory with a view"):
        d2s.export(_write_through_a_view, input_spec=[d2s.InputSpec([None, 3])])


@pytest.mark.parametrize("fn, op_type", exported_writes.CASES, ids=lambda c: getattr(c, "__name__", c))
def test_an_in_place_write_inside_a_branch_or_loop_comes_out_of_it(fn, op_type):
    exported = d2s.export(d2s.declarative(fn), input_spec=[d2s.InputSpec([None, 3])])
    target = {"cond": torch.ops.higher_order.cond, "while": torch.ops.higher_order.while_loop}[op_type]
    assert target in _ops(exported.graph_module)
    for x in exported_writes.inputs():
        _same(exported.module()(x), fn(x.clone()))


def test_a_model_writing_its_own_state_is_refused():
    with pytest.raises(d2s.ExportError, match=r"'torch.Tensor.add_' writes the model's state 'count'"):
        d2s.export(d2s.declarative(exported_writes.CountsCalls()), input_spec=[d2s.InputSpec([None, 3])])


def _causal(q):
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=q.shape[2] > 3)


def _gated_mean(x):
    m = x.mean()
    assert m > -10, "mean too small"
    return x * m


def test_a_size_check_becomes_a_runtime_assertion():
    # Converted for a length > 3, the program decided is_causal=True and
    # checks s0 > 3; the ExportedProgram keeps the check instead of dropping it.
    spec = [d2s.InputSpec([1, 2, None, 4])]
    static = d2s.declarative(_causal, input_spec=spec)
    static(torch.randn(1, 2, 5, 4))
    assert "check_sizes" in {op.type for op in static.program_cache.last.main_program.global_block().ops}
    module = d2s.export(static, input_spec=spec).module()
    for n in (4, 9):
        q = torch.randn(1, 2, n, 4)
        torch.testing.assert_close(module(q), _causal(q))
    with pytest.raises(Exception, match=r"size\(\)\[2\]|>= 4"):
        module(torch.randn(1, 2, 3, 4))  # not causal in eager: the module refuses


def _checked_halving(x):
    while x.sum() > 1:
        if x.min() < 0:
            raise ValueError("negative entry")
        x = x / 2
    return x


FULL, PADDED = torch.ones(2, 3), torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


CHECK, WHILE, COND = torch.ops.d2s.check.default, torch.ops.higher_order.while_loop, torch.ops.higher_order.cond


@pytest.mark.parametrize("fn, spec, ok, failing, message, graph_ops", [
    (_gated_mean, [None, 3], [torch.ones(2, 3), torch.ones(4, 3) * -2], torch.ones(2, 3) * -20, "mean too small",
     {CHECK}),
    # a `raise` on one side of an `if` in a loop body: zero, one and several
    # trips (that side always raises: a check in the body, the other inline)
    (_checked_halving, [None], [torch.zeros(2), torch.ones(2), torch.arange(4.0)], torch.tensor([10.0, -1.0]),
     "negative entry", {CHECK, WHILE}),
])
def test_a_check_of_tensor_values_raises_when_the_module_runs(fn, spec, ok, failing, message, graph_ops):
    static = d2s.declarative(fn, input_spec=[d2s.InputSpec(spec)])
    exported = d2s.export(static)
    assert graph_ops <= _ops(exported.graph_module)
    module = exported.module()
    for x in ok:
        _same(module(x), fn(x))
    with pytest.raises(Exception, match=message):
        fn(failing)
    with pytest.raises(RuntimeError, match=message):  # (the message names eager's exception type)
        module(failing)


@pytest.mark.parametrize("taken, other", [(FULL, PADDED), (PADDED, FULL)])
def test_the_side_not_converted_raises_where_the_program_does(taken, other):
    # `None` or a mask: values the program cannot merge, so it holds the
    # side its example took; the other side raises (DecisionFailed in d2s).
    static = d2s.declarative(attend)
    x = torch.randn(2, 3, 3)
    static(x, taken)
    assert {"cond", "decision_failed"} <= {op.type for b in static.program_cache.last.main_program.blocks
                                           for op in b.ops}
    exported = d2s.export(static)
    assert CHECK in _ops(exported.graph_module) and COND not in _ops(exported.graph_module)  # checked, inline
    module = exported.module()
    _same(module(x, taken), attend(x, taken))
    with pytest.raises(RuntimeError, match="converted for inputs that take the"):
        module(x, other)


def _nested_return(x):
    if x.sum() > 0:
        if x.max() > 2:
            return x * 2
        x = x + 1
    return x - 1


def test_a_return_inside_nested_branches():
    # The inner `if` yields the return flag of the outer scope unchanged on
    # one side: the outer branch takes it from outside too.
    static = d2s.declarative(_nested_return, input_spec=[d2s.InputSpec([None])])
    exported = d2s.export(static)
    assert COND in _ops(exported.graph_module)
    module = exported.module()
    for x in (torch.tensor([3.0, 1.0]), torch.tensor([1.0, 0.5]), torch.tensor([-3.0, 1.0])):
        _same(module(x), _nested_return(x))


def _pad_to(x, y):
    if x.shape[0] < y.shape[0]:  # sizes: a mask padded to the keys' length
        x = torch.nn.functional.pad(x, (0, y.shape[0] - x.shape[0]))
    return x + y


def test_a_size_test_whose_sides_differ_in_size_is_a_guard():
    spec = [d2s.InputSpec([None]), d2s.InputSpec([None])]
    static = d2s.declarative(_pad_to, input_spec=spec)
    module = d2s.export(static, input_spec=spec).module()
    for n in (3, 6):  # the side the conversion's sizes take (equal lengths), at other sizes
        x, y = torch.randn(n), torch.randn(n)
        _same(module(x, y), _pad_to(x, y))
    with pytest.raises(Exception, match=r"[Gg]uard|size"):
        module(torch.randn(2), torch.randn(5))


def test_torch_onnx_refuses_a_graph_with_checks_of_values():
    # torch.onnx drops torch._assert_async: an ONNX model of the graph would
    # compute on where the program raises. d2s's own check op it cannot drop.
    pytest.importorskip("onnxscript")
    exported = d2s.export(d2s.declarative(_gated_mean, input_spec=[d2s.InputSpec([None, 3])]))
    assert torch.ops.d2s.check.default in _ops(exported.graph_module)
    with pytest.raises(Exception, match=r"d2s\.check"):
        torch.onnx.export(exported, dynamo=True, verbose=False)


class _Tower(nn.Module):
    """Five stride-2 convolutions: at a small example size the last maps
    are one pixel wide, which torch.export fixes (a guard)."""

    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(*[nn.Conv2d(3 if i == 0 else 4, 4, 3, stride=2, padding=1) for i in range(5)])

    def forward(self, x):
        return self.convs(x).mean((2, 3))


def test_the_trace_takes_the_sizes_the_program_was_converted_at():
    torch.manual_seed(0)
    model = _Tower().eval()
    spec = [d2s.InputSpec([None, 3, None, None])]
    module = d2s.export(d2s.declarative(copy.deepcopy(model)), input_spec=spec).module()
    for size in (48, 64, 96):
        x = torch.randn(2, 3, size, size)
        _same(module(x), model(x))


def _flagged(x, y):
    longer = x.shape[0] > y.shape[0]  # a test of sizes, read inside a tensor `if`
    if x.sum() > 0:
        if longer:
            z = x * 2
        else:
            z = x * 3
    else:
        z = x - 1
    return z


@pytest.mark.parametrize("n, m, sign", [(3, 2, 1.0), (2, 3, 1.0), (3, 2, -1.0), (4, 4, 1.0)])
def test_a_test_of_sizes_read_inside_a_branch_takes_each_side(n, m, sign):
    # It comes into the torch.cond as a bool tensor: closed over, the trace
    # fixed it to the example's side (a guard refusing the other).
    spec = [d2s.InputSpec([None]), d2s.InputSpec([None])]
    exported = d2s.export(d2s.declarative(_flagged, input_spec=spec), input_spec=spec)
    assert COND in _ops(exported.graph_module)
    module = exported.module()
    x, y = torch.ones(n) * sign, torch.ones(m)
    _same(module(x, y), _flagged(x, y))
