"""CPU integer and bool scalars as Python values.

Loop counters, lengths and break flags are 0-d int64/bool tensors in a
traced program; every `ctr + 1`, `ctr < n`, `not broke` is then a torch op
(argument parsing, dispatch, an allocation). On CPU they hold exactly what a
Python int/bool holds, so this pass runs them as Python values:

  - sources: `fill_constant` of a Python int (int64) or bool (bool), and
    int64 0-d feeds that such arithmetic reads (converted once, on entry);
  - `+ - *` and comparisons of scalars and Python int constants, and
    `logical_and/or/not` and `& |` of bool scalars, become Python expressions;
  - a `while` loop variable is a scalar when its initial value and its
    update are; a `cond` output when both branches yield scalars;
  - a scalar read by anything else (a torch op, a fetch, a loop variable or
    branch output that stays a tensor) is turned back into the 0-d tensor it
    was, `fill_constant(v, dtype)`, right before that use; a scalar index of
    `Tensor.__getitem__` and of `array_read` stays an int (same result).

A value an in-place op may write (`y = n * 1; while y.add_(1) < 5:`), directly
or through a view made of it, stays a tensor: a Python int would not change.

int64 overflow (past 2**63) is the one difference from the tensor
arithmetic, and counters never get there; a `check_int64` of a value that
became a Python int is dropped (the value is exact, as eager's).

On another device (a CUDA program) only values that start from
`fill_constant` become Python values: those are CPU tensors there too, and
turned back into the same CPU tensors wherever a torch op reads them. Feeds
stay tensors: one on the GPU would make `i < n` a CUDA bool, which a Python
bool turned back into a tensor would not be.

Before:                                          After:
    tmp_2 = fill_constant(0, torch.int64)            length_i = scalar_from_tensor(length)
    Out=[..] = while(Init=[.., tmp_2], ..)           tmp_2 = py.const(0)
  block 1:                                           Out=[..] = while(Init=[.., tmp_2], ..)
    tmp_6 = torch.Tensor.__add__(ctr_0, 1)         block 1:
    tmp_7 = torch.Tensor.__getitem__(x, (:, ctr_0))  tmp_6 = py.add(ctr_0, 1)
  block 2:                                           tmp_7 = torch.Tensor.__getitem__(x, (:, ctr_0))
    tmp_5 = torch.Tensor.__lt__(ctr_0, length)     block 2:
                                                     tmp_5 = py.lt(ctr_0, length_i)
generated:  v_tmp_6 = v_ctr_0 + 1;  v_tmp_5 = v_ctr_0 < v_length_i
"""

import ast
import operator

import torch

from ..attrs import InputRef, OutputRef
from ..effects import written_in_place
from ..ir import Operator
from ..optable import OpDef, is_internal, register
from ._util import find_var, is_call

_BINARY = {  # op type -> (py op type, ast operator, reversed operands)
    "torch.Tensor.__add__": ("py.add", ast.Add, False),
    "torch.Tensor.__radd__": ("py.add", ast.Add, True),
    "torch.Tensor.__sub__": ("py.sub", ast.Sub, False),
    "torch.Tensor.__rsub__": ("py.sub", ast.Sub, True),
    "torch.Tensor.__mul__": ("py.mul", ast.Mult, False),
    "torch.Tensor.__rmul__": ("py.mul", ast.Mult, True),
}
_COMPARE = {
    "torch.Tensor.__lt__": ("py.lt", ast.Lt), "torch.Tensor.__le__": ("py.le", ast.LtE),
    "torch.Tensor.__gt__": ("py.gt", ast.Gt), "torch.Tensor.__ge__": ("py.ge", ast.GtE),
    "torch.Tensor.__eq__": ("py.eq", ast.Eq), "torch.Tensor.__ne__": ("py.ne", ast.NotEq),
}
# (`&` / `|` of two bools is what the translator writes for the truth of `a and b`, `a or b`.)
_LOGICAL = {"torch.logical_and": ("py.and", ast.And), "torch.logical_or": ("py.or", ast.Or),
            "torch.Tensor.__and__": ("py.and", ast.And), "torch.Tensor.__or__": ("py.or", ast.Or)}
_INT, _BOOL = "int64", "bool"


# -- the Python-value ops (emitted as plain expressions) -----------------------------------

def _emit_expr(make):
    def emit(op, gen):
        ins = op.input("X")
        args = [gen.arg_expr(a, ins) for a in op.attrs["args"]]
        return [gen.assign(gen.store(op.output("Out")[0]), make(*args))]
    return emit


def _register_py_ops():
    if is_internal("py.const"):
        return
    pyops = [OpDef("py.const", kernel=lambda v: v, emit=_emit_expr(lambda v: v)),
             OpDef("py.not", kernel=operator.not_,
                   emit=_emit_expr(lambda a: ast.UnaryOp(op=ast.Not(), operand=a))),
             OpDef("scalar_from_tensor", kernel=lambda t: t.item(),
                   emit=_emit_expr(lambda t: ast.Call(func=ast.Attribute(value=t, attr="item", ctx=ast.Load()),
                                                      args=[], keywords=[])))]
    for name, kind in {v[0]: v[1] for v in _BINARY.values()}.items():
        pyops.append(OpDef(name, kernel=getattr(operator, name[3:]),
                           emit=_emit_expr(lambda a, b, k=kind: ast.BinOp(left=a, op=k(), right=b))))
    for name, kind in _COMPARE.values():
        pyops.append(OpDef(name, kernel=getattr(operator, name[3:]),
                           emit=_emit_expr(lambda a, b, k=kind: ast.Compare(left=a, ops=[k()], comparators=[b]))))
    for name, kind in dict(_LOGICAL.values()).items():
        pyops.append(OpDef(name, kernel=None,
                           emit=_emit_expr(lambda a, b, k=kind: ast.BoolOp(op=k(), values=[a, b]))))
    for opdef in pyops:
        opdef.internal = True  # made by passes, never traced or saved
        register(opdef)


_register_py_ops()


# -- analysis ----------------------------------------------------------------------------------

class _Analysis:
    def __init__(self, program, loop_vars, written, feeds=True):
        self.program = program
        self.feeds = feeds            # int64 0-d feeds may be read as Python ints (CPU programs)
        self.loop_vars = loop_vars    # loop variables assumed scalar
        self.written = written        # names an in-place op may write: they stay tensors
        self.scalar = {}              # var name -> "int64" | "bool"
        self.rewrite = {}             # id(op) -> (py op type, args)
        self.feeds_read = set()       # int64 feeds a scalar op reads

    def kind(self, name):
        return self.scalar.get(name)

    def var(self, name):
        for block in self.program.blocks:
            if name in block.vars:
                return block.vars[name]
        return None

    def operand(self, op, arg, want):
        """The kind of one argument if it can take part in scalar arithmetic of `want`."""
        if isinstance(arg, InputRef):
            name = op.input("X")[arg.index]
            if self.kind(name) == want:
                return name
            var = self.var(name)
            if (want == _INT and self.feeds and name not in self.written and var is not None and var.is_data
                    and var.dtype_name == _INT and var.shape == ()):
                return name  # a length fed by the caller: converted once on entry
            return None
        if want == _INT and type(arg) is int:
            return arg
        if want == _BOOL and type(arg) is bool:
            return arg
        return None

    def visit_block(self, block):
        for op in block.ops:
            self.visit_op(op)

    def visit_op(self, op):
        out = op.output("Out")
        if op.type == "while":
            for lv, init in zip(op.attrs["loop_vars"], op.input("Init")):
                if lv in self.loop_vars:
                    self.scalar[lv] = self.loop_vars[lv]
            self.visit_block(op.attrs["cond_block"])
            self.visit_block(op.attrs["body_block"])
            for lv, o in zip(op.attrs["loop_vars"], out):
                if lv in self.loop_vars:
                    self.scalar[o] = self.loop_vars[lv]
            return
        if op.type == "cond":
            self.visit_block(op.attrs["true_block"])
            self.visit_block(op.attrs["false_block"])
            for o, t, f in zip(out, op.attrs["true_outs"], op.attrs["false_outs"]):
                if self.kind(t) is not None and self.kind(t) == self.kind(f):
                    self.scalar[o] = self.kind(t)
            return
        if not is_call(op) or len(out) != 1 or op.attrs.get("out") != OutputRef(0):
            return
        var = self.var(out[0])
        if var is None or var.shape != ():
            return
        args = op.attrs["args"]
        if op.type == "fill_constant" and len(args) == 2 and not op.input("X"):
            value, dtype = args
            if dtype == torch.int64 and type(value) is int and var.dtype_name == _INT:
                self._set(op, out[0], _INT, "py.const", (value,))
            elif dtype == torch.bool and type(value) is bool and var.dtype_name == _BOOL:
                self._set(op, out[0], _BOOL, "py.const", (value,))
            return
        if len(args) != 2 and op.type != "torch.logical_not":
            return
        if op.type in _BINARY and var.dtype_name == _INT:
            py, _, swap = _BINARY[op.type]
            self._binary(op, out[0], _INT, _INT, py, args, swap)
        elif op.type in _COMPARE and var.dtype_name == _BOOL:
            self._binary(op, out[0], _INT, _BOOL, _COMPARE[op.type][0], args, False)
        elif op.type in _LOGICAL and var.dtype_name == _BOOL:
            self._binary(op, out[0], _BOOL, _BOOL, _LOGICAL[op.type][0], args, False)
        elif op.type == "torch.logical_not" and len(args) == 1 and var.dtype_name == _BOOL:
            a = self.operand(op, args[0], _BOOL)
            if isinstance(args[0], InputRef) and a is not None:
                self._set(op, out[0], _BOOL, "py.not", (a,))

    def _binary(self, op, out, want, result, py, args, swap):
        a, b = (self.operand(op, x, want) for x in args)
        # At least one operand must be a scalar variable (two constants never reach here).
        if a is None or b is None or not any(isinstance(x, InputRef) for x in args):
            return
        for x, name in zip(args, (a, b)):
            if isinstance(x, InputRef) and self.kind(name) is None:
                self.feeds_read.add(name)
        self._set(op, out, result, py, (b, a) if swap else (a, b))

    def _set(self, op, out, kind, py, operands):
        if out in self.written:
            return
        self.scalar[out] = kind
        self.rewrite[id(op)] = (py, operands)


def _written_in_place(program, get_op_def):
    """Names whose memory an in-place op may write: the first input of each
    mutating op and, since an op's result may be a view of its inputs, every
    input of an op making such a name (loop and branch values: the names a
    `while`/`cond` joins), to a fixed point."""
    ops = [op for block in program.blocks for op in block.ops]
    written = {written_in_place(op) for op in ops if get_op_def(op.type).writes_tensor} - {None}
    if not written:
        return written
    groups = []  # names that share memory or a value through an op
    for op in ops:
        if op.type == "while":
            groups += [set(g) for g in zip(op.attrs["loop_vars"], op.input("Init"), op.attrs["body_outs"],
                                           op.output("Out"))]
        elif op.type == "cond":
            groups += [set(g) for g in zip(op.output("Out"), op.attrs["true_outs"], op.attrs["false_outs"])]
        elif op.output_names:
            groups.append((set(op.output_names), set(op.input_names)))
    size = None
    while size != len(written):
        size = len(written)
        for group in groups:
            if isinstance(group, tuple):
                outs, ins = group
                if outs & written:
                    written |= ins
            elif group & written:
                written |= group
    return written


def _analyse(program, get_op_def, feeds=True):
    """Find the scalar variables, assuming loop variables scalar and
    retracting those whose initial value or update turns out not to be."""
    written = _written_in_place(program, get_op_def)
    candidates = {}
    for block in program.blocks:
        for op in block.ops:
            if op.type == "while":
                for lv in op.attrs["loop_vars"]:
                    var = find_var(program, lv)
                    if (var is not None and var.shape == () and var.dtype_name in (_INT, _BOOL)
                            and lv not in written):
                        candidates[lv] = var.dtype_name
    while True:
        analysis = _Analysis(program, dict(candidates), written, feeds)
        analysis.visit_block(program.global_block())
        bad = set()
        for block in program.blocks:
            for op in block.ops:
                if op.type not in ("while", "cond") and id(op) not in analysis.rewrite:
                    # Written by a tensor op (`count += t` is `__iadd__` writing the
                    # loop variable in place): a Python int there would not change.
                    bad.update(n for n in op.output("Out") if n in candidates)
                if op.type == "while":
                    for lv, init, upd in zip(op.attrs["loop_vars"], op.input("Init"), op.attrs["body_outs"]):
                        if lv in candidates and (analysis.kind(init) != candidates[lv]
                                                 or analysis.kind(upd) != candidates[lv]):
                            bad.add(lv)
        if not bad:
            return analysis
        for lv in bad:
            del candidates[lv]


# -- rewriting -----------------------------------------------------------------------------------

def _index_positions(op, get_op_def):
    """Input positions where a scalar may stay a Python int (an index)."""
    if get_op_def(op.type).takes_python_ints:
        return set(range(len(op.input("X"))))
    if op.type == "torch.Tensor.__getitem__" and len(op.attrs["args"]) == 2:
        return {r.index for r in _refs(op.attrs["args"][1])} - {r.index for r in _refs(op.attrs["args"][0])}
    if op.type == "array_read":
        return {1}
    args = op.attrs.get("args", ())
    if op.type == "torch.select" and len(args) == 3 and isinstance(args[2], InputRef) and args[0] != args[2]:
        return {args[2].index}  # `for row in x`: x.select(0, ctr) takes the int as well
    return set()


def _refs(tree):
    if isinstance(tree, InputRef):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for t in tree:
            yield from _refs(t)
    elif isinstance(tree, slice):
        for t in (tree.start, tree.stop, tree.step):
            yield from _refs(t)


def run(ctx):
    program = ctx.program
    on_cpu = program.device is None or program.device.type == "cpu"
    analysis = _analyse(program, ctx.get_op_def, feeds=on_cpu)
    if not analysis.rewrite:
        return
    kinds = analysis.scalar
    dtypes = {_INT: torch.int64, _BOOL: torch.bool}
    def fresh(block, like, suffix):
        name = program.unique_name(f"{like}_{suffix}")
        src = find_var(program, like)
        block.create_var(name=name, shape=(), dtype=src.dtype if src is not None else "int64",
                         stop_gradient=True)
        return name

    # Feeds read by scalar arithmetic: one conversion on entry.
    entry_ops, feed_scalar = [], {}
    gblock = program.global_block()
    for name in sorted(analysis.feeds_read):
        feed_scalar[name] = fresh(gblock, name, "i")
        entry_ops.append(Operator(gblock, "scalar_from_tensor", {"X": [name]}, {"Out": [feed_scalar[name]]},
                                  {"args": (InputRef(0),), "kwargs": {}, "out": OutputRef(0)}))
    scalar_names = set(kinds) | set(feed_scalar.values())

    def to_tensor(block, name):
        out = fresh(block, name, "t")
        return out, Operator(block, "fill_constant", {"X": [name]}, {"Out": [out]},
                             {"args": (InputRef(0), dtypes[kinds[name]]), "kwargs": {}, "out": OutputRef(0)})

    def rewrite_block(block, yields=()):
        """Rewrite `block`'s ops; `yields` are names the block hands back that
        must be tensors (materialised at its end)."""
        new_ops = []
        for op in block.ops:
            rule = analysis.rewrite.get(id(op))
            if rule is not None:
                py, operands = rule
                names = [feed_scalar.get(o, o) for o in operands if isinstance(o, str)]
                it = iter(range(len(names)))
                args = tuple(InputRef(next(it)) if isinstance(o, str) else o for o in operands)
                new_ops.append(Operator(block, py, {"X": names}, {"Out": op.output("Out")},
                                        {"args": args, "kwargs": {}, "out": OutputRef(0)}, op.origin))
                continue
            if op.type == "check_int64" and op.input("X")[0] in scalar_names:
                continue  # a Python int now: exact, as eager's (ops/framework.py check_int64)
            keep_scalar = _index_positions(op, ctx.get_op_def)
            if op.type == "while":
                lvs = op.attrs["loop_vars"]
                keep_scalar = {i for i, lv in enumerate(lvs) if lv in kinds}  # Init positions
                body_yields = [o for lv, o in zip(lvs, op.attrs["body_outs"]) if lv not in kinds]
                rewrite_block(op.attrs["cond_block"])  # `bool(cond_out)` takes a Python bool too
                rewrite_block(op.attrs["body_block"], body_yields)
                _materialise_slot(op, "Init", keep_scalar, scalar_names, block, to_tensor, new_ops)
            elif op.type == "cond":
                outs = op.output("Out")
                rewrite_block(op.attrs["true_block"],
                              [t for o, t in zip(outs, op.attrs["true_outs"]) if o not in kinds])
                rewrite_block(op.attrs["false_block"],
                              [f for o, f in zip(outs, op.attrs["false_outs"]) if o not in kinds])
                # The condition may be a Python bool or int: `bool()` of it is the same.
            elif op.sub_blocks():
                # Another op with a block (`checkpoint`): its block's ops read
                # the scalars themselves (turned back into tensors there), and
                # what it hands back is a tensor.
                for key in ctx.get_op_def(op.type).var_attrs:
                    rewrite_block(_block_of(op, key), op.attrs[key])
            else:
                _materialise_slot(op, None, keep_scalar, scalar_names, block, to_tensor, new_ops)
            new_ops.append(op)
        block.ops = new_ops
        return _materialise_yields(block, yields, scalar_names, to_tensor, program)

    renames = rewrite_block(gblock, ctx.fetch_names) or {}
    ctx.fetch_names = [renames.get(n, n) for n in ctx.fetch_names]
    gblock.ops[:0] = entry_ops


def _materialise_slot(op, slot, keep, scalar_names, block, to_tensor, new_ops):
    """Turn the scalars `op` reads in `slot` (every slot when `slot` is None)
    back into tensors, except at the positions in `keep`."""
    for name_of_slot in ([slot] if slot else list(op.inputs)):
        names = list(op.input(name_of_slot))
        for i, name in enumerate(names):
            if name in scalar_names and (i not in keep or name_of_slot not in ("X", "Init")):
                tensor_name, conv = to_tensor(block, name)
                new_ops.append(conv)
                names[i] = tensor_name
        if names != op.input(name_of_slot):
            op.inputs[name_of_slot] = names


def _materialise_yields(block, yields, scalar_names, to_tensor, program):
    """Names a block hands back as tensors (fetches, non-scalar loop updates,
    branch outputs) that are scalars here: convert them at the block's end
    and hand back the tensor instead."""
    renames = {}
    for name in yields:
        if name in scalar_names and name not in renames:
            tensor_name, conv = to_tensor(block, name)
            block.ops.append(conv)
            renames[name] = tensor_name
    if not renames:
        return None
    owner = _owner(program, block)
    if owner is None:  # the global block: the names fetched
        return renames
    for key in ("body_outs", "true_outs", "false_outs", "outs"):
        if owner.attrs.get(key) is not None and _block_of(owner, key) is block:
            owner.attrs[key] = [renames.get(n, n) for n in owner.attrs[key]]
    return None


def _block_of(op, key):
    """The block whose values `op`'s attribute `key` names (an op with one
    block, `checkpoint`: that block)."""
    blocks = {"body_outs": op.attrs.get("body_block"), "true_outs": op.attrs.get("true_block"),
              "false_outs": op.attrs.get("false_block")}
    return blocks[key] if key in blocks else op.sub_blocks()[0]


def _owner(program, block):
    for b in program.blocks:
        for op in b.ops:
            if any(sub is block for sub in op.sub_blocks()):
                return op
    return None
