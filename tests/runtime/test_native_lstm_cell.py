"""torch.lstm_cell as two autograd nodes (runtime/native/lstm_cell.h): values
and gradients bit for bit equal to eager's on every path (zero, one and
several steps of a tensor loop, every subset of inputs requiring grad, odd
sizes, column-major and transposed operands, outputs read several times),
eager's errors (in-place writes, a second backward), and eager's per-op path
wherever the two nodes could not reproduce it exactly."""

import itertools
import os

import pytest
import torch
import torch.nn as nn

import d2s
from runtime import native

_AVAILABLE = native.load() is not None
pytestmark = pytest.mark.skipif(not _AVAILABLE and not os.environ.get("D2S_REQUIRE_NATIVE"),
                                reason=f"native executor unavailable: {native.unavailable_reason()}")

ONE_NODE = "D2SLstmCellBackward"  # cy's grad_fn; hy's is D2SLstmCellHyBackward
NAMES = ("x", "h", "c", "w_ih", "w_hh", "b_ih", "b_hh")


def _inputs(batch, inp, hidden, dtype=torch.float32, layout="contiguous", seed=0):
    g = torch.Generator().manual_seed(seed)

    def make(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    x, h, c = make(6, batch, inp), make(batch, hidden), make(batch, hidden)
    w_ih, w_hh = make(4 * hidden, inp), make(4 * hidden, hidden)
    b_ih, b_hh = make(4 * hidden), make(4 * hidden)
    if layout == "column_major":  # x[t], h and the weights stored transposed
        x = make(6, inp, batch).transpose(1, 2)
        h = make(hidden, batch).t()
        w_ih, w_hh = make(inp, 4 * hidden).t(), make(hidden, 4 * hidden).t()
    return [x, h, c, w_ih, w_hh, b_ih, b_hh]


def steps(x, n, h, c, w_ih, w_hh, b_ih, b_hh):
    """The cell over `n` rows of x, every state kept and read again."""
    hs = [h]
    cs = [c]
    for t in range(n):
        h, c = torch.lstm_cell(x[t], (h, c), w_ih, w_hh, b_ih, b_hh)
        hs.append(h)
        cs.append(c)
    return h * c + torch.stack(hs).sum(0) * 0.5 + torch.stack(cs).pow(2).sum(0)


static_steps = d2s.declarative(steps)


def _grads(fn, tensors, n, wants):
    leaves = [t.detach().clone().requires_grad_(w) for t, w in zip(tensors, wants)]
    out = fn(leaves[0], torch.tensor(n), *leaves[1:])
    if out.requires_grad:  # not when no step ran and only x requires grad
        (out * torch.linspace(-1.0, 1.0, out.shape[-1], dtype=out.dtype)).sum().backward()
    return out, [t.grad for t in leaves]


def _assert_same(fn, tensors, n, wants):
    want_out, want_grads = _grads(steps, tensors, n, wants)
    got_out, got_grads = _grads(fn, tensors, n, wants)
    assert torch.equal(got_out, want_out)
    for name, g, w in zip(NAMES, got_grads, want_grads):
        assert (g is None) == (w is None), name
        if w is not None:
            assert g.stride() == w.stride(), name
            assert torch.equal(g, w), (name, (g - w).abs().max())


WANTS = [(True,) * 7, (False, True, True, True, True, True, True), (True, False, False, False, False, False, False),
         (False, False, True, False, False, False, False), (False, False, False, True, False, False, True),
         (True, True, False, True, True, False, False)]


@pytest.mark.parametrize("n", [0, 1, 5])
@pytest.mark.parametrize("wants", WANTS, ids=lambda w: "".join("1" if v else "0" for v in w))
@pytest.mark.parametrize("layout", ["contiguous", "column_major"])
def test_values_and_gradients_bit_identical(n, wants, layout):
    _assert_same(static_steps, _inputs(3, 5, 7, layout=layout), n, wants)


@pytest.mark.parametrize("batch, inp, hidden", [(1, 1, 1), (1, 3, 8), (4, 32, 64), (2, 17, 9)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_odd_sizes_and_dtypes(batch, inp, hidden, dtype):
    _assert_same(static_steps, _inputs(batch, inp, hidden, dtype=dtype), 3, (True,) * 7)


def test_one_program_holds_the_loop_and_takes_the_two_node_path():
    tensors = [t.requires_grad_() for t in _inputs(2, 3, 4)]
    static_steps(tensors[0], torch.tensor(2), *tensors[1:])
    program = static_steps.concrete_program
    assert any(op.type == "while" for op in program.main_program.global_block().ops)
    assert program.compiled.segments

    @d2s.declarative
    def one(x, h, c, w_ih, w_hh, b_ih, b_hh):
        return torch.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)

    hy, cy = one(tensors[0][0], *tensors[1:])
    assert cy.grad_fn.name() == ONE_NODE and hy.grad_fn.name() == "D2SLstmCellHyBackward"
    assert [edge[0] for edge in hy.grad_fn.next_functions] == [cy.grad_fn, cy.grad_fn]


class Module(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(3, 5)

    def forward(self, x, n):
        h = torch.zeros(x.shape[1], 5)
        c = torch.zeros(x.shape[1], 5)
        for t in range(n):
            h, c = self.cell(x[t], (h, c))
        return h, c


@pytest.mark.parametrize("reads", ["h only", "c only", "c three times", "both, interleaved"])
def test_outputs_read_several_ways(reads):
    """hy unused (a zero gradient for the output gate), cy read by several
    consumers made before and after hy's: the sums are eager's."""
    torch.manual_seed(0)
    model = Module()
    static = d2s.declarative(model.forward)

    def loss(fn):
        model.zero_grad()
        h, c = fn(torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(1)), torch.tensor(3))
        if reads == "h only":
            out = h.sum()
        elif reads == "c only":
            out = c.pow(2).sum()
        elif reads == "c three times":
            out = (c * 2).sum() + (c * h).sum() + c.exp().sum()
        else:
            a = (c * h).sum()
            out = a + h.tanh().sum() * c.sum() + (h * 3).sum()
        out.backward()
        return [p.grad.clone() for p in model.parameters()]

    for got, want in zip(loss(static), loss(model.forward)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("written", [0, 3], ids=["x", "w_ih"])
def test_in_place_write_after_the_call_is_eagers_error(written):
    """x is saved for w_ih's gradient, w_ih (as its t() view) for x's."""
    tensors = _inputs(2, 3, 4)
    for fn in (steps, static_steps):
        leaves = [t.detach().clone().requires_grad_(k >= 3) for k, t in enumerate(tensors)]
        leaves[0].requires_grad_(written != 0)  # w_ih.t() is saved for x's gradient
        out = fn(leaves[0], torch.tensor(2), *leaves[1:])
        with torch.no_grad():
            leaves[written].mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


@pytest.mark.parametrize("level", ["default", "fast"])
def test_output_versions_are_eagers(level):
    """Eager's composite writes cy in place once; the cell's calls run below
    autograd, which counts no write, so the version is set as eager's."""
    tensors = [t.requires_grad_(k >= 3) for k, t in enumerate(_inputs(2, 3, 4))]

    def one(x, h, c, w_ih, w_hh, b_ih, b_hh):
        return torch.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)

    args = [tensors[0][0]] + tensors[1:]
    hy, cy = d2s.declarative(one, optimize=level)(*args)
    want_hy, want_cy = one(*args)
    assert hy.grad_fn.name() == "D2SLstmCellHyBackward"
    assert (hy._version, cy._version) == (want_hy._version, want_cy._version) == (0, 1)


def test_second_backward_is_eagers_error():
    tensors = [t.requires_grad_() for t in _inputs(2, 3, 4)]
    out = static_steps(tensors[0], torch.tensor(2), *tensors[1:]).sum()
    out.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()
    out = static_steps(tensors[0], torch.tensor(2), *tensors[1:]).sum()
    out.backward(retain_graph=True)
    out.backward()


def test_grad_of_some_inputs():
    tensors = [t.requires_grad_() for t in _inputs(2, 3, 4)]
    for subset in ([0], [3], [2, 6], [1, 4]):
        got = torch.autograd.grad(static_steps(tensors[0], torch.tensor(3), *tensors[1:]).sum(),
                                  [tensors[k] for k in subset])
        want = torch.autograd.grad(steps(tensors[0], torch.tensor(3), *tensors[1:]).sum(),
                                   [tensors[k] for k in subset])
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_double_backward_recomputes_the_cell():
    """create_graph=True: first-order gradients bit for bit; the gradient of
    a gradient within rounding (the recomputed cell's nodes are made during
    the backward, so the second backward sums in another order)."""
    torch.manual_seed(0)
    model = Module()
    static = d2s.declarative(model.forward)

    def run(fn):
        x = torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(1)).requires_grad_()
        h, c = fn(x, torch.tensor(4))
        first = torch.autograd.grad((h * c).sum(), [x, model.cell.weight_ih], create_graph=True)
        second = torch.autograd.grad(sum(g.pow(2).sum() for g in first), [x, *model.parameters()])
        return first, second

    (f1, s1), (f2, s2) = run(static), run(model.forward)
    assert all(torch.equal(a, b) for a, b in zip(f1, f2))
    for a, b in zip(s1, s2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_double_backward_refuses_inputs_written_since_the_call():
    torch.manual_seed(0)
    model = Module()
    static = d2s.declarative(model.forward)
    x = torch.randn(4, 2, 3).requires_grad_()
    h, c = static(x, torch.tensor(2))
    with torch.no_grad():
        model.cell.bias_ih.add_(1.0)  # not saved by eager's nodes, but the recomputation reads it
    with pytest.raises(RuntimeError, match="recomputes the cell from its inputs, and its b_ih argument"):
        torch.autograd.grad(h.sum(), [x], create_graph=True)


def _one(tensors):
    @d2s.declarative
    def one(x, h, c, w_ih, w_hh, b_ih, b_hh):
        return torch.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)

    return one(tensors[0][0], *tensors[1:])


@pytest.mark.parametrize("context", ["saved_tensor_hooks", "anomaly", "no_grad", "aliased_state", "no_bias"])
def test_per_op_path_where_two_nodes_cannot_be_exact(context):
    tensors = [t.requires_grad_() for t in _inputs(2, 3, 4)]
    if context == "aliased_state":
        tensors[2] = tensors[1]
    if context == "no_bias":
        tensors[5] = tensors[6] = None
    ctx = {"saved_tensor_hooks": torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
           "anomaly": torch.autograd.detect_anomaly(check_nan=False),
           "no_grad": torch.no_grad()}.get(context)
    with ctx if ctx is not None else torch.enable_grad():
        hy, cy = _one(tensors)
        want_hy, want_cy = torch.lstm_cell(tensors[0][0], (tensors[1], tensors[2]), *tensors[3:])
    assert torch.equal(hy, want_hy) and torch.equal(cy, want_cy)
    if context == "no_grad":
        assert hy.grad_fn is None
    else:
        assert cy.grad_fn.name() == want_cy.grad_fn.name() != ONE_NODE


def test_tensor_hooks_and_retain_grad_on_the_outputs():
    tensors = [t.requires_grad_() for t in _inputs(2, 3, 4)]
    seen = []
    for fn in (_one, lambda ts: torch.lstm_cell(ts[0][0], (ts[1], ts[2]), *ts[3:])):
        for t in tensors:
            t.grad = None
        hy, cy = fn(tensors)
        hy.retain_grad()
        handle = cy.register_hook(lambda g: g * 2)
        (hy * cy).sum().backward()
        handle.remove()
        seen.append([hy.grad] + [t.grad for t in tensors])
    assert all(torch.equal(a, b) for a, b in itertools.zip_longest(*seen))
