"""Compile a Program into one Python function.

Each op becomes one or a few Python statements built as `ast` nodes (never
as formatted strings): a call-style op becomes

    v_y = k_torch_nn_functional_linear(v_x, v_fc_weight, v_fc_bias)

and control-flow ops become real `if` / `while` statements around their
sub-blocks' statements. Variables become function locals; a local is deleted
right after its last use, so intermediates are freed as early as in eager
code. Kernels and non-literal constants (dtypes, slices, ...) are globals of
the generated function.

Every op's statements get a line number of their own in a synthetic file, so
a failure inside the generated code maps back to the op (and from there to
the user line that created it).
"""

import ast
import builtins
import itertools
import re

import torch

from .attrs import InputRef, OutputRef, ReturnType
from .ir import Block, torch_dtype
from .native import lower as native_lower
from .native import lower_flow as native_flow
from .native import plan as native_plan

_program_ids = itertools.count()


class CompiledBlock:
    """The generated function plus what is needed to call it and explain a
    failure: argument order, the line -> op map, and the source text."""

    def __init__(self, fn, feed_names, param_names, fetch_names, written_params, line_ops, source, derived=(),
                 segments=(), flows=()):
        self.fn = fn
        self.segments = list(segments)  # the native segments the function calls (runtime/native)
        self.flows = list(flows)  # its `while`/`cond` ops run by C++ (runtime/native/lower_flow.py)
        self.feed_names = feed_names
        self.param_names = param_names
        # Parameters whose transposes (`w.t()`) the caller passes after the
        # parameters (runtime/passes/pretranspose.py), in this order.
        self.derived = list(derived)
        self.fetch_names = fetch_names
        self.written_params = written_params
        self.line_ops = line_ops
        self.source = source


class Codegen:
    """State of one compilation; op emitters (`OpDef.emit`) call its methods."""

    def __init__(self, program, get_op_def, trace_hook=None, native_module=None, fused_autograd=False):
        self.program = program
        self.get_op_def = get_op_def
        self.trace_hook = trace_hook
        self.native = native_module  # the extension (runtime/native), or None: Python statements only
        # The fast level: a segment called with grad on records one autograd node (segment.cpp).
        self.fused_autograd = fused_autograd
        self._tensor_names = None
        self._value_kinds = None
        self.segments = []
        self.flows = []  # native control flow (runtime/native/lower_flow.py)
        self.globals = {}
        self._locals = {}
        self._fresh = 0  # functions emitters define (`fresh_local`)
        self._globals_by_id = {}
        self._line = itertools.count(1)
        self.line_ops = {}
        self.filename = f"<d2s program {next(_program_ids)}>"

    # -- names -------------------------------------------------------------------
    def local(self, var_name):
        ident = self._locals.get(var_name)
        if ident is None:
            ident = "v_" + re.sub(r"\W", "_", var_name)
            while ident in self._locals.values():
                ident += "_"
            self._locals[var_name] = ident
        return ident

    def fresh_local(self, prefix):
        """A local name no variable's local can take (those start with `v_`):
        `ck_1`, `ck_2`, ... for functions emitters define."""
        self._fresh += 1
        return f"{prefix}_{self._fresh}"

    def load(self, var_name):
        return ast.Name(id=self.local(var_name), ctx=ast.Load())

    def store(self, var_name):
        return ast.Name(id=self.local(var_name), ctx=ast.Store())

    def global_ref(self, obj, prefix="c"):
        """A Name for `obj` as a global of the generated function."""
        key = id(obj)
        ident = self._globals_by_id.get(key)
        if ident is None:
            base = prefix + "_" + re.sub(r"\W", "_", getattr(obj, "__name__", "") or "")[:40]
            ident = base
            n = 0
            while ident in self.globals:
                n += 1
                ident = f"{base}{n}"
            self.globals[ident] = obj
            self._globals_by_id[key] = ident
        return ast.Name(id=ident, ctx=ast.Load())

    def kernel(self, opdef):
        return self.global_ref(opdef.kernel, "k")

    # -- expressions -------------------------------------------------------------
    def arg_expr(self, tree, input_names):
        """An expression rebuilding an argument tree (InputRef -> the local)."""
        if isinstance(tree, InputRef):
            return self.load(input_names[tree.index])
        if isinstance(tree, (bool, int, float, str)) or tree is None:
            if isinstance(tree, float) and tree != tree:
                return self.global_ref(tree)
            return ast.Constant(value=tree)
        if isinstance(tree, list):
            return ast.List(elts=[self.arg_expr(t, input_names) for t in tree], ctx=ast.Load())
        if isinstance(tree, tuple) and type(tree) is tuple:
            return ast.Tuple(elts=[self.arg_expr(t, input_names) for t in tree], ctx=ast.Load())
        if isinstance(tree, slice) and _has_ref(tree):
            parts = [self.arg_expr(p, input_names) for p in (tree.start, tree.stop, tree.step)]
            return ast.Call(func=ast.Name(id="slice", ctx=ast.Load()), args=parts, keywords=[])
        if isinstance(tree, dict):
            return ast.Dict(keys=[ast.Constant(k) for k in tree],
                            values=[self.arg_expr(v, input_names) for v in tree.values()])
        return self.global_ref(tree)

    def out_target(self, tree, output_names):
        if isinstance(tree, OutputRef):
            return self.store(output_names[tree.index])
        if isinstance(tree, ReturnType):
            tree = tree.items
        if isinstance(tree, (tuple, list)):
            return ast.Tuple(elts=[self.out_target(t, output_names) for t in tree], ctx=ast.Store())
        return ast.Name(id="_", ctx=ast.Store())

    def call(self, func, args=(), kwargs=None):
        return ast.Call(func=func, args=list(args),
                        keywords=[ast.keyword(arg=k, value=v) for k, v in (kwargs or {}).items()])

    def assign(self, targets, value):
        return ast.Assign(targets=[targets], value=value, lineno=0)

    # -- statements -----------------------------------------------------------------
    def emit_call_op(self, op, opdef):
        """The statement of a call-style op: `outs = kernel(*args, **kwargs)`."""
        ins = op.input("X")
        args = [self.arg_expr(a, ins) for a in op.attrs.get("args", ())]
        kwargs = {k: self.arg_expr(v, ins) for k, v in op.attrs.get("kwargs", {}).items()}
        call = self.call(self.kernel(opdef), args, kwargs)
        out = op.attrs.get("out")
        if out is None or opdef.mutates:
            stmts = [ast.Expr(value=call)]
        else:
            stmts = [self.assign(self.out_target(out, op.output("Out")), call)]
        if op.attrs.get("no_grad"):
            no_grad = self.call(self.global_ref(torch.no_grad, "no_grad"))
            block = ast.With(items=[ast.withitem(context_expr=no_grad)], body=stmts)
            block._d2s_no_grad = True
            stmts = [block]
        for device, dtype, enabled in reversed(op.attrs.get("autocast", ())):  # runtime/run_modes.py
            mode = self.call(self.global_ref(torch.autocast, "autocast"), [ast.Constant(device)],
                             {"dtype": self.global_ref(torch_dtype(dtype), "dtype"), "enabled": ast.Constant(enabled)})
            stmts = [ast.With(items=[ast.withitem(context_expr=mode)], body=stmts)]
        if op.attrs.get("once"):
            # A loop-invariant op (runtime/passes/hoist_invariants.py): its
            # loop sets the result to None first; computed in the first trip.
            first = ast.Compare(left=self.load(op.output("Out")[0]), ops=[ast.Is()],
                                comparators=[ast.Constant(None)])
            stmts = [ast.If(test=first, body=stmts, orelse=[])]
        return stmts

    def emit_block(self, block, keep=()):
        """Statements for every op of `block`, freeing each local defined in
        this block after its last use (except the names in `keep`). Runs of
        ops a native segment can hold become one segment call (see
        `_emit_segment`)."""
        last_use = self.last_uses(block)
        keep = set(keep)

        def dead_after(i, op):
            return [n for n in dict.fromkeys(op.input_names + op.output_names)
                    if last_use.get(n) == i and n in block.vars and n not in keep
                    and not block.vars[n].persistable]

        per_op = []  # (line, statements, names freed after it)
        for i, op in enumerate(block.ops):
            per_op.append(self._op_stmts(op) + (dead_after(i, op),))
        lowered = self.lower_block(block)
        stmts = []
        for i, end in native_plan.runs(block.ops, lowered):
            if end is not None:  # even one op: the segment call costs less than the op's Python binding
                stmts += self._emit_segment(block, range(i, end), lowered, per_op, last_use, keep)
                continue
            line, op_stmts, dead = per_op[i]
            stmts += op_stmts + _free(self, dead, line)
        return _group_no_grad(stmts)

    @staticmethod
    def last_uses(block):
        """name -> the index of the last op of `block` that reads or writes it
        (inside its sub-blocks too)."""
        last_use = {}
        for i, op in enumerate(block.ops):
            for name in itertools.chain(op.input_names, op.output_names, _sub_block_names(op)):
                last_use[name] = i
        return last_use

    def _op_stmts(self, op):
        """(line, statements) of one op, every node numbered with the op's line."""
        opdef = self.get_op_def(op.type)
        line = next(self._line)
        self.line_ops[line] = op
        op_stmts = []
        if self.trace_hook is not None:
            op_stmts.append(ast.Expr(value=self.call(self.global_ref(self.trace_hook, "trace"),
                                                     [self.global_ref(op, "op")])))
        stmts = opdef.emit(op, self) if opdef.emit else self.emit_call_op(op, opdef)
        if op.type in ("while", "cond") and self.native is not None and self.trace_hook is None:
            if self._value_kinds is None:
                self._value_kinds = native_flow.value_kinds(self.program)
            stmts = native_flow.wrap(self, op, stmts, self._value_kinds)  # one C++ call where it can
        return line, _number_lines(op_stmts + stmts, line)

    # -- native segments ------------------------------------------------------------
    def lower_block(self, block):
        """For each op of `block`: its (opcode, operands) when a native segment
        can run it, else None."""
        if self.native is None or self.trace_hook is not None:
            return [None] * len(block.ops)
        return [self.lower_op(op) for op in block.ops]

    def lower_op(self, op, once=False):
        """`op` as (opcode, operands) for a segment, or None (see `lower_block`)."""
        if self._tensor_names is None:
            self._tensor_names = native_lower.tensor_names(self.program)
        opdef = self.get_op_def(op.type)
        ok = opdef.emit is None and not opdef.random and (not opdef.mutates or opdef.aten in native_lower.INPLACE)
        return native_lower.lower(op, self._tensor_names, once, self.fused_autograd) if ok else None

    def _emit_segment(self, block, indices, lowered, per_op, last_use, keep):
        """One native segment for the ops at `indices`:

            s_out = seg_1(v_x, v_w)
            if s_out is None:          # the segment leaves these ops to Python
                <the ops' own statements, with their frees>
            else:
                v_a, v_b = s_out
                del <the locals those frees would free>

        (with one result, `v_a = seg_1(...)` and `if v_a is None:`).
        """
        start, end = indices[0], indices[-1]
        plan = native_plan.plan_segment(
            self.native, [block.ops[i] for i in indices], [lowered[i] for i in indices],
            live_after=lambda n: n in keep or last_use.get(n, -1) > end or n not in block.vars
            or block.vars[n].persistable)
        python = [stmt for i in indices for stmt in per_op[i][1] + _free(self, per_op[i][2], per_op[i][0])]
        if plan is None:
            return python
        dead = [n for i in indices for n in per_op[i][2] if n in plan.inputs]  # what the Python path frees
        segment = self.native.Segment(plan.n_regs, len(plan.inputs), plan.instructions, plan.output_regs,
                                      self.fused_autograd)
        name = f"seg_{len(self.segments) + 1}"  # segments have no __name__ to build one from
        self.globals[name] = segment
        call = self.call(ast.Name(id=name, ctx=ast.Load()), [self.load(n) for n in plan.inputs])
        line = per_op[start][0]
        if len(plan.outputs) == 1:
            result = plan.outputs[0]
            stmts = [self.assign(self.store(result), call)]
            test, unpack = self.load(result), []
        else:
            stmts = [self.assign(ast.Name(id="s_out", ctx=ast.Store()), call)]
            test = ast.Name(id="s_out", ctx=ast.Load())
            unpack = [self.assign(ast.Tuple(elts=[self.store(n) for n in plan.outputs], ctx=ast.Store()),
                                  ast.Name(id="s_out", ctx=ast.Load()))]
        is_none = ast.Compare(left=test, ops=[ast.Is()], comparators=[ast.Constant(None)])
        stmts.append(ast.If(test=is_none, body=python, orelse=unpack + _free(self, dead, line) or [ast.Pass()]))
        self.segments.append(segment)
        return _number_lines(stmts, line)


def _number_lines(stmts, line):
    """Give every node of `stmts` not numbered yet the line of `line`'s op
    (statements of sub-blocks, and an op's own statements inside a segment's
    fallback, keep their own)."""
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.stmt, ast.expr)) and not hasattr(node, "_d2s_line"):
                node._d2s_line = node.lineno = node.end_lineno = line
                node.col_offset = node.end_col_offset = 0
    return stmts


def _free(gen, names, line):
    if not names:
        return []
    return [ast.Delete(targets=[ast.Name(id=gen.local(n), ctx=ast.Del()) for n in names], lineno=line)]


def _group_no_grad(stmts):
    """Consecutive `with no_grad():` statements (ops under a no_grad block
    of the user's code, with only frees between them) become one, so the
    grad mode is switched once per region instead of once per op."""
    out = []
    open_with = None  # the last `with no_grad()` emitted, while only frees followed it
    pending = []      # frees seen since
    for stmt in stmts:
        if getattr(stmt, "_d2s_no_grad", False):
            if open_with is not None:
                open_with.body += pending + stmt.body
                pending = []
                continue
            out += pending
            pending = []
            open_with = stmt
            out.append(stmt)
        elif isinstance(stmt, ast.Delete) and open_with is not None:
            pending.append(stmt)
        else:
            out += pending
            pending = []
            open_with = None
            out.append(stmt)
    return out + pending


def _has_ref(tree):
    if isinstance(tree, InputRef):
        return True
    if isinstance(tree, slice):
        return any(_has_ref(p) for p in (tree.start, tree.stop, tree.step))
    return False


def _sub_block_names(op):
    """Every variable name read or written inside `op`'s sub-blocks (and in
    the names its attributes list), so a parent block keeps them alive."""
    names = []
    for value in op.attrs.values():
        if isinstance(value, Block):
            for inner in value.ops:
                names += inner.input_names + inner.output_names + _sub_block_names(inner)
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            names += value
        elif isinstance(value, str):
            names.append(value)
    return names


def compile_program(program, feed_names, fetch_names, get_op_def, trace_hook=None, native_module=None,
                    fused_autograd=False):
    """Compile the global block of `program` into a CompiledBlock; with
    `native_module` (runtime/native's extension), runs of ops run as native
    segments, recording one autograd node per call with `fused_autograd`."""
    gen = Codegen(program, get_op_def, trace_hook, native_module, fused_autograd)
    block = program.global_block()
    # Persistables an op assigns (optimizer state made by a startup program)
    # are results to store in the scope; the others are arguments.
    written = sorted({n for b in program.blocks for op in b.ops for n in op.output_names
                      if n in block.vars and block.vars[n].persistable
                      and not get_op_def(op.type).mutates})
    params = [v.name for v in program.persistable_vars() if v.name not in written]
    body = gen.emit_block(block, keep=set(fetch_names) | set(written))
    returns = [gen.load(n) for n in list(fetch_names) + written]
    body.append(ast.Return(value=ast.Tuple(elts=returns, ctx=ast.Load()), lineno=0))
    derived = getattr(program, "derived_transposes", {})  # transpose name -> parameter name
    arg_names = [gen.local(n) for n in list(feed_names) + params + list(derived)]
    fn_def = ast.FunctionDef(
        name="program", args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=a) for a in arg_names],
                                           kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=body, decorator_list=[], returns=None, type_params=[], lineno=0)
    module = ast.Module(body=[fn_def], type_ignores=[])
    ast.fix_missing_locations(module)
    for node in ast.walk(module):
        if isinstance(node, (ast.stmt, ast.expr)):
            node.end_lineno, node.end_col_offset = node.lineno, node.col_offset
    code = compile(module, gen.filename, "exec")
    namespace = dict(gen.globals)
    # Full builtins: C code called from this frame (a lazy import inside
    # torch) looks `__import__` up in the calling frame's builtins.
    namespace["__builtins__"] = builtins
    exec(code, namespace)
    return CompiledBlock(namespace["program"], list(feed_names), params, list(fetch_names), written,
                         gen.line_ops, ast.unparse(module), list(derived.values()), gen.segments,
                         gen.flows)
