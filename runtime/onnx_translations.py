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
    aten::mean, mean.dim     onnxruntime's float ReduceMean sums a long row
    aten::instance_norm      in a few float32 accumulators (torch sums by
    aten::group_norm         cascades): on values whose mean is large next
    aten::native_group_norm  to their spread (activations of 30 +- 0.1) its
    aten::_native_batch_norm_legit.no_stats   mean missed float64 by 5 times
                             what torch's misses, and InstanceNormalization
                             (torchlib's instance and group norm) and the
                             ReduceMeans of its batch norm over the batch
                             lose as much. Here a mean is a sum of sums of
                             blocks of 128 elements, divided by the count,
                             corrected by the mean of the residuals
                             x - m1; the norms are two passes over the
                             centred values (x - m1) - c. LayerNormalization
                             is as good as eager and stays.
    aten::_native_batch_norm_legit, native_batch_norm,
    aten::_native_batch_norm_legit_functional  in training mode: torchlib's
                             functions normalise with the running statistics
                             when given them (a silent wrong value for a
                             module in train mode); here with the batch's,
                             the running statistics updated as torch does
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


def _float(dtype):
    from onnxscript import ir
    return dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE)


_BLOCK = 128


def _block_mean(op, x, rank, axes):
    """The mean over `axes` (dims kept) as the sum of sums of blocks of
    _BLOCK elements, divided by the count: onnxruntime sums a long row in
    a few float32 accumulators (its error grows with the row), torch by
    cascades; summing blocks, then the blocks' sums, keeps every sum short.
    The reduced axes are moved last and flattened, padded with zeros to a
    multiple of _BLOCK; sizes are read from the tensor (symbolic dims)."""
    kept = [i for i in range(rank) if i not in axes]
    perm = kept + sorted(axes)
    if perm != list(range(rank)):
        x = op.Transpose(x, perm=perm)
    k = len(kept)
    lead = op.Shape(x, start=0, end=k)
    n = op.ReduceProd(op.Shape(x, start=k), keepdims=1)  # int64[1]
    flat = op.Reshape(x, op.Concat(lead, n, axis=0), allowzero=1)
    block = op.Constant(value_ints=[_BLOCK])
    pad = op.Mod(op.Sub(block, op.Mod(n, block)), block)
    padded = op.Pad(flat, op.Concat(op.Constant(value_ints=[0] * (2 * k + 1)), pad, axis=0))
    blocks = op.Div(op.Add(n, pad), block)
    shaped = op.Reshape(padded, op.Concat(lead, blocks, block, axis=0), allowzero=1)
    last = op.Constant(value_ints=[-1])
    total = op.ReduceSum(op.ReduceSum(shaped, last, keepdims=0), last, keepdims=0)  # [kept dims]
    mean = op.Div(total, op.CastLike(n, total))
    sizes = []
    for i in range(rank):  # the kept-dims shape: the input's sizes (x is transposed), 1 for the reduced axes
        j = perm.index(i)
        sizes.append(op.Constant(value_ints=[1]) if i in axes else op.Shape(x, start=j, end=j + 1))
    return op.Reshape(mean, op.Concat(*sizes, axis=0), allowzero=1)


def _mean_parts(op, x, rank, axes):
    """(m1, c, r) with dims kept: m1 the mean of x, r = x - m1 and c the
    mean of r, 0 where it is not finite (an infinite or NaN element: then
    m1 is already inf or NaN, as torch's mean is). m1 + c is the mean and
    r - c the centred values: c, a sum of small residuals, corrects what
    rounding m1 lost (values whose mean is large next to their spread)."""
    m1 = _block_mean(op, x, rank, axes)
    r = op.Sub(x, m1)
    c = _block_mean(op, r, rank, axes)
    c = op.Where(op.Or(op.IsNaN(c), op.IsInf(c)), op.CastLike(0.0, c), c)
    return m1, c, r


def _mean_dim(self, dim=None, keepdim: bool = False, dtype: int = -1):
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops import core
    rank = None if self.shape is None else len(self.shape)
    cast = dtype != -1 and dtype is not None
    if not _float(dtype if cast else self.dtype) or rank is None or rank == 0:
        if dim is None:
            return core.aten_mean(self, dtype)
        return core.aten_mean_dim(self, dim, keepdim, dtype)
    if cast:
        self = op.Cast(self, to=dtype)  # torch accumulates in the requested dtype
    dims = list(range(rank)) if dim is None or len(dim) == 0 else [d % rank for d in dim]
    m1, c, _ = _mean_parts(op, self, rank, dims)
    mean = op.Add(m1, c)
    return mean if keepdim else op.Squeeze(mean, _axes(op, *dims))


def _mean(self, dtype: int = -1):
    return _mean_dim(self, None, False, dtype)


def _normalize(op, x, rank, axes, eps):
    """(x - mean) / sqrt(var + eps) over `axes` in two passes, with the
    corrected mean; also the mean and 1 / sqrt(var + eps), kept dims."""
    m1, c, r = _mean_parts(op, x, rank, axes)
    centred = op.Sub(r, c)
    var = _block_mean(op, op.Mul(centred, centred), rank, axes)
    rstd = op.Reciprocal(op.Sqrt(op.Add(var, op.CastLike(eps, var))))
    return op.Mul(centred, rstd), op.Add(m1, c), rstd, var


def _channel_affine(op, y, weight, bias, rank):
    """y * weight + bias, both of shape [C] along dimension 1."""
    shape = _axes(op, -1, *[1] * (rank - 2))
    if weight is not None:
        y = op.Mul(y, op.CastLike(op.Reshape(weight, shape), y))
    if bias is not None:
        y = op.Add(y, op.CastLike(op.Reshape(bias, shape), y))
    return y


def _instance_norm(input, weight=None, bias=None, running_mean=None, running_var=None,
                   use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-05,
                   cudnn_enabled: bool = False):
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops import core
    if not use_input_stats or not _float(input.dtype) or input.shape is None or len(input.shape) < 3:
        return core.aten_instance_norm(input, weight, bias, running_mean, running_var, use_input_stats,
                                       momentum, eps, cudnn_enabled)
    rank = len(input.shape)
    y = _normalize(op, input, rank, list(range(2, rank)), eps)[0]
    return _channel_affine(op, y, weight, bias, rank)


def _native_group_norm(input, weight=None, bias=None, N=None, C=None, HxW=None, group: int = 1,
                       eps: float = 1e-05):
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops import core
    if not _float(input.dtype) or input.shape is None or len(input.shape) < 2:
        return core.aten_native_group_norm(input, weight, bias, N, C, HxW, group, eps)
    rank = len(input.shape)
    grouped = op.Reshape(input, _axes(op, 0, group, -1))  # [N, G, C / G * HxW]
    y, mean, rstd, _ = _normalize(op, grouped, 3, [2], eps)
    y = _channel_affine(op, op.Reshape(y, op.Shape(input), allowzero=True), weight, bias, rank)
    two = _axes(op, 2)
    return y, op.Squeeze(mean, two), op.Squeeze(rstd, two)


def _group_norm(input, num_groups: int, weight=None, bias=None, eps: float = 1e-05,
                cudnn_enabled: bool = True):
    from onnxscript.function_libs.torch_lib.ops import nn
    if not _float(input.dtype) or input.shape is None or len(input.shape) < 2:
        return nn.aten_group_norm(input, num_groups, weight, bias, eps, cudnn_enabled)
    return _native_group_norm(input, weight, bias, None, None, None, num_groups, eps)[0]


def _batch_norm_no_stats(input, weight=None, bias=None, training: bool = False, momentum: float = 0.9,
                         eps: float = 1e-05):
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops import core
    if not _float(input.dtype) or input.shape is None or len(input.shape) < 2:
        return core.aten__native_batch_norm_no_stats(input, weight, bias, training, momentum, eps)
    rank = len(input.shape)
    axes = [0, *range(2, rank)]
    y, mean, rstd, _ = _normalize(op, input, rank, axes, eps)
    y = _channel_affine(op, y, weight, bias, rank)
    return y, op.Squeeze(mean, _axes(op, *axes)), op.Squeeze(rstd, _axes(op, *axes))


def _batch_norm_training(input, weight, bias, running_mean, running_var, training, momentum, eps, functional):
    """Batch norm in training mode: torchlib's function normalises with the
    running statistics when it is given them (it sets training to False),
    a silent wrong value for a module in train mode; here the batch's own
    statistics, and for the functional form the running statistics
    updated as torch updates them (the unbiased variance)."""
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops import core
    if not training or not _float(input.dtype) or input.shape is None or len(input.shape) < 2:
        if functional:
            return core.aten__native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var,
                                                                 training, momentum, eps)
        return core.aten_native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    rank = len(input.shape)
    axes = [0, *range(2, rank)]
    y, mean, rstd, var = _normalize(op, input, rank, axes, eps)
    y = _channel_affine(op, y, weight, bias, rank)
    squeeze = _axes(op, *axes)
    mean, rstd, var = op.Squeeze(mean, squeeze), op.Squeeze(rstd, squeeze), op.Squeeze(var, squeeze)
    if not functional:
        return y, mean, rstd
    n = op.CastLike(op.Div(op.Size(input), op.Shape(input, start=1, end=2)), var)
    unbiased = op.Mul(var, op.Div(n, op.Sub(n, op.CastLike(1.0, n))))
    keep = op.CastLike(1.0 - momentum, running_mean)
    new_mean = op.Add(op.Mul(running_mean, keep), op.CastLike(op.Mul(mean, op.CastLike(momentum, mean)), running_mean))
    new_var = op.Add(op.Mul(running_var, keep), op.CastLike(op.Mul(unbiased, op.CastLike(momentum, var)), running_var))
    return y, mean, rstd, new_mean, new_var


def _native_batch_norm(input, weight=None, bias=None, running_mean=None, running_var=None,
                       training: bool = False, momentum: float = 0.1, eps: float = 1e-05):
    return _batch_norm_training(input, weight, bias, running_mean, running_var, training, momentum, eps, False)


def _batch_norm_functional(input, weight=None, bias=None, running_mean=None, running_var=None,
                           training: bool = False, momentum: float = 0.1, eps: float = 1e-05):
    return _batch_norm_training(input, weight, bias, running_mean, running_var, training, momentum, eps, True)


def translations():
    from onnxscript.function_libs.torch_lib.ops import core
    from . import onnx_rnn  # lazy: registers the d2s_onnx custom ops, when exporting only  # noqa: F401
    return {torch.ops.d2s_onnx.lstm.default: core.aten_lstm, torch.ops.d2s_onnx.gru.default: core.aten_gru,
            torch.ops.aten.squeeze.dim: _squeeze_dim,
            torch.ops.aten.cross_entropy_loss.default: _cross_entropy_loss,
            torch.ops.aten.index_put.default: _index_put, torch.ops.aten._unsafe_index_put.default: _index_put,
            torch.ops.aten.masked_select.default: _masked_select,
            torch.ops.aten.mean.dim: _mean_dim, torch.ops.aten.mean.default: _mean,
            torch.ops.aten.instance_norm.default: _instance_norm,
            torch.ops.aten.native_group_norm.default: _native_group_norm,
            torch.ops.aten.group_norm.default: _group_norm,
            torch.ops.aten._native_batch_norm_legit.no_stats: _batch_norm_no_stats,
            torch.ops.aten._native_batch_norm_legit.default: _native_batch_norm,
            torch.ops.aten.native_batch_norm.default: _native_batch_norm,
            torch.ops.aten._native_batch_norm_legit_functional.default: _batch_norm_functional}
