"""torch.nn.functional ops against eager, including random ones under a seed."""

import pytest
import torch
import torch.nn.functional as F

from opcheck import check, randn

DYN = [None, {0: [0]}]
IDS = ["static", "dynamic"]
W = randn(4, 6, seed=1)
B = randn(4, seed=2)
K2 = randn(5, 3, 3, 3, seed=3)
K1 = randn(5, 3, 2, seed=4)

IMAGE_OPS = {
    "conv2d": lambda x: F.conv2d(x, K2, padding=1),
    "conv2d_stride": lambda x: F.conv2d(x, K2, stride=2),
    "max_pool2d": lambda x: F.max_pool2d(x, 2),
    "avg_pool2d": lambda x: F.avg_pool2d(x, 3, stride=1, padding=1),
    "adaptive_avg": lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
    "adaptive_max": lambda x: F.adaptive_max_pool2d(x, 1),
    "interpolate_nearest": lambda x: F.interpolate(x, scale_factor=2),
    "interpolate_bilinear": lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=False),
    "pad": lambda x: F.pad(x, (1, 2, 0, 1)),
    "pad_reflect": lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"),
    "batch_norm_eval": lambda x: F.batch_norm(x, torch.zeros(3), torch.ones(3), training=False),
    "instance_norm": lambda x: F.instance_norm(x),
    "group_norm": lambda x: F.group_norm(x, 3),
    "pixel_shuffle": lambda x: F.pixel_shuffle(torch.cat([x, x, x, x], 1), 2),
    "unfold": lambda x: F.unfold(x, 2),
    "softmax": lambda x: F.softmax(x, dim=1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
}


@pytest.mark.parametrize("dyn", DYN, ids=IDS)
@pytest.mark.parametrize("name", sorted(IMAGE_OPS))
def test_image_op(name, dyn):
    check(IMAGE_OPS[name], lambda n: (randn(n, 3, 6, 8),), dyn)


@pytest.mark.parametrize("dyn,make", [(None, lambda n: (randn(2, 3, 9),)),
                                      ({0: [0]}, lambda n: (randn(n, 3, 9),)),
                                      ({0: [2]}, lambda n: (randn(2, 3, n + 4),))],
                         ids=["static", "batch", "length"])
def test_conv1d_and_pool1d(dyn, make):
    check(lambda x: (F.conv1d(x, K1), F.max_pool1d(x, 2), F.avg_pool1d(x, 2)), make, dyn)


ACTIVATIONS = "relu relu6 leaky_relu elu selu celu gelu silu mish softplus softsign hardtanh hardswish hardsigmoid logsigmoid tanhshrink sigmoid tanh".split()


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation(name):
    check(lambda x: getattr(F, name)(x), lambda n: (randn(n, 6),), {0: [0]})


@pytest.mark.parametrize("dyn", DYN, ids=IDS)
def test_linear_layer_norm_normalize(dyn):
    check(lambda x: (F.linear(x, W, B), F.linear(x, W), F.layer_norm(x, (6,)),
                     F.layer_norm(x, (6,), W[0], B.repeat(2)[:6]), F.normalize(x, dim=1), F.glu(x)),
          lambda n: (randn(n, 6),), dyn)


@pytest.mark.parametrize("dyn", DYN, ids=IDS)
def test_embedding_and_one_hot(dyn):
    table = randn(10, 4)
    check(lambda i: (F.embedding(i, table), F.embedding(i, table, padding_idx=0), F.one_hot(i, 10)),
          lambda n: (torch.arange(n * 2).reshape(n, 2) % 10,), dyn)


LOSSES = {
    "mse": lambda x, t, c: F.mse_loss(x, t),
    "l1_sum": lambda x, t, c: F.l1_loss(x, t, reduction="sum"),
    "smooth_l1_none": lambda x, t, c: F.smooth_l1_loss(x, t, reduction="none"),
    "huber": lambda x, t, c: F.huber_loss(x, t),
    "cross_entropy": lambda x, t, c: F.cross_entropy(x, c),
    "cross_entropy_smooth": lambda x, t, c: F.cross_entropy(x, c, label_smoothing=0.1),
    "nll": lambda x, t, c: F.nll_loss(F.log_softmax(x, 1), c),
    "bce_logits": lambda x, t, c: F.binary_cross_entropy_with_logits(x, t.sigmoid()),
    "bce": lambda x, t, c: F.binary_cross_entropy(x.sigmoid(), t.sigmoid()),
    "kl_div": lambda x, t, c: F.kl_div(F.log_softmax(x, 1), F.softmax(t, 1), reduction="batchmean"),
}


@pytest.mark.parametrize("dyn", [None, {0: [0], 1: [0], 2: [0]}], ids=IDS)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss(name, dyn):
    check(LOSSES[name], lambda n: (randn(n, 5), randn(n, 5, seed=1), torch.arange(n) % 5), dyn)


@pytest.mark.parametrize("dyn", DYN, ids=IDS)
def test_scaled_dot_product_attention(dyn):
    check(lambda q: F.scaled_dot_product_attention(q, q * 0.5, q + 1.0), lambda n: (randn(n, 2, 3, 4),), dyn)


# -- random ops: the same draws as eager under the same seed ------------------------------------

RANDOM = {
    "dropout": lambda x: F.dropout(x, 0.5),
    "dropout_eval": lambda x: F.dropout(x, 0.5, training=False),
    "dropout2d": lambda x: F.dropout2d(x[:, :, None, None], 0.3),
    "alpha_dropout": lambda x: F.alpha_dropout(x, 0.2, training=True),
    "two_dropouts": lambda x: (F.dropout(x, 0.5), F.dropout(x, 0.1)),  # draws in program order
    "rrelu": lambda x: F.rrelu(x, training=True),
    "bernoulli": lambda x: torch.bernoulli(x.sigmoid()),
}


@pytest.mark.parametrize("dyn", DYN, ids=IDS)
@pytest.mark.parametrize("name", sorted(RANDOM))
def test_random_op_same_draws_as_eager(name, dyn):
    check(RANDOM[name], lambda n: (randn(n, 16),), dyn, seed=1234)


def test_dropout_draws_differ_between_runs():
    # The mask is drawn when the program runs, not once when it is built.
    from opcheck import build, run
    x = torch.ones(4, 64)
    program, feeds, out = build(lambda v: F.dropout(v, 0.5), [x])
    a, = run(program, feeds, out, [x])
    b, = run(program, feeds, out, [x])
    assert not torch.equal(a, b)
