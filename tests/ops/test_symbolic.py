"""Symbolic shapes: dynamic dimensions are ShapeEnv symbols, sizes are
SymInts while tracing and Python ints when the program runs."""

import math
import textwrap

import pytest
import torch
import torch.nn.functional as F

import d2s


def _run_all(static, eager, inputs):
    for args in inputs:
        want, got = eager(*args), static(*args)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        assert len(want) == len(got)
        for w, g in zip(want, got):
            assert torch.equal(w, g), args
    assert len(static.program_cache) == 1


def matmul(y, w):
    return y @ w


def test_matmul_with_two_dynamic_dims():
    static = d2s.declarative(matmul, input_spec=[d2s.InputSpec([None, 3]), d2s.InputSpec([None, None])])
    _run_all(static, matmul, [(torch.randn(4, 3), torch.randn(3, 5)), (torch.randn(1, 3), torch.randn(3, 2)),
                              (torch.randn(9, 3), torch.randn(3, 7))])
    program = static.concrete_program.main_program
    # The reduction dimension of w is fixed by the matmul: w is [3, s2]. No
    # check op: any other size makes the matmul itself fail, as in eager.
    assert program.to_string() == textwrap.dedent("""\
        block 0 (parent -1)
          var y: float32[s0, 3] (data)
          var w: float32[3, s2] (data)
          var tmp_0: float32[s0, s2] (stop_gradient)
          tmp_0 = torch.Tensor.__matmul__(y, w)
        """)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        static(torch.randn(4, 3), torch.randn(4, 5))


def sizes(x):
    n = x.size(0)
    return torch.zeros(n * 2, 3), x.view(x.size(0), -1), torch.zeros(x.size(0), 3)


def test_view_and_zeros_of_a_dynamic_batch_and_the_compiled_code_uses_python_ints():
    static = d2s.declarative(sizes, input_spec=[d2s.InputSpec([None, 2, 2])])
    _run_all(static, sizes, [(torch.randn(n, 2, 2),) for n in (5, 1, 8)])
    concrete = static.concrete_program
    assert concrete.main_program.to_string() == textwrap.dedent("""\
        block 0 (parent -1)
          var x: float32[s0, 2, 2] (data)
          var size_0: scalar<int64> (stop_gradient)
          var size_1: scalar<int64> (stop_gradient)
          var tmp_0: float32[2*s0, 3] (stop_gradient)
          var tmp_1: float32[s0, 4] (stop_gradient)
          var tmp_2: float32[s0, 3] (stop_gradient)
          size_0 = size(x, 0)
          size_1 = operator.mul(2, size_0)
          tmp_0 = torch.zeros(size_1, 3)
          tmp_1 = torch.Tensor.view(x, size_0, -1)
          tmp_2 = torch.zeros(size_0, 3)
        """)
    # The sizes are plain Python ints at run time: x.size(0), then int arithmetic.
    source = concrete.compiled.source
    assert "v_size_0 = k__size_kernel(v_x, 0)" in source
    assert "v_size_1 = k_mul(2, v_size_0)" in source
    assert "k_zeros(v_size_0, 3)" in source


def broadcast_add(x, y):
    return x + y


def test_an_assumption_on_sizes_is_checked_when_the_program_runs():
    # Tracing takes x and y to have the same batch (not a broadcast of 1):
    # a program input breaking that raises instead of computing something else.
    static = d2s.declarative(broadcast_add, input_spec=[d2s.InputSpec([None, 3]), d2s.InputSpec([None, 3])])
    _run_all(static, broadcast_add, [(torch.randn(4, 3), torch.randn(4, 3)), (torch.randn(2, 3), torch.randn(2, 3))])
    first = static.concrete_program
    x, y = torch.randn(4, 3), torch.randn(1, 3)
    with pytest.raises(AssertionError, match=r"s0 == s1 \(s0 = x.size\(0\), s1 = y.size\(0\)\)"):
        first.run([x, y])
    # A declarative call converts again for such inputs (d2s/decisions.py).
    assert torch.equal(static(x, y), broadcast_add(x, y)) and len(static.program_cache) == 2


def size_control_flow(x):
    n = x.size(0)
    total = torch.zeros(3)
    if x.sum() > 0:                  # tensor condition: a cond op
        rows = x.view(n, -1)[:, :3] * (n * 2 - 1)
    else:
        rows = torch.ones(n + 1, 3)[1:] * n
    if n > 3:                         # a comparison of sizes: decided at run time
        total = total + rows.sum(0)
    else:
        total = total - rows[: n // 2 + 1].sum(0)
    i = 0
    while i < n and total.sum() < 1000:   # loop over a size, with a tensor test
        total = total + i
        i += 1
    return total, torch.zeros(max(n - 1, 1), 2) if n > 3 else torch.ones(n * 3, 2)


@pytest.mark.parametrize("sign", [1, -1], ids=["positive", "negative"])
def test_size_arithmetic_and_comparisons_inside_tensor_control_flow(sign):
    static = d2s.declarative(size_control_flow, input_spec=[d2s.InputSpec([None, 4])])
    inputs = [(sign * torch.rand(n, 4) + sign * 0.1,) for n in (2, 5, 1, 7)]
    _run_all(static, size_control_flow, inputs)
    types = {op.type for b in static.concrete_program.main_program.blocks for op in b.ops}
    assert {"cond", "while", "size", "operator.gt"} <= types


def squeeze_then_size(x):
    return torch.zeros(x.squeeze(0).size(0))


def test_an_assumption_that_changes_a_shape_at_size_1_is_kept():
    # squeeze(0) removes the batch only when it is 1: tracing with batch 4
    # assumes it is not, and a batch of 1 must not silently get batch-4 semantics.
    static = d2s.declarative(squeeze_then_size, input_spec=[d2s.InputSpec([None, 3])])
    _run_all(static, squeeze_then_size, [(torch.randn(4, 3),), (torch.randn(2, 3),)])
    first, x = static.concrete_program, torch.randn(1, 3)
    with pytest.raises(AssertionError, match=r"s0 != 1 \(s0 = x.size\(0\)\)"):
        first.run([x])
    got = static(x)  # converted again for batch 1
    assert torch.equal(got, squeeze_then_size(x)) and len(static.program_cache) == 2


def new_of_int(x, n):
    k = int(n)
    return x.new(k).fill_(1) * 2


def masked_softmax_counts(mat, len_s):
    # cedias/Hierarchical_Sentiment's EmbedAttention: arange into a tensor made by `new(int(...))`.
    len_s = len_s.type_as(mat)
    idxes = torch.arange(0, int(len_s[0]), out=mat.new(int(len_s[0])).long()).unsqueeze(1)
    return (idxes.float() < len_s.unsqueeze(0)).float() * torch.exp(mat)


@pytest.mark.parametrize("fn, inputs", [
    (new_of_int, [(torch.arange(3), torch.tensor(5)), (torch.arange(3), torch.tensor(0)),
                  (torch.arange(2.0), torch.tensor(2))]),
    (masked_softmax_counts, [(torch.rand(4, 4), torch.full((4,), 4)), (torch.rand(4, 4), torch.full((4,), 4))]),
])
def test_int_of_a_tensor_given_as_a_size_is_a_python_int(fn, inputs):
    # `x.new(k)` with a Python int k is k values; with a 0-d tensor it would
    # be a copy of that tensor. `int(t)` reaches it as the int eager passes.
    static = d2s.declarative(fn)
    for args in inputs:
        want, got = fn(*args), static(*args)
        assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)
    ops = {op.type for op in static.concrete_program.main_program.global_block().ops}
    assert "builtins.int" in ops


class MaskedAttention(torch.nn.Module):
    """`view(B, N, heads, -1)` on two symbolic sizes and a padding mask
    broadcast onto the scores, as BERT-style encoders write them."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x, mask):
        b, n, c = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        scores = q @ k.transpose(-1, -2) / 8 + (1.0 - mask[:, None, None, :].to(x.dtype)) * -1e9
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c))


def test_layout_checks_on_several_sizes_leave_every_size_to_one_program(tmp_path):
    """Torch decides memory layout on products of sizes (`s0 != s0*s1`,
    `s0*s1 != 1`); those checks refused a batch or a length of 1 (one
    token); the kernel re-decides them when the program runs, so they go,
    as one-size ones do. A saved model serves every size."""
    torch.manual_seed(0)
    model = MaskedAttention().eval()
    specs = [d2s.InputSpec([None, None, 32]), d2s.InputSpec([None, None], "int64")]
    d2s.jit.save(model, str(tmp_path / "m"), input_spec=specs)
    loaded = d2s.jit.load(str(tmp_path / "m"))
    static = d2s.declarative(model, input_spec=specs)
    for b, n in [(2, 8), (1, 1), (4, 1), (1, 7), (3, 5)]:
        x = torch.randn(b, n, 32)
        mask = torch.ones(b, n, dtype=torch.long)
        mask[0, n - 1:] = 0 if n > 1 else 1
        expected = model(x, mask)
        assert torch.equal(loaded(x, mask), expected) and torch.equal(static(x, mask), expected)
    assert len(static.forward.program_cache) == 1


PATCH_WEIGHT = torch.randn(2, 3, 4, 4)


def patches(x):
    # timm's PatchEmbed asserts the sides divide by the patch, so the patch
    # grid's sides are torch's CleanDiv (an exact FloorDiv); then its
    # resample_abs_pos_embed: `not is_exporting() and h * w + 1 == n`, a run-time bool
    _, _, H, W = x.shape
    torch._assert(H % 4 == 0, "height")
    torch._assert(W % 4 == 0, "width")
    y = F.conv2d(x, PATCH_WEIGHT, stride=4).permute(0, 2, 3, 1)
    b, h, w, c = y.shape
    if not torch.jit.is_scripting() and h * w + 1 == 5:
        if h == w:
            return y.reshape(b, -1, c)
    return y.reshape(b, -1, c) * 2


def test_a_condition_on_an_exact_division_of_sizes_is_read_at_run_time():
    static = d2s.declarative(patches, input_spec=[d2s.InputSpec([None, 3, None, None])])
    _run_all(static, patches, [(torch.randn(2, 3, 8, 8),), (torch.randn(1, 3, 16, 8),), (torch.randn(3, 3, 4, 12),)])
    (concrete,) = list(static.program_cache)
    assert "cond" in {op.type for op in concrete.main_program.global_block().ops}


def padded_to_patches(x):
    # timm's MobileViT: sides rounded up to whole patches with math.ceil(H / 4), resized when they differ
    B, C, H, W = x.shape
    new_h, new_w = math.ceil(H / 4) * 4, math.ceil(W / 4) * 4
    if new_h != H or new_w != W:
        x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=True)
    return x.reshape(B, C, new_h // 4, 4, new_w // 4, 4).mean((3, 5))


def test_ceil_of_a_true_division_of_sizes_is_computed_at_run_time(tmp_path):
    static = d2s.declarative(padded_to_patches, input_spec=[d2s.InputSpec([None, 3, None, None])])
    inputs = [(torch.randn(2, 3, 8, 8),), (torch.randn(1, 3, 9, 8),), (torch.randn(3, 3, 6, 13),)]
    _run_all(static, padded_to_patches, inputs)
    (concrete,) = list(static.program_cache)
    ops = {op.type for op in concrete.main_program.global_block().ops}
    assert {"cond", "math.ceil", "operator.truediv"} <= ops
    d2s.jit.save(static, str(tmp_path / "m"))
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for (x,) in inputs:
        assert torch.equal(loaded(x), padded_to_patches(x))


class Fold(torch.nn.Module):
    """timm's MobileViT block: a resize to whole patches (under a condition
    on sizes), unfold to patches, a linear over them, fold back. The fold's
    view decides on `size // patches`; probing that decision at a size where
    the patch count is 0 must not abandon the symbolic shapes."""

    def __init__(self, patch):
        super().__init__()
        self.patch = patch
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        p = self.patch
        x = self.conv(x)
        B, C, H, W = x.shape
        new_h, new_w = math.ceil(H / p) * p, math.ceil(W / p) * p
        nh, nw = new_h // p, new_w // p
        if new_h != H or new_w != W:
            x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=True)
        x = x.reshape(B, C, nh, p, nw, p).permute(0, 1, 3, 5, 2, 4).reshape(B, C, -1, nh * nw)
        x = self.lin(x.transpose(1, 3)).transpose(1, 3)
        x = x.reshape(B, C, p, p, nh, nw).permute(0, 1, 4, 2, 5, 3)
        return x.reshape(B, C, nh * p, nw * p)


@pytest.mark.parametrize("patch", [2, 3])
def test_a_view_of_sizes_divided_by_a_patch_count_stays_symbolic(tmp_path, patch):
    model = Fold(patch).eval()
    d2s.jit.save(model, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 3, None, None])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for hw in ((64, 64), (18, 30), (12, 10), (13, 9)):
        x = torch.randn(2, 3, *hw)
        assert torch.allclose(loaded(x), model(x), atol=1e-6), hw


# -- a size computed as a tensor is that size's expression (ops/symbolic_ints.py) ---------------

def chunked_by_a_tensor_count(x):
    # Longformer's chunk count: a tensor in eager code, which `view` reads as an int.
    chunks = torch.div(x.size(1), 4, rounding_mode="trunc")
    y = x.view(x.size(0), chunks, 4).flip(-1)
    return y.reshape(x.size(0), -1) + x  # back to x's sizes: the count is x.size(1) // 4, exactly


def counted_by_floor_division(x):
    half = torch.tensor(x.size(0)) // 2 + 1
    return x.new_ones(half, x.size(1)) * x[:1]


@pytest.mark.parametrize("fn, spec, sizes", [
    (chunked_by_a_tensor_count, [None, None], [(2, 8), (3, 12), (4, 20)]),
    (counted_by_floor_division, [None, 3], [(4, 3), (5, 3), (2, 3)]),
])
def test_a_size_computed_as_a_tensor_serves_every_size(fn, spec, sizes):
    """torch functions given run-time sizes alone are ops (run at once, torch
    would fix each size to its example's), and a 0-d integer tensor computed
    from sizes is their expression where a kernel reads it: one program for
    every size."""
    static = d2s.declarative(fn, input_spec=[d2s.InputSpec(spec)])
    for shape in sizes:
        x = torch.randn(*shape)
        assert torch.equal(static(x), fn(x))
    assert len(static.program_cache) == 1


def per_class_lengths(x, labels):
    valid = x[labels >= 0]
    total = x.sum() * 0
    for c in range(3):  # a Python loop: each trip its own tensor `if`
        if (valid > c).sum() > 0:
            fg = (valid > c).float()  # made in this trip's branch, of valid's run-time length
            n = len(fg)
            if n > 1:
                total = total + fg[1:n].sum() * (c + 1)
            else:
                total = total - fg.sum()
    return total


def test_a_size_first_read_in_a_finished_branch_is_read_again_where_it_is_used():
    """The run-time length of `valid` is first read in the first trip's
    branch; the later trips' `n > 1` read it from their own `fg` (it was
    'the size `s > 1` ... cannot tell which tensor it is read from', as
    ParityBench's Lovasz-Softmax loss hit)."""
    static = d2s.declarative(per_class_lengths)
    x = torch.tensor([0.5, 1.5, 2.5, 0.2])
    for labels in ([1, -1, 1, 1], [-1, -1, 1, -1], [-1, -1, -1, -1], [1, 1, 1, 1]):
        labels = torch.tensor(labels)
        assert torch.equal(static(x, labels), per_class_lengths(x, labels))
    assert len(static.program_cache) == 1
    types = [op.type for block in static.concrete_program.main_program.blocks for op in block.ops]
    assert types.count("cond") >= 6 and "size" in types
