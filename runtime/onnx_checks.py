"""Run-time checks of a program in ONNX: the model fails where d2s raises.

A program checks what conversion decided or the user asserted when it
runs (`assert`, `raise` on a side, `check_all_true`, and the decisions of
d2s/decisions.py: `check_sizes`, `check_dims`, `check_bool`,
`decision_failed`). ONNX has no assertion op, but a Gather whose index is
out of range fails in every runtime, so each check becomes

    ok     = <the check's condition>                   (a bool scalar)
    token  = Gather(Reshape(ok, [1]), 1 - Cast(ok))    (index 1 fails)

named after the check (onnxruntime's error names the failing node:
"d2s check failed: <message>; created at File ..., line N"). Tokens leave
If branches and Loop bodies as an extra output (a Loop carries their
conjunction), and the graph's outputs pass through one more such Gather
on the conjunction of them all: no output is computed without every
check, so no optimizer can drop them. The ONNX model thus raises for
exactly the inputs for which d2s raises (it runs on to the end of the
graph first: the error comes from onnxruntime, not as the Python
exception d2s raises).

Not a check in ONNX: `check_int64` (a Python int past int64: the ONNX
model computes ints in int64, as torch does), `check_strides` of a contiguous input (ONNX tensors
are always dense), and `check_modes` (ops/ambient_modes.py: ONNX has no
autograd or inference mode; the model is the program converted in the
exporting call's mode, as torch.onnx.export traces in the caller's mode),
nor `check_python_values` (the Python state the program was converted
with, which a saved program keeps too). A program converted for a non-contiguous input layout
is refused, and so is one that read strides of a value whose layout depends on the path
(`check_layout`: the program answered one layout, and ONNX has none to check).
"""

from .ir import contiguous_strides
from .onnx_common import op_error

CHECKS = frozenset(("assert", "raise", "check_all_true", "check_int64", "check_sizes", "check_dims", "check_bool",
                    "check_strides", "check_layout", "decision_failed", "check_modes",
                    "check_python_values"))


def is_check(op):
    return op.type in CHECKS


def _message(op):
    args = list(op.attrs.get("args", ()))
    if op.type == "raise":
        return f"{args[0]}: {args[1]}"
    if op.type == "decision_failed":
        return str(args[0])
    if op.type == "check_bool":
        return f"this program was converted for inputs where {args[2]} is {args[1]}"
    if op.type == "check_dims":
        return f"this program was converted for '{args[2]}' of sizes {dict(args[1])} in those dimensions"
    return str(args[1]) if len(args) > 1 else op.type


def _input(graph, op, index=0):
    return graph.read(op.input("X")[index])


def _all_true(graph, value):
    """A bool scalar: whether every element of `value` is true (nonzero);
    an empty tensor passes, as `t.all()` does."""
    from onnx import TensorProto
    as_bool = graph.node("Cast", [value], name_hint="check", to=TensorProto.BOOL)
    failing = graph.node("Cast", [graph.node("Not", [as_bool])], to=TensorProto.INT64)
    count = graph.node("ReduceSum", [failing], keepdims=0)
    return graph.node("Equal", [count, graph.const(0, "int64")])


def _never(graph, lowering):
    """False, computed from an input so that no constant folding fails at load."""
    anchor = lowering.anchor
    if anchor is None:
        return graph.const(False, "bool")
    size = graph.node("Size", [graph.read(anchor)])
    return graph.node("Less", [size, graph.const(0, "int64")])


def condition(graph, op, block, lowering):
    """The ONNX bool scalar that holds when `op` passes, or None when the
    check holds for every ONNX input. Raises the lowering's error for a
    check ONNX cannot express."""
    args = list(op.attrs.get("args", ()))
    if op.type in ("raise", "decision_failed"):
        return _never(graph, lowering)
    if op.type == "check_int64":
        return None  # ONNX computes the ints in int64, as torch does: no check of Python's unbounded ints
    if op.type in ("assert", "check_all_true", "check_sizes"):
        return _all_true(graph, _input(graph, op))
    if op.type == "check_bool":
        ok = _all_true(graph, _input(graph, op))
        return ok if args[1] else graph.node("Not", [ok])
    if op.type == "check_dims":
        shape = graph.node("Shape", [_input(graph, op)])
        ok = None
        for axis, size in args[1]:
            dim = graph.node("Gather", [shape, graph.const(int(axis), "int64")], axis=0)
            same = graph.node("Equal", [dim, graph.const(int(size), "int64")])
            ok = same if ok is None else graph.node("And", [ok, same])
        return ok
    if op.type == "check_modes":
        return None  # ONNX has no autograd or inference mode: the model is the program of the export's mode
    if op.type == "check_python_values":
        return None  # the Python state of the exporting call, as a saved program keeps it
    if op.type == "check_strides":
        dims = block.find_var(op.input_names[0]).dims
        static = all(type(d) is int and d >= 0 for d in dims)
        if args[1] is None or (static and tuple(args[1]) == contiguous_strides(dims)):
            return None  # contiguous: every ONNX tensor is
        raise op_error(op, f"the program was converted for a non-contiguous layout of {args[2]} (strides "
                       f"{tuple(args[1])}), while ONNX inputs are dense; convert from contiguous inputs")
    if op.type == "check_layout":
        # Every ONNX value is dense, while eager's layout of this one (and so
        # the strides the program answered) depends on the path a run takes.
        raise op_error(op, f"the program reads the strides of {args[2]}, whose layout depends on the path a run "
                       "takes, and an ONNX model keeps no layout to answer or check them with: make it "
                       "`.contiguous()` before reading its strides")
    raise op_error(op, "no ONNX lowering for this check")  # a check type added to CHECKS without one


def lower_check(graph, op, block, lowering):
    """Append `op`'s check to `graph`: its token joins `graph.guards`."""
    ok = condition(graph, op, block, lowering)
    if ok is None:
        return
    origin = lowering.origin(op)
    graph.guards.append(fail_unless(graph, ok, f"d2s check failed: {_message(op)}; {origin}"))


def fail_unless(graph, ok, name):
    """A bool scalar, true, computed by a node that fails when `ok` is false."""
    from onnx import TensorProto, helper
    data = graph.node("Reshape", [ok, graph.const([1], "int64")])
    index = graph.node("Sub", [graph.const(1, "int64"), graph.node("Cast", [ok], to=TensorProto.INT64)])
    token = graph.lowering.fresh("check_ok")
    graph.nodes.append(helper.make_node("Gather", [data, index], [token], axis=0, name=graph.lowering.node_name(name)))
    return token


def conjunction(graph):
    """One bool scalar standing for every token of `graph` (None if none)."""
    ok = None
    for token in graph.guards:
        ok = token if ok is None else graph.node("And", [ok, token], name_hint="checks")
    return ok


def gated(graph, value, ok):
    """`value`, through a node that needs `ok` (and fails when it is false)."""
    from onnx import TensorProto
    lifted = graph.node("Unsqueeze", [value, graph.const([0], "int64")])
    index = graph.node("Sub", [graph.const(1, "int64"), graph.node("Cast", [ok], to=TensorProto.INT64)])
    return graph.node("Gather", [lifted, index], axis=0, name_hint="checked")


