"""The ONNX lowerings d2s writes itself: ops on tensor arrays (lists
appended in a graph loop), as ONNX sequences.

Every other straight-line op goes through torch's own exporter
(`runtime/onnx_regions.py`). These do not, because a tensor array is a
Python list at run time: torch.export traces tensors and numbers, not a
list that a loop grows, so torch.onnx has no sequence values to give.

    array_create              SequenceEmpty
    array_from_list           SequenceConstruct
    array_append              SequenceInsert (the array variable is rebound)
    array_length              SequenceLength
    array_read                SequenceAt
    stack / cat               ConcatFromSequence (new_axis 1 / 0)

`LOWERINGS[name](graph, op, block)`, keyed by the op's canonical name
(`OpDef.canonical`: the ATen operator `torch.stack` calls, or the type of
an op of our own), appends nodes to `graph` and returns the ONNX value(s)
of the op's `Out` outputs.
"""

from .attrs import InputRef
from .onnx_common import elem_type, op_error
from .optable import get_op_def

LOWERINGS = {}


def lowering(*names):
    def register(fn):
        for name in names:
            LOWERINGS[name] = fn
        return fn
    return register


def _args(op):
    return list(op.attrs.get("args", ())), dict(op.attrs.get("kwargs", {}))


def _value(graph, op, arg):
    """The ONNX value of an argument that refers to an op input."""
    if not isinstance(arg, InputRef):
        raise op_error(op, f"expected a tensor or tensor array argument, got {arg!r}")
    return graph.read(op.input("X")[arg.index])


def _var(block, op, arg):
    return block.find_var(op.input("X")[arg.index])


def _as(graph, value, var, dtype):
    """`value` (of program variable `var`) cast to d2s dtype `dtype`."""
    if var.dtype_name == dtype:
        return value
    return graph.node("Cast", [value], name_hint="cast", to=elem_type(dtype))


@lowering("array_create")
def _array_create(graph, op, block):
    return graph.node("SequenceEmpty", [], name_hint="seq",
                      dtype=elem_type(block.find_var(op.output("Out")[0]).dtype_name))


@lowering("array_from_list")
def _array_from_list(graph, op, block):
    args, _ = _args(op)
    dtype = block.find_var(op.output("Out")[0]).dtype_name
    if not args:
        return graph.node("SequenceEmpty", [], name_hint="seq", dtype=elem_type(dtype))
    items = [_as(graph, _value(graph, op, a), _var(block, op, a), dtype) for a in args]
    return graph.node("SequenceConstruct", items, name_hint="seq")


@lowering("array_append")
def _array_append(graph, op, block):
    (array, value), _ = _args(op)
    item = _as(graph, _value(graph, op, value), _var(block, op, value), _var(block, op, array).dtype_name)
    out = graph.node("SequenceInsert", [_value(graph, op, array), item], name_hint="seq")
    # In place in the program: the array variable itself now holds the new sequence.
    graph.define(op.input("X")[array.index], out)
    return out


@lowering("array_length")
def _array_length(graph, op, block):
    (array,), _ = _args(op)
    return graph.node("SequenceLength", [_value(graph, op, array)])


@lowering("array_read")
def _array_read(graph, op, block):
    (array, index), _ = _args(op)
    if isinstance(index, InputRef):
        position = _as(graph, _value(graph, op, index), _var(block, op, index), "int64")
    else:
        position = graph.const(int(index), "int64")
    return graph.node("SequenceAt", [_value(graph, op, array), position])


@lowering("stack", "cat")
def _stack(graph, op, block):
    args, kwargs = _args(op)
    tensors = args[0] if args else kwargs.get("tensors")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if not isinstance(tensors, InputRef) or isinstance(dim, InputRef):
        raise op_error(op, "only a whole tensor array and a constant dim are supported for ONNX")
    return graph.node("ConcatFromSequence", [_value(graph, op, tensors)], axis=int(dim),
                      new_axis=int(get_op_def(op.type).aten == "stack"))
