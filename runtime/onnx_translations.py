"""The translation table d2s hands torch.onnx besides its own library
(`custom_translation_table` of `torch.onnx.export`):

    d2s_onnx::lstm / ::gru   torch.onnx's own aten_lstm / aten_gru
                             (the custom ops of runtime/onnx_rnn.py)
    aten::squeeze.dim        Squeeze only a dimension that may be 1: torch's
                             `x.squeeze(1)` of a dimension of another size
                             returns x, while torchlib's function emits a
                             Squeeze that ONNX refuses ("Dimension of input 1
                             must be 1") for a static size other than 1
    aten::cross_entropy_loss torchlib's function is ONNX SoftmaxCrossEntropyLoss,
                             which takes class indices only and which it
                             calls without `label_smoothing` (a silent wrong
                             value); probability targets and label smoothing
                             are written here as torch computes them
                             (log_softmax, then the weighted sums)
    aten::index_put          the values cast to the tensor's dtype first, as
                             torch does (`w[mask] = total / count`, a 0-d
                             float64 into float32): torchlib's ScatterND
                             takes them as they are, which ONNX refuses
    aten::masked_select      not in torchlib: both operands broadcast, then
                             Compress of the flattened tensor by the
                             flattened mask (row-major, as torch orders it)
"""

import torch


def _squeeze_dim(self, dim: int):
    from onnxscript import opset18 as op
    shape = self.shape
    if shape is None or len(shape) == 0:
        return op.Identity(self)
    size = shape[dim]
    if isinstance(size, int) and size != 1:
        return op.Identity(self)  # torch leaves a dimension of another size as it is
    return op.Squeeze(self, op.Constant(value_ints=[dim]))


def _axes(op, *axes):
    return op.Constant(value_ints=list(axes))


def _cross_entropy_loss(self, target, weight=None, reduction: int = 1, ignore_index: int = -100,
                        label_smoothing: float = 0.0):
    from onnxscript import ir, opset18 as op
    from onnxscript.function_libs.torch_lib.ops import nn
    integer = target.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16,
                                   ir.DataType.BFLOAT16)
    if integer and label_smoothing == 0:
        return nn.aten_cross_entropy_loss(self, target, weight, reduction, ignore_index)
    if self.shape is None:
        raise NotImplementedError("cross_entropy_loss of an input of unknown rank")
    rank = len(self.shape)
    axis = 0 if rank == 1 else 1  # torch's class dimension
    logp = op.LogSoftmax(self, axis=axis)
    if weight is not None:  # [C, 1, ...]: broadcasts along the class dimension
        logp_w = op.Mul(logp, op.Reshape(weight, _axes(op, -1, *[1] * max(rank - 2, 0))))
    else:
        logp_w = logp
    classes = op.CastLike(op.Gather(op.Shape(self), op.Constant(value_int=axis)), self)
    if integer:
        return _smoothed_class_loss(op, nn, self, target, weight, logp_w, classes, axis, reduction,
                                    ignore_index, label_smoothing)
    if label_smoothing > 0:
        target = op.Add(op.Mul(target, op.CastLike(1.0 - label_smoothing, self)),
                        op.Div(op.CastLike(label_smoothing, self), classes))
    products = op.Mul(logp_w, target)
    if reduction == 0:
        return op.Neg(op.ReduceSum(products, _axes(op, axis), keepdims=0))
    total = op.Neg(op.ReduceSum(products, keepdims=0))
    if reduction == 2:
        return total
    # mean over the samples: numel / classes (0 / 0 is NaN for no samples, as in torch)
    return op.Div(total, op.Div(op.CastLike(op.Size(self), self), classes))


def _smoothed_class_loss(op, nn, self, target, weight, logp_w, classes, axis, reduction, ignore_index,
                         label_smoothing):
    """torch's class-index cross entropy with label smoothing:
    (1 - ls) * nll + ls / C * smooth, smooth being the (weighted) sum of
    -log p over the classes of each sample not ignored, reduced as nll is
    (a mean divides by the weights of the targets not ignored)."""
    nll = nn.aten_cross_entropy_loss(self, target, weight, reduction, ignore_index)
    ignored = op.Equal(target, op.CastLike(ignore_index, target))
    zero = op.CastLike(0.0, self)
    smooth = op.Where(ignored, zero, op.Neg(op.ReduceSum(logp_w, _axes(op, axis), keepdims=0)))
    if reduction != 0:
        smooth = op.ReduceSum(smooth, keepdims=0)
    if reduction == 1:
        if weight is not None:
            picked = op.Gather(weight, op.Where(ignored, op.CastLike(0, target), target))
            count = op.ReduceSum(op.Where(ignored, zero, picked), keepdims=0)
        else:
            count = op.CastLike(op.ReduceSum(op.Cast(op.Not(ignored), to=7), keepdims=0), self)
        smooth = op.Div(smooth, count)
    return op.Add(op.Mul(op.CastLike(1.0 - label_smoothing, self), nll),
                  op.Mul(smooth, op.Div(op.CastLike(label_smoothing, self), classes)))


def _index_put(self, indices, values, accumulate: bool = False):
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops import core
    if values.dtype != self.dtype:
        values = op.CastLike(values, self)
    return core.aten_index_put(self, indices, values, accumulate)


def _masked_select(self, mask):
    from onnxscript import opset18 as op
    values = op.Expand(self, op.Shape(mask))  # Expand broadcasts both ways: the common shape
    flags = op.Expand(mask, op.Shape(values))
    return op.Compress(op.Reshape(values, _axes(op, -1)), op.Reshape(flags, _axes(op, -1)), axis=0)


def translations():
    from onnxscript.function_libs.torch_lib.ops import core
    from . import onnx_rnn  # lazy: registers the d2s_onnx custom ops, when exporting only  # noqa: F401
    return {torch.ops.d2s_onnx.lstm.default: core.aten_lstm, torch.ops.d2s_onnx.gru.default: core.aten_gru,
            torch.ops.aten.squeeze.dim: _squeeze_dim,
            torch.ops.aten.cross_entropy_loss.default: _cross_entropy_loss,
            torch.ops.aten.index_put.default: _index_put, torch.ops.aten._unsafe_index_put.default: _index_put,
            torch.ops.aten.masked_select.default: _masked_select}
