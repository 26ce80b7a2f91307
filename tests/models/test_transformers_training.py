"""A tiny random GPT-2 trained by a d2s.Graph (forward with its dropout,
transformers' own loss with ignored label positions, backward, SGD with
momentum) step for step as the eager loop trains it: the losses, every
parameter and the optimizer's state, bit for bit at the default level. The
step takes the training ops' shortcuts (ops/optimizer_ops.py) and the
loss's `F.cross_entropy` runs in a native segment."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
try:
    from transformers.models.gpt2 import modeling_gpt2 as modeling
except Exception as exc:  # noqa: BLE001 - a broken optional dependency (a torchvision built for another torch)
    pytest.skip(f"transformers' GPT-2 cannot be imported here: {exc}", allow_module_level=True)

import d2s  # noqa: E402
from ops import optimizer_ops  # noqa: E402

STEPS = 3


class Step(d2s.Graph):
    def __init__(self, model, optimizer, optimize):
        super().__init__(optimize=optimize)
        self.model = model
        self.add_optimizer(optimizer)

    def build(self, ids, labels):
        loss = self.model(input_ids=ids, labels=labels).loss
        loss.backward()
        return loss


def _batch(step):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 64, (2, 10), generator=g)
    labels = ids.clone()
    labels[:, : 2 + step] = -100  # positions the loss ignores
    return ids, labels


@pytest.mark.parametrize("optimize", ["default", "fast"])
def test_gpt2_graph_trains_as_the_eager_loop(optimize):
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, use_cache=False)
    torch.manual_seed(0)
    eager = modeling.GPT2LMHeadModel(config)
    model = copy.deepcopy(eager)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    graph_opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    graph = Step(model, graph_opt, optimize)
    assert optimizer_ops._plain_sgd(graph_opt)
    for step in range(STEPS):
        ids, labels = _batch(step)
        torch.manual_seed(100 + step)  # the same dropout masks
        eager_opt.zero_grad()
        want = eager(input_ids=ids, labels=labels).loss
        want.backward()
        eager_opt.step()
        torch.manual_seed(100 + step)
        got = graph(ids, labels)
        if optimize == "default":
            assert torch.equal(got, want)
            for (name, p), q in zip(eager.named_parameters(), model.parameters()):
                assert torch.equal(p, q), name
        else:  # the fast level's gradients: eager's up to the order of sums
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            for (name, p), q in zip(eager.named_parameters(), model.parameters()):
                torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    if optimize == "default":
        want_state, got_state = eager_opt.state_dict()["state"], graph_opt.state_dict()["state"]
        assert want_state.keys() == got_state.keys()
        assert all(torch.equal(want_state[k]["momentum_buffer"], got_state[k]["momentum_buffer"]) for k in want_state)
    assert len(graph._build_fn.program_cache) == 1
    types = [op.type for op in graph.program.global_block().ops]
    assert types[-2:] == ["tensor_backward", "optimizer_step"]


def test_bert_fine_tuned_on_padded_and_unpadded_batches_draws_its_dropout_once():
    # transformers builds no mask for an unpadded batch (`if padding_mask is
    # not None:` decides None): a call that takes that side after a padded
    # one converts again and runs again. Its embeddings' dropout had drawn
    # before the decision, so the call was refused; the generators' states
    # are now put back first, and every draw, loss and gradient is eager's.
    from transformers import BertConfig, BertForMaskedLM
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=24, max_position_embeddings=32, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    eager = BertForMaskedLM(config).train()
    model = copy.deepcopy(eager)
    forward = d2s.declarative(model.forward)
    for step, pad in enumerate((3, 0, 2, 0)):
        ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(step))
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[0, 8 - pad:] = 0
        results = []
        for run, module in ((eager.forward, eager), (forward, model)):
            torch.manual_seed(step)
            loss = run(input_ids=ids, attention_mask=mask, labels=ids).loss
            results.append((loss, torch.autograd.grad(loss, list(module.parameters())), torch.get_rng_state()))
        (loss_e, grads_e, state_e), (loss_d, grads_d, state_d) = results
        assert torch.equal(loss_e, loss_d) and torch.equal(state_e, state_d)
        assert all(torch.equal(a, b) for a, b in zip(grads_e, grads_d))
    assert len(forward.program_cache) == 2  # the padded batches' program and the unpadded ones'
    for concrete in forward.program_cache:  # each converted one side of the mask's `if`, the other a check
        assert {"cond", "decision_failed"} <= {op.type for block in concrete.main_program.blocks for op in block.ops}


@pytest.mark.parametrize("reentrant", [False, True])
def test_bloom_trained_with_gradient_checkpointing_gets_eagers_gradients(reentrant):
    """Each BLOOM layer runs under torch.utils.checkpoint, and its GELU is a
    custom autograd.Function: the layer's parameters before the GELU got no
    gradient at all (torch's checkpoint ran the layer unconverted, where the
    Function's apply lost its backward), silently."""
    from transformers import BloomConfig, BloomForCausalLM
    config = BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4, hidden_dropout=0.1,
                         attention_dropout=0.1)
    torch.manual_seed(0)
    eager = BloomForCausalLM(config).train()
    eager.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model = copy.deepcopy(eager)
    forward = d2s.declarative(model.forward)
    for step in range(2):
        ids, labels = _batch(step)
        results = []
        for run, module in ((eager.forward, eager), (forward, model)):
            module.zero_grad(set_to_none=True)
            torch.manual_seed(step)
            loss = run(input_ids=ids, labels=labels, use_cache=False).loss
            loss.backward()
            results.append((loss.detach(), [p.grad for p in module.parameters()]))
        (loss_e, grads_e), (loss_d, grads_d) = results
        assert torch.equal(loss_e, loss_d)
        assert all(g is not None for g in grads_e)
        assert all(torch.equal(a, b) for a, b in zip(grads_e, grads_d))
    types = {op.type for concrete in forward.program_cache for block in concrete.main_program.blocks
             for op in block.ops}
    assert "autograd_function" in types
