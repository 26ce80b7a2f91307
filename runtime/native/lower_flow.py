"""Control flow run by C++ (flow.h): a `while` or `cond` op as one call.

Every trip of a `while` and every `cond` of the generated Python returns to
Python: the loop test, the rebinding of the loop variables, a segment call
per straight-line run, `if` on the break flag. When every op of the op's
blocks runs natively -- the ops segments hold (cut into runs exactly as
codegen cuts them), the `scalars` pass's Python int/bool arithmetic, the
`loop_slices` index, `array_append`, and `cond`/`while` ops of such blocks --
the op becomes one `Flow` call, and its Python statements stay as the path
for what the flow gives back:

    v_c_0 = v_tmp_1; v_ctr_0 = v_tmp_2; v_h_0 = v_tmp_0
    s_done, v_c_0, v_ctr_0, v_h_0 = flow_1(v_c_0, v_ctr_0, v_h_0, v_length_i_0, v_x_slices_0, ...)
    if not s_done:        # the flow stopped at the head of a trip (or never started)
        while True:       # the loop's own statements, from there
            ...

A `cond`: `s_done, v_out = flow_1(v_test, ...)`, and `if not s_done:` the
`if` statement. What a flow gives back and why: flow.h.

Each value of the flow has one register and a kind, the Python type it has
at run time (`value_kinds`: a tensor, a Python int or bool of the `scalars`
pass, a tensor array's list, `loop_slices`' tuple); an op whose operands are
not of the kinds it takes, or a value whose kind cannot be told, keeps the op
in Python. The kinds of the flow's inputs are checked on every call.
"""

import ast

import torch

from ..attrs import InputRef, OutputRef
from ..ir import TENSOR, TENSOR_ARRAY
from . import plan as native_plan

# Value kinds and step kinds (flow.h's V_* and S_*).
T, INT, BOOL, LIST, SEQ = 0, 1, 2, 3, 4
S_SEG, S_SCALAR, S_INDEX, S_APPEND, S_COND, S_WHILE, S_TENSOR = range(7)
SCALAR_OPS = {name: i for i, name in enumerate(
    "py.const py.add py.sub py.mul py.lt py.le py.gt py.ge py.eq py.ne py.and py.or py.not".split())}
_ARITH = {"py.add", "py.sub", "py.mul"}
_INT64 = 2 ** 63


class _NoFlow(Exception):
    """Something in the op's blocks does not run natively: the op stays Python."""


def _constant_kind(value):
    if type(value) is bool:
        return BOOL
    if type(value) is int and -_INT64 <= value < _INT64:
        return INT
    return None


def value_kinds(program):
    """name -> the kind of value it holds at run time (None: cannot tell)."""
    kinds = {}
    vars_ = {name: var for block in program.blocks for name, var in block.vars.items()}

    def kind(name):
        if name not in kinds:
            var = vars_.get(name)
            kinds[name] = None if var is None else T if var.kind == TENSOR else LIST \
                if var.kind == TENSOR_ARRAY else None
        return kinds[name]

    def visit(block):
        for op in block.ops:
            outs = op.output_names
            if op.type in SCALAR_OPS:
                kinds[outs[0]] = _scalar_result(op, kind)
            elif op.type == "scalar_from_tensor":
                dtype = getattr(vars_.get(outs[0]), "dtype_name", None)
                kinds[outs[0]] = {"int64": INT, "bool": BOOL}.get(dtype)
            elif op.type == "unbind_slices":
                kinds[outs[0]] = SEQ
            elif op.type == "while":
                _visit_while(op, kinds, kind, visit)
            elif op.type == "cond":
                visit(op.attrs["true_block"])
                visit(op.attrs["false_block"])
                for o, a, b in zip(outs, op.attrs["true_outs"], op.attrs["false_outs"]):
                    kinds[o] = kind(a) if kind(a) == kind(b) else None
            else:
                for name in outs:
                    kind(name)

    visit(program.global_block())
    for name in vars_:  # feeds, parameters: what their variables say
        kind(name)
    return kinds


def _visit_while(op, kinds, kind, visit):
    loop_vars = op.attrs["loop_vars"]
    for v, init in zip(loop_vars, op.input("Init")):
        kinds[v] = kind(init)
    visit(op.attrs["cond_block"])
    visit(op.attrs["body_block"])
    for v, new, out in zip(loop_vars, op.attrs["body_outs"], op.output("Out")):
        if kind(new) != kinds[v]:
            kinds[v] = None  # a flow reading it is refused (what the body computed from it is moot)
        kinds[out] = kinds[v]


def _scalar_result(op, kind):
    args = [kind(op.input("X")[a.index]) if isinstance(a, InputRef) else _constant_kind(a)
            for a in op.attrs["args"]]
    if None in args or any(k not in (INT, BOOL) for k in args):
        return None
    if op.type == "py.const":
        return args[0]
    if op.type in _ARITH:
        return INT
    if op.type in ("py.and", "py.or"):  # Python's `a and b` is one of its operands
        return args[0] if args[0] == args[1] else None
    return BOOL


class _Builder:
    """Registers, inputs and steps of one flow."""

    def __init__(self, gen, kinds):
        self.gen = gen
        self.kinds = kinds
        self.regs = {}       # name -> register
        self.inputs = []     # names the flow reads before defining them, in order
        self.defined = set()

    def reg(self, name):
        if name not in self.regs:
            self.regs[name] = len(self.regs)
        return self.regs[name]

    def read(self, name, *want):
        k = self.kinds.get(name)
        if k is None or want and k not in want:
            raise _NoFlow
        if name not in self.defined and name not in self.inputs:
            self.inputs.append(name)
        return self.reg(name)

    def write(self, name, kind):
        if self.kinds.get(name) != kind:
            raise _NoFlow
        self.defined.add(name)
        return self.reg(name)

    # -- blocks -------------------------------------------------------------------------
    def block(self, block, keep):
        """The steps of `block`; a register is freed after its last use in the
        block unless `keep` names it (as codegen's `emit_block` frees locals)."""
        ops = block.ops
        lowered = self.gen.lower_block(block)
        last_use = self.gen.last_uses(block)
        keep = set(keep)

        def live_after(end):
            return lambda n: n in keep or last_use.get(n, -1) >= end or n not in block.vars \
                or block.vars[n].persistable

        dying = {}  # op index -> the block's own names last used there
        for n, last in last_use.items():
            if n in block.vars and n not in keep and not block.vars[n].persistable:
                dying.setdefault(last, []).append(n)

        def dead(lo, hi):
            return [self.regs[n] for k in range(lo, hi) for n in dying.get(k, ()) if n in self.regs]

        steps = []
        for i, end in native_plan.runs(ops, lowered):
            if end is None and ops[i].attrs.get("once"):
                # A hoisted invariant (fast level): alone, run while its register is unset.
                step, end = self.segment([ops[i]], [self.gen.lower_op(ops[i], once=True)], live_after(i + 1),
                                         once=True), i + 1
            elif end is None:
                step, end = self.op_step(ops[i]), i + 1
            else:
                step = self.segment(ops[i:end], lowered[i:end], live_after(end))
            steps.append(step + (dead(i, end),))
        return steps

    def segment(self, ops, lowered, live_after, once=False):
        gen = self.gen
        if None in lowered:
            raise _NoFlow
        plan = native_plan.plan_segment(gen.native, ops, lowered, live_after)
        if plan is None or once and len(plan.outputs) != 1:
            raise _NoFlow  # ops whose results nobody reads: the Python path runs them (dce left them)
        ins = [self.read(n, T) for n in plan.inputs]
        segment = gen.native.Segment(plan.n_regs, len(plan.inputs), plan.instructions, plan.output_regs,
                                     gen.fused_autograd)
        return S_SEG, segment, ins, [self.write(n, T) for n in plan.outputs], once

    def op_step(self, op):
        if op.type in SCALAR_OPS:
            args = [(self.read(op.input("X")[a.index], INT, BOOL), None) if isinstance(a, InputRef)
                    else (None, a) for a in op.attrs["args"]]
            if any(r is None and _constant_kind(c) is None for r, c in args):
                raise _NoFlow
            out = op.output("Out")[0]
            return S_SCALAR, SCALAR_OPS[op.type], args, self.write(out, self.kinds.get(out))
        if op.type in ("py.index", "array_append"):
            if tuple(op.attrs.get("args", ())) != (InputRef(0), InputRef(1)) or op.attrs.get("kwargs") \
                    or op.attrs.get("out") != OutputRef(0):
                raise _NoFlow
            seq, item = op.input("X")
            if op.type == "py.index":
                return S_INDEX, [self.read(seq, SEQ), self.read(item, INT, BOOL)], self.write(op.output("Out")[0], T)
            return S_APPEND, [self.read(seq, LIST), self.read(item, T)], self.write(op.output("Out")[0], LIST)
        if op.type == "fill_constant":  # a Python int/bool made a 0-d tensor where a torch op needs one
            args = op.attrs.get("args", ())
            if len(args) != 2 or args[0] != InputRef(0) or op.attrs.get("kwargs") or op.attrs.get("out") != OutputRef(0):
                raise _NoFlow
            source = op.input("X")[0]
            want = {torch.int64: INT, torch.bool: BOOL}.get(args[1])
            if want is None:
                raise _NoFlow
            return S_TENSOR, [self.read(source, want)], self.write(op.output("Out")[0], T)
        if op.type == "cond":
            return self.cond(op)
        if op.type == "while":
            return self.loop(op)
        raise _NoFlow

    def cond(self, op):
        test = self.read(op.input("Cond")[0], T, INT, BOOL)
        steps = []
        srcs = []
        for block, outs in ((op.attrs["true_block"], op.attrs["true_outs"]),
                            (op.attrs["false_block"], op.attrs["false_outs"])):
            steps.append(self.block(block, outs))
            srcs.append([self.read(n) for n in outs])
        outs = [self.write(o, self.kinds.get(o)) for o in op.output("Out")]
        return S_COND, test, steps[0], steps[1], srcs[0], srcs[1], outs

    def loop(self, op):
        if _once_names(op.attrs["body_block"], nested=True):
            raise _NoFlow  # hoisted invariants of a nested loop are reset each time it starts: Python's
        loop_vars = op.attrs["loop_vars"]
        inits = [self.read(n, self.kinds.get(v)) for n, v in zip(op.input("Init"), loop_vars)]
        regs = [self.write(v, self.kinds.get(v)) for v in loop_vars]
        test_steps, test, body, srcs = self.trips(op)
        outs = [self.write(o, self.kinds.get(v)) for o, v in zip(op.output("Out"), loop_vars)]
        return S_WHILE, inits, regs, test_steps, test, body, srcs, outs

    def trips(self, op):
        """The steps of a loop's test block and body, the test's register and
        the body's values of the loop variables."""
        loop_vars = op.attrs["loop_vars"]
        test_steps = self.block(op.attrs["cond_block"], [op.attrs["cond_out"]])
        test = self.read(op.attrs["cond_out"], T, INT, BOOL)
        once = _once_names(op.attrs["body_block"])  # kept across trips, as `_emit_while` keeps them
        body = self.block(op.attrs["body_block"], set(op.attrs["body_outs"]) | set(loop_vars) | set(once))
        srcs = [self.read(n, self.kinds.get(v)) for n, v in zip(op.attrs["body_outs"], loop_vars)]
        return test_steps, test, body, srcs

    def flow(self, root, outputs):
        return self.gen.native.Flow(len(self.regs), [self.regs[n] for n in self.inputs],
                                    [self.kinds[n] for n in self.inputs], root, outputs, self.gen.fused_autograd)


def build(gen, op, kinds):
    """(Flow, input names, output names) running `op` (a `while` or `cond`), or None."""
    b = _Builder(gen, kinds)
    try:
        if op.type == "cond":
            root = b.cond(op) + ([],)
            return b.flow(root, root[-2]), b.inputs, op.output("Out")
        loop_vars = op.attrs["loop_vars"]
        # The loop variables are the flow's first inputs (the Python code has
        # bound them to the initial values) and its outputs.
        regs = [b.read(v) for v in loop_vars]
        b.defined.update(loop_vars)
        test_steps, test, body, srcs = b.trips(op)
        root = (S_WHILE, regs, regs, test_steps, test, body, srcs, regs, [])
        return b.flow(root, regs), b.inputs, loop_vars
    except (_NoFlow, ValueError, TypeError, OverflowError):
        # (The extension refusing a description is a layout mistake of ours:
        # it costs speed, the Python statements run, never a wrong value.)
        return None


def _once_names(block, nested=False):
    """The results of `block`'s hoisted invariants (its own ops; with
    `nested`, in its sub-blocks too)."""
    names = [n for op in block.ops if op.attrs.get("once") for n in op.output("Out")]
    if nested:
        names += [n for op in block.ops for sub in op.sub_blocks() for n in _once_names(sub, True)]
    return names


def wrap(gen, op, stmts, kinds):
    """`stmts` (the op's Python statements) behind a flow call, when the op
    runs natively; else `stmts` as they are."""
    built = build(gen, op, kinds)
    if built is None:
        return stmts
    flow, inputs, outputs = built
    name = f"flow_{len(gen.flows) + 1}"
    gen.globals[name] = flow
    gen.flows.append(flow)
    done = ast.Name(id="s_done", ctx=ast.Load())
    call = gen.assign(ast.Tuple(elts=[ast.Name(id="s_done", ctx=ast.Store())] + [gen.store(n) for n in outputs],
                                ctx=ast.Store()),
                      gen.call(ast.Name(id=name, ctx=ast.Load()), [gen.load(n) for n in inputs]))
    at = next(i for i, s in enumerate(stmts) if isinstance(s, (ast.While if op.type == "while" else ast.If)))
    guarded = ast.If(test=ast.UnaryOp(op=ast.Not(), operand=done), body=[stmts[at]], orelse=[])
    return stmts[:at] + [call, guarded] + stmts[at + 1:]
