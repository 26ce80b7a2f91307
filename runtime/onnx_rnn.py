"""`torch.lstm` / `torch.gru` over a sequence length ONNX keeps symbolic.

torch.export decomposes `aten.lstm` while tracing (a CompositeImplicit op
whose C++ kernel loops over the time steps), so the trace fixes the
sequence length to the example's. torch.onnx's library has one function
for the whole op (`aten_lstm` / `aten_gru`: ONNX's LSTM / GRU nodes), which
takes any length. So a region traces these calls as opaque custom ops
(`d2s_onnx::lstm`, `d2s_onnx::gru`; their fake kernels give the result
shapes from the input's, symbolic dims included) and torch.onnx translates
them with its own functions for the ATen ops (runtime/onnx_translations.py).

Left to torch's decomposition (so a dynamic length is refused as before):
an LSTM with projections (`proj_size`, which the ONNX function does not
take), the packed-sequence forms, and dropout in training mode (random).
"""

import torch

from .optable import get_op_def


@torch.library.custom_op("d2s_onnx::lstm", mutates_args=())
def _lstm(input: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor], has_biases: bool,
          num_layers: int, dropout: float, train: bool, bidirectional: bool,
          batch_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, h, c = torch.lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    return out.clone(), h.clone(), c.clone()


@torch.library.custom_op("d2s_onnx::gru", mutates_args=())
def _gru(input: torch.Tensor, hx: torch.Tensor, params: list[torch.Tensor], has_biases: bool, num_layers: int,
         dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out, h = torch.gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    return out.clone(), h.clone()


def _output(input, h, bidirectional, batch_first):
    """The shape of the sequence output: the input's, its last dimension the hidden size (both directions)."""
    steps, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
    features = h.shape[2] * (2 if bidirectional else 1)
    shape = (batch, steps, features) if batch_first else (steps, batch, features)
    return input.new_empty(shape)


@_lstm.register_fake
def _lstm_fake(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return (_output(input, hx[0], bidirectional, batch_first), hx[0].new_empty(hx[0].shape),
            hx[1].new_empty(hx[1].shape))


@_gru.register_fake
def _gru_fake(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _output(input, hx, bidirectional, batch_first), hx.new_empty(hx.shape)


def _plain(args, params_at):
    """Whether a torch.lstm / torch.gru call is the whole-sequence form
    without projections and draws nothing."""
    if len(args) != 9 or not isinstance(args[params_at], (list, tuple)):
        return False
    params, has_biases, num_layers, dropout, train, bidirectional = args[params_at:params_at + 6]
    per_weight_set = len(params) // (num_layers * (2 if bidirectional else 1))
    return per_weight_set == (4 if has_biases else 2) and not (train and dropout > 0)


def _lstm_kernel(*args):
    if _plain(args, 2) and isinstance(args[1], (list, tuple)):
        return torch.ops.d2s_onnx.lstm(args[0], list(args[1]), list(args[2]), *args[3:])
    return torch.lstm(*args)


def _gru_kernel(*args):
    if _plain(args, 2) and isinstance(args[1], torch.Tensor):
        return torch.ops.d2s_onnx.gru(args[0], args[1], list(args[2]), *args[3:])
    return torch.gru(*args)


_KERNELS = {"torch.lstm": _lstm_kernel, "torch.gru": _gru_kernel}


def region_op_defs(op_type):
    """get_op_def for a region traced for ONNX: the RNN ops as custom ops."""
    opdef = get_op_def(op_type)
    kernel = _KERNELS.get(op_type)
    if kernel is None or opdef.kernel not in (torch.lstm, torch.gru):
        return opdef
    import dataclasses
    return dataclasses.replace(opdef, kernel=kernel)

