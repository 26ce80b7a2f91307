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

from .examples import example_ints
from .infer import Meta, substitute


def _signature(names):
    """The kernel's arguments, by torch's names, for binding a call's."""
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names.split()])


_PACK = _signature("input lengths batch_first")
_PAD = _signature("data batch_sizes batch_first padding_value total_length")
_PACKED_RNN = _signature("data batch_sizes hx params has_biases num_layers dropout train bidirectional")


def _bind(signature, inputs, args, kwargs):
    """{argument: value}, Variables in place of their InputRefs."""
    return signature.bind(*substitute(args, inputs), **substitute(kwargs, inputs)).arguments


def _size(tracer, hint, label):
    """A fresh size symbol's IR text."""
    shapes = tracer.shapes
    return shapes.text(shapes.new_symbol(max(int(hint), 0), label))


def _example(tracer, var):
    """The example call's ints of the integer tensor `var`, if known and not empty."""
    values = example_ints(tracer, var) if isinstance(var, Variable) else None
    return values or None


def pack_padded_sequence(inputs, args, kwargs, tracer):
    """`(data, batch_sizes)`: `data` [sum(lengths), *features], `batch_sizes`
    [max(lengths)] int64."""
    a = _bind(_PACK, inputs, args, kwargs)
    x, lengths = a["input"], a["lengths"]
    steps, batch = (x.dims[1], x.dims[0]) if a["batch_first"] else (x.dims[0], x.dims[1])
    example, hint = _example(tracer, lengths), tracer.shapes.hint
    total, longest = (sum(example), max(example)) if example is not None else \
        (hint(steps) * hint(batch), hint(steps))
    return (Meta((_size(tracer, total, "sum(lengths)"), *x.dims[2:]), x.dtype),
            Meta((_size(tracer, longest, "max(lengths)"),), torch.int64))


def pad_packed_sequence(inputs, args, kwargs, tracer):
    """`(padded, lengths)`: `padded` [total_length, batch, *features] (batch
    first: [batch, total_length, ...]) where batch is `batch_sizes[0]`;
    `lengths` [batch] int64."""
    a = _bind(_PAD, inputs, args, kwargs)
    data, total = a["data"], a["total_length"]
    example = _example(tracer, a["batch_sizes"])
    batch = _size(tracer, example[0] if example is not None else 8, "batch_sizes[0]")
    scalar = tracer.shapes.scalars.get(id(total)) if isinstance(total, Variable) else None
    if scalar is not None:  # `batch_sizes.size(0)`, pad_packed_sequence's default: that size
        total = tracer.shapes.text(scalar)
    elif isinstance(total, Variable):
        total = _size(tracer, tracer.example_int(total, 8), "total_length")
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
        return _padded_rnn(inputs, args, kwargs)  # `(input, hx, params, ...)`: hx is floating point
    a = _bind(_PACKED_RNN, inputs, args, kwargs)
    data, hx = a["data"], a["hx"]
    hidden = list(hx) if isinstance(hx, (list, tuple)) else [hx]
    features = hidden[0].dims[2]  # h's last size (proj_size where an LSTM has one)
    if not isinstance(features, int):
        return None
    features *= 2 if a["bidirectional"] else 1
    return (Meta((data.dims[0], features), data.dtype), *(Meta(v.dims, v.dtype) for v in hidden))


_PADDED_RNN = _signature("input hx params has_biases num_layers dropout train bidirectional batch_first")


def _padded_rnn(inputs, args, kwargs):
    """The padded form: `output` the input's shape with the last size
    `directions * h's last size`, each hidden state the shape of its
    initial one, whatever the input's rank or layout. (Its stand-in run
    would tell the same; torch 2.11's fake kernel gives `h` a rank too many
    where the batch size is symbolic.)"""
    try:
        a = _bind(_PADDED_RNN, inputs, args, kwargs)
    except TypeError:
        return None
    x, hx = a["input"], a["hx"]
    hidden = list(hx) if isinstance(hx, (list, tuple)) else [hx]
    if not isinstance(x, Variable) or not all(isinstance(v, Variable) and v.kind == "tensor" for v in hidden):
        return None
    features = hidden[0].dims[-1] if hidden[0].dims else None
    if not isinstance(features, int) or not isinstance(a["bidirectional"], bool) or not x.dims:
        return None
    features *= 2 if a["bidirectional"] else 1
    return (Meta((*x.dims[:-1], features), x.dtype), *(Meta(v.dims, v.dtype) for v in hidden))


RULES = {
    "torch._pack_padded_sequence": pack_padded_sequence,
    "torch._pad_packed_sequence": pad_packed_sequence,
    "torch.lstm": packed_rnn,
    "torch.gru": packed_rnn,
    "torch.rnn_tanh": packed_rnn,
    "torch.rnn_relu": packed_rnn,
}
