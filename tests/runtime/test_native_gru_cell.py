"""torch.gru_cell as one autograd node (runtime/native/gru_cell.h): values
and gradients bit for bit equal to eager's on every path (zero, one and
several steps of a tensor loop, subsets of inputs requiring grad, odd sizes,
column-major operands, the state read by consumers made before and after
the cell), eager's errors, and eager's per-op path wherever one node could
not reproduce it exactly."""

import os

import pytest
import torch
import torch.nn as nn

import d2s
from runtime import native

_AVAILABLE = native.load() is not None
pytestmark = pytest.mark.skipif(not _AVAILABLE and not os.environ.get("D2S_REQUIRE_NATIVE"),
                                reason=f"native executor unavailable: {native.unavailable_reason()}")

ONE_NODE = "D2SGruCellBackward"
NAMES = ("x", "h", "w_ih", "w_hh", "b_ih", "b_hh")


def _inputs(batch, inp, hidden, dtype=torch.float32, layout="contiguous", seed=0):
    g = torch.Generator().manual_seed(seed)

    def make(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    x, h = make(6, batch, inp), make(batch, hidden)
    w_ih, w_hh = make(3 * hidden, inp), make(3 * hidden, hidden)
    b_ih, b_hh = make(3 * hidden), make(3 * hidden)
    if layout == "column_major":  # x[t], h and the weights stored transposed
        x = make(6, inp, batch).transpose(1, 2)
        h = make(hidden, batch).t()
        w_ih, w_hh = make(inp, 3 * hidden).t(), make(hidden, 3 * hidden).t()
    return [x, h, w_ih, w_hh, b_ih, b_hh]


def steps(x, n, h, w_ih, w_hh, b_ih, b_hh):
    """The cell over `n` rows of x, every state kept and read again (h is
    read by the next step, by the stack, and before the loop)."""
    hs = [h * 0.25]
    for t in range(n):
        h = torch.gru_cell(x[t], h, w_ih, w_hh, b_ih, b_hh)
        hs.append(h)
    return h.tanh() * h + torch.stack(hs).sum(0) * 0.5


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


WANTS = [(True,) * 6, (False, True, True, True, True, True), (True, False, False, False, False, False),
         (False, True, False, False, False, False), (False, False, True, False, False, True),
         (True, True, False, True, False, False)]


@pytest.mark.parametrize("n", [0, 1, 5])
@pytest.mark.parametrize("wants", WANTS, ids=lambda w: "".join("1" if v else "0" for v in w))
@pytest.mark.parametrize("layout", ["contiguous", "column_major"])
def test_values_and_gradients_bit_identical(n, wants, layout):
    _assert_same(static_steps, _inputs(3, 5, 7, layout=layout), n, wants)


@pytest.mark.parametrize("batch, inp, hidden", [(1, 1, 1), (1, 3, 8), (4, 32, 64), (2, 17, 9)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_odd_sizes_and_dtypes(batch, inp, hidden, dtype):
    _assert_same(static_steps, _inputs(batch, inp, hidden, dtype=dtype), 3, (True,) * 6)


def _one(tensors):
    @d2s.declarative
    def one(x, h, w_ih, w_hh, b_ih, b_hh):
        return torch.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)

    return one(tensors[0][0], *tensors[1:])


def test_one_program_holds_the_loop_and_takes_the_one_node_path():
    tensors = [t.requires_grad_() for t in _inputs(2, 3, 4)]
    static_steps(tensors[0], torch.tensor(2), *tensors[1:])
    program = static_steps.concrete_program
    assert any(op.type == "while" for op in program.main_program.global_block().ops)
    assert program.compiled.segments
    hy = _one(tensors)
    assert hy.grad_fn.name() == ONE_NODE
    h_edges = [edge for edge in hy.grad_fn.next_functions if edge[0] is tensors[1].grad_fn or
               (edge[0] is not None and getattr(edge[0], "variable", None) is tensors[1])]
    assert len(h_edges) == 2  # hx through `hx - n`, then through linear_hh, as eager's buffer sums them


class Decoder(nn.Module):
    """nn.GRUCell in a tensor loop whose state is also read outside the cell."""

    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(3, 5)
        self.out = nn.Linear(5, 2)

    def forward(self, x, n):
        h = torch.zeros(x.shape[1], 5)
        total = torch.zeros(x.shape[1], 2)
        for t in range(n):
            h = self.cell(x[t], h)
            total = total + self.out(h) * h.sum(-1, keepdim=True)
        return h, total


@pytest.mark.parametrize("n", [0, 1, 4])
def test_module_loop_parameters_gradients_bit_identical(n):
    torch.manual_seed(0)
    model = Decoder()
    static = d2s.declarative(model.forward)

    def loss(fn):
        model.zero_grad()
        x = torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(1)).requires_grad_()
        h, total = fn(x, torch.tensor(n))
        out = (h * 3).sum() + total.pow(2).sum() + x.sum()  # x: a graph to run backward on at zero trips
        out.backward()
        return [out, x.grad] + [p.grad for p in model.parameters()]

    for got, want in zip(loss(static), loss(model.forward)):
        assert (got is None) == (want is None)
        if want is not None:
            assert torch.equal(got, want)


@pytest.mark.parametrize("written", [0, 2], ids=["x", "w_ih"])
def test_in_place_write_after_the_call_is_eagers_error(written):
    """x is saved for w_ih's gradient, w_ih (as its t() view) for x's."""
    tensors = _inputs(2, 3, 4)
    for fn in (steps, static_steps):
        leaves = [t.detach().clone().requires_grad_(k >= 2) for k, t in enumerate(tensors)]
        leaves[0].requires_grad_(written != 0)  # w_ih.t() is saved for x's gradient
        out = fn(leaves[0], torch.tensor(2), *leaves[1:])
        with torch.no_grad():
            leaves[written].mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


@pytest.mark.parametrize("level", ["default", "fast"])
def test_output_version_is_eagers(level):
    """Eager's composite writes hy in place twice (`(hx - n).mul_(z).add_(n)`);
    the cell's calls run below autograd, which counts no write, so the
    version is set as eager's."""
    tensors = [t.requires_grad_(k >= 2) for k, t in enumerate(_inputs(2, 3, 4))]

    def one(x, h, w_ih, w_hh, b_ih, b_hh):
        return torch.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)

    args = [tensors[0][0]] + tensors[1:]
    hy = d2s.declarative(one, optimize=level)(*args)
    assert hy.grad_fn.name() == ONE_NODE
    assert hy._version == one(*args)._version == 2


def test_second_backward_is_eagers_error():
    tensors = [t.requires_grad_() for t in _inputs(2, 3, 4)]
    out = static_steps(tensors[0], torch.tensor(2), *tensors[1:]).sum()
    out.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()
    out = static_steps(tensors[0], torch.tensor(2), *tensors[1:]).sum()
    out.backward(retain_graph=True)
    out.backward()


def test_double_backward_recomputes_the_cell():
    """create_graph=True: first-order gradients bit for bit, second-order
    ones within rounding (see gru_cell.h)."""
    torch.manual_seed(0)
    model = Decoder()
    static = d2s.declarative(model.forward)

    def run(fn):
        x = torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(1)).requires_grad_()
        h, total = fn(x, torch.tensor(3))
        first = torch.autograd.grad((h * total.sum()).sum(), [x, model.cell.weight_ih], create_graph=True)
        second = torch.autograd.grad(sum(g.pow(2).sum() for g in first), [x, *model.parameters()])
        return first, second

    (f1, s1), (f2, s2) = run(static), run(model.forward)
    assert all(torch.equal(a, b) for a, b in zip(f1, f2))
    for a, b in zip(s1, s2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("context", ["saved_tensor_hooks", "anomaly", "no_grad", "aliased_state", "no_bias"])
def test_per_op_path_where_one_node_cannot_be_exact(context):
    tensors = [t.requires_grad_() for t in _inputs(2, 4, 4)]
    if context == "aliased_state":
        tensors[1] = tensors[0][0]  # h is x[0]: one buffer fed by several of the cell's nodes
    if context == "no_bias":
        tensors[4] = tensors[5] = None
    ctx = {"saved_tensor_hooks": torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
           "anomaly": torch.autograd.detect_anomaly(check_nan=False),
           "no_grad": torch.no_grad()}.get(context)
    with ctx if ctx is not None else torch.enable_grad():
        hy = _one(tensors)
        want = torch.gru_cell(tensors[0][0], *tensors[1:])
    assert torch.equal(hy, want)
    if context == "no_grad":
        assert hy.grad_fn is None
    else:
        assert hy.grad_fn.name() == want.grad_fn.name() != ONE_NODE
