"""A generate loop written as plain Python around a causal LM with a KV
cache (examples/generate.py), greedy and sampled (temperature, top-k, a
`torch.Generator`): one program for prompt lengths 1, 5 and 17 and max
lengths 0, 1 and 20, both exits (EOS, max length) taken, tokens equal to
eager's (sampled ones drawn from the same generator state, which ends
where eager leaves it), the cache the loop grows coming back with the run's
tensors, and the saved program giving the same tokens in a fresh process
that never imports transformers."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

import d2s
from generate import Generate, KVCache, LMOutput, TinyLM, specs
from runtime.ir import Variable

PROMPTS = (1, 5, 17)
MAX_NEW = (0, 1, 20)
KINDS = ("greedy", "sampling")


def _prompt(length, batch=1):
    return torch.randint(4, 64, (batch, length), generator=torch.Generator().manual_seed(length))


def _eos():
    """A token greedy decoding makes early for the 5-token prompt (so the
    EOS exit is taken there), found with an EOS that never comes."""
    torch.manual_seed(0)
    lm = TinyLM().eval()
    with torch.no_grad():
        return int(Generate(lm, eos=-1)(_prompt(5), torch.tensor(20))[0, 5 + 3])


@pytest.fixture(scope="module")
def models():
    eos = _eos()
    torch.manual_seed(0)
    lm = TinyLM().eval()
    out = {}
    for kind in KINDS:
        eager = Generate(lm, eos=eos, sample=kind == "sampling", temperature=0.7, top_k=8).eval()
        out[kind] = eager, d2s.declarative(copy.deepcopy(eager), input_spec=specs(kind == "sampling"))
    return out


def _run(model, kind, ids, max_new, seed=0):
    """The tokens, and (sampling) the state the generator is left in."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        tokens = model(ids, torch.tensor(max_new), *([g] if kind == "sampling" else []))
    return tokens, g.get_state()


def _ops(static):
    return [op.type for op in static.forward.concrete_program.main_program.global_block().ops]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("length", PROMPTS)
@pytest.mark.parametrize("max_new", MAX_NEW)
def test_every_prompt_and_max_length_one_program(models, kind, length, max_new):
    eager, static = models[kind]
    for batch, seed in [(1, 0), (1, 1), (2, 0)]:
        ids = _prompt(length, batch)
        want, state = _run(eager, kind, ids, max_new, seed)
        got, got_state = _run(static, kind, ids, max_new, seed)
        assert torch.equal(got, want)
        assert torch.equal(got_state, state)  # sampling drew exactly eager's numbers, no more
    assert len(static.forward.program_cache) == 1  # one conversion for every call
    assert _ops(static).count("while") == 1


@pytest.mark.parametrize("kind", KINDS)
def test_both_exits_are_taken(models, kind):
    eager, _ = models[kind]
    made = {(n, m, seed): _run(eager, kind, _prompt(n), m, seed)[0].shape[1] - n
            for n in PROMPTS for m in MAX_NEW for seed in (0, 1)}
    assert any(k < m for (_, m, _), k in made.items())  # EOS before the limit
    assert any(k == m > 0 for (_, m, _), k in made.items())  # the limit


class Decode(torch.nn.Module):
    """Greedy decoding that returns the cache and the model's last output
    too: objects the loop rebinds (`out`) and grows in place (`cache`)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, max_new):
        mask = torch.ones_like(ids)
        out = self.lm(input_ids=ids, attention_mask=mask)
        cache = out.past_key_values
        step = 0
        while step < max_new:
            nxt = out.logits[:, -1].argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(nxt[:, None])], 1)
            out = self.lm(input_ids=nxt[:, None], attention_mask=mask, past_key_values=cache)
            cache = out.past_key_values
            step += 1
        return ids, cache, out


def test_the_cache_and_output_come_back_with_the_runs_tensors():
    torch.manual_seed(0)
    eager = Decode(TinyLM()).eval()
    static = d2s.declarative(copy.deepcopy(eager), input_spec=specs())
    with torch.no_grad():
        for length, max_new in [(5, 3), (2, 6), (9, 0)]:
            ids = _prompt(length)
            want = eager(ids, torch.tensor(max_new))
            got = static(ids, torch.tensor(max_new))
            assert torch.equal(got[0], want[0])
            assert type(got[1]) is KVCache and type(got[2]) is LMOutput
            assert type(got[2].past_key_values) is KVCache
            for a, b in zip(got[1].layers + got[2].past_key_values.layers, want[1].layers * 2):
                assert type(a.keys) is torch.Tensor and not isinstance(a.keys, Variable)
                assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
                assert a.keys.shape[-2] == length + max_new
            assert torch.equal(got[2].logits, want[2].logits)
    assert len(static.forward.program_cache) == 1


LOAD = """
import json, sys
import torch, d2s
model = d2s.jit.load(sys.argv[1])
sampling = sys.argv[2] == "sampling"
for length, max_new, batch, seed in json.loads(sys.argv[3]):
    ids = torch.randint(4, 64, (batch, length), generator=torch.Generator().manual_seed(length))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        tokens = model(ids, torch.tensor(max_new), *([g] if sampling else []))
    print(json.dumps(tokens.tolist()))
assert "transformers" not in sys.modules and "generate" not in sys.modules
"""

CASES = [(n, m, b, s) for n in PROMPTS for m in MAX_NEW for b, s in [(1, 0), (2, 1)]]


@pytest.mark.parametrize("kind", KINDS)
def test_saved_loop_runs_in_a_fresh_process(models, kind, tmp_path):
    eager, static = models[kind]
    d2s.jit.save(static, str(tmp_path / kind), input_spec=specs(kind == "sampling"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p and "examples" not in p))
    out = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / kind), kind, json.dumps(CASES)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    expected = [_run(eager, kind, _prompt(n, b), m, s)[0].tolist() for n, m, b, s in CASES]
    assert [json.loads(line) for line in out.stdout.splitlines()] == expected
