"""The generate loop of examples/generate.py around transformers' GPT-2 and
LLaMA (tiny random configs, offline): greedy tokens equal to eager's and
to `model.generate(do_sample=False)`, sampled tokens equal to eager's
under the same generator, for prompt lengths 1, 5 and 17 and max lengths
0, 1 and 20, both exits taken; saved and run in a fresh process that
never imports transformers. Skipped when transformers is not installed.

transformers decides on the prompt length where torch wants a Python bool
(sdpa's `is_causal = q_len > 1`, GPT-2's size check): a prompt of one
token and a longer one take a program each (d2s/decisions.py), both
converted by the calls here and both held by the saved model."""

import copy
import importlib.util
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import d2s
from generate import Generate, specs

transformers = pytest.importorskip("transformers")

PROMPTS = (5, 1, 17)
MAX_NEW = (20, 0, 1)
EOS, PAD = 3, 0


def _lm(kind):
    torch.manual_seed(0)
    common = dict(vocab_size=48, bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_positions=64, n_embd=16, n_layer=1, n_head=2, **common)
        lm = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                          **common)
        lm = transformers.LlamaForCausalLM(config)
    return lm.eval()


def _prompt(length):
    return torch.randint(4, 48, (1, length), generator=torch.Generator().manual_seed(length))


def _call(model, ids, max_new, sampling, seed=0):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # `past_key_values` is named `cache` from 5.x
        return model(ids, torch.tensor(max_new), *([torch.Generator().manual_seed(seed)] if sampling else []))


@pytest.fixture(scope="module", params=[("gpt2", "greedy"), ("llama", "greedy"), ("llama", "sampling")],
                ids=lambda p: "-".join(p))
def loop(request):
    kind, mode = request.param
    lm = _lm(kind)
    sampling = mode == "sampling"
    eager = Generate(lm, eos=EOS, pad=PAD, sample=sampling, temperature=0.8, top_k=10).eval()
    static = d2s.declarative(copy.deepcopy(eager), input_spec=specs(sampling))
    return lm, eager, static, sampling


def test_tokens_equal_eager_and_generate(loop):
    lm, eager, static, sampling = loop
    made = {}
    for length in PROMPTS:
        for max_new in MAX_NEW:
            ids = _prompt(length)
            want = _call(eager, ids, max_new, sampling)
            assert torch.equal(_call(static, ids, max_new, sampling), want)
            made[length, max_new] = want.shape[1] - length
            if not sampling and max_new:
                with torch.no_grad():
                    reference = lm.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                            max_new_tokens=max_new, eos_token_id=EOS, pad_token_id=PAD)
                assert torch.equal(want, reference)
    # One program for every prompt longer than one token, one for a one-token prompt.
    assert len(static.forward.program_cache) == 2
    assert [op.type for op in static.forward.concrete_program.main_program.global_block().ops].count("while") == 1
    assert any(n == m > 0 for (_, m), n in made.items())  # the max-length exit
    if not sampling:
        return
    eos_exit = [(n, m, s) for n in PROMPTS for m in (20,) for s in range(8)
                if _call(eager, _prompt(n), m, True, s).shape[1] - n < m]
    assert eos_exit  # EOS before the limit, for some seed
    n, m, s = eos_exit[0]
    assert torch.equal(_call(static, _prompt(n), m, True, s), _call(eager, _prompt(n), m, True, s))


LOAD = """
import json, sys
import torch, d2s
model = d2s.jit.load(sys.argv[1])
sampling = sys.argv[2] == "1"
out = []
for length, max_new in json.loads(sys.argv[3]):
    ids = torch.randint(4, 48, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        extra = [torch.Generator().manual_seed(0)] if sampling else []
        out.append(model(ids, torch.tensor(max_new), *extra).tolist())
print(json.dumps(out))
assert "transformers" not in sys.modules, "the loaded model imported transformers"
"""


def test_saved_loop_runs_without_transformers(loop, tmp_path):
    # Saved from the calls' own programs (their InputSpec has None batch and
    # length): the latest call's, and the one-token prompt's as a path.
    lm, eager, static, sampling = loop
    for length in PROMPTS:
        _call(static, _prompt(length), 2, sampling)
    d2s.jit.save(static, str(tmp_path / "loop"))
    cases = [(n, m) for n in PROMPTS for m in MAX_NEW]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p and "examples" not in p))
    run = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "loop"), str(int(sampling)), json.dumps(cases)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [_call(eager, _prompt(n), m, sampling).tolist() for n, m in cases]


def _zoo_lm(name):
    """A decoder of benchmarks/models.py's zoo (tiny config, eval mode)."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "models.py")
    spec = importlib.util.spec_from_file_location("models_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.build(next(e for e in bench.ZOO if e.name == name))


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gemma3_text"])
def test_generate_with_a_declarative_forward(kind):
    # The way most users try it: decorate the model, call `generate`. Each
    # step's forward updates the cache generate passes in place
    # (d2s/argument_writes.py; Gemma 3's keeps a sliding window), the cache
    # length becomes a run-time size (d2s/varying_sizes.py); every token
    # equals eager's, and a later `generate` of the same sizes runs on the
    # programs the first ones made.
    lm = _lm(kind) if kind in ("gpt2", "llama") else _zoo_lm(kind)
    eager = copy.deepcopy(lm)
    d2s.declarative(lm)
    options = dict(do_sample=False, max_new_tokens=4, min_new_tokens=4, pad_token_id=PAD)
    with torch.no_grad():
        for length in (5, 1, 5, 5):
            ids = _prompt(length)
            programs = len(lm.forward.program_cache)
            want = eager.generate(ids, attention_mask=torch.ones_like(ids), **options)
            assert torch.equal(lm.generate(ids, attention_mask=torch.ones_like(ids), **options), want)
        assert len(lm.forward.program_cache) == programs  # the last call made none
