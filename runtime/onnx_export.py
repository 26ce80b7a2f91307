"""Lowering a Program to ONNX: `cond` -> If, `while` -> Loop, tensor arrays
-> sequences (`runtime/onnx_ops.py`), every run of other ops between them
through torch's own exporter (`runtime/onnx_regions.py`).

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

`onnx` and torch.onnx (with `onnxscript`) are imported only when exporting
(the `d2s[onnx]` extra).
"""

import itertools

from .ir import GENERATOR, TENSOR_ARRAY, torch_dtype
from .optable import get_op_def
from .onnx_checks import conjunction, gated, is_check, lower_check
from .onnx_common import _ELEM, _NUMPY, OnnxExportError, _origin, _span, elem_type, op_error
from .onnx_ops import LOWERINGS, WHOLE_OPS
from .replay import (AliasingError, check_aliasing, failing_op, op_reads, reads_and_writes, region_function,
                     outer_writes, state_write, untraceable, written_roots)


# torch.onnx translates to opset 18 and later.
DEFAULT_OPSET = 18
SUPPORTED_OPSETS = range(18, 22)


class Graph:
    """Nodes and the value environment of one ONNX graph (the main graph or
    a subgraph); subgraphs start from their parent's environment."""

    def __init__(self, lowering, env):
        self.lowering = lowering
        self.env = dict(env)
        self.nodes = []
        self.guards = []  # tokens of the run-time checks (runtime/onnx_checks.py)

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

    def const_tensor(self, value, dtype):
        """A Constant holding `value` (a tensor, or a Python number of d2s dtype `dtype`)."""
        import torch
        from onnx import numpy_helper
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value, dtype=torch_dtype(dtype))
        array = numpy_helper.from_array(value.detach().cpu().contiguous().numpy())
        return self.node("Constant", [], name_hint="c", value=array)

    def read(self, name):
        return self.env.get(name, name)

    def define(self, var_name, value):
        """Bind program variable `var_name` to ONNX value `value`."""
        self.env[var_name] = value


class Lowering:
    def __init__(self, program, opset):
        self.program = program
        self.opset = opset
        self.lowerings = LOWERINGS
        self._names = itertools.count()
        self.used = set()
        self.node_names = set()  # names given to nodes (a check's message): unique, as onnxruntime requires
        self.opsets = set()  # (domain, version) of the regions torch.onnx exported
        self.regions = {}  # (block, first op, ...) -> the ONNX model torch.onnx made of the region
        self.progress = None
        self.anchor = None  # a graph input: run-time values for checks that always fail
        self.origin = _origin

    def fresh(self, hint):
        while True:
            name = f"{hint}__{next(self._names)}"
            if name not in self.used:
                self.used.add(name)
                return name

    def node_name(self, name):
        """`name`, or where a node already has it (two checks of one message
        and line), `name` with a count."""
        unique, count = name, 1
        while unique in self.node_names:
            count += 1
            unique = f"{name} ({count})"
        self.node_names.add(unique)
        return unique

    # -- blocks --------------------------------------------------------------------
    def block(self, graph, block, keep=()):
        """Lower the ops of `block` into `graph`; `keep`: the names read
        after the block (a sub-block's outputs, the fetches)."""
        reads_after = [set(keep)]
        for op in reversed(block.ops):
            reads_after.append(reads_after[-1] | op_reads(op))
        reads_after.reverse()  # reads_after[i]: names ops[i:] and the block's readers read
        run, checks = [], []

        def flush(live):
            checked = {n for c in checks for n in c.input_names}
            part = _slice(run, checked)
            if part and not any(get_op_def(op.type).mutates for op in part):
                # What the checks test, traced apart: a trace of the other ops
                # may assume the very sizes a check tests (`x + y` unifies the
                # lengths of x and y), and would hand the check a constant.
                self.region(graph, block, part, checked)
            else:
                live = live | checked  # the checks' inputs leave the region with its results
            for check in checks:
                lower_check(graph, check, block, self)
            self.region(graph, block, run, live)
            run.clear()
            checks.clear()

        for i, op in enumerate(block.ops):
            if is_check(op):
                checks.append(op)
                continue
            if checks and set(reads_and_writes([op])[1]) & {n for c in checks for n in c.input_names}:
                flush(reads_after[i])  # op writes what a check read: the check takes the value before
            if op.type in ("cond", "while") or self._on_arrays(op, block) or \
                    get_op_def(op.type).canonical in WHOLE_OPS:
                flush(reads_after[i])
                self.structured(graph, block, op)
            else:
                run.append(op)
        flush(reads_after[-1])

    def _on_arrays(self, op, block):
        return any(block.find_var(n).kind == TENSOR_ARRAY for n in op.input_names + op.output_names)

    def region(self, graph, block, ops, live):
        """Straight-line `ops` through torch's exporter (runtime/onnx_regions.py)."""
        from .onnx_regions import OpMarker, RegionError, export_region, splice  # lazy: export only (torch.onnx)
        from .onnx_rnn import region_op_defs  # lazy: registers torch custom ops, when exporting only
        reads, writes = reads_and_writes(ops)
        # Inputs written through a view made here (`y = x.data; y.copy_(v)`):
        # the trace returns their new values too.
        through = [n for n in written_roots(ops) if n not in writes]
        try:
            check_aliasing(self.program, ops, set(reads) & (set(writes) | set(through)))
        except AliasingError as e:
            raise op_error(e.op, str(e)) from None
        refused = untraceable(ops)
        if refused:
            raise op_error(*refused)
        outputs = [n for n in writes + through if n in live]
        if not outputs:
            return  # nothing read later
        marker = OpMarker()
        compiled = region_function(block, ops, reads, outputs, marker, region_op_defs)
        if not reads and not any(get_op_def(op.type).random for op in ops):
            # Constants (fill_constant, torch.zeros(3)): their values, computed once.
            for name, value in zip(outputs, region_function(block, ops, reads, outputs).fn()):
                graph.define(name, graph.const_tensor(value, block.find_var(name).dtype_name))
            return
        # A loop's condition block is lowered twice (first test, end of the body): traced once.
        key = (block.idx, id(ops[0]), len(ops), tuple(outputs))
        model = self.regions.get(key)
        if model is None:
            mutates = any(get_op_def(op.type).mutates for op in ops)
            try:
                model = export_region(compiled.fn, [block.find_var(n) for n in reads],
                                      [block.find_var(n) for n in outputs], mutates, self.opset, marker)
            except RegionError as e:
                op = e.op or failing_op(compiled, e)
                if op is not None:
                    raise op_error(op, str(e)) from e
                raise OnnxExportError(f"cannot export the ops {_span(ops)} to ONNX: {e}") from e
            self.regions[key] = model
            if self.progress is not None:
                self.progress(f"exported ops {_span(ops)} ({len(ops)} ops) with torch.onnx")
        self.opsets.update((o.domain, o.version) for o in model.opset_import)
        values = splice(graph.nodes, model, [graph.read(n) for n in reads], self.fresh)
        for name, value in zip(outputs, values):
            graph.define(name, value)

    def structured(self, graph, block, op):
        """A control-flow op, or an op on tensor arrays (runtime/onnx_ops.py)."""
        if op.type == "cond":
            return self.cond(graph, block, op)
        if op.type == "while":
            return self.loop(graph, block, op)
        lower = self.lowerings.get(get_op_def(op.type).canonical)
        if lower is None:
            raise op_error(op, "no ONNX lowering for this op on tensor arrays (runtime/onnx_ops.py lists "
                           "the ones that have one)")
        results = lower(graph, op, block)
        outs = op.output("Out")
        if results is None:
            return
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
        """(GraphProto running `block` (with `enter(graph)` before and
        `leave(graph)` after), the ONNX value standing for its checks or
        None); `outputs` are (program name, Variable) pairs, each copied
        into a fresh output value."""
        from onnx import helper
        graph = Graph(self, parent.env)
        if enter is not None:
            enter(graph)
        self.block(graph, block, keep=[n for n, _ in outputs])
        if leave is not None:
            leave(graph)
        out_infos = []
        for var_name, var in outputs:
            value = self.fresh(var_name.replace(".", "_") + "_out")
            graph.nodes.append(helper.make_node("Identity", [graph.read(var_name)], [value]))
            out_infos.append(self.value_info(value, var))
        return helper.make_graph(graph.nodes, name, list(inputs), out_infos), conjunction(graph)

    def guard_output(self, subgraph, ok):
        """Add the checks' value `ok` (None: no checks, true) as the last output of `subgraph`."""
        from onnx import TensorProto, helper
        value = self.fresh("checks_out")
        if ok is None:
            node = helper.make_node("Constant", [], [value], value=helper.make_tensor("t", TensorProto.BOOL, [], [True]))
        else:
            node = helper.make_node("Identity", [ok], [value])
        subgraph.node.append(node)
        subgraph.output.append(helper.make_tensor_value_info(value, TensorProto.BOOL, []))

    # -- control flow ------------------------------------------------------------------
    def cond(self, graph, block, op):
        written = outer_writes(block, op)
        outs = op.output("Out") + written
        out_vars = [block.find_var(n) for n in outs]
        branches, checks = [], []
        for side in ("true", "false"):
            sub = op.attrs[f"{side}_block"]
            names = op.attrs[f"{side}_outs"] + written
            branch, ok = self.subgraph(graph, sub, list(zip(names, out_vars)), f"{side}_block_{sub.idx}")
            branches.append(branch)
            checks.append(ok)
        checked = any(ok is not None for ok in checks)
        if checked:  # the branch's checks come out as one more output
            for branch, ok in zip(branches, checks):
                self.guard_output(branch, ok)
        n_out = len(outs) + checked
        if not n_out:
            return  # nothing comes out (ONNX wants an If to yield something); the branches were still checked
        results = graph.node("If", [graph.read(op.input("Cond")[0])], n_out=n_out, name_hint="if",
                             then_branch=branches[0], else_branch=branches[1])
        results = results if n_out != 1 else [results]
        for name, value in zip(outs, results):
            graph.define(name, value)
        if checked:
            graph.guards.append(results[-1])

    def loop(self, graph, block, op):
        from onnx import TensorProto, helper
        body, cond_block = op.attrs["body_block"], op.attrs["cond_block"]
        loop_vars, body_outs = op.attrs["loop_vars"], op.attrs["body_outs"]
        cond_out = op.attrs["cond_out"]
        # The first test, on the initial values, in the enclosing graph.
        first = Graph(self, graph.env)
        for name, init in zip(loop_vars, op.input("Init")):
            first.define(name, graph.read(init))
        self.block(first, cond_block, keep=[cond_out])
        graph.nodes += first.nodes
        graph.guards += first.guards
        start = first.read(cond_out)

        # Names of the enclosing scope the loop writes in place: carried too.
        written = [n for n in outer_writes(block, op) if n not in loop_vars]
        loop_vars, body_outs = loop_vars + written, body_outs + written
        carried = [(name, body.find_var(name)) for name in loop_vars]
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
            self.block(g, cond_block, keep=[cond_out])

        outputs = [(cond_out, cond_block.find_var(cond_out))] + [
            (out, var) for out, (_, var) in zip(body_outs, carried)]
        body_graph, ok = self.subgraph(graph, body, outputs, f"while_body_{body.idx}", inputs, enter,
                                       next_condition)
        if ok is not None:
            # The body's checks, carried: true while every trip's have held.
            carried_ok = self.fresh("checks_in")
            body_graph.input.append(helper.make_tensor_value_info(carried_ok, TensorProto.BOOL, []))
            both = self.fresh("checks")
            body_graph.node.append(helper.make_node("And", [carried_ok, ok], [both]))
            self.guard_output(body_graph, both)
        outs = op.output("Out") + written
        initial = []
        for init, (_, var) in zip(op.input("Init") + written, carried):
            init_var = block.find_var(init)
            if var.kind == TENSOR_ARRAY and not getattr(init_var, "elem_known", True):
                # An array nothing was appended to yet: its element type is
                # the one the loop settles on.
                initial.append(graph.node("SequenceEmpty", [], name_hint="seq", dtype=elem_type(var.dtype_name)))
            else:
                initial.append(graph.read(init))
        if ok is not None:
            initial.append(graph.const(True, "bool"))
        n_out = len(outs) + (ok is not None)
        values = graph.node("Loop", ["", start] + initial, n_out=n_out, name_hint="loop", body=body_graph)
        values = values if n_out != 1 else [values]
        for name, value in zip(outs, values):
            graph.define(name, value)
        if ok is not None:
            graph.guards.append(values[-1])


def program_to_onnx(program, feed_names, fetch_names, params, opset_version=None, name="d2s_program",
                    progress=None):
    """An onnx.ModelProto computing `fetch_names` from `feed_names`;
    `params` maps each persistable variable the program reads to its tensor.
    `progress(message)`, if given, is told of each region torch.onnx exports."""
    from onnx import helper, numpy_helper

    opset = DEFAULT_OPSET if opset_version is None else opset_version
    if opset not in SUPPORTED_OPSETS:
        raise OnnxExportError(f"opset_version {opset} is not supported; use one of "
                              f"{SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1}")
    if not fetch_names:
        # An ONNX model with no outputs is invalid (onnxruntime cannot load one).
        raise OnnxExportError("the program computes no tensor: its results are Python values fixed when it was "
                              "converted, so there is nothing for an ONNX model to compute")
    _refuse_state_writes(program)
    lowering = Lowering(program, opset)
    lowering.progress = progress
    block = program.global_block()
    lowering.used |= {v.name for b in program.blocks for v in b.vars.values()}
    graph = Graph(lowering, {})
    inputs = []
    for feed in feed_names:
        var = block.vars[feed]
        if var.kind == GENERATOR:
            raise OnnxExportError(f"the program takes the torch.Generator {feed!r}, and an ONNX model cannot draw "
                                  "the numbers torch's generator draws; export a function without random draws")
        dims = [f"{feed}_dim{i}" if d == -1 else d for i, d in enumerate(var.shape)]
        inputs.append(helper.make_tensor_value_info(feed, elem_type(var.dtype_name), dims))
    initializers = []
    read = _reads(program)
    for var in program.persistable_vars():
        if var.name in read:
            tensor = params[var.name].detach().cpu().contiguous()
            initializers.append(numpy_helper.from_array(tensor.numpy(), var.name))
    lowering.anchor = next((f for f in feed_names if block.vars[f].kind != TENSOR_ARRAY), None)
    lowering.block(graph, block, keep=fetch_names)
    checks = conjunction(graph)
    outputs = []
    named = set()
    for fetch in fetch_names:
        var = block.vars[fetch]
        value = graph.read(fetch)
        # A value returned twice is two outputs: the second gets a name of its
        # own; so does a feed written in place (its name is the input's).
        written_feed = fetch in feed_names and value != fetch
        # (a feed or parameter returned as is, but gated, needs another name too)
        written_feed |= checks is not None and value == fetch
        if checks is not None:  # no output without every check (runtime/onnx_checks.py)
            value = gated(graph, value, checks)
        name = fetch if fetch not in named and not written_feed else lowering.fresh(fetch)
        named.add(name)
        if value != name:  # equal only for a fetched feed or parameter, already a graph value
            graph.nodes.append(helper.make_node("Identity", [value], [name]))
        dims = [f"{fetch}_dim{j}" if d == -1 else d for j, d in enumerate(var.shape)]
        outputs.append(helper.make_tensor_value_info(name, elem_type(var.dtype_name), dims))
    domains = {d: v for d, v in lowering.opsets if d}
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in sorted(domains.items())]
    model = helper.make_model(helper.make_graph(graph.nodes, name, inputs, outputs, initializers),
                              opset_imports=opsets, producer_name="d2s")
    # The oldest IR version the opset allows, so that runtimes older than
    # the onnx package (onnxruntime lags it) load the model.
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model


def _refuse_state_writes(program):
    found = state_write(program)
    if found is not None:
        op, name = found
        raise op_error(op, f"it writes the model's state {name!r} (a parameter or buffer) in place; an ONNX model "
                       "keeps no state between runs, so its later runs would differ from the model's later "
                       "calls; export a model whose forward does not write its state")


def _slice(ops, names):
    """The ops of `ops` that `names` depend on, in order."""
    needed, part = set(names), []
    for op in reversed(ops):
        if needed & set(reads_and_writes([op])[1]):
            part.append(op)
            needed |= set(op.input_names)
    return part[::-1]


def _reads(program):
    names = set()
    for b in program.blocks:
        for op in b.ops:
            names.update(op.input_names)
    return names

