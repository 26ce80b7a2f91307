"""A greedy decoding loop written as plain Python around a causal LM
(examples/generate.py): one program for prompt lengths 1, 5 and 17 and
max lengths 0, 1 and 20, both exits (EOS, max length) taken, tokens equal
to eager's, also from a saved model in a fresh process."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

import d2s
from generate import Greedy, TinyLM, specs

PROMPTS = (1, 5, 17)
MAX_NEW = (0, 1, 20)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    eager = Greedy(TinyLM(), eos=3).eval()
    return eager, d2s.declarative(copy.deepcopy(eager), input_spec=specs())


def _prompt(length):
    return torch.randint(4, 32, (1, length), generator=torch.Generator().manual_seed(length))


@pytest.mark.parametrize("length", PROMPTS)
@pytest.mark.parametrize("max_new", MAX_NEW)
def test_every_prompt_and_max_length_one_program(models, length, max_new):
    eager, static = models
    ids, limit = _prompt(length), torch.tensor(max_new)
    with torch.no_grad():
        expected = eager(ids, limit)
        assert torch.equal(static(ids, limit), expected)
    assert len(static.forward.program_cache) == 1
    assert "while" in [op.type for op in static.forward.concrete_program.main_program.global_block().ops]


def test_both_exits_are_taken(models):
    eager, _ = models
    with torch.no_grad():
        stopped = {(length, max_new): eager(_prompt(length), torch.tensor(max_new)).shape[1] - length
                   for length in PROMPTS for max_new in MAX_NEW}
    assert any(n < max_new for (_, max_new), n in stopped.items())  # EOS before the limit
    assert any(n == max_new > 0 for (_, max_new), n in stopped.items())  # the limit


LOAD = """
import sys, torch, d2s
model = d2s.jit.load(sys.argv[1])
for length, max_new in [(1, 20), (5, 1), (17, 20), (5, 0)]:
    ids = torch.randint(4, 32, (1, length), generator=torch.Generator().manual_seed(length))
    print(model(ids, torch.tensor(max_new)).tolist())
"""


def test_saved_loop_runs_in_a_fresh_process(models, tmp_path):
    eager, static = models
    d2s.jit.save(static, str(tmp_path / "greedy"), input_spec=specs())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "greedy")], capture_output=True, text=True,
                         env=env, timeout=300, check=True).stdout.splitlines()
    with torch.no_grad():
        expected = [eager(_prompt(n), torch.tensor(m)).tolist() for n, m in [(1, 20), (5, 1), (17, 20), (5, 0)]]
    assert [json.loads(line) for line in out] == expected
