"""Which `training` mode a program was built in, read from its ops.

A module's mode reaches a program only as arguments of the ops that behave
differently in the two modes: dropout's `training`, batch norm's
`training`, `torch.dropout`'s `train`, instance norm's `use_input_stats`,
the RNN kernels' `train`. So a program that has none of these ops computes
the same in both modes, and one that has them was built in the mode their
arguments say. A saved model records the mode it was traced in (`mode` in
program.json); these functions decide, for a loaded layer asked to switch to
a mode it has no program for, whether its program serves that mode too, and
give the mode of a program saved without one (built under program_guard, or
an older file).

What the ops cannot show: Python code that branches on `self.training`
without such an op. `d2s.jit.save(module, path, input_spec=[...])` traces
both modes and saves both programs when they differ.
"""

import inspect

import torch

from .optable import get_op_def

# Parameter names that carry a module's mode into a kernel.
MODE_ARGUMENTS = ("training", "train", "use_input_stats")

_positions = {}  # op type -> (position of the mode argument or None, its name, default) or None


def _parameter(kernel, names, schema_defaults=False):
    """(position or None, name, default) of the first parameter of `kernel`
    called one of `names`, or None when it takes none. A builtin's default
    is its native schema's when `schema_defaults`, else None (unknown)."""
    try:
        params = list(inspect.signature(kernel).parameters.values())
    except (TypeError, ValueError):
        params = None
    if params is not None:
        for i, p in enumerate(params):
            if p.name in names:
                positional = p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                default = None if p.default is p.empty else p.default
                return (i if positional else None), p.name, default
        return None
    # A builtin: its native schemas (torch.dropout(input, p, train)).
    name = getattr(kernel, "__name__", "") or ""
    packet = getattr(torch.ops.aten, name, None) if name.isidentifier() and not name.startswith("__") else None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return None
    for overload in packet.overloads():
        arguments = getattr(packet, overload)._schema.arguments
        for i, a in enumerate(arguments):
            if a.name in names:
                default = a.default_value if schema_defaults and a.has_default_value() else None
                return (None if a.kwarg_only else i), a.name, default
    return None


def _mode_parameter(kernel):
    """(position or None, name, default) of `kernel`'s mode argument, or None
    when it takes none."""
    return _parameter(kernel, MODE_ARGUMENTS)


def mode_parameter(op_type):
    """The mode argument of ops of `op_type` (see `_mode_parameter`), or None."""
    if op_type not in _positions:
        kernel = get_op_def(op_type).kernel
        _positions[op_type] = _mode_parameter(kernel) if kernel is not None else None
    return _positions[op_type]


def mode_ops(program):
    """[(op, the mode argument's value: True, False or None if not a
    constant)] for every op of `program` that takes a mode argument."""
    found = []
    for block in program.blocks:
        for op in block.ops:
            if mode_parameter(op.type) is not None:
                found.append((op, mode_value(op)))
    return found


# Parameter names of a dropout probability inside a bigger kernel (attention's
# `dropout_p`, the RNN kernels' `dropout` between layers): such a kernel
# draws from the global generator unless the probability is 0.
DROPOUT_ARGUMENTS = ("dropout_p", "dropout")

_dropout_positions = {}  # op type -> (position or None, name, default) or None


def dropout_value(op):
    """The constant dropout probability `op` passes (a number), or None if
    it takes none or passes a value known only when the program runs."""
    if op.type not in _dropout_positions:
        kernel = get_op_def(op.type).kernel
        _dropout_positions[op.type] = (_parameter(kernel, DROPOUT_ARGUMENTS, schema_defaults=True)
                                       if kernel is not None else None)
    param = _dropout_positions[op.type]
    if param is None:
        return None
    value = _argument(op, *param)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _argument(op, position, name, default):
    args, kwargs = op.attrs.get("args", ()), op.attrs.get("kwargs", {})
    if isinstance(kwargs, dict) and name in kwargs:
        return kwargs[name]
    if position is not None and isinstance(args, (tuple, list)) and position < len(args):
        return args[position]
    return default


def mode_value(op):
    """The constant True or False `op` passes as its mode argument; None if
    it takes none or passes a value known only when the program runs."""
    param = mode_parameter(op.type)
    if param is None:
        return None
    value = _argument(op, *param)
    return value if isinstance(value, bool) else None


def mode_from_ops(program):
    """"train" or "eval" as the ops' mode arguments say, or None: no such op,
    or arguments that do not agree on one mode."""
    values = {value for _, value in mode_ops(program)}
    if values == {True}:
        return "train"
    if values == {False}:
        return "eval"
    return None
