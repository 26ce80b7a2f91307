"""nn modules called on Variables: values, shapes, gradients into the bound
parameters, and buffer updates shared with the module."""

import copy

import pytest
import torch

import runtime
from runtime.errors import ConversionError
from opcheck import build, check, randn, run


def _modules():
    torch.manual_seed(0)
    return {
        "linear": (torch.nn.Linear(6, 4), lambda n: (randn(n, 6),)),
        "conv2d": (torch.nn.Conv2d(3, 4, 3, padding=1), lambda n: (randn(n, 3, 5, 5),)),
        "batchnorm_eval": (torch.nn.BatchNorm2d(3).eval(), lambda n: (randn(n, 3, 4, 4),)),
        "layernorm": (torch.nn.LayerNorm(6), lambda n: (randn(n, 6),)),
        "embedding": (torch.nn.Embedding(10, 3), lambda n: (torch.arange(n * 2).reshape(n, 2) % 10,)),
        "lstm": (torch.nn.LSTM(6, 5, batch_first=True), lambda n: (randn(n, 4, 6),)),
        "lstm_2layer": (torch.nn.LSTM(6, 5, num_layers=2), lambda n: (randn(4, n, 6),)),
        "gru": (torch.nn.GRU(6, 5, batch_first=True, bidirectional=True), lambda n: (randn(n, 4, 6),)),
        "lstm_cell": (torch.nn.LSTMCell(6, 5), lambda n: (randn(n, 6),)),
        "gru_cell": (torch.nn.GRUCell(6, 5), lambda n: (randn(n, 6),)),
        "mha": (torch.nn.MultiheadAttention(6, 2, batch_first=True).eval(), lambda n: (randn(n, 3, 6),)),
        "sequential": (torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)),
                       lambda n: (randn(n, 6),)),
    }


MODULES = _modules()


def _call(module, x):
    if isinstance(module, torch.nn.MultiheadAttention):
        return module(x, x, x)
    return module(x)


def _forward_cases():
    for name in sorted(MODULES):
        for dyn_id, dyn in (("static", None), ("dynamic", {0: [0]})):
            yield pytest.param(name, dyn, id=f"{name}-{dyn_id}")


@pytest.mark.parametrize("name,dyn", list(_forward_cases()))
def test_module_forward(name, dyn):
    module, make = MODULES[name]
    if name == "lstm_2layer" and dyn:
        dyn = {0: [1]}  # batch is dim 1 without batch_first
    check(lambda x: _call(module, x), make, dyn)


@pytest.mark.parametrize("name", [n
                                  for n in sorted(set(MODULES) - {"embedding"})])
def test_module_gradients_equal_eager(name):
    module, make = MODULES[name]
    x = make(3)[0]
    static_module = copy.deepcopy(module)

    def loss_of(m, v):
        out = _call(m, v)
        out = out[0] if isinstance(out, tuple) else out
        return (out * out).sum()

    loss_of(module, x).backward()
    program, feeds, loss = build(lambda v: loss_of(static_module, v), [x])
    got, = run(program, feeds, loss, [x])
    got.backward()
    for (pname, p), q in zip(module.named_parameters(), static_module.parameters()):
        assert q.grad is not None, pname
        assert torch.equal(p.grad, q.grad), pname
    module.zero_grad(set_to_none=True)


def test_embedding_gradient():
    emb = torch.nn.Embedding(10, 3)
    static = copy.deepcopy(emb)
    idx = torch.tensor([[1, 2], [2, 9]])
    emb(idx).sum().backward()
    program, feeds, out = build(lambda i: static(i).sum(), [idx])
    run(program, feeds, out, [idx])[0].backward()
    assert torch.equal(emb.weight.grad, static.weight.grad)


def test_batchnorm_train_updates_running_stats_shared_with_module():
    bn = torch.nn.BatchNorm2d(3, momentum=0.3)
    static = copy.deepcopy(bn)
    x = randn(4, 3, 2, 2)
    want = bn(x)
    program, feeds, out = build(lambda v: static(v), [x], {0: [0]})
    # Building must not touch the module's state; only running does.
    assert torch.equal(static.running_mean, torch.zeros(3))
    got, = run(program, feeds, out, [x])
    assert torch.equal(got, want)
    assert torch.equal(static.running_mean, bn.running_mean)
    assert torch.equal(static.running_var, bn.running_var)
    assert static.num_batches_tracked == bn.num_batches_tracked == 1
    # A second run updates the same tensors again, as a second eager call does.
    bn(x)
    run(program, feeds, out, [x])
    assert torch.equal(static.running_mean, bn.running_mean)
    assert static.num_batches_tracked == 2


def test_functional_batch_norm_training_with_stats():
    mean, var = torch.zeros(3), torch.ones(3)
    smean, svar = mean.clone(), var.clone()
    x = randn(5, 3)
    want = torch.nn.functional.batch_norm(x, mean, var, training=True, momentum=0.5)
    program, feeds, out = build(lambda v: torch.nn.functional.batch_norm(v, smean, svar, training=True,
                                                                           momentum=0.5), [x])
    got, = run(program, feeds, out, [x])
    assert torch.equal(got, want) and torch.equal(smean, mean) and torch.equal(svar, var)


def test_dropout_module_same_mask_as_eager():
    drop = torch.nn.Dropout(0.5)
    check(lambda x: drop(x), lambda n: (randn(n, 32),), {0: [0]}, seed=7)


def test_parameter_update_seen_by_next_run():
    # Lifted parameters are bound to the module's tensors, not copied.
    lin = torch.nn.Linear(2, 2)
    x = randn(1, 2)
    program, feeds, out = build(lambda v: lin(v), [x])
    before, = run(program, feeds, out, [x])
    with torch.no_grad():
        lin.weight.add_(1.0)
    after, = run(program, feeds, out, [x])
    assert torch.equal(after, lin(x)) and not torch.equal(before, after)


def test_module_constructed_inside_capture_mode():
    from ops.capture import CaptureMode
    program = runtime.Program()
    with runtime.program_guard(program):
        x = runtime.data("x", [None, 4])
        with CaptureMode():
            # Building a module while tracing runs its initialisers on
            # Variables; that is refused with an error naming the initialiser.
            with pytest.raises(ConversionError, match="kaiming_uniform_"):
                torch.nn.Linear(4, 2)(x)


@pytest.mark.parametrize("mask", ["float attn_mask", "bool attn_mask", "key_padding_mask", "both"])
def test_multihead_attention_with_masks(mask):
    """nn.MultiheadAttention asks `F._none_or_dtype(mask)`, which accepts only
    real tensors: while capturing it also takes graph tensors (and is torch's
    own function again afterwards)."""
    import d2s
    import torch.nn.functional as F
    original = F._none_or_dtype
    torch.manual_seed(0)
    attn = torch.nn.MultiheadAttention(6, 2, batch_first=True)
    causal = torch.tril(torch.ones(3, 3))
    padding = torch.tensor([[False, False, True], [False, False, False]])

    def f(x, causal, padding):
        masks = {"float attn_mask": dict(attn_mask=causal.log()), "bool attn_mask": dict(attn_mask=causal == 0),
                 "key_padding_mask": dict(key_padding_mask=padding),
                 "both": dict(attn_mask=causal == 0, key_padding_mask=padding)}[mask]
        out, weights = attn(x, x, x, **masks)
        return out, weights

    x = torch.randn(2, 3, 6)
    got, want = d2s.declarative(f)(x, causal, padding), f(x, causal, padding)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert F._none_or_dtype is original
