"""Decisions a program checks when it runs, and converting again when a run
breaks one (d2s/decisions.py; DESIGN, Semantics 3 and 8; issue 22 classes
2, 4 and 5, issue 21's size assumptions):

- a tensor `if` whose sides give values no output holds on both (None and a
  tensor: transformers' mask helpers) is converted for the side taken;
- a Python `if` on a run-time size whose other side cannot be traced (a
  view valid only for length 1) likewise;
- a symbolic comparison reaching a torch argument that takes only a Python
  bool (`is_causal=q_len > 1`) is decided and checked;
- an InputSpec program whose size assumptions (`s0 == s1` for a broadcast,
  `s0 // s1 != 0` for a reshape) fail is converted again.

Each: eager == declarative on inputs taking every path, in both orders, the
documented number of programs, each holding its checks."""

import json
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

import d2s
from d2s import static_function
from runtime.errors import ConversionError, DecisionFailed


def _ops(program):
    return [op.type for block in program.blocks for op in block.ops]


# -- class 2: None on one side, a tensor on the other --------------------------------------------

def mask_or_none(mask):
    if mask.all():  # nothing masked: no mask at all (transformers' _ignore_causal_mask_sdpa & co.)
        return None
    return (1.0 - mask[:, None, :]) * -1e9


def attend(x, mask):
    m = mask_or_none(mask)
    scores = x @ x.transpose(-1, -2)
    if m is not None:
        scores = scores + m
    return scores.softmax(-1)


def ternary(x, mask):
    m = None if mask.all() else mask[:, None, :] * -1e9
    return x if m is None else x + m


FULL, PADDED = torch.ones(2, 3), torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


@pytest.mark.parametrize("fn", [attend, ternary])
@pytest.mark.parametrize("masks", [[FULL, PADDED, FULL, PADDED], [PADDED, FULL, PADDED, FULL]])
def test_none_or_tensor_converts_each_side_once(fn, masks):
    static = d2s.declarative(fn)
    x = torch.randn(2, 3, 3)
    for mask in masks:
        assert torch.equal(static(x, mask), fn(x, mask))
    programs = list(static.program_cache)
    assert len(programs) == 2  # one per side, both kept
    for concrete in programs:
        ops = _ops(concrete.main_program)
        assert "cond" in ops and "decision_failed" in ops  # the other side: a check, not a trace


def test_a_side_that_cannot_be_told_still_raises_as_before():
    # The condition is random: which side the example takes is unknown, so the
    # tensor side is converted and the None side raises when a run takes it.
    @d2s.declarative
    def f(x):
        if torch.rand(()) > 2.0:
            return None
        return x + 1

    assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))


def written_mask_or_none(x, mask):
    # The condition reads an in-place write (wav2vec2's feature mask), which
    # replaying the example cannot do: the side the example takes is unknown.
    m = mask.clone()
    m[:, 0] = 1.0
    bias = None if m.all() else (1.0 - m[:, None, :]) * -1e9
    return x if bias is None else x + bias


@pytest.mark.parametrize("masks", [[FULL, PADDED, FULL], [PADDED, FULL, PADDED]])
def test_side_unknown_by_replay_converts_the_side_the_run_took(masks, tmp_path):
    static = d2s.declarative(written_mask_or_none)
    x = torch.randn(2, 3, 3)
    for mask in masks:
        assert torch.equal(static(x, mask), written_mask_or_none(x, mask))
    programs = list(static.program_cache)
    assert len(programs) == 2 and all("decision_failed" in _ops(c.main_program) for c in programs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d2s.jit.save(static, str(tmp_path / "m"), input_spec=[x, masks[0]])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert _paths(tmp_path / "m") == 1
    for mask in masks:
        assert torch.equal(loaded(x, mask), written_mask_or_none(x, mask))


def view_on_a_side_replay_cannot_tell(x, both):
    # The condition reads an in-place write (replay cannot tell its side);
    # the true side's view fails at these sizes (longformer's global
    # attention branch, traced with made-up sizes). `both`: the false side
    # fails as well, and so the `if` does.
    m = x.clone()
    m.add_(1)
    if (m > 100).any():
        y = x.view(7, 5)
    elif both:
        y = x.view(5, 7)
    else:
        y = x * 2
    return y + 1


def decoding(x, n):
    i = torch.zeros((), dtype=torch.int64)
    while i < n:
        mask = (torch.arange(3) <= i + 1).float()[None].expand(2, 3)  # nothing masked from the second trip on
        x = attend(x, mask)
        i += 1
    return x


def test_an_if_taking_both_sides_in_one_call_is_refused_not_converted_over_and_over():
    """The mask is None on some trips and a tensor on others: no one program
    holds both, so converting again for the side a trip took fails on
    another trip. The second failure names the `if`, after two programs."""
    static = d2s.declarative(decoding)
    x = torch.randn(2, 3, 3)
    for n in (1, 0):  # the tensor side only: one program
        assert torch.equal(static(x, torch.tensor(n)), decoding(x, torch.tensor(n)))
    assert "while" in _ops(static.concrete_program.main_program)
    with pytest.raises(ConversionError, match="that `if` takes both sides within it") as info:
        static(x, torch.tensor(3))
    assert info.value.filename == __file__
    assert len(static.program_cache) <= 3  # (each program of a group is held under a key of its own too)


def test_a_side_failing_to_trace_converts_where_replay_cannot_tell_the_side():
    # Was a ConversionError for every input: the side is unknown, so the
    # failure could have been eager's.
    static = d2s.declarative(view_on_a_side_replay_cannot_tell)
    x = torch.randn(2, 3)
    assert torch.equal(static(x, False), view_on_a_side_replay_cannot_tell(x, False))
    assert {"cond", "decision_failed"} <= set(_ops(static.concrete_program.main_program))
    with pytest.raises(ConversionError, match=r"test_decisions.py\", line \d+: .*shape '\[7, 5\]' is invalid"):
        static(torch.full((2, 3), 200.0), False)
    with pytest.raises(ConversionError, match=r"shape '\[(7, 5|5, 7)\]' is invalid"):  # not a side: the if fails
        d2s.declarative(view_on_a_side_replay_cannot_tell)(x, True)


# -- class 5: a Python `if` on a run-time size, the other side untraceable --------------------------

def last_token(x):
    b, n, d = x.shape
    if n == 1:  # transformers' `q_length == 1`: a view valid only for one token
        return x.view(b, d)[:, None, :] * 2
    return x.cumsum(1)


@pytest.mark.parametrize("lengths", [[3, 1, 5, 1], [1, 4, 1, 2]])
def test_size_branch_specialises_and_converts_the_other_side(lengths):
    static = d2s.declarative(last_token, input_spec=[d2s.InputSpec([2, None, 4])])
    for n in lengths:
        x = torch.randn(2, n, 4)
        assert torch.equal(static(x), last_token(x))
    programs = list(static.program_cache)
    assert len(programs) == 2
    general = [c for c in programs if "cond" in _ops(c.main_program)]
    assert len(general) == 1 and "decision_failed" in _ops(general[0].main_program)
    one = [c for c in programs if c not in general][0]
    assert "check_dims" in _ops(one.main_program)  # converted for length 1, and checks it


# -- class 4: a symbolic comparison as a torch bool argument ------------------------------------------

def causal(q):
    return F.scaled_dot_product_attention(q, q, q, is_causal=q.shape[2] > 1)


def causal_from_tensor(q, flag):
    return F.scaled_dot_product_attention(q, q, q, is_causal=bool(flag.any()))


@pytest.mark.parametrize("lengths", [[3, 1, 5], [1, 3, 1]])
def test_symbolic_bool_argument_is_decided_and_checked(lengths):
    static = d2s.declarative(causal, input_spec=[d2s.InputSpec([1, 2, None, 4])])
    for n in lengths:
        q = torch.randn(1, 2, n, 4)
        assert torch.equal(static(q), causal(q))
    assert len(static.program_cache) == 2  # causal for n > 1, not for n == 1
    assert any("check_sizes" in _ops(c.main_program) for c in static.program_cache)


def test_bool_from_a_tensor_as_argument_is_decided_and_checked():
    static = d2s.declarative(causal_from_tensor)
    q = torch.randn(1, 2, 3, 4)
    for flag in (torch.ones(2), torch.zeros(2), torch.ones(2)):
        assert torch.equal(static(q, flag), causal_from_tensor(q, flag))
    programs = list(static.program_cache)
    assert len(programs) == 2 and all("check_bool" in _ops(c.main_program) for c in programs)


# -- issue 21: size assumptions of an InputSpec program ---------------------------------------------

def add(x, y):
    return x + y


def rows(x, n):
    return x.reshape(-1, n.shape[0]).sum(1)


@pytest.mark.parametrize("fn, cases, count", [
    (add, [(3, 3), (1, 3), (4, 1), (5, 5)], 3),   # s0 == s1, then a broadcast from either side
])
def test_failed_size_assumption_converts_again(fn, cases, count):
    static = d2s.declarative(fn, input_spec=[d2s.InputSpec([None]), d2s.InputSpec([None])])
    for a, b in cases:
        x, y = torch.randn(a), torch.randn(b)
        assert torch.equal(static(x, y), fn(x, y))
    assert len(static.program_cache) == count
    assert all("check_sizes" in _ops(c.main_program) or "check_dims" in _ops(c.main_program)
               for c in static.program_cache)


def test_a_shape_neutral_size_assumption_needs_no_check():
    # `s0 // s1 != 0` for `reshape(-1, s1)` is shape-neutral: no rows gives shape (0,) from the same
    # program (ops/symbolic._shape_neutral no longer gives up at a probe size dividing by zero).
    static = d2s.declarative(rows, input_spec=[d2s.InputSpec([None]), d2s.InputSpec([None])])
    for a, b in [(6, 3), (0, 3), (8, 2), (0, 2)]:
        x, y = torch.randn(a), torch.randn(b)
        assert torch.equal(static(x, y), rows(x, y))
    assert len(static.program_cache) == 1
    for a, b in [(0, 0), (5, 0), (7, 2)]:  # torch's own reshape errors, from the program
        with pytest.raises(RuntimeError, match=r"shape|reshape"):
            static(torch.randn(a), torch.randn(b))


def test_converting_again_counts_toward_the_many_programs_warning(monkeypatch):
    monkeypatch.setattr(static_function, "MANY_PROGRAMS", 2)
    static = d2s.declarative(add, input_spec=[d2s.InputSpec([None]), d2s.InputSpec([None])])
    static(torch.ones(3), torch.ones(3))
    with pytest.warns(UserWarning, match="has built 2 programs"):
        static(torch.ones(1), torch.ones(3))


# -- what cannot be run again, and saved programs ------------------------------------------------

class Normalized(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x, mask):
        x = self.bn(x)  # training: updates the running statistics in place
        m = None if mask.all() else mask * -1e9
        return x if m is None else x + m


def test_a_run_that_changed_state_before_its_check_is_refused_not_repeated():
    model = d2s.declarative(Normalized())
    x = torch.randn(4, 3)
    model(x, torch.ones(4, 3))
    before = model.bn.num_batches_tracked.clone()
    with pytest.raises(RuntimeError, match="cannot convert again and rerun this call"):
        model(x, torch.zeros(4, 3))
    assert model.bn.num_batches_tracked == before + 1  # once, as the one eager call would
    model.eval()  # nothing changes state: both sides convert
    for mask in (torch.ones(4, 3), torch.zeros(4, 3)):
        assert torch.equal(model(x, mask), Normalized.forward(model, x, mask))


class WrittenThenMasked(torch.nn.Module):
    """An in-place write before the None-or-tensor decision: into a
    temporary the run made (MobileBERT's NoNorm, `h * w + b`, which the
    in-place pass runs as `mul_`/`add_` on the linear's result), or into
    the caller's input."""

    def __init__(self, write):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.w = torch.nn.Parameter(torch.randn(3))
        self.b = torch.nn.Parameter(torch.randn(3))
        self.bn = torch.nn.BatchNorm1d(3)
        self.write = write

    def forward(self, x, mask):
        h = self.lin(x)
        if self.write == "temporary, by the user":
            h.mul_(self.w)
        elif self.write == "temporary, by the pass":
            h = h * self.w + self.b
        elif self.write == "temporary's view":
            h[0].mul_(self.w)
        elif self.write == "factory at a run-time size":  # wav2vec2's feature-vector mask
            z = torch.zeros(x.shape[0], x.shape[1])
            z[:, 0] = 1.0
            h = h + z[:, :, None]
        elif self.write == "loop-carried temporary":  # a cache's counter in a decoding loop
            count = torch.zeros(())
            while count < 3:  # a tensor condition: a `while` op, `count` a loop variable
                count += 1
            h = h * count
        elif self.write == "an ATen op's new result":  # index_select: fresh by its schema (runtime/aten.py)
            t = torch.index_select(x, 2, torch.tensor([2, 0, 1]))  # of the input, but not the input
            t.mul_(self.w)
            h = h + t
        elif self.write == "a normalisation's result":  # timm: BatchNorm, then ReLU(inplace=True)
            t = self.bn(h)  # reads the running statistics, yet its result is memory of its own
            t.relu_()
            u = F.layer_norm(h, (3,), self.w, self.b)
            u.mul_(self.w)
            h = t + u
        elif self.write == "a pool's result":
            t = F.adaptive_avg_pool1d(self.w.expand(2, 3, 3), 2)  # of a parameter, not the parameter
            t.mul_(2.0)
            h = h + t.sum()
        elif self.write == "a branch's result":
            t = h * 2 if h.sum() > 0 else h - 1  # a `cond` op: a new tensor on either side
            t.mul_(self.w)
            h = t
        elif self.write == "input, carried by a loop":
            count = x.sum() * 0
            y = x
            while count < 2:
                y.mul_(self.w)
                count = count + 1
            h = h + y
        elif self.write == "input's view":
            x[0].mul_(self.w)
            h = h + x
        elif self.write == "input, through dropout":  # in eval mode dropout returns its input itself
            F.dropout(x, 0.5, training=self.training).mul_(self.w)
            h = h + x
        else:
            x.mul_(self.w)
            h = h + x
        return attend(h, mask)


@pytest.mark.parametrize("write", ["temporary, by the user", "temporary, by the pass", "temporary's view",
                                   "factory at a run-time size", "loop-carried temporary", "a branch's result",
                                   "an ATen op's new result", "a normalisation's result", "a pool's result"])
@pytest.mark.parametrize("masks", [[PADDED, FULL, PADDED], [FULL, PADDED, FULL]])
def test_a_write_into_a_temporary_before_the_check_converts_again(write, masks):
    model = WrittenThenMasked(write).eval()
    static = d2s.declarative(WrittenThenMasked(write).eval())
    static.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 3)
    with torch.no_grad():  # the in-place pass runs where autograd is off
        for mask in masks:
            assert torch.equal(static(x, mask), model(x, mask))
    programs = list(static.forward.program_cache)
    assert len(programs) == 2
    assert all("cond" in _ops(c.main_program) for c in programs)
    if write == "loop-carried temporary":
        assert all("while" in _ops(c.main_program) for c in programs)


@pytest.mark.parametrize("write", ["temporary, by the pass", "factory at a run-time size"])
def test_a_saved_model_reruns_a_write_into_a_temporary_on_its_other_path(write, tmp_path):
    model = WrittenThenMasked(write).eval()
    spec = [d2s.InputSpec([None, None, 3]), d2s.InputSpec([None, None])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d2s.jit.save(model, str(tmp_path / "m"), input_spec=spec)
    assert _paths(tmp_path / "m") == 1
    loaded = d2s.jit.load(str(tmp_path / "m"))
    with torch.no_grad():
        for x, mask in [(torch.randn(2, 3, 3), PADDED), (torch.randn(2, 3, 3), FULL), (torch.randn(4, 5, 3),
                                                                                       torch.ones(4, 5))]:
            assert torch.equal(loaded(x, mask), model(x, mask))
    ops = [_ops(p) for p in [loaded.program] + [part[0] for part in loaded._paths]]
    assert all("cond" in o and "decision_failed" in o for o in ops)


@pytest.mark.parametrize("write", ["input", "input's view", "input, through dropout", "input, carried by a loop"])
def test_a_write_into_what_the_caller_may_hold_is_refused_not_repeated(write):
    model = WrittenThenMasked(write).eval()
    static = d2s.declarative(WrittenThenMasked(write).eval())
    static.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 3)
    with torch.no_grad():
        assert torch.equal(static(x.clone(), PADDED), model(x.clone(), PADDED))
        given = x.clone()
        with pytest.raises(RuntimeError, match="cannot convert again and rerun this call.*mul_"):
            static(given, FULL)
    expected = x.clone()
    WrittenThenMasked.forward(model, expected, FULL)
    assert torch.equal(given, expected)  # written once, as the one eager call would


class DroppedThenMasked(torch.nn.Module):
    """Dropout before the None-or-tensor decision, as every transformers
    encoder runs its embeddings' dropout before building its mask."""

    def __init__(self, native):
        super().__init__()
        self.native = native

    def forward(self, x, mask):
        if self.native:  # torch.dropout(input, p, train): the op's args hold `train` positionally
            x = torch.dropout(x, 0.5, self.training)
        else:
            x = F.dropout(x, 0.5, training=self.training)
        return attend(x, mask)


@pytest.mark.parametrize("native", [False, True])
def test_dropout_in_eval_mode_draws_nothing_so_the_call_converts_again(native):
    model = d2s.declarative(DroppedThenMasked(native).eval())
    x = torch.randn(2, 3, 3)
    for mask in (PADDED, FULL, PADDED):
        assert torch.equal(model(x, mask), attend(x, mask))
    assert len(list(model.forward.program_cache)) == 2


@pytest.mark.parametrize("native", [False, True])
def test_dropout_in_training_draws_once_when_the_call_converts_again(native):
    # The run that breaks the decision drew its mask from torch's generator:
    # its state is put back before the call runs again, so the draws are
    # made once, as eager makes them (BERT fine-tuned on padded and unpadded batches).
    model = d2s.declarative(DroppedThenMasked(native).train())
    x = torch.randn(2, 3, 3)
    for seed, mask in enumerate((PADDED, FULL, PADDED, FULL)):
        torch.manual_seed(seed)
        want, want_state = attend(F.dropout(x, 0.5), mask), torch.get_rng_state()
        torch.manual_seed(seed)
        assert torch.equal(model(x, mask), want)
        assert torch.equal(torch.get_rng_state(), want_state)
    assert len(list(model.forward.program_cache)) == 2
    assert all({"cond", "decision_failed"} <= set(_ops(c.main_program)) for c in model.forward.program_cache)


class Masked(torch.nn.Module):
    def forward(self, x, mask):
        return attend(x, mask)


def _paths(path):
    with open(os.path.join(path, "program.json")) as f:
        return len(json.load(f).get("paths", []))


def _saved_and_loaded(model, path, input_spec):
    """`model` saved with `jit.save` (its warnings about the sides it
    traces again silenced) and loaded back."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d2s.jit.save(model, str(path), input_spec=input_spec)
    return d2s.jit.load(str(path))


@pytest.mark.parametrize("example", [PADDED, FULL])
def test_saved_model_holds_every_side_of_a_decision(tmp_path, example):
    # Saved from inputs taking one side, the model holds a program for the
    # other (d2s/save_paths.py), tried when the first raises DecisionFailed.
    x = torch.randn(2, 3, 3)
    loaded = _saved_and_loaded(Masked(), tmp_path / "m", [x, example])
    assert _paths(tmp_path / "m") == 1
    ops = [_ops(p) for p in [loaded.program] + [part[0] for part in loaded._paths]]
    assert all("cond" in o and "decision_failed" in o for o in ops)
    for mask in (PADDED, FULL, PADDED):
        assert torch.equal(loaded(x, mask), attend(x, mask))
    d2s.jit.save(loaded, str(tmp_path / "again"))
    again = d2s.jit.load(str(tmp_path / "again"))
    assert _paths(tmp_path / "again") == 1  # saved again from the loaded model: the paths stay
    assert torch.equal(again(x, FULL), attend(x, FULL))


class FullAndWindowed(torch.nn.Module):
    """One helper line reached by two calls that take different sides for
    one input: transformers' `sdpa_mask` building a model's full mask (None
    when nothing is masked) and its sliding-window mask (never None)."""

    def forward(self, x, mask):
        full = attend(x, mask)
        windowed = attend(x, mask * torch.tensor([1.0, 1.0, 0.0]))
        return full + windowed


@pytest.mark.parametrize("example", [PADDED, FULL])
def test_saved_model_holds_the_sides_each_call_of_a_helper_takes(tmp_path, example):
    # Sides were forced per source line: both calls took the same one, so
    # no saved path held (None, tensor) and an unpadded batch was refused.
    x = torch.randn(2, 3, 3)
    loaded = _saved_and_loaded(FullAndWindowed(), tmp_path / "m", [x, example])
    for mask in (PADDED, FULL, PADDED):
        assert torch.equal(loaded(x, mask), FullAndWindowed()(x, mask))


class Reshaped(torch.nn.Module):
    """The None side holds a view the saved sizes cannot take."""

    def forward(self, x, mask):
        m = mask_or_none(mask)
        if m is None:
            return x.reshape(5, -1)
        return x + m


def test_saved_model_refuses_the_side_it_could_not_trace(tmp_path):
    x = torch.randn(2, 3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d2s.jit.save(Reshaped(), str(tmp_path / "m"), input_spec=[x, PADDED])
    assert _paths(tmp_path / "m") == 0
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert torch.equal(loaded(x, PADDED), Reshaped()(x, PADDED))
    with pytest.raises(DecisionFailed, match="save from inputs that take this side"):
        loaded(x, FULL)


# -- a size that differs between the sides of an `if` on sizes -------------------------------------

def padded_to(x, mask):
    # transformers' prepare_padding_mask, then a slice whose size is min(length, mask length)
    pad = x.shape[1] - mask.shape[1]
    if pad > 0:
        mask = F.pad(mask, (0, pad))
    return x * mask[:, :x.shape[1]]


@pytest.mark.parametrize("pad", [0, 3])
def test_saved_size_merged_from_both_sides_is_traced_at_the_example_size(tmp_path, pad):
    # The merged mask length is a new symbol; with a made-up hint (8) the
    # slice decided `s1 > s8` at the saved length 64, and the loaded model
    # refused every input whose mask is as long as x.
    spec = [d2s.InputSpec([None, None]), d2s.InputSpec([None, None])]
    d2s.jit.save(d2s.declarative(padded_to), str(tmp_path / "m"), input_spec=spec)
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert "cond" in _ops(loaded.program)  # one program: both sides of `if pad > 0`
    for batch, length in [(2, 8), (1, 5), (3, 12)]:
        x, mask = torch.randn(batch, length), torch.ones(batch, length - pad)
        assert torch.equal(loaded(x, mask), padded_to(x, mask))


def size_of_side(x):
    n = x.shape[0]
    if x.sum() > 0:  # a run-time size (a SymInt) out of a tensor `if` (T5's relative buckets)
        n = x.shape[1]
    return x * n


def test_tensor_if_giving_a_run_time_size_merges_it():
    static = d2s.declarative(size_of_side, input_spec=[d2s.InputSpec([None, None])])
    for x in (torch.ones(2, 3), -torch.ones(4, 5), torch.ones(1, 7)):
        assert torch.equal(static(x), size_of_side(x))
    (concrete,) = list(static.program_cache)
    assert "cond" in _ops(concrete.main_program)


def cached_length(k):
    # transformers' DynamicLayer.get_seq_length: 0 for an empty cache, else a size
    if k.numel() == 0:
        return 0
    return k.shape[-2]


def length_first(k):
    if k.numel() != 0:
        return k.shape[-2]
    return 0


@pytest.mark.parametrize("length", [cached_length, length_first])
def test_a_number_returned_early_or_a_run_time_size_stays_a_number(length):
    # T5 at a dynamic save: `n.clone() if isinstance(n, torch.Tensor) else n`
    # had no one answer, as the path that returned early yielded a tensor
    # placeholder where it merged with the Python 0.
    def shifted(x):
        n = length(x)
        n = n.clone() if isinstance(n, torch.Tensor) else n
        return x * n + (1 if isinstance(n, int) else 2)

    static = d2s.declarative(shifted, input_spec=[d2s.InputSpec([None, None, 4])])
    for shape in [(2, 3, 4), (0, 3, 4), (1, 5, 4), (2, 0, 4)]:
        x = torch.randn(shape)
        assert torch.equal(static(x), shifted(x))
    (concrete,) = list(static.program_cache)
    assert "cond" in _ops(concrete.main_program)


# -- a reconversion at run-time sizes that cannot trace the side taken ---------------------------

def layout_read_on_one_side(x, m):
    """The false side merges two layouts of `q` and reads its strides, which
    tracing cannot answer at run-time sizes; `s` (a number or a tensor,
    returned) makes the `if` a decision."""
    a = x * 1.0
    s = 0.0
    q = m * 1.0
    if x.sum() < 0.0:
        pass
    else:
        s = min(s, a.sum()) + 0.1
        q = q.t().t() * 2.0
    return a + s + q.sum(0) + q.stride(0) + q.stride(1) * 0.5, s


def test_a_reconversion_refused_at_run_time_sizes_converts_at_the_calls_sizes():
    """The program of run-time sizes (traced for the true side) met a run of
    the false side; converting again at run-time sizes was refused at the
    stride read and the call failed, where a first conversion falls back
    to the call's own sizes. Now the reconversion does too."""
    static = d2s.declarative(layout_read_on_one_side)
    for sign, rows in ((1, 2), (-1, 2), (-1, 3), (1, 5), (-1, 6), (1, 7)):
        x, m = torch.ones(3) * sign, torch.ones(rows, 3)
        got, want = static(x, m), layout_read_on_one_side(x, m)
        assert torch.equal(got[0], want[0]) and type(got[1]) is type(want[1]) and got[1] == want[1], (sign, rows)
    assert all("decision_failed" in _ops(c.main_program) for c in static.program_cache)


# -- a decided `if` keeps the Python numbers of its live side --------------------------------------

def count_over_functions_after_a_tensor_return(x, n):
    """The `return` in the tensor loop guards what follows, so the loop over
    functions is unrolled into one `cond` per item; each trip gives `s` a
    bool or keeps a float, which makes that `cond` a decision. Its count of
    items (a Python int) became a tensor there, and the next trip's test
    (`bool()` of it) was refused."""
    a = x * 1.0
    t = x.sum()
    s = 0.0
    w = n * 1
    while w.add_(1) < 2:
        return a + t + s
    for fn in (torch.tanh, torch.sigmoid):
        s = bool(t > -0.5) if a.sum() > -0.5 else s
    else:
        s = s + (a > -0.5).float().sum().item()
        return a + t + s
    return a + t + s


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0], [1, 2, 0]])
def test_a_decided_if_keeps_the_python_count_of_an_unrolled_loop(order):
    calls = [(torch.ones(3), 0), (-torch.ones(3), 5), (torch.ones(3), 5)]  # return in the while; s float; s bool
    static = d2s.declarative(count_over_functions_after_a_tensor_return)
    for i in order:
        x, n = calls[i]
        want = count_over_functions_after_a_tensor_return(x.clone(), torch.tensor(n))
        assert torch.equal(static(x.clone(), torch.tensor(n)), want), calls[i]
    ops = {op for c in static.program_cache for op in _ops(c.main_program)}
    assert {"while", "cond", "decision_failed"} <= ops
