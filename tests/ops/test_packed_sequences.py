"""Packed sequences (`pack_padded_sequence` -> an RNN module ->
`pad_packed_sequence`) in a program: their kernels read the lengths'
values, so the sizes they make (`sum(lengths)` rows of data,
`max(lengths)` steps, the padded batch) are run-time sizes of the program,
never the sizes of one call frozen (ops/packed_sequences.py). They were
refused ("`torch._pack_padded_sequence` ... is not in d2s's op table").

torch's RNN modules check the hidden state against `int(batch_sizes[0])`
in their own Python, which d2s does not convert: that int is the example
call's, checked when the program runs (a decision: another batch converts
again, a saved program names the check)."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_packed_sequence, pad_sequence

import d2s
from runtime.errors import DecisionFailed


class Tagger(nn.Module):
    def __init__(self, kind, bidirectional, enforce_sorted):
        super().__init__()
        self.rnn = kind(4, 5, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(10 if bidirectional else 5, 3)
        self.enforce_sorted = enforce_sorted

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=self.enforce_sorted)
        out, hidden = self.rnn(packed)
        padded, out_lengths = pad_packed_sequence(out, batch_first=True)
        h = hidden[0] if isinstance(hidden, tuple) else hidden
        return self.head(padded), out_lengths, h


# Batch 3 of length 6: the longest sequence full, then one shorter than the
# padding (the padded output is shorter than the input), then sorted lengths.
LENGTHS = ([6, 2, 4], [1, 5, 3], [5, 5, 1])


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_rnns_give_eager_values_and_gradients(kind, bidirectional):
    torch.manual_seed(0)
    eager = Tagger(kind, bidirectional, enforce_sorted=False)
    model = d2s.declarative(copy.deepcopy(eager))
    for lengths in LENGTHS:
        x, lengths = torch.randn(3, 6, 4), torch.tensor(lengths)
        got, want = model(x, lengths), eager(x, lengths)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        got[0].sum().backward()
        want[0].sum().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert torch.equal(p.grad, q.grad), name
    assert len(model.forward.program_cache) == 1  # one program for every set of lengths
    ops = {op.type for op in model.forward.concrete_program.main_program.global_block().ops}
    assert {"torch._pack_padded_sequence", "torch._pad_packed_sequence"} <= ops


class TrimmedGRU(nn.Module):
    """`T = int(lengths.max())`, the batch trimmed to it and padded back to
    it: torch's pad_packed_sequence then tests `total_length < max_length`,
    a bool of two run-time sizes, in its own Python."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 5, batch_first=True)

    def forward(self, x, lengths):
        steps = int(lengths.max())
        packed = pack_padded_sequence(x[:, :steps], lengths, batch_first=True, enforce_sorted=False)
        out, h = self.gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=steps)
        return out, h


def test_padding_back_to_the_longest_length_read_as_an_int():
    # It raised "TypeError: __bool__ should return bool, returned int" inside torch.
    torch.manual_seed(0)
    eager = TrimmedGRU()
    model = d2s.declarative(copy.deepcopy(eager))
    for lengths in ([3, 2], [5, 1], [4, 4], [1, 1]):
        x, lengths = torch.randn(2, 6, 4), torch.tensor(lengths)
        got, want = model(x, lengths), eager(x, lengths)
        assert all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want))
    assert len(model.forward.program_cache) == 1


def padded_length(x, lengths):
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    padded, _ = pad_packed_sequence(packed, batch_first=True)
    # Sizes the lengths' values decide: read when the program runs.
    return padded.new_ones(padded.shape[1]).cumsum(0), packed.data.shape[0] * torch.ones(1)


def test_sizes_from_the_lengths_are_run_time_sizes():
    static = d2s.declarative(padded_length)
    for lengths in ([6, 2, 4], [1, 2, 1], [3, 3, 3]):
        x, lengths = torch.randn(3, 6, 4), torch.tensor(lengths)
        got, want = static(x, lengths), padded_length(x, lengths)
        assert all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want))
    assert len(static.program_cache) == 1
    data = [v for v in static.concrete_program.main_program.global_block().vars.values()
            if v.name.startswith("tmp") and v.dtype == torch.float32 and len(v.dims) == 2]
    assert data and all(isinstance(v.dims[0], str) for v in data)  # sum(lengths): never a frozen size


def test_sorted_packing_and_a_saved_model(tmp_path):
    torch.manual_seed(0)
    eager = Tagger(nn.GRU, False, enforce_sorted=True)
    spec = [d2s.InputSpec([None, None, 4]), d2s.InputSpec([None], torch.int64)]
    model = d2s.declarative(copy.deepcopy(eager), input_spec=spec)
    x = torch.randn(3, 6, 4)
    with torch.no_grad():
        for lengths in ([6, 4, 2], [5, 5, 1]):
            assert all(torch.equal(a, b) for a, b in zip(model(x, torch.tensor(lengths)), eager(x, torch.tensor(lengths))))
    path = str(tmp_path / "tagger")
    d2s.jit.save(model, path)
    loaded = d2s.jit.load(path)
    with torch.no_grad():
        for x, lengths in ((torch.randn(3, 8, 4), [8, 3, 1]), (torch.randn(3, 2, 4), [2, 2, 2])):
            lengths = torch.tensor(lengths)
            assert all(torch.equal(a, b) for a, b in zip(loaded(x, lengths), eager(x, lengths)))
        # GRU's own check reads `int(batch_sizes[0])`: the program was converted
        # for a batch of 3 and says so for another.
        with pytest.raises(DecisionFailed, match="the Python int 3"):
            loaded(torch.randn(2, 4, 4), torch.tensor([4, 1]))


def test_another_batch_converts_again():
    torch.manual_seed(0)
    eager = Tagger(nn.GRU, False, enforce_sorted=False)
    model = d2s.declarative(copy.deepcopy(eager), input_spec=[d2s.InputSpec([None, 5, 4]),
                                                                d2s.InputSpec([None], torch.int64)])
    with torch.no_grad():
        for x, lengths in ((torch.randn(3, 5, 4), [5, 2, 4]), (torch.randn(2, 5, 4), [1, 5]),
                           (torch.randn(3, 5, 4), [3, 5, 1])):
            lengths = torch.tensor(lengths)
            assert all(torch.equal(a, b) for a, b in zip(model(x, lengths), eager(x, lengths)))


def padded_and_packed(a, b, c):
    padded = pad_sequence([a, b, c], batch_first=True, padding_value=-1.0)
    packed = pack_sequence([a, b, c], enforce_sorted=False)
    out, _ = pad_packed_sequence(packed, batch_first=True)
    return padded, out


@pytest.mark.parametrize("dynamic", [False, True])
def test_pad_sequence_and_pack_sequence(dynamic):
    spec = [d2s.InputSpec([None, 2])] * 3 if dynamic else None
    static = d2s.declarative(padded_and_packed, input_spec=spec)
    for lengths in ((3, 5, 1), (2, 2, 4)):
        args = [torch.randn(n, 2, requires_grad=True) for n in lengths]
        want, got = padded_and_packed(*args), static(*args)
        assert all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(want, got))
        weights = [torch.randn(t.shape) for t in want]
        expected = torch.autograd.grad(sum((t * w).sum() for t, w in zip(want, weights)), args)
        grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip(got, weights)), args)
        assert all(torch.equal(g, e) for g, e in zip(grads, expected))
    # (Run-time lengths: which sequence is the longest is a size decision of its own.)
    assert len(static.program_cache) <= 2
