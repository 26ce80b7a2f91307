"""A greedy decoding loop written as plain Python around a causal LM, one
program for every prompt length and every number of new tokens.

    python examples/generate.py [--tokens 48] [--prompts 8]

The loop (`Greedy.forward`) is what users write: call the model on the
tokens so far, take the last position's argmax, append it, stop at
`max_new` tokens or when every sequence produced EOS. Under
`d2s.declarative` the `while` on a tensor bound and the `break` on a tensor
condition become one `while` op; the growing `ids` gets a symbolic length.
The program is saved with `d2s.jit.save` and loaded with `d2s.jit.load`,
and prints tokens/s for eager and d2s (tqdm shows the progress).
"""

import argparse
import copy
import os
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s


class TinyLM(nn.Module):
    """A one-layer causal transformer: token and position embeddings,
    causal self-attention, a vocabulary head."""

    def __init__(self, vocab=32, dim=16, heads=2, positions=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(positions, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)
        self.heads = heads

    def forward(self, ids):
        b, t = ids.shape
        h = self.emb(ids) + self.pos(torch.arange(t))
        q, k, v = (x.view(b, t, self.heads, -1).transpose(1, 2) for x in self.qkv(h).chunk(3, -1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        return self.head(h)


class Greedy(nn.Module):
    """Greedy decoding around `lm` until `max_new` tokens or EOS."""

    def __init__(self, lm, eos):
        super().__init__()
        self.lm = lm
        self.eos = eos

    def forward(self, ids, max_new):
        step = 0
        while step < max_new:
            logits = self.lm(ids)
            nxt = logits[:, -1].argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], 1)
            step += 1
            if (nxt == self.eos).all():
                break
        return ids


def specs():
    """One sequence of any length, and the number of new tokens."""
    return [d2s.InputSpec([1, None], "int64", name="ids"), d2s.InputSpec([], "int64", name="max_new")]


def _tokens_per_second(generate, prompts, max_new, progress):
    start, made = time.perf_counter(), 0
    for ids in progress(prompts):
        made += generate(ids, max_new).shape[1] - ids.shape[1]
    return made / (time.perf_counter() - start), made


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=48, help="new tokens per prompt at most")
    p.add_argument("--prompts", type=int, default=8)
    a = p.parse_args(argv)
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = lambda xs, **_: xs  # noqa: E731
    torch.manual_seed(0)
    eager = Greedy(TinyLM(), eos=3).eval()
    static = d2s.declarative(copy.deepcopy(eager), input_spec=specs())
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 32, (1, int(n)), generator=g) for n in torch.randint(1, 12, (a.prompts,), generator=g)]
    max_new = torch.tensor(a.tokens)
    with torch.no_grad():
        for ids in prompts:  # the same tokens, on every prompt
            assert torch.equal(static(ids, max_new), eager(ids, max_new))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "greedy")
            d2s.jit.save(static, path, input_spec=specs())
            loaded = d2s.jit.load(path)
            assert all(torch.equal(loaded(ids, max_new), eager(ids, max_new)) for ids in prompts)
        rates = {}
        for name, fn in [("eager", eager), ("d2s", static), ("d2s loaded", loaded)]:
            rates[name], made = _tokens_per_second(fn, prompts, max_new, lambda xs: tqdm(xs, desc=name, leave=False))
    ops = [op.type for op in static.forward.concrete_program.main_program.global_block().ops]
    print(f"{len(prompts)} prompts, {made} tokens each way; one program ({ops.count('while')} while op), "
          "tokens equal to eager's")
    for name, rate in rates.items():
        print(f"  {name:<11}{rate:9.0f} tokens/s  ({rate / rates['eager']:.2f}x eager)")


if __name__ == "__main__":
    main()
