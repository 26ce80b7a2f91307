"""Small models with data-dependent control flow, shared by the examples,
the benchmarks and the end-to-end tests."""

import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s


class LSTMTagger(nn.Module):
    """Tags every token of a sequence; loops `for t in range(length)` with a
    tensor `length`, so one program serves every sequence length."""

    def __init__(self, vocab=50, embed=16, hidden=32, tags=6):
        super().__init__()
        self.hidden = hidden
        self.embed = nn.Embedding(vocab, embed)
        self.cell = nn.LSTMCell(embed, hidden)
        self.out = nn.Linear(hidden, tags)

    def forward(self, tokens, length):
        batch = tokens.shape[0]
        h = torch.zeros(batch, self.hidden)
        c = torch.zeros(batch, self.hidden)
        emb = self.embed(tokens)
        scores = []
        for t in range(length):
            h, c = self.cell(emb[:, t], (h, c))
            scores.append(F.log_softmax(self.out(h), -1))
        return torch.stack(scores, 1)


class GreedyDecoder(nn.Module):
    """GRU greedy decoding: `while step < max_len`, stopping early with
    `if done.all(): break` once every sequence has produced `eos`."""

    def __init__(self, vocab=30, hidden=32, eos=1):
        super().__init__()
        self.eos = eos
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, h, max_len):
        token = torch.zeros(h.shape[0], dtype=torch.long, device=h.device)
        done = torch.zeros(h.shape[0], dtype=torch.bool, device=h.device)
        tokens = []
        step = 0
        while step < max_len:
            h = self.cell(self.embed(token), h)
            token = self.out(h).argmax(-1)
            tokens.append(token)
            done = done | (token == self.eos)
            step += 1
            if done.all():
                break
        return torch.stack(tokens, 1), step


def declarative_copy(module_cls, eager, **kwargs):
    """A second instance with the same weights whose forward is declarative."""
    static = module_cls(**kwargs)
    static.load_state_dict(eager.state_dict())
    return d2s.declarative(static)
