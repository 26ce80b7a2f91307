"""Native control flow (runtime/native/flow.h, lower_flow.py): a `while` or
`cond` whose blocks lower runs as one C++ call. Values, gradients and the
autograd graph against eager, bit for bit, on zero, one and several trips,
both branches and `break`; what a flow gives back to Python (a trip it
cannot finish, an input it cannot take) and the Python path taking over."""

import os
import re

import pytest
import torch
import torch.nn.functional as F

import d2s
from runtime import native

pytestmark = pytest.mark.skipif(native.load() is None and not os.environ.get("D2S_REQUIRE_NATIVE"),
                                reason=f"native executor unavailable: {native.unavailable_reason()}")


def _compiled(fn):
    return fn.concrete_program.compiled


def _root_flow(compiled):
    """The flow the generated function calls at its top level (not inside
    a fallback path), and the names of its arguments and results."""
    m = re.search(r"^    s_done, (.*) = (flow_\d+)\((.*)\)$", compiled.source, re.M)
    assert m, compiled.source
    flow = compiled.fn.__globals__[m.group(2)]
    return flow, m.group(1).split(", "), m.group(3).split(", ")


def _graph(t):
    """The names of the autograd nodes behind `t`, breadth first."""
    seen, order, todo = set(), [], [t.grad_fn]
    while todo:
        node = todo.pop(0)
        if node is None or node in seen:
            continue
        seen.add(node)
        order.append(type(node).__name__)
        todo += [n for n, _ in node.next_functions]
    return order


def _run_both(fn, make_args, level="default"):
    """(static results, eager results, static args, eager args); checks the
    op ran as a flow that gave nothing back."""
    static = d2s.declarative(fn, optimize=level)
    static_args, eager_args = make_args(), make_args()
    static(*make_args())  # build
    got, want = static(*static_args), fn(*eager_args)
    flow, _, _ = _root_flow(_compiled(static))
    assert flow.fallbacks() == 0, flow.last_fallback()
    return got, want, static_args, eager_args


def _check_equal(got, want, static_args, eager_args, graph=True):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype and torch.equal(g, w), (g, w)
        else:
            assert type(g) is type(w) and g == w
    floats = [(g, w) for g, w in zip(got, want) if isinstance(w, torch.Tensor) and w.requires_grad]
    if not floats:
        return
    if graph:
        assert [_graph(g) for g, _ in floats] == [_graph(w) for _, w in floats]
    sum(g.sum() for g, _ in floats).backward()
    sum(w.sum() for _, w in floats).backward()
    for a, b in zip(static_args, eager_args):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            assert (a.grad is None) == (b.grad is None)  # argmax's operands get none
            assert a.grad is None or torch.equal(a.grad, b.grad)


def rnn(x, n, w, u):
    h = torch.zeros(x.shape[0], w.shape[1])
    for t in range(n):
        h = torch.tanh(x[:, t] @ w + h @ u)  # (`w.t()` would be hoisted at the fast level: Python's)
    return h


def _rnn_args(n):
    def make():
        g = torch.Generator().manual_seed(0)
        return (torch.randn(3, 6, 4, generator=g), torch.tensor(n),
                torch.randn(4, 5, generator=g).requires_grad_(), torch.randn(5, 5, generator=g).requires_grad_())
    return make


@pytest.mark.parametrize("level", ["default", "fast"])
@pytest.mark.parametrize("n", [0, 1, 6])
def test_loop_over_a_tensor_length(n, level):
    """The counter, its test, the slice per step and the carried state stay
    in C++; zero, one and every step; the fast level's fused segments too."""
    got, want, sa, ea = _run_both(rnn, _rnn_args(n), level)
    if level == "default":
        _check_equal(got, want, sa, ea)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def decode(h, max_len, emb, w_ih, w_hh, b_ih, b_hh, w_out, b_out):
    token = torch.zeros(h.shape[0], dtype=torch.long)
    done = torch.zeros(h.shape[0], dtype=torch.bool)
    tokens = []
    step = 0
    while step < max_len:
        h = torch.gru_cell(F.embedding(token, emb), h, w_ih, w_hh, b_ih, b_hh)
        token = (h @ w_out + b_out).argmax(-1)
        tokens.append(token)
        done = done | (token == 1)
        step += 1
        if done.all():
            break
    return h, step, torch.stack(tokens, 1)


def _decode_args(max_len, eos_bias):
    def make():
        g = torch.Generator().manual_seed(1)
        b_out = torch.zeros(7)
        b_out[1] = eos_bias  # +50: the first token is eos (break); -50: never (the loop runs out)
        params = [torch.randn(*s, generator=g).requires_grad_()
                  for s in [(7, 4), (12, 4), (12, 4), (12,), (12,), (4, 7)]]
        return (torch.randn(2, 4, generator=g), torch.tensor(max_len), *params, b_out)
    return make


@pytest.mark.parametrize("max_len, eos_bias", [(1, -50.0), (5, -50.0), (5, 50.0)])
def test_greedy_decoder_with_break_and_appends(max_len, eos_bias):
    """`while step < max_len` with `if done.all(): break` and a list
    appended each step: the break flag, the counter (a Python int after the
    loop) and the appends stay in C++; gru_cell's node is the segments'."""
    got, want, sa, ea = _run_both(decode, _decode_args(max_len, eos_bias))
    assert got[1] == want[1] == (1 if eos_bias > 0 else max_len)
    _check_equal(got, want, sa, ea, graph=False)  # gru_cell: one node of ours for eager's 16


def branch(x, w):
    y = torch.tanh(x @ w)
    if y.mean() > 0:
        out = y * 2.0
    else:
        out = y - 1.0
    return out


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_takes_either_branch(sign):
    def make():
        g = torch.Generator().manual_seed(2)
        return torch.rand(3, 4, generator=g) * sign, torch.rand(4, 4, generator=g).requires_grad_()
    _check_equal(*_run_both(branch, make))


def nested(x, n, m):
    acc = x * 0.0
    i = 0
    while i < n:
        j = 0
        while j < m:
            acc = torch.tanh(acc + x)
            j += 1
        if acc.sum() > 0:
            acc = acc * 0.5
        i += 1
    return acc


@pytest.mark.parametrize("n, m", [(0, 2), (2, 0), (3, 2)])
def test_nested_loops_and_cond_in_one_call(n, m):
    def make():
        return torch.randn(2, 3, generator=torch.Generator().manual_seed(3)).requires_grad_(), \
            torch.tensor(n), torch.tensor(m)
    _check_equal(*_run_both(nested, make))


def collect(x, n):
    ys = []
    for t in range(n):
        ys.append(torch.tanh(x[t]))
    return torch.stack(ys)


def test_a_trip_that_fails_is_given_back_at_its_head():
    """Past the end of the sequence, the flow hands back the state at the
    head of the failing trip: the counter, and the list holding the finished
    trips' elements only (the same list object)."""
    static = d2s.declarative(collect)
    x = torch.randn(4, 3)
    torch.testing.assert_close(static(x, torch.tensor(4)), torch.tanh(x), rtol=0, atol=0)
    flow, outs, args = _root_flow(_compiled(static))
    values = dict(zip(args, [None] * len(args)))
    slices = x.unbind(0)[:2]  # two of four: trip 2 cannot index
    for name in args:
        values[name] = {"tuple": slices, "list": [], "int": 0, "n": 4}.get(_role(name))
    given = [values[n] for n in args]
    done, *state = flow(*given)
    assert done is False and "out of range" in flow.last_fallback()
    by_name = dict(zip(outs, state))
    ys = next(v for n, v in by_name.items() if isinstance(v, list))
    assert ys is next(g for g in given if isinstance(g, list))
    assert len(ys) == 2 and all(torch.equal(y, torch.tanh(s)) for y, s in zip(ys, slices))
    assert sorted(v for v in by_name.values() if type(v) is int) == [2]


def _role(name):
    if "slices" in name:
        return "tuple"
    if "ys" in name or "array" in name:
        return "list"
    if "ctr" in name:
        return "int"
    return "n"


def test_index_past_the_end_raises_eagers_error():
    static = d2s.declarative(collect)
    x = torch.randn(3, 2)
    static(x, torch.tensor(2))
    with pytest.raises(IndexError):
        collect(x, torch.tensor(5))
    with pytest.raises(Exception) as info:  # the Python path's error, at the user's line
        static(x, torch.tensor(5))
    assert isinstance(info.value.__cause__ or info.value, IndexError) and "ys.append" in str(info.value)
    flow, _, _ = _root_flow(_compiled(static))
    assert flow.fallbacks() == 1 and "out of range" in flow.last_fallback()


class Seen(torch.Tensor):
    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        Seen.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_subclass_input_runs_the_python_path():
    """A tensor subclass must see every call: the flow does not start, and
    gives the loop variables back as they were given."""
    static = d2s.declarative(rnn)
    args = _rnn_args(3)()
    static(*args)
    x = args[0].as_subclass(Seen)
    Seen.calls = 0
    got = static(x, *args[1:])
    assert Seen.calls > 0
    flow, _, _ = _root_flow(_compiled(static))
    assert flow.fallbacks() == 1 and "plain tensor" in flow.last_fallback()
    torch.testing.assert_close(got.as_subclass(torch.Tensor), rnn(*args), rtol=0, atol=0)


@pytest.mark.parametrize("fn, make", [(rnn, _rnn_args(6)), (decode, _decode_args(5, -50.0))])
def test_no_grad_calls_run_the_in_place_variant_as_a_flow(fn, make):
    static = d2s.declarative(fn)
    with torch.no_grad():
        static(*make())
        got, want = static(*make()), fn(*make())
        flow, _, _ = _root_flow(static.concrete_program._inference)
    assert flow.fallbacks() == 0, flow.last_fallback()
    _check_equal(got, want, (), ())


def spin(x, n):
    i = 0
    while i < n:
        x = x + 1.0
        i += 1
    return x


class _Stop(BaseException):  # as KeyboardInterrupt: not wrapped in the op error
    pass


def test_a_signal_handler_interrupts_a_long_loop():
    """Python checks signals between bytecodes, so Ctrl-C stops its loop; a
    flow checks them every 64 trips. Without that, the handler would run
    only after the flow's 10**9 trips (a hang, which is this test failing)."""
    import signal

    static = d2s.declarative(spin)
    static(torch.zeros(1), torch.tensor(3))

    def stop(*_):
        raise _Stop

    old = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(_Stop):
            static(torch.zeros(1), torch.tensor(10 ** 9))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def rnn_t(x, n, w, u):
    h = torch.zeros(x.shape[0], w.shape[0])
    for t in range(n):
        h = torch.tanh(x[:, t] @ w.t() + h @ u)  # `w.t()`: hoisted out of the loop at the fast level
    return h


@pytest.mark.parametrize("n", [0, 1, 6])
def test_hoisted_invariants_run_once_per_call(n):
    def make():
        g = torch.Generator().manual_seed(0)
        return (torch.randn(3, 6, 4, generator=g), torch.tensor(n),
                torch.randn(5, 4, generator=g).requires_grad_(), torch.randn(5, 5, generator=g).requires_grad_())
    static = d2s.declarative(rnn_t, optimize="fast")
    static(*make())
    assert "is None:" in _compiled(static).source  # the hoisted `t()` (its Python path)
    sa, ea = make(), make()
    got, want = static(*sa), rnn_t(*ea)
    flow, _, _ = _root_flow(_compiled(static))
    assert flow.fallbacks() == 0, flow.last_fallback()
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # values: the same kernels
    if n:
        got.sum().backward()
        want.sum().backward()
        for a, b in zip(sa[2:], ea[2:]):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)  # hoist_invariants' tolerance


def scaled(x, n):
    y = x * 0.0
    for t in range(n):
        y = y + x * t  # `t` a Python int, made a 0-d tensor for the product
        if t > 2:
            y = y * 0.5
    return y


@pytest.mark.parametrize("n", [0, 2, 5])
def test_counters_made_tensors_inside_the_loop(n):
    def make():
        return torch.randn(2, 3, generator=torch.Generator().manual_seed(4)).requires_grad_(), torch.tensor(n)
    _check_equal(*_run_both(scaled, make))


def overflow(x, n):
    i = 1
    while i < n:
        i = i * 3037000500  # past int64 on the second trip (Python's ints go on)
        x = x + 1.0
    return x


def test_python_finishes_the_trip_a_flow_gives_back():
    """int64 overflow in C++ on trip 2: the flow hands back the state at
    that trip's head (x after one trip) and the Python loop finishes it."""
    static = d2s.declarative(overflow)
    x = torch.randn(3)
    static(x, torch.tensor(2))
    got = static(x, torch.tensor(2 ** 62))
    flow, _, _ = _root_flow(_compiled(static))
    assert flow.fallbacks() == 1 and "overflow" in flow.last_fallback()
    assert torch.equal(got, x + 1.0 + 1.0)


def gather(x, n, w):
    ys = []
    for t in range(n):
        if x[t].sum() > 0:  # the list appended in either branch, inside the loop
            ys.append(torch.tanh(x[t] * w))
        else:
            ys.append(x[t] * 2.0 + w)
    return torch.stack(ys)


@pytest.mark.parametrize("n", [1, 4])
def test_appends_in_a_branch(n):
    def make():  # rows 0, 2, 3 take the false branch, row 1 the true one
        g = torch.Generator().manual_seed(5)
        return torch.randn(4, 3, generator=g), torch.tensor(n), torch.randn(3, generator=g).requires_grad_()
    _check_equal(*_run_both(gather, make))


def test_an_exception_a_saved_tensor_hook_raises_inside_a_flow_propagates():
    """As for a segment (tests/runtime/test_native.py): a pack hook's
    exception raised in a trip leaves the flow call as eagerly."""
    class Refused(Exception):
        pass

    def refuse(t):
        raise Refused("refused")

    static = d2s.declarative(rnn)
    static(*_rnn_args(3)())
    flow, _, _ = _root_flow(_compiled(static))
    with torch.autograd.graph.saved_tensors_hooks(refuse, lambda t: t):
        with pytest.raises(Refused):
            rnn(*_rnn_args(3)())
        with pytest.raises(Exception) as info:  # the hook's exception, named with the op and line
            static(*_rnn_args(3)())
    assert isinstance(info.value.__cause__, Refused)
    assert flow.fallbacks() == 0
