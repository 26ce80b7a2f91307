"""Packed sequences: the shapes of the ops behind
`torch.nn.utils.rnn.pack_padded_sequence`, `pad_packed_sequence` and the
RNN kernels' packed form (`torch.lstm(data, batch_sizes, hx, ...)`).

Their kernels read the lengths' values (`data` has `sum(lengths)` rows,
`batch_sizes` `max(lengths)` entries, the padded batch `batch_sizes[0]`
rows), so running them on stand-in tensors (ops/infer.py) cannot tell
their sizes, and a run on made-up values would give made-up ones. Each
such size is a fresh symbol of the trace here, read from the tensor when
the program runs; its hint is the example call's value where replaying
the example (ops/examples.py) tells it, so the trace decides what the
example decides, and every size assumption stays a run-time check.

Each rule takes (inputs, args, kwargs, tracer) as ops/infer.py's `infer`
does (args hold InputRef(i) for inputs[i]) and returns the outputs' `Meta`,
or None for the kernel's other forms, which the stand-in run infers.
"""

import inspect

import torch

from runtime.attrs import InputRef
from runtime.ir import Variable

from .examples import example_tensor
from .infer import Meta


def _pack_padded_sequence(input, lengths, batch_first):  # noqa: A002 - torch's own argument names
    pass


def _pad_packed_sequence(data, batch_sizes, batch_first, padding_value, total_length):
    pass


def _packed_rnn(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional):
    pass


def _bind(signature_of, inputs, args, kwargs):
    """{argument: value}, Variables in place of their InputRefs."""
    bound = inspect.signature(signature_of).bind(*args, **kwargs).arguments

    def value(v):
        if isinstance(v, InputRef):
            return inputs[v.index]
        if isinstance(v, (list, tuple)):
            return type(v)(value(x) for x in v)
        return v
    return {k: value(v) for k, v in bound.items()}


def _size(tracer, hint, label):
    """A fresh size symbol's IR text."""
    shapes = tracer.shapes
    return shapes.text(shapes.new_symbol(max(int(hint), 0), label))


def _example(tracer, var):
    return example_tensor(tracer, var) if isinstance(var, Variable) else None


def pack_padded_sequence(inputs, args, kwargs, tracer):
    """`(data, batch_sizes)`: `data` [sum(lengths), *features], `batch_sizes`
    [max(lengths)] int64."""
    a = _bind(_pack_padded_sequence, inputs, args, kwargs)
    x, lengths = a["input"], a["lengths"]
    steps, batch = (x.dims[1], x.dims[0]) if a["batch_first"] else (x.dims[0], x.dims[1])
    example = _example(tracer, lengths)
    hint_total = int(example.sum()) if example is not None and example.numel() else \
        tracer.shapes.hint(steps) * tracer.shapes.hint(batch)
    hint_steps = int(example.max()) if example is not None and example.numel() else tracer.shapes.hint(steps)
    return (Meta((_size(tracer, hint_total, "sum(lengths)"), *x.dims[2:]), x.dtype),
            Meta((_size(tracer, hint_steps, "max(lengths)"),), torch.int64))


def pad_packed_sequence(inputs, args, kwargs, tracer):
    """`(padded, lengths)`: `padded` [total_length, batch, *features] (batch
    first: [batch, total_length, ...]) where batch is `batch_sizes[0]`;
    `lengths` [batch] int64."""
    a = _bind(_pad_packed_sequence, inputs, args, kwargs)
    data, total = a["data"], a["total_length"]
    example = _example(tracer, a["batch_sizes"])
    batch = _size(tracer, int(example[0]) if example is not None and example.numel() else 8, "batch_sizes[0]")
    scalar = tracer.shapes.scalars.get(id(total)) if isinstance(total, Variable) else None
    if scalar is not None:  # `batch_sizes.size(0)`, pad_packed_sequence's default: that size
        total = tracer.shapes.text(scalar)
    elif isinstance(total, Variable):
        known = tracer.example_int(total, None)
        total = _size(tracer, known if known is not None else 8, "total_length")
    elif not isinstance(total, int) or total <= 0:
        return None  # the kernel's own form of the length (its error, when it has one)
    padded = (batch, total) if a["batch_first"] else (total, batch)
    return Meta((*padded, *data.dims[1:]), data.dtype), Meta((batch,), torch.int64)


def packed_rnn(inputs, args, kwargs, tracer):
    """`torch.lstm` / `gru` / `rnn_tanh` / `rnn_relu` on packed data:
    `(output, *hidden)`, `output` [rows of data, directions * h's last
    size], each hidden state the shape of its initial one."""
    second = inputs[args[1].index] if len(args) > 1 and isinstance(args[1], InputRef) else None
    if second is None or second.kind != "tensor" or second.dtype != torch.int64 or len(second.dims) != 1:
        return None  # the padded form, `(input, hx, params, ...)`: hx is floating point
    a = _bind(_packed_rnn, inputs, args, kwargs)
    data, hx = a["data"], a["hx"]
    hidden = list(hx) if isinstance(hx, (list, tuple)) else [hx]
    directions = 2 if a["bidirectional"] else 1
    h = hidden[0]
    out_size = h.dims[2] * directions if isinstance(h.dims[2], int) else None
    if out_size is None:
        return None
    return (Meta((data.dims[0], out_size), data.dtype), *(Meta(v.dims, v.dtype) for v in hidden))


RULES = {
    "torch._pack_padded_sequence": pack_padded_sequence,
    "torch._pad_packed_sequence": pad_packed_sequence,
    "torch.lstm": packed_rnn,
    "torch.gru": packed_rnn,
    "torch.rnn_tanh": packed_rnn,
    "torch.rnn_relu": packed_rnn,
}
