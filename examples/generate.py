"""A generate loop written as plain Python around a causal LM with a KV
cache: greedy and sampled decoding, one program for every prompt length
and every number of new tokens.

    python examples/generate.py [--tokens 48] [--prompts 8]

`Generate.forward` is what users write: run the prompt through the model
once (the prefill), then feed it one token at a time with the cache the
model returned, growing the attention mask, until `max_new_tokens` tokens
or until every sequence produced EOS. Greedy takes the argmax; sampling
divides by a temperature, keeps the top k and draws with
`torch.multinomial(..., generator=generator)` from the `torch.Generator`
the caller passes. Under `d2s.declarative` the `while` on a tensor bound
and the `break` on a tensor condition become one `while` op; the cache's
keys and values (attributes of the cache object the model updates in
place, as transformers' DynamicCache) are carried by it and grow every
trip, and `out`, a new output object every trip, is carried as its parts.
The same `Generate` runs around transformers' causal LMs
(tests/models/test_generate_transformers.py). The program is saved with `d2s.jit.save` and loaded with
`d2s.jit.load` (it takes the generator as an input), and the example
prints tokens/s for eager, d2s and the loaded model on one thread (tqdm
shows the progress; docs/models.md has the numbers).
"""

import argparse
import copy
import dataclasses
import os
import tempfile
import time
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import d2s


class CacheLayer:
    """The keys and values of one attention layer, as transformers'
    DynamicLayer holds them: None until the first update, then grown by
    `torch.cat` along the sequence."""

    def __init__(self):
        self.keys = self.values = None

    def update(self, keys, values):
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], -2)
            self.values = torch.cat([self.values, values], -2)
        return self.keys, self.values

    def get_seq_length(self):
        if self.keys is None or self.keys.numel() == 0:
            return 0
        return self.keys.shape[-2]


class KVCache:
    """A key/value cache the model updates in place, one layer object per
    attention layer (the shape of transformers' DynamicCache)."""

    def __init__(self, layers):
        self.layers = [CacheLayer() for _ in range(layers)]

    def get_seq_length(self):
        return self.layers[0].get_seq_length()


@dataclasses.dataclass
class LMOutput:
    logits: torch.Tensor
    past_key_values: Optional[KVCache] = None


class Attention(nn.Module):
    def __init__(self, dim, heads, index):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.heads, self.index = heads, index

    def forward(self, h, mask, cache):
        b, t, _ = h.shape
        q, k, v = (x.view(b, t, self.heads, -1).transpose(1, 2) for x in self.qkv(h).chunk(3, -1))
        k, v = cache.layers[self.index].update(k, v)
        total = k.shape[-2]
        # Query i (at position total - t + i) sees the keys up to its own
        # position that the attention mask keeps.
        causal = torch.ones(t, total, dtype=torch.bool).tril(total - t)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=causal & mask[:, None, None, :].bool())
        return h + self.proj(a.transpose(1, 2).reshape(b, t, -1))


class TinyLM(nn.Module):
    """A causal transformer: token and position embeddings, attention
    layers reading and growing a KV cache, a vocabulary head. Called as
    transformers' causal LMs are: `lm(input_ids=..., attention_mask=...,
    past_key_values=cache, use_cache=True)`, returning `.logits` and
    `.past_key_values`."""

    def __init__(self, vocab=64, dim=32, heads=2, layers=2, positions=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(positions, dim)
        self.layers = nn.ModuleList(Attention(dim, heads, i) for i in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, attention_mask, past_key_values=None, use_cache=True):
        cache = past_key_values if past_key_values is not None else KVCache(len(self.layers))
        start = cache.get_seq_length()
        h = self.emb(input_ids) + self.pos(torch.arange(start, start + input_ids.shape[1]))
        for layer in self.layers:
            h = layer(h, attention_mask, cache)
        return LMOutput(self.head(h), cache if use_cache else None)


class Generate(nn.Module):
    """Greedy decoding, or sampling with a temperature and top-k, around a
    causal LM with a KV cache, until `max_new_tokens` or EOS in every
    sequence (finished sequences get `pad`, as transformers' generate)."""

    def __init__(self, lm, eos, pad=0, sample=False, temperature=1.0, top_k=0):
        super().__init__()
        self.lm = lm
        self.eos, self.pad = eos, pad
        self.sample, self.temperature, self.top_k = sample, temperature, top_k

    def pick(self, logits, generator):
        if not self.sample:
            return logits.argmax(-1)
        logits = logits / self.temperature
        if self.top_k:
            kth = torch.topk(logits, self.top_k).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, -1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]

    def forward(self, input_ids, max_new_tokens, generator=None):
        mask = torch.ones_like(input_ids)
        out = self.lm(input_ids=input_ids, attention_mask=mask, use_cache=True)
        cache = out.past_key_values
        unfinished = torch.ones(input_ids.shape[0], dtype=torch.bool)
        ids, step = input_ids, 0
        while step < max_new_tokens:
            nxt = self.pick(out.logits[:, -1], generator)
            nxt = torch.where(unfinished, nxt, self.pad)
            ids = torch.cat([ids, nxt[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(nxt[:, None])], 1)
            unfinished = unfinished & (nxt != self.eos)
            step += 1
            if step >= max_new_tokens or not unfinished.any():
                break
            out = self.lm(input_ids=nxt[:, None], attention_mask=mask, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
        return ids


def specs(generator=False):
    """Any batch of prompts of any length, the number of new tokens, and
    (sampling) the generator to draw from."""
    return [d2s.InputSpec([None, None], "int64", name="input_ids"),
            d2s.InputSpec([], "int64", name="max_new_tokens")] + ([torch.Generator()] if generator else [])


def _tokens_per_second(generate, prompts, max_new, seed, progress, repeats=3):
    """New tokens per second over all prompts, the best of `repeats` passes."""
    best = 0.0
    for _ in range(repeats):
        start, made = time.perf_counter(), 0
        for ids in progress(prompts):
            extra = (torch.Generator().manual_seed(seed),) if seed is not None else ()
            made += generate(ids, max_new, *extra).numel() - ids.numel()
        best = max(best, made / (time.perf_counter() - start))
    return best, made


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=48, help="new tokens per prompt at most")
    p.add_argument("--prompts", type=int, default=8)
    a = p.parse_args(argv)
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = lambda xs, **_: xs  # noqa: E731
    # A model this small runs a few microseconds per op: one thread is fastest
    # for eager and d2s alike, and steady on a shared machine.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    lm = TinyLM().eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 64, (1, int(n)), generator=g) for n in torch.randint(1, 18, (a.prompts,), generator=g)]
    max_new = torch.tensor(a.tokens)
    print(f"{len(prompts)} prompts of {min(p.shape[1] for p in prompts)} to {max(p.shape[1] for p in prompts)} "
          f"tokens, at most {a.tokens} new tokens each")
    for name, eager, seed in [("greedy", Generate(lm, eos=3), None),
                              ("sampling (temperature 0.8, top-k 20)",
                               Generate(lm, eos=3, sample=True, temperature=0.8, top_k=20), 7)]:
        sampling = seed is not None
        static = d2s.declarative(copy.deepcopy(eager), input_spec=specs(sampling))
        extra = lambda: (torch.Generator().manual_seed(seed),) if sampling else ()  # noqa: E731
        with torch.no_grad():
            for ids in prompts:  # the same tokens, on every prompt (sampling: from the same generator state)
                assert torch.equal(static(ids, max_new, *extra()), eager(ids, max_new, *extra()))
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "generate")
                d2s.jit.save(static, path, input_spec=specs(sampling))
                loaded = d2s.jit.load(path)
            assert all(torch.equal(loaded(ids, max_new, *extra()), eager(ids, max_new, *extra())) for ids in prompts)
            rates = {}
            for label, fn in [("eager", eager), ("d2s", static), ("d2s loaded", loaded)]:
                rates[label], made = _tokens_per_second(fn, prompts, max_new, seed,
                                                        lambda xs: tqdm(xs, desc=f"{name}: {label}", leave=False))
        ops = [op.type for op in static.forward.concrete_program.main_program.global_block().ops]
        print(f"{name}: {made} tokens per pass, one thread; {len(static.forward.program_cache)} program "
              f"({ops.count('while')} while op), tokens equal to eager's, also from the loaded model")
        for label, rate in rates.items():
            print(f"  {label:<11}{rate:9.0f} tokens/s  ({rate / rates['eager']:.2f}x eager)")


if __name__ == "__main__":
    main()
