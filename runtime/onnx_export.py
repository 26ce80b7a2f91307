"""Lowering a Program to ONNX: `cond` -> If, `while` -> Loop, every other op
through the table of `runtime/onnx_ops.py`.

    feeds          graph inputs; dimensions of -1 become symbolic dims ("x_dim0")
    parameters     initializers (the values the program is bound to)
    fetches        graph outputs
    cond           If; each branch a subgraph whose outputs are its
                   `true_outs` / `false_outs`
    while          Loop(M="", cond=<cond block on the initial values>, *Init);
                   the body subgraph runs the body block, then the cond block
                   again on the new values for the next trip's condition
                   (the same test d2s runs before each trip, `break` included,
                   since a break flag is an ordinary loop variable)
    tensor arrays  ONNX sequences (SequenceEmpty / SequenceInsert,
                   ConcatFromSequence for torch.stack / torch.cat)

ONNX wants every value name defined once in the whole model, while a d2s
program may write a name again (in-place ops, tensor-array appends) and
lowers the cond block twice for a loop; so the lowering keeps an
environment from variable names to ONNX value names and gives each new
definition a fresh name.

`onnx` is imported only here and only when exporting (the `d2s[onnx]` extra).
"""

import itertools

from .ir import TENSOR_ARRAY


class OnnxExportError(ValueError):
    """The program cannot be expressed in ONNX: the message names the op
    and the user's line that created it."""


DEFAULT_OPSET = 17
SUPPORTED_OPSETS = range(17, 21)


def _origin(op):
    if not op.origin:
        return "(no source location saved with the program)"
    filename, lineno, line = op.origin
    return f'created at File "{filename}", line {lineno}' + (f": {line.strip()}" if line else "")


def op_error(op, message):
    return OnnxExportError(f"cannot export op {op.type!r} to ONNX: {message}; {_origin(op)}")


class Graph:
    """Nodes and the value environment of one ONNX graph (the main graph or
    a subgraph); subgraphs start from their parent's environment."""

    def __init__(self, lowering, env):
        self.lowering = lowering
        self.env = dict(env)
        self.nodes = []

    def node(self, op_type, inputs, n_out=1, name_hint="t", **attrs):
        from onnx import helper
        outs = [self.lowering.fresh(name_hint) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, dtype):
        """A Constant of `value` with d2s dtype name `dtype`."""
        import numpy as np
        from onnx import numpy_helper
        array = np.array(value, dtype=_NUMPY[dtype])
        return self.node("Constant", [], name_hint="c", value=numpy_helper.from_array(array))

    def read(self, name):
        return self.env.get(name, name)

    def define(self, var_name, value):
        """Bind program variable `var_name` to ONNX value `value`."""
        self.env[var_name] = value


class Lowering:
    def __init__(self, program, opset):
        from .onnx_ops import LOWERINGS
        self.program = program
        self.opset = opset
        self.lowerings = LOWERINGS
        self._names = itertools.count()
        self.used = set()

    def fresh(self, hint):
        while True:
            name = f"{hint}__{next(self._names)}"
            if name not in self.used:
                self.used.add(name)
                return name

    # -- blocks --------------------------------------------------------------------
    def block(self, graph, block):
        for op in block.ops:
            if op.type == "cond":
                self.cond(graph, block, op)
            elif op.type == "while":
                self.loop(graph, block, op)
            else:
                lower = self.lowerings.get(op.type)
                if lower is None:
                    raise op_error(op, "no ONNX lowering for this op (runtime/onnx_ops.py lists the ops that have one)")
                results = lower(graph, op, block)
                outs = op.output("Out")
                if results is None:
                    continue
                results = list(results) if isinstance(results, (list, tuple)) else [results]
                if len(results) != len(outs):
                    raise op_error(op, f"the lowering made {len(results)} values for {len(outs)} outputs")
                for name, value in zip(outs, results):
                    graph.define(name, value)

    def value_info(self, name, var):
        from onnx import helper
        dims = [None if d == -1 else d for d in var.shape]
        if var.kind == TENSOR_ARRAY:
            return helper.make_tensor_sequence_value_info(name, _ELEM[var.dtype_name], None)
        return helper.make_tensor_value_info(name, _ELEM[var.dtype_name], dims)

    def subgraph(self, parent, block, outputs, name, inputs=(), enter=None, leave=None):
        """A GraphProto running `block` (with `enter(graph)` before and
        `leave(graph)` after); `outputs` are (program name, Variable) pairs,
        each copied into a fresh output value."""
        from onnx import helper
        graph = Graph(self, parent.env)
        if enter is not None:
            enter(graph)
        self.block(graph, block)
        if leave is not None:
            leave(graph)
        out_infos = []
        for var_name, var in outputs:
            value = self.fresh(var_name.replace(".", "_") + "_out")
            graph.nodes.append(helper.make_node("Identity", [graph.read(var_name)], [value]))
            out_infos.append(self.value_info(value, var))
        return helper.make_graph(graph.nodes, name, list(inputs), out_infos)

    # -- control flow ------------------------------------------------------------------
    def cond(self, graph, block, op):
        outs = op.output("Out")
        out_vars = [block.find_var(n) for n in outs]
        branches = []
        for side in ("true", "false"):
            sub = op.attrs[f"{side}_block"]
            names = op.attrs[f"{side}_outs"]
            branches.append(self.subgraph(graph, sub, list(zip(names, out_vars)), f"{side}_block_{sub.idx}"))
        results = graph.node("If", [graph.read(op.input("Cond")[0])], n_out=len(outs), name_hint="if",
                             then_branch=branches[0], else_branch=branches[1])
        for name, value in zip(outs, results if len(outs) != 1 else [results]):
            graph.define(name, value)

    def loop(self, graph, block, op):
        from onnx import TensorProto, helper
        body, cond_block = op.attrs["body_block"], op.attrs["cond_block"]
        loop_vars, body_outs = op.attrs["loop_vars"], op.attrs["body_outs"]
        cond_out = op.attrs["cond_out"]
        # The first test, on the initial values, in the enclosing graph.
        first = Graph(self, graph.env)
        for name, init in zip(loop_vars, op.input("Init")):
            first.define(name, graph.read(init))
        self.block(first, cond_block)
        graph.nodes += first.nodes
        start = first.read(cond_out)

        carried = [(name, body.vars[name]) for name in loop_vars]
        inputs = [helper.make_tensor_value_info(self.fresh("iter"), TensorProto.INT64, []),
                  helper.make_tensor_value_info(self.fresh("cond_in"), TensorProto.BOOL, [])]
        renamed = {}
        for name, var in carried:
            renamed[name] = self.fresh(name.replace(".", "_"))
            inputs.append(self.value_info(renamed[name], var))

        def enter(g):
            for name in loop_vars:
                g.define(name, renamed[name])

        def next_condition(g):
            # The body's results become the loop variables of the next test.
            new = {name: g.read(out) for name, out in zip(loop_vars, body_outs)}
            for name, value in new.items():
                g.define(name, value)
            self.block(g, cond_block)

        outputs = [(cond_out, cond_block.find_var(cond_out))] + [
            (out, var) for out, (_, var) in zip(body_outs, carried)]
        body_graph = self.subgraph(graph, body, outputs, f"while_body_{body.idx}", inputs, enter, next_condition)
        outs = op.output("Out")
        initial = []
        for init, (_, var) in zip(op.input("Init"), carried):
            init_var = block.find_var(init)
            if var.kind == TENSOR_ARRAY and not getattr(init_var, "elem_known", True):
                # An array nothing was appended to yet: its element type is
                # the one the loop settles on.
                initial.append(graph.node("SequenceEmpty", [], name_hint="seq", dtype=elem_type(var.dtype_name)))
            else:
                initial.append(graph.read(init))
        values = graph.node("Loop", ["", start] + initial,
                            n_out=len(outs), name_hint="loop", body=body_graph)
        for name, value in zip(outs, values if len(outs) != 1 else [values]):
            graph.define(name, value)


_ELEM_NAMES = {"float32": "FLOAT", "float64": "DOUBLE", "float16": "FLOAT16", "bfloat16": "BFLOAT16",
               "int64": "INT64", "int32": "INT32", "int16": "INT16", "int8": "INT8", "uint8": "UINT8",
               "bool": "BOOL", "complex64": "COMPLEX64", "complex128": "COMPLEX128"}


class _LazyTable(dict):
    def __init__(self, build):
        super().__init__()
        self._build = build

    def __missing__(self, key):
        if not dict.__len__(self):
            self.update(self._build())
        return dict.__getitem__(self, key)


def _elem_table():
    from onnx import TensorProto
    return {name: getattr(TensorProto, attr) for name, attr in _ELEM_NAMES.items()}


def _numpy_table():
    import numpy as np
    return {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int64": np.int64,
            "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}


_ELEM = _LazyTable(_elem_table)
_NUMPY = _LazyTable(_numpy_table)


def elem_type(dtype_name):
    return _ELEM[dtype_name]


def program_to_onnx(program, feed_names, fetch_names, params, opset_version=None, name="d2s_program"):
    """An onnx.ModelProto computing `fetch_names` from `feed_names`;
    `params` maps each persistable variable the program reads to its tensor."""
    from onnx import helper, numpy_helper

    opset = DEFAULT_OPSET if opset_version is None else opset_version
    if opset not in SUPPORTED_OPSETS:
        raise OnnxExportError(f"opset_version {opset} is not supported; use one of "
                              f"{SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1}")
    lowering = Lowering(program, opset)
    block = program.global_block()
    lowering.used |= {v.name for b in program.blocks for v in b.vars.values()}
    graph = Graph(lowering, {})
    inputs = []
    for feed in feed_names:
        var = block.vars[feed]
        dims = [f"{feed}_dim{i}" if d == -1 else d for i, d in enumerate(var.shape)]
        inputs.append(helper.make_tensor_value_info(feed, elem_type(var.dtype_name), dims))
    initializers = []
    read = _reads(program)
    for var in program.persistable_vars():
        if var.name in read:
            tensor = params[var.name].detach().cpu().contiguous()
            initializers.append(numpy_helper.from_array(tensor.numpy(), var.name))
    lowering.block(graph, block)
    outputs = []
    for fetch in fetch_names:
        var = block.vars[fetch]
        value = graph.read(fetch)
        if value != fetch:  # equal only for a fetched feed or parameter, already a graph value
            graph.nodes.append(helper.make_node("Identity", [value], [fetch]))
        dims = [f"{fetch}_dim{j}" if d == -1 else d for j, d in enumerate(var.shape)]
        outputs.append(helper.make_tensor_value_info(fetch, elem_type(var.dtype_name), dims))
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(helper.make_graph(graph.nodes, name, inputs, outputs, initializers),
                              opset_imports=opsets, producer_name="d2s")
    # The oldest IR version the opset allows, so that runtimes older than
    # the onnx package (onnxruntime lags it) load the model.
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model


def _reads(program):
    names = set()
    for b in program.blocks:
        for op in b.ops:
            names.update(op.input_names)
    return names

