"""Shared oracle for the op tests: run a function eagerly and as a captured
program, and compare values (bit for bit) and inferred shapes/dtypes.

`make(n)` builds the inputs with `n` as the size of every dimension listed in
`dyn` ({input index: [dims]}). The expected static shape of each output comes
from eager PyTorch itself: outputs are computed for two values of `n`, and the
dimensions that differ are the ones that must be -1 in the program.
"""

import torch

import runtime
from ops.capture import CaptureMode

SIZES = (3, 5)  # differ from infer.STAND_INS so a stand-in can never leak through


def flatten(value):
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]


def build(fn, inputs, dyn=None, capture_mode=True):
    """(program, feed Variables, captured outputs) for `fn` on `inputs`."""
    dyn = dyn or {}
    program = runtime.Program()
    with runtime.program_guard(program):
        feeds = []
        for i, t in enumerate(inputs):
            shape = [None if d in dyn.get(i, ()) else s for d, s in enumerate(t.shape)]
            feeds.append(runtime.data(f"in{i}", shape, t.dtype))
        if capture_mode:
            with CaptureMode():
                out = fn(*feeds)
        else:
            out = fn(*feeds)
    return program, feeds, out


def run(program, feeds, out, inputs, seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    fetch = [v for v in flatten(out) if isinstance(v, runtime.Variable)]
    results = runtime.Executor().run(program, feed={v.name: t for v, t in zip(feeds, inputs)},
                                     fetch_list=fetch, return_numpy=False)
    return results


def expected_shape(a, b):
    return tuple(x if x == y else -1 for x, y in zip(a.shape, b.shape))


def check(fn, make, dyn=None, seed=None, capture_mode=True, exact=True, shapes=None):
    """Compare `fn` captured (dims in `dyn` unknown) against eager `fn`.
    `shapes` overrides the expected static shapes for value-dependent ops."""
    clone = lambda ts: [t.clone() for t in ts]
    inputs = make(SIZES[0])
    other = make(SIZES[1]) if dyn else inputs
    if seed is not None:
        torch.manual_seed(seed)
    eager = flatten(fn(*clone(inputs)))
    if seed is not None:
        torch.manual_seed(seed)
    eager_other = flatten(fn(*clone(other)))
    program, feeds, out = build(fn, inputs, dyn, capture_mode)
    leaves = flatten(out)
    assert len(leaves) == len(eager), (leaves, eager)
    for i, (var, e, e2) in enumerate(zip(leaves, eager, eager_other)):
        if isinstance(e, torch.Tensor):
            assert isinstance(var, runtime.Variable), var
            want = tuple(shapes[i]) if shapes else expected_shape(e, e2)
            assert var.shape == want, (var, e.shape, e2.shape)
            assert var.dtype == e.dtype, (var, e.dtype)
        else:
            assert var == e
    got = run(program, feeds, out, clone(inputs), seed)
    want = [e for e in eager if isinstance(e, torch.Tensor)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if exact:
            assert torch.equal(g, w) or (g.is_floating_point() and torch.equal(g.isnan(), w.isnan())
                                         and torch.equal(g[~g.isnan()], w[~w.isnan()])), (g, w)
        else:
            torch.testing.assert_close(g, w)
    return program, got


def line_of(path, marker):
    """The line number of the first line of `path` holding `marker` (where a test expects an error)."""
    for i, line in enumerate(open(path), 1):
        if marker in line and "line_of(" not in line:
            return i
    raise AssertionError(marker)


def randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)
