"""The translation table d2s hands torch.onnx besides its own library
(`custom_translation_table` of `torch.onnx.export`):

    d2s_onnx::lstm / ::gru   torch.onnx's own aten_lstm / aten_gru
                             (the custom ops of runtime/onnx_rnn.py)
    aten::squeeze.dim        Squeeze only a dimension that may be 1: torch's
                             `x.squeeze(1)` of a dimension of another size
                             returns x, while torchlib's function emits a
                             Squeeze that ONNX refuses ("Dimension of input 1
                             must be 1") for a static size other than 1
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


def translations():
    from onnxscript.function_libs.torch_lib.ops import core
    from . import onnx_rnn  # lazy: registers the d2s_onnx custom ops, when exporting only  # noqa: F401
    return {torch.ops.d2s_onnx.lstm.default: core.aten_lstm, torch.ops.d2s_onnx.gru.default: core.aten_gru,
            torch.ops.aten.squeeze.dim: _squeeze_dim}
