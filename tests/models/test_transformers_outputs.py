"""A tiny random LLaMA under `d2s.declarative` (issue 22, classes 1-3 on the
model that found them): the ModelOutput comes back as itself, its
DynamicCache holds the run's tensors, and a padded and an unpadded batch
(the mask helper returns a tensor or None) each get their program."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
try:
    from transformers.models.llama import modeling_llama as modeling
except Exception as exc:  # noqa: BLE001 - a broken optional dependency (a torchvision built for another torch)
    pytest.skip(f"transformers' LLaMA cannot be imported here: {exc}", allow_module_level=True)

import d2s  # noqa: E402


def _model():
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return modeling.LlamaForCausalLM(config).eval()


def test_llama_outputs_and_cache_hold_the_runs_tensors():
    eager, model = _model(), d2s.declarative(_model())
    ids = torch.randint(0, 64, (2, 7))
    padded = torch.ones(2, 7, dtype=torch.long)
    padded[0, :2] = 0
    for mask in (padded, torch.ones_like(padded), padded):
        want, got = eager(input_ids=ids, attention_mask=mask), model(input_ids=ids, attention_mask=mask)
        assert type(got) is type(want)
        assert torch.allclose(got.logits, want.logits, atol=1e-6)
        cache = got.past_key_values
        assert type(cache) is type(want.past_key_values)
        for layer, ref in zip(cache.layers, want.past_key_values.layers):
            assert type(layer.keys) is torch.Tensor and torch.allclose(layer.keys, ref.keys, atol=1e-6)
    assert len(model.forward.program_cache) == 2  # the mask path and the None path


@pytest.mark.parametrize("flag", ["output_hidden_states", "output_attentions", "use_cache"])
def test_a_config_flag_changed_between_calls_is_read_as_eager_reads_it(flag):
    eager, model = _model(), _model()
    static = d2s.declarative(model)
    ids = torch.randint(0, 64, (1, 5))
    for value in (False, True, False):
        for m in (eager, model):
            setattr(m.config, flag, value)
        if flag == "output_attentions":  # eager attention returns the weights; sdpa does not
            for m in (eager, model):
                m.config._attn_implementation = "eager"
        want, got = eager(input_ids=ids), static(input_ids=ids)
        assert torch.allclose(got.logits, want.logits, atol=1e-6)
        key = {"output_hidden_states": "hidden_states", "output_attentions": "attentions",
               "use_cache": "past_key_values"}[flag]
        assert (getattr(got, key) is None) == (getattr(want, key) is None) == (not value)
