"""The ONNX lowerings d2s writes itself: ops on tensor arrays (lists
appended in a graph loop), as ONNX sequences, and a mixture of experts'
`torch._grouped_mm`.

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

    torch._grouped_mm         a Loop over the experts: each one's rows
                              (between consecutive offsets) times its weight,
                              gathered in a sequence and concatenated, as
                              torch's CPU kernel multiplies them group by
                              group (torch.onnx has no function for it; a
                              gather of one weight per row would hold
                              rows x in x out floats)

`LOWERINGS[name](graph, op, block)`, keyed by the op's canonical name
(`OpDef.canonical`: the ATen operator `torch.stack` calls, or the type of
an op of our own), appends nodes to `graph` and returns the ONNX value(s)
of the op's `Out` outputs.
"""

from .attrs import InputRef
from .onnx_common import elem_type, op_error
from .optable import get_op_def

LOWERINGS = {}
# Lowered here wherever they appear (the others only on tensor arrays).
WHOLE_OPS = frozenset({"torch._grouped_mm"})


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


@lowering("torch._grouped_mm")
def _grouped_mm(graph, op, block):
    """`torch._grouped_mm(x, w, offs=offs)` with x [rows, in], w [experts,
    in, out] and offs the experts' cumulative row counts (transformers'
    Mixtral, Qwen-MoE, OLMoE, gpt-oss): expert g's rows are
    x[offs[g-1]:offs[g]] (from 0 for the first), multiplied by w[g]. Rows
    past the last offset are uninitialized in torch's result; here they are
    left out, so they must be none (transformers' offsets end at the rows)."""
    from onnx import TensorProto, helper
    args, kwargs = _args(op)
    names = ("mat_a", "mat_b", "offs", "bias", "out_dtype")
    given = dict(zip(names, args), **kwargs)
    x, w, offs = given.get("mat_a"), given.get("mat_b"), given.get("offs")
    if given.get("bias") is not None or given.get("out_dtype") is not None:
        raise op_error(op, "only torch._grouped_mm without bias and out_dtype is lowered to ONNX")
    if not all(isinstance(a, InputRef) for a in (x, w, offs)) or \
            (len(_var(block, op, x).shape), len(_var(block, op, w).shape)) != (2, 3):
        raise op_error(op, "only torch._grouped_mm of 2-d rows, 3-d expert weights and offsets is lowered "
                       "to ONNX (a mixture of experts' form)")
    dtype = _var(block, op, x).dtype_name
    rows, weights = _value(graph, op, x), _value(graph, op, w)
    ends = _as(graph, _value(graph, op, offs), _var(block, op, offs), "int64")
    zero = graph.const([0], "int64")
    # starts[g] = ends[g - 1], 0 for the first expert
    starts = graph.node("Concat", [zero, graph.node("Slice", [ends, zero, graph.const([-1], "int64")])], axis=0)
    count = graph.node("Shape", [ends])

    lowering = graph.lowering
    g, keep, seq_in = lowering.fresh("expert"), lowering.fresh("cond_in"), lowering.fresh("seq_in")
    g1, start, end = lowering.fresh("g1"), lowering.fresh("start"), lowering.fresh("end")
    piece, weight, product = lowering.fresh("rows"), lowering.fresh("w"), lowering.fresh("y")
    keep_out, seq_out, axes = lowering.fresh("cond_out"), lowering.fresh("seq_out"), lowering.fresh("axes")
    body = helper.make_graph([
        helper.make_node("Constant", [], [axes], value=helper.make_tensor("a", TensorProto.INT64, [1], [0])),
        helper.make_node("Unsqueeze", [g, axes], [g1]),
        helper.make_node("Gather", [starts, g1], [start], axis=0),
        helper.make_node("Gather", [ends, g1], [end], axis=0),
        helper.make_node("Slice", [rows, start, end, axes], [piece]),
        helper.make_node("Gather", [weights, g], [weight], axis=0),
        helper.make_node("MatMul", [piece, weight], [product]),
        helper.make_node("SequenceInsert", [seq_in, product], [seq_out]),
        helper.make_node("Identity", [keep], [keep_out]),
    ], f"grouped_mm_{lowering.fresh('body')}", [
        helper.make_tensor_value_info(g, TensorProto.INT64, []),
        helper.make_tensor_value_info(keep, TensorProto.BOOL, []),
        helper.make_tensor_sequence_value_info(seq_in, elem_type(dtype), None),
    ], [
        helper.make_tensor_value_info(keep_out, TensorProto.BOOL, []),
        helper.make_tensor_sequence_value_info(seq_out, elem_type(dtype), None),
    ])
    empty = graph.node("SequenceEmpty", [], name_hint="seq", dtype=elem_type(dtype))
    trips = graph.node("Squeeze", [count, zero])
    pieces = graph.node("Loop", [trips, "", empty], name_hint="experts", body=body)
    return graph.node("ConcatFromSequence", [pieces], axis=0)
