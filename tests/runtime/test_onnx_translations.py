"""runtime/onnx_translations.py: the ATen translations d2s gives torch.onnx
besides its library, exported with a dynamic batch and run in onnxruntime
against eager (rtol 1e-4)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import d2s

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


class _CrossEntropy(torch.nn.Module):
    def __init__(self, weighted, reduction, smoothing, ignore):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(5) + 0.5) if weighted else None
        self.reduction, self.smoothing, self.ignore = reduction, smoothing, ignore

    def forward(self, x, y):
        return F.cross_entropy(x, y, weight=self.weight, reduction=self.reduction,
                               label_smoothing=self.smoothing, ignore_index=self.ignore)


def _targets(kind, shape):
    """Probabilities over dimension 1 (or 0 unbatched), or class indices
    with some of them the ignored index 2."""
    if kind == "probabilities":
        return torch.softmax(torch.randn(shape), dim=1 if len(shape) > 1 else 0)
    classes = torch.randint(0, 5, shape[:1] + shape[2:])
    classes.view(-1)[0] = 2  # the ignored index, and a real class in the other rows
    return classes


# torchlib's own function is SoftmaxCrossEntropyLoss, which refuses
# probabilities and leaves label smoothing out (a wrong value).
@pytest.mark.parametrize("kind, weighted, smoothing", [
    ("probabilities", False, 0.0), ("probabilities", True, 0.2),
    ("classes", False, 0.1), ("classes", True, 0.3)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("spatial", [False, True])
def test_cross_entropy_targets_and_label_smoothing(tmp_path, kind, weighted, smoothing, reduction, spatial):
    torch.manual_seed(0)
    model = _CrossEntropy(weighted, reduction, smoothing, ignore=-100 if kind == "probabilities" else 2).eval()
    tail = (3, 2) if spatial else ()
    spec = [d2s.InputSpec([None, 5, *tail])] + [
        d2s.InputSpec([None, 5, *tail]) if kind == "probabilities" else d2s.InputSpec([None, *tail], "int64")]
    path = str(tmp_path / "ce.onnx")
    d2s.onnx.export(d2s.declarative(model), path, input_spec=spec)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for batch in (2, 6):  # (a class-index program is converted for batches other than 1)
        x = torch.randn(batch, 5, *tail)
        y = _targets(kind, (batch, 5, *tail))
        with torch.no_grad():
            want = model(x, y).numpy()
        got, = session.run(None, {names[0]: x.numpy(), names[1]: y.numpy()})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


class _MaskedFill(torch.nn.Module):
    """GHM loss's weights: a number computed from tensors (float64 in d2s,
    a Python float eagerly) written through a mask, on one side of an if."""

    def forward(self, pred, target):
        weights = torch.zeros_like(pred)
        gap = torch.abs(pred - target)
        total = max(gap.sum().item(), 1.0)
        picked = gap > 0.5
        count = picked.sum().item()
        if count > 0:
            weights[picked] = total / count
        return weights


def test_index_put_casts_its_values(tmp_path):
    path = str(tmp_path / "put.onnx")
    model = _MaskedFill().eval()
    d2s.onnx.export(d2s.declarative(model), path, input_spec=[d2s.InputSpec([None, 4])] * 2)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for batch, spread in [(3, 0.0), (5, 2.0), (1, 2.0)]:  # no element picked, then some
        pred = torch.rand(batch, 4)
        target = pred + spread * torch.rand(batch, 4)
        got, = session.run(None, {names[0]: pred.numpy(), names[1]: target.numpy()})
        np.testing.assert_allclose(got, model(pred, target).numpy(), rtol=1e-4, atol=1e-5)


class _PairLoss(torch.nn.Module):
    """ParityBench's ContrastiveLoss: rows picked by masks (a size known at
    run time), and a sum only when some are left."""

    def forward(self, inputs, targets):
        sim = inputs @ inputs.t()
        total = 0
        for i in range(inputs.size(0)):
            same = torch.masked_select(sim[i], targets == targets[i])
            far = torch.masked_select(sim[i].unsqueeze(0), (sim[i] > 0.5).unsqueeze(1))  # broadcast mask
            extra = 0
            if len(far) > 0:
                extra = torch.sum(far)
            total = total + torch.sum(1 - same) + extra
        return total


def test_masked_select_broadcasts_and_flattens(tmp_path):
    path = str(tmp_path / "sel.onnx")
    model = _PairLoss().eval()
    torch.manual_seed(0)
    inputs, targets = torch.rand(3, 4), torch.tensor([0, 1, 0])
    static = d2s.declarative(model)
    static(inputs, targets)
    model_proto = d2s.onnx.export(static, path)
    assert "If" in {node.op_type for node in model_proto.graph.node}
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for scale in (1.0, 0.1):  # some similarities above 0.5, then none: both sides of the if
        x = inputs * scale
        got, = session.run(None, {names[0]: x.numpy(), names[1]: targets.numpy()})
        np.testing.assert_allclose(got, model(x, targets).numpy(), rtol=1e-4, atol=1e-5)


class _DisparityRegression(torch.nn.Module):
    """`.data` of a plain tensor attribute (ParityBench RealtimeStereo)."""

    def __init__(self):
        super().__init__()
        self.disp = torch.arange(4.0).view(1, 4, 1, 1)

    def forward(self, x):
        return torch.sum(x * self.disp.data, 2, keepdim=True)


def test_data_of_a_constant_tensor(tmp_path):
    path = str(tmp_path / "data.onnx")
    model = _DisparityRegression().eval()
    d2s.onnx.export(d2s.declarative(model), path, input_spec=[d2s.InputSpec([None, 4, 3, 2])])
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        x = torch.rand(batch, 4, 3, 2)
        got, = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5)
