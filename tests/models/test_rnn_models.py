"""End to end: an LSTM tagger looping over a tensor length and a GRU greedy
decoder with an early `break`, each served by one program for every length,
matching eager outputs and gradients."""

import pytest
import torch

from models import GreedyDecoder, LSTMTagger, declarative_copy


def _op_types(program):
    return {op.type for block in program.blocks for op in block.ops}


@pytest.fixture(scope="module")
def tagger_pair():
    torch.manual_seed(0)
    eager = LSTMTagger()
    return eager, declarative_copy(LSTMTagger, eager)


@pytest.fixture(scope="module")
def decoder_pair():
    torch.manual_seed(1)
    eager = GreedyDecoder()
    return eager, declarative_copy(GreedyDecoder, eager)


def test_tagger_one_program_for_every_length(tagger_pair):
    eager, static = tagger_pair
    tokens = torch.randint(0, 50, (4, 9))
    for length in [1, 2, 5, 9]:
        want = eager(tokens, torch.tensor(length))
        got = static(tokens, torch.tensor(length))
        assert got.shape == (4, length, 6)
        assert torch.equal(got, want)
    assert len(static.forward.program_cache) == 1
    program = static.forward.concrete_program.main_program
    assert "while" in _op_types(program)


def test_tagger_gradients_match_eager(tagger_pair):
    eager, static = tagger_pair
    tokens = torch.randint(0, 50, (4, 9))
    targets = torch.randint(0, 6, (4, 6))
    for model in (eager, static):
        model.zero_grad()
        scores = model(tokens, torch.tensor(6))
        torch.nn.functional.nll_loss(scores.reshape(-1, 6), targets.reshape(-1)).backward()
    for (name, p), q in zip(eager.named_parameters(), static.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7), name


@pytest.mark.parametrize("max_len", [1, 3, 12, 40])
def test_decoder_matches_eager_with_and_without_early_stop(decoder_pair, max_len):
    eager, static = decoder_pair
    h = torch.randn(3, 32, generator=torch.Generator().manual_seed(7))
    want_tokens, want_steps = eager(h, torch.tensor(max_len))
    got_tokens, got_steps = static(h, torch.tensor(max_len))
    assert torch.equal(got_tokens, want_tokens)
    assert int(got_steps) == int(want_steps)
    assert len(static.forward.program_cache) == 1
    types = _op_types(static.forward.concrete_program.main_program)
    assert {"while", "cond"} <= types


def test_decoder_break_is_taken():
    """An eos-biased decoder stops before max_len: the early `break` path."""
    torch.manual_seed(2)
    eager = GreedyDecoder()
    with torch.no_grad():
        eager.out.bias[eager.eos] = 100.0  # every step predicts eos
    static = declarative_copy(GreedyDecoder, eager)
    h = torch.randn(2, 32)
    want_tokens, want_steps = eager(h, torch.tensor(10))
    got_tokens, got_steps = static(h, torch.tensor(10))
    assert want_steps == 1 and int(got_steps) == 1
    assert torch.equal(got_tokens, want_tokens)
