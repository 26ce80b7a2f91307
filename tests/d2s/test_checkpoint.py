"""`torch.utils.checkpoint.checkpoint(block, x)` in converted code: the
block converted, its ops a `checkpoint` op's block that torch's checkpoint
runs (ops/control_flow/checkpoint_op.py), values, gradients and the tensors
kept for backward eager's on every path (d2s/operators/calls.py
`_checkpointed`). Before, the block's ops ran inline: every activation was
kept, checkpointing's memory saving lost. Called as it was,
torch's checkpoint ran the block unconverted on graph tensors: a custom
autograd.Function there lost its backward (the gradients of everything
before it were None: transformers' BLOOM with gradient checkpointing), and
a tensor `if` was refused."""

import contextlib
import copy

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as cp

import d2s


class HalfGradSiLU(torch.autograd.Function):
    """SiLU forward; half its derivative backward (on purpose: the user's backward must be the one run)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s + x * s * (1 - s)) * 0.5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        h = HalfGradSiLU.apply(self.a(x))
        if isinstance(h, torch.Tensor) and h.sum() > 0:  # converted: a cond, and a graph tensor is a Tensor
            h = self.drop(h) * 2
        return self.b(h)


class Checkpointed(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.block = Block()
        self.reentrant = reentrant

    def forward(self, x):
        return cp.checkpoint(self.block, x, use_reentrant=self.reentrant).sum()


XS = [torch.rand(3, 4) + 0.5, -torch.rand(3, 4) - 0.5]  # both sides of the block's `if`


def _step(module, run, x, *args):
    """(result, x's gradient, the parameters' gradients, how many tensors
    autograd kept for backward outside every checkpoint)."""
    for p in module.parameters():
        p.grad = None
    torch.manual_seed(5)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        y = run(x, *args)
    y = y[0] if isinstance(y, tuple) else y
    if y.requires_grad:
        y.sum().backward()
    return y.detach(), None if x.grad is None else x.grad, [p.grad for p in module.parameters()], len(kept)


def _same_step(got, want):
    assert torch.equal(got[0], want[0])
    assert (got[1] is None) == (want[1] is None) and (want[1] is None or torch.equal(got[1], want[1]))
    for a, b in zip(want[2], got[2]):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


def _pair(make, level="default"):
    """(eager module, its copy, the copy declarative), made under one seed."""
    torch.manual_seed(0)
    eager = make().train()
    model = copy.deepcopy(eager)
    return eager, model, d2s.declarative(model, optimize=level)


def _trains_as_eagerly(eager, model, static, x0, *args, input_grad=True, kept=True, state=False):
    """One training step of each on `x0` (and `args`): the result and the
    gradients eager's, and the count of tensors kept for backward (`kept`)
    and the modules' state (`state`) too. Returns eager's step."""
    want = _step(eager, eager, x0.clone().requires_grad_(input_grad), *args)
    got = _step(model, static, x0.clone().requires_grad_(input_grad), *args)
    _same_step(got, want)
    assert not kept or got[3] == want[3]  # the blocks' activations are computed again in backward, as eagerly
    for (name, a), b in zip(eager.state_dict().items() if state else (), model.state_dict().values()):
        assert torch.equal(a, b), name
    return want


def _op_types(static):
    return [op.type for concrete in static.forward.program_cache for block in concrete.main_program.blocks
            for op in block.ops]


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("input_grad", [True, False])
def test_a_checkpointed_block_trains_as_eagerly(reentrant, input_grad):
    eager, model, static = _pair(lambda: Checkpointed(reentrant))
    for x0 in XS:
        want = _trains_as_eagerly(eager, model, static, x0, input_grad=input_grad)
        assert all(g is None for g in want[2]) == (reentrant and not input_grad)
    assert len(static.forward.program_cache) == 1
    types = _op_types(static)
    assert {"autograd_function", "cond"} <= set(types)
    # The reentrant variant with no input requiring grad runs without gradients and keeps nothing, as eagerly.
    assert ("checkpoint" in types) == (not reentrant or input_grad)


def test_the_reentrant_variant_takes_no_keywords_as_eagerly():
    def keyword_call(x, block):
        return cp.checkpoint(block, x, use_reentrant=True, scale=2)

    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        d2s.declarative(keyword_call)(torch.ones(2, 4), Block())


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        h = torch.tanh(self.a(x))
        if h.mean() > 0:
            h = h * 2
        return self.b(h) * scale


class LoopAndBranch(nn.Module):
    """Checkpoints in a tensor `while` (with a number argument), in a
    branch (the reentrant variant), and one inside another."""

    def __init__(self):
        super().__init__()
        self.layer = Layer()
        self.inner = Layer()

    def two(self, x):
        return cp.checkpoint(self.inner, self.layer(x), use_reentrant=False)

    def forward(self, x, n):
        i = torch.zeros((), dtype=torch.long)
        while i < n:
            x = cp.checkpoint(self.layer, x, 0.5, use_reentrant=False)
            i = i + 1
        if x.sum() > 0:
            x = cp.checkpoint(self.layer, x, use_reentrant=True)
        return cp.checkpoint(self.two, x, use_reentrant=False), n


@pytest.mark.parametrize("level", ["default", "fast"])
def test_checkpoints_in_loops_branches_and_each_other(level):
    eager, model, static = _pair(LoopAndBranch, level)
    x = torch.randn(3, 4)
    cases = [(x, 0), (x, 1), (x, 3), (-x.abs() * 5, 0), (-x.abs() * 5, 2)]  # zero/one/several trips, both sides
    for x0, n in cases:
        _trains_as_eagerly(eager, model, static, x0, torch.tensor(n))
    assert len(static.forward.program_cache) == 1
    types = _op_types(static)
    assert types.count("checkpoint") == 4 and {"while", "cond"} <= set(types)


class KeepsOnModule(nn.Module):
    """The block keeps a value it makes on a module, read after the call:
    its ops run inline (the value must exist outside it)."""

    def __init__(self):
        super().__init__()
        self.layer = Layer()

    def block(self, x):
        y = self.layer(x)
        self.last = y.relu()
        return y

    def forward(self, x):
        y = cp.checkpoint(self.block, x, use_reentrant=False)
        return y + self.last


class NoGradInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = Layer()

    def forward(self, x):
        with torch.no_grad():
            y = cp.checkpoint(self.layer, x, use_reentrant=False)
        return x * y


@pytest.mark.parametrize("cls", [KeepsOnModule, NoGradInside])
def test_blocks_a_checkpoint_op_cannot_stand_for_run_inline(cls):
    eager, model, static = _pair(cls)
    for x0 in (XS[0], -XS[0]):
        _trains_as_eagerly(eager, model, static, x0, kept=False)
    assert "checkpoint" not in _op_types(static) and "cond" in _op_types(static)
    assert len(static.forward.program_cache) == (2 if cls is KeepsOnModule else 1)  # (`last` set on the first call)


class Normed(nn.Module):
    """Batch norm in a checkpointed block: eager's checkpoint computes the
    block again in backward, updating the running statistics a second time."""

    def __init__(self, reentrant):
        super().__init__()
        self.norm = nn.BatchNorm1d(4)
        self.layer = Layer()
        self.reentrant = reentrant

    def block(self, x):
        return self.layer(self.norm(x))

    def forward(self, x):
        return cp.checkpoint(self.block, x, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
def test_batch_norm_statistics_are_updated_as_eagerly_under_checkpointing(reentrant):
    """Was: the block's ops inline, the statistics updated once a step where
    eager updates them twice: a silent difference in the model's state."""
    eager, model, static = _pair(lambda: Normed(reentrant))
    for x0 in [XS[0], XS[1], XS[0] * 3]:
        _trains_as_eagerly(eager, model, static, x0, state=True)
    assert eager.norm.num_batches_tracked.item() == 6  # two updates per step
    assert len(static.forward.program_cache) == 1 and {"checkpoint", "cond"} <= set(_op_types(static))


class NormedAndKept(Normed):
    def block(self, x):
        y = super().block(x)
        self.kept = y.relu()  # a value of the block on a module: the block must run inline
        return y

    def forward(self, x):
        return super().forward(x) + self.kept


def test_a_block_that_must_run_inline_and_writes_statistics_is_refused():
    """Inline, the statistics would be written once where eager writes them
    twice: refused at the user's line instead."""
    static = d2s.declarative(NormedAndKept(False).train())
    with pytest.raises(d2s.ConversionError, match="writes 'norm.num_batches_tracked' in place.*keeps a value it makes "
                       "on a module") as info:
        static(XS[0].clone().requires_grad_())
    assert info.value.filename == __file__


class BiasedLayer(nn.Module):
    """Returns the bias it is given as it is, for the next layer (T5's
    position bias): a value of the enclosing code among the block's results."""

    def __init__(self):
        super().__init__()
        self.layer = Layer()

    def forward(self, x, bias):
        if bias is None:
            bias = x.mean(0, keepdim=True)
        return self.layer(x + bias), bias


class PassesTheBiasOn(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.first = BiasedLayer()
        self.second = BiasedLayer()
        self.reentrant = reentrant

    def forward(self, x):
        h, bias = cp.checkpoint(self.first, x, None, use_reentrant=self.reentrant)
        h, bias = cp.checkpoint(self.second, h, bias, use_reentrant=self.reentrant)
        return h * bias


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_block_returning_a_value_it_was_given_is_a_checkpoint_too(reentrant):
    """Was: such a block ran inline (T5 kept every activation under
    checkpointing: 117 tensors where eager keeps 33)."""
    eager, model, static = _pair(lambda: PassesTheBiasOn(reentrant))
    for x0 in XS:
        _trains_as_eagerly(eager, model, static, x0)
    assert len(static.forward.program_cache) == 1 and _op_types(static).count("checkpoint") == 2
    assert "cond" in _op_types(static)


class TrainStep(d2s.Graph):
    def __init__(self, model, optimizer):
        super().__init__()
        self.model = model
        self.add_optimizer(optimizer)

    def build(self, x):
        loss = self.model(x).square().mean()
        loss.backward()
        return loss


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_graph_training_step_with_checkpoints_steps_as_eagerly(reentrant):
    """zero_grad, forward, backward (computing the blocks again) and SGD
    with momentum in one program: losses, parameters and batch norm's
    statistics (updated twice a step) eager's."""
    torch.manual_seed(0)
    eager = Normed(reentrant).train()
    model = copy.deepcopy(eager)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    for i, x0 in enumerate([XS[0], XS[1], XS[0] * 2]):
        torch.manual_seed(i)
        eager_opt.zero_grad()
        want = eager(x0.clone().requires_grad_()).square().mean()
        want.backward()
        eager_opt.step()
        torch.manual_seed(i)
        got = step(x0.clone().requires_grad_())
        assert torch.equal(got.detach(), want.detach())
    for (name, a), b in zip(eager.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    types = [op.type for c in step._build_fn.program_cache for b in c.main_program.blocks for op in b.ops]
    assert "checkpoint" in types


class NormedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x):
        h = self.norm(self.linear(x))
        if h.mean() > 0:
            h = h * 2
        return h


class Sequential(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.seq = nn.Sequential(NormedBlock(), nn.Tanh(), nn.Dropout(0.3), NormedBlock(), nn.Linear(4, 4))
        self.reentrant = reentrant

    def forward(self, x):
        return cp.checkpoint_sequential(self.seq, 2, x, use_reentrant=self.reentrant)


class Wrapped(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        wrapper = pytest.importorskip("torch.distributed.algorithms._checkpoint.checkpoint_wrapper")
        impl = wrapper.CheckpointImpl.REENTRANT if reentrant else wrapper.CheckpointImpl.NO_REENTRANT
        self.block = wrapper.checkpoint_wrapper(NormedBlock(), checkpoint_impl=impl)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.block(x))


@pytest.mark.parametrize("cls", [Sequential, Wrapped])
@pytest.mark.parametrize("reentrant", [False, True])
def test_torchs_own_checkpointing_helpers_checkpoint_as_eagerly(cls, reentrant):
    """`checkpoint_sequential` and torch.distributed's `checkpoint_wrapper`
    call `checkpoint` from torch's own code: it ran the blocks inline
    (batch norm's statistics updated once where eager updates them twice,
    silently), or refused the block's tensor `if`."""
    eager, model, static = _pair(lambda: cls(reentrant))
    for x0 in (XS[0], XS[1] * 3):
        _trains_as_eagerly(eager, model, static, x0, state=True)
    assert len(static.forward.program_cache) == 1 and {"checkpoint", "cond"} <= set(_op_types(static))


class ReadsAFlag(nn.Module):
    """The block reads a bool the program holds as a Python bool when it runs
    (a tensor `if`'s merged flag: runtime/passes/scalars.py), through a
    keyword: a value bound to the block's function, not an input."""

    def __init__(self):
        super().__init__()
        self.layer = Layer()

    def step(self, x, wide):
        h = self.layer(x)
        doubled = h.mean() > 0 and wide  # a tensor and a bool: logical_and in the program
        if doubled:
            h = h * 2
        return h

    def forward(self, x):
        if x.sum() > 0:
            wide = True
        else:
            wide = False
        return cp.checkpoint(self.step, x, wide=wide, use_reentrant=False)


@pytest.mark.parametrize("level", ["default", "fast"])
def test_a_block_reading_a_python_scalar_of_the_program(level):
    """Was: the block's `logical_and` got the Python bool and failed when the
    program ran (Whisper under checkpointing)."""
    eager, model, static = _pair(ReadsAFlag, level)
    for x0 in (XS[0], XS[1], XS[0] - 0.6):
        _trains_as_eagerly(eager, model, static, x0)
    assert len(static.forward.program_cache) == 1 and {"checkpoint", "cond"} <= set(_op_types(static))


class DecidesThenCounts(nn.Module):
    """A block whose `if` gives values that cannot be merged (None on one
    side): a program converts the side its inputs take, and a call taking
    the other converts again. After the check, the block writes a buffer."""

    def __init__(self):
        super().__init__()
        self.layer = Layer()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def block(self, x):
        h = self.layer(x)
        if h.mean() > 0:
            extra = None
        else:
            extra = h * 2
        self.calls.add_(1)  # after the check: a rerun of the call does not repeat it
        return h if extra is None else h + extra

    def forward(self, x):
        return cp.checkpoint(self.block, x, use_reentrant=False)


def test_a_decision_failing_in_a_block_converts_again():
    """Was refused: what the block does after the failed check was taken for
    something the run had done (Longformer under checkpointing)."""
    eager, model, static = _pair(DecidesThenCounts)
    inputs = [XS[0], XS[1] * 20, XS[0]]
    sides = [bool(eager.layer(x0).mean() > 0) for x0 in inputs]
    assert sides[0] != sides[1]  # the second call takes the other side
    for x0 in inputs:
        # (Eager's count: its recomputation stops after the last tensor backward needs.)
        _trains_as_eagerly(eager, model, static, x0, kept=False, state=True)
    assert "checkpoint" in _op_types(static) and len(static.forward.program_cache) == 2


class TakesAnything(nn.Module):
    """Swin's layers take `input_dimensions`, a tuple of ints; a tensor in a
    tuple is no input of either variant (bound, as eagerly a closure's); a
    parameter passed as an argument is one."""

    def __init__(self, reentrant):
        super().__init__()
        self.layer = Layer()
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.reentrant = reentrant

    def block(self, x, dims, pair, scale):
        rows, cols = dims
        shift, _ = pair
        return self.layer(x.reshape(rows, cols) + shift) * scale

    def forward(self, x):
        shift = x.mean(0)
        return cp.checkpoint(self.block, x, (3, 4), (shift, None), self.scale, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("input_grad", [True, False])
def test_a_block_given_sizes_tuples_and_a_parameter(reentrant, input_grad):
    """Was: any argument but a tensor or a plain number ran the block inline
    (Swin under checkpointing kept 78 tensors where eager keeps 14). With
    the reentrant variant and no input requiring grad but the parameter,
    the parameter is what makes the block's gradients flow, as eagerly."""
    eager, model, static = _pair(lambda: TakesAnything(reentrant))
    for x0 in XS:
        _trains_as_eagerly(eager, model, static, x0, input_grad=input_grad)
    assert len(static.forward.program_cache) == 1 and {"checkpoint", "cond"} <= set(_op_types(static))


class MasksThenEncodes(nn.Module):
    """torch's TransformerEncoder asks in its own code whether the padding
    mask, made in a checkpointed block, is left-aligned: the answer comes
    from replaying the block's ops on the call's values (ops/examples.py)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)

    def prepare(self, x, keep):
        return self.proj(x), keep.logical_not()  # (`linear` of a 3-d input returns a view of its own product)

    def forward(self, x, keep):
        h, padding = cp.checkpoint(self.prepare, x, keep, use_reentrant=False)
        return self.encoder(h, src_key_padding_mask=padding)


def test_torch_code_deciding_on_a_blocks_value():
    """Was refused: the replay knew no op with a block but `cond`, and took a
    kernel's result that is a view of memory of its own for a view of its
    inputs (unknown when they are read from an enclosing block)."""
    torch.manual_seed(0)
    eager = MasksThenEncodes().eval()
    static = d2s.declarative(copy.deepcopy(eager))
    x = torch.randn(2, 5, 8, requires_grad=True)
    for keep in (torch.tensor([[True] * 5, [True] * 3 + [False] * 2]), torch.ones(2, 5, dtype=torch.bool)):
        assert torch.equal(static(x, keep), eager(x, keep))
    # (torch's answer, left-aligned, is checked when the program runs: check_bool)
    assert len(static.forward.program_cache) == 1 and {"checkpoint", "check_bool"} <= set(_op_types(static))


class CountsCalls(nn.Module):
    def __init__(self, early_stop):
        super().__init__()
        self.layer = Layer()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.early_stop = early_stop

    def block(self, x):
        h = self.layer(x)
        self.calls.add_(1)  # after the last tensor backward needs
        return h

    def forward(self, x):
        return cp.checkpoint(self.block, x, use_reentrant=False, early_stop=self.early_stop)


@pytest.mark.parametrize("early_stop", [True, False])
def test_the_recomputation_stops_where_eagers_does(early_stop):
    """`early_stop` is torch's checkpoint's: with it the recomputation stops
    after the last tensor backward needs (the count grows once a step),
    without it the whole block runs again (twice); it was taken for a
    keyword argument of the block."""
    eager, model, static = _pair(lambda: CountsCalls(early_stop))
    for x0 in XS:
        _trains_as_eagerly(eager, model, static, x0, state=True)
    assert eager.calls.item() == (2 if early_stop else 4)
    assert len(static.forward.program_cache) == 1 and {"checkpoint", "cond"} <= set(_op_types(static))


def _no_context():
    return contextlib.nullcontext(), contextlib.nullcontext()


class Selective(Normed):
    """A `context_fn` (selective checkpointing's hook): the block runs inline."""

    def forward(self, x):
        return cp.checkpoint(self.block, x, use_reentrant=False, context_fn=_no_context)


class SelectiveWithoutState(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = Layer()

    def forward(self, x):
        return cp.checkpoint(self.layer, x, use_reentrant=False, context_fn=_no_context)


def test_a_context_fn_runs_the_block_inline_unless_it_writes_state():
    """Inline, batch norm's statistics would be updated once where eager's
    checkpoint updates them twice: refused (was silent); a block writing
    nothing runs inline with eager's values and gradients."""
    with pytest.raises(d2s.ConversionError, match="writes 'norm.num_batches_tracked' in place.*a context_fn"):
        d2s.declarative(Selective(False).train())(XS[0].clone().requires_grad_())
    eager, model, static = _pair(SelectiveWithoutState)
    for x0 in XS:
        _trains_as_eagerly(eager, model, static, x0, kept=False)
    assert len(static.forward.program_cache) == 1
    assert "checkpoint" not in _op_types(static) and "cond" in _op_types(static)
