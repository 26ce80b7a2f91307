"""Straight-line ops to ONNX through PyTorch's own exporter.

A region (a run of ops between control-flow and tensor-array ops) becomes
a Python function calling the ops' kernels (`runtime/replay.py`); it is
traced by `torch.export` with every symbolic dimension of its inputs
dynamic, and translated by `torch.onnx` (the ATen decompositions and the
onnxscript "torchlib" functions behind `torch.onnx.export(dynamo=True)`).
The resulting graph is spliced into the enclosing ONNX graph with fresh
value names. So every op torch.onnx can export, d2s exports too, with the
same ONNX functions; what torch.onnx refuses is refused with its message.

Refused rather than exported approximately:
  - a dimension that is symbolic in the program but that torch.export
    specialises to the example size (the region would be right for one
    size only);
  - a region whose trace needs a range assumption on a size beyond what
    every run satisfies;
  - a region that draws random numbers (dropout in training mode).
"""

import re

import sympy
import torch
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.symbol import SymT, symbol_is_type

from .attrs import InputRef
from .ir import SCALAR, torch_dtype
from .onnx_translations import translations

# The sizes symbolic dimensions take in the example inputs of a trace:
# distinct, so that torch.export cannot mistake two sizes for one, and
# larger than 1 (torch keeps sizes 0 and 1 apart from the others).
_EXAMPLE_SIZES = (7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)


class RegionError(ValueError):
    """torch's exporter could not export the region (the message says why);
    `op`: the program op whose ATen call failed, when torch says which."""

    def __init__(self, message, op=None):
        super().__init__(message)
        self.op = op


class OpMarker:
    """The region's trace hook (called before each op): labels the graph
    nodes each op makes (`node.meta["custom"]["d2s_op"]`), so that a node
    torch.onnx refuses names the program op that made it."""

    def __init__(self):
        self.ops, self._scope = [], None

    def __call__(self, op):
        self.close()
        self.ops.append(op)
        self._scope = torch.fx.traceback.annotate({"d2s_op": len(self.ops) - 1})
        self._scope.__enter__()

    def close(self):
        if self._scope is not None:
            self._scope.__exit__(None, None, None)
            self._scope = None

    def op_of(self, node):
        index = (node.meta.get("custom") or {}).get("d2s_op")
        return None if index is None else self.ops[index]


def _example_size(dim, sizes):
    """The example size of a dimension: an int, a symbol ("s0") or an
    expression of symbols ("2*s0")."""
    if isinstance(dim, int) and dim >= 0:
        return dim, False
    expr = sympy.sympify(dim if isinstance(dim, str) else f"_unknown{len(sizes)}")
    return _evaluate(expr, sizes), True


def _evaluate(expr, sizes):
    """`expr` at the example sizes (new symbols get new sizes)."""
    for symbol in sorted(expr.free_symbols, key=str):
        if str(symbol) not in sizes:
            sizes[str(symbol)] = _EXAMPLE_SIZES[len(sizes) % len(_EXAMPLE_SIZES)] + 100 * (
                len(sizes) // len(_EXAMPLE_SIZES))
    return int(expr.subs({sympy.Symbol(k): v for k, v in sizes.items()}))


_SCALAR_OPS = {"operator.add": lambda a, b: a + b, "operator.sub": lambda a, b: a - b,
               "operator.mul": lambda a, b: a * b, "operator.floordiv": lambda a, b: a // b,
               "builtins.max": sympy.Max, "builtins.min": sympy.Min}


def scalar_expr(var):
    """A program's integer SCALAR as an expression of its dimension symbols
    (`size(x, 0)` of an x of dims [s0, 8] is s0; `2 * size(...)`, ...), or
    None: so that its example value agrees with the example tensors."""
    block, op = var.block, None
    while block is not None and op is None:
        op = next((o for o in block.ops if var.name in o.output_names), None)
        block = block.parent
    if op is None or (op.type != "size" and op.type not in _SCALAR_OPS):
        return None
    args = []
    for arg in op.attrs.get("args", ()):
        if isinstance(arg, InputRef):
            source = op.block.find_var(op.input("X")[arg.index])
            arg = source if op.type == "size" and not args else scalar_expr(source)
            if arg is None:
                return None
        args.append(arg)
    if op.type == "size":
        dim = args[0].dims[args[1]] if len(args) == 2 and isinstance(args[1], int) else None
        return None if dim is None or dim == -1 else sympy.sympify(dim)
    return _SCALAR_OPS[op.type](*args)


def example_inputs(variables):
    """(example values, dynamic_shapes) for torch.export of a function of
    `variables` (program Variables): zeros of the variables' shapes, with
    each symbolic dimension dynamic; a SCALAR is a dynamic int."""
    Dim = torch.export.Dim
    sizes, values, dynamic = {}, [], []
    for var in variables:
        if var.kind == SCALAR:
            if var.dtype_name == "int64":
                expr = scalar_expr(var)
                values.append(5 if expr is None else _evaluate(sympy.sympify(expr), sizes))
                dynamic.append(Dim.DYNAMIC)
            else:  # refused by export_region: a trace holds other numbers as constants
                values.append(None)
                dynamic.append(None)
            continue
        shape, dims = [], {}
        for i, d in enumerate(var.dims):
            size, symbolic = _example_size(d, sizes)
            shape.append(size)
            if symbolic:
                dims[i] = Dim.DYNAMIC
        values.append(torch.zeros(shape, dtype=torch_dtype(var.dtype_name)))
        dynamic.append(dims or None)
    return values, dynamic


def _bool_tensor(value):
    """A region's bool number (a size test `s0 != 1` that a check or a
    branch reads) as a 0-d bool tensor: torch.export returns tensors only."""
    return torch.scalar_tensor(torch.sym_ite(value, 1, 0), dtype=torch.int64).bool()


class _Region(torch.nn.Module):
    def __init__(self, fn, clone, marker, bools=()):
        super().__init__()
        self.fn, self.clone, self.marker, self.bools = fn, clone, marker, set(bools)

    def forward(self, *args):
        if self.clone:
            # The region writes some tensor in place: work on copies so that
            # the trace has no input mutation (outputs carry the new values).
            args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        self.marker.ops.clear()
        try:
            return tuple(_bool_tensor(v) if i in self.bools else v for i, v in enumerate(self.fn(*args)))
        finally:
            self.marker.close()


def export_region(fn, in_vars, out_vars, mutates, opset, marker):
    """An onnx.ModelProto of `fn` (inputs: values of `in_vars`; outputs: of
    `out_vars`), its graph inputs and outputs in that order. `fn` calls
    `marker` (an OpMarker) before each op."""
    import onnx.inliner
    for var in in_vars:
        if var.kind == SCALAR and var.dtype_name != "int64":
            raise RegionError(f"a {var.dtype_name} number ({var.name}) crosses into a straight-line region; "
                              "torch.export takes only integer sizes as dynamic numbers")
    values, dynamic = example_inputs(in_vars)
    bools = [i for i, var in enumerate(out_vars) if var.kind == SCALAR and var.dtype_name == "bool"]
    module = _Region(fn, mutates, marker, bools)
    try:
        with torch.fx.experimental._config.patch(backed_size_oblivious=True), torch.no_grad(), \
                torch.fx.traceback.preserve_node_meta():
            exported = torch.export.export(module, tuple(values), dynamic_shapes=(tuple(dynamic),), strict=False)
    except Exception as e:  # torch's message says what it could not trace
        raise RegionError(f"torch.export failed: {_first_line(e)}") from e
    _check_dynamic(exported, in_vars, dynamic)
    _check_deterministic(exported, marker)
    try:
        program = torch.onnx.export(exported, (), dynamo=True, opset_version=opset, optimize=False,
                                    verbose=False, custom_translation_table=translations())
    except Exception as e:
        raise _translation_error(e, exported, marker) from e
    optimize(program.model)
    model = onnx.inliner.inline_local_functions(program.model_proto)
    if len(model.graph.input) != len(in_vars) or len(model.graph.output) != len(out_vars):
        raise RegionError(f"torch.onnx made a graph of {len(model.graph.input)} inputs and "
                          f"{len(model.graph.output)} outputs for {len(in_vars)} and {len(out_vars)}")
    return model


def optimize(model):
    """torch.onnx's optimisation (`optimize=True`: onnxscript's constant
    folding and rewrite rules, then its clean-up passes) without its no-op
    rules. Those match a constant within a tolerance (abs 1e-8, rel 1e-5)
    and delete the op: `x + 1e-8` (an epsilon under a square root),
    `x * 1.000001`, `x - c`, `x / c` for such constants become x, a silent
    wrong value (ParityBench mile BevDecoder's `sqrt(var + 1e-8)` of a
    channel of variance near 0, in both exporters). onnxruntime removes
    exact no-ops itself. In place, on torch.onnx's onnx_ir model. The
    passes are onnxscript's own (some private): where a release renames
    them, the region stays unoptimised (onnxruntime optimises at load),
    never optimised with the no-op rules."""
    try:
        import onnx_ir.passes.common as common_passes
        from onnx_ir import passes
        from onnxscript import rewriter
        from onnxscript.optimizer import _constant_folding
        from onnxscript.rewriter.rules.common import _no_op
        tolerant = {id(rule) for rule in _no_op.rules.rules}
        rewriter._DEFAULT_REWRITE_RULES  # noqa: B018 - present in this release
    except (ImportError, AttributeError):
        return
    rules = [rule for rule in rewriter._DEFAULT_REWRITE_RULES if id(rule) not in tolerant]
    passes.Sequential(
        common_passes.InlinePass(),
        passes.PassManager([_constant_folding.FoldConstantsPass(
                                shape_inference=True,
                                input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
                                output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT),
                            rewriter.RewritePass(rules),
                            common_passes.RemoveUnusedNodesPass(),
                            common_passes.RemoveUnusedFunctionsPass(),
                            common_passes.RemoveUnusedOpsetsPass()],
                           steps=2, early_stop=True),
        common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
        common_passes.OutputFixPass(),
        common_passes.NameFixPass(),
    )(model)


def _check_deterministic(exported, marker):
    """Refuse random ATen ops (dropout in training mode, torch.rand): ONNX's
    random ops cannot draw the numbers torch's generator draws."""
    for node in exported.graph.nodes:
        tags = getattr(node.target, "tags", ())
        if node.op == "call_function" and torch.Tag.nondeterministic_seeded in tags and not _draws_nothing(node):
            raise RegionError(f"it draws random numbers ({node.target}), which an ONNX model cannot draw as "
                              "torch does; for dropout, export the model in eval mode", marker.op_of(node))


def _draws_nothing(node):
    """Whether a call of an op that may draw (dropout, lstm, gru,
    scaled_dot_product_attention) is made with `train=False` or a dropout
    probability of 0, so that it draws nothing."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    values = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    values.update({a.name: v for a, v in zip(schema.arguments, node.args)})
    values.update(node.kwargs)
    return values.get("train") is False or any(values.get(k) == 0 for k in ("dropout", "p", "dropout_p"))


def _translation_error(error, exported, marker):
    """A RegionError saying which ATen op torch.onnx could not translate and
    which line of the region called it (from the node's stack trace)."""
    text = str(error)
    missing = re.search(r"No ONNX function found for <OpOverload\(op='([\w.]+)'", text)
    reason = (f"torch.onnx has no ONNX function for {missing.group(1)}" if missing
              else f"torch.onnx failed: {_first_line(error)}")
    op = None
    node = re.search(r"Error when translating node %(\w+)", text)
    if node:
        for n in exported.graph.nodes:
            if n.name == node.group(1):
                op = marker.op_of(n)
    return RegionError(reason, op)


def _first_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _check_dynamic(exported, in_vars, dynamic):
    """Refuse a trace that fixed a dimension the program keeps symbolic, or
    that assumed a size range some run may leave."""
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder"]
    user = exported.graph_signature.user_inputs
    by_name = {n.name: n for n in placeholders}
    for var, dims, name in zip(in_vars, dynamic, user):
        val = by_name[name].meta.get("val")
        if var.kind == SCALAR or not dims:
            continue
        for i in dims:
            if not isinstance(val.shape[i], torch.SymInt):
                raise RegionError(f"torch.export fixed dimension {i} of {var.name} (symbolic in the program: "
                                  f"{var.dims[i]}) to the example size {val.shape[i]}")
    for var, name in zip(in_vars, user):
        if var.kind == SCALAR and not isinstance(by_name[name].meta.get("val"), torch.SymInt):
            raise RegionError(f"torch.export fixed the number {var.name} to its example value")
    for symbol, bounds in exported.range_constraints.items():
        lower, upper = bounds.lower, bounds.upper
        if symbol_is_type(symbol, SymT.UNBACKED_INT):
            continue  # a size the region computes (rows a mask selects): its range is a fact, not an assumption
        if lower > 2 or upper not in (int_oo, sympy.oo):
            raise RegionError(f"torch.export assumed {lower} <= {symbol} <= {upper}, which not every run "
                              "satisfies")


def splice(graph, model, input_values, fresh):
    """Append the nodes of `model`'s graph to `graph` (a list of NodeProto),
    its inputs bound to the ONNX values `input_values`; every value it
    defines gets a name from `fresh(hint)`. Returns the ONNX values of its
    outputs."""
    from onnx import helper
    names = {i.name: v for i, v in zip(model.graph.input, input_values)}
    for init in model.graph.initializer:
        names[init.name] = fresh("c")
        graph.append(helper.make_node("Constant", [], [names[init.name]], value=init))
        graph[-1].attribute[0].t.name = ""
    for node in model.graph.node:
        graph.append(_renamed(node, names, fresh))
    return [names[o.name] for o in model.graph.output]


def _renamed(node, names, fresh):
    """A copy of `node` reading `names[...]` and writing fresh names (added
    to `names`); subgraphs are renamed in a scope of their own."""
    import onnx.inliner
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = ""
    del copy.input[:]
    copy.input.extend(names.get(n, n) if n else "" for n in node.input)
    for attr in copy.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            _rename_graph(attr.g, names, fresh)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for g in attr.graphs:
                _rename_graph(g, names, fresh)
    del copy.output[:]
    for n in node.output:
        if n:
            names[n] = fresh("t")
        copy.output.append(names[n] if n else "")
    return copy


def _rename_graph(g, outer, fresh):
    scope = dict(outer)
    for value in list(g.input) + list(g.initializer):
        scope[value.name] = fresh("s")
        value.name = scope[value.name]
    nodes = [_renamed(n, scope, fresh) for n in g.node]
    del g.node[:]
    g.node.extend(nodes)
    for out in g.output:
        out.name = scope.get(out.name, out.name)
    del g.value_info[:]
