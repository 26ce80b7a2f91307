"""In-place reuse of temporaries nothing else can observe (calls without autograd).

An elementwise op whose input is a temporary read by nothing else writes its
result into that temporary instead of allocating a new tensor: the same
kernel on the same values, so results are bit-identical (for `a + t` and
`a * t` the temporary may be either operand: IEEE addition and
multiplication are commutative). The temporary must be

  - made earlier in the same block by an op that always returns a new
    tensor (never an input, a view or a parameter), so no other name can
    see the write;
  - read by this op only, once (not fetched, not a loop variable or branch
    output, no view of it taken);
  - of the result's dtype and shape (dimensions equal as ints or as the
    same symbol; never an unknown -1), so no broadcast or cast changes it.

Autograd may save a temporary for the backward pass (`tanh` saves its
result, `mul` its inputs), so this pass only builds the variant that runs
when grad mode is off (`torch.no_grad()`, `torch.inference_mode()`); calls
with grad mode on run the program without it. Programs with any in-place
write of their own are left alone.

Before:                                        After:
    tmp_0 = torch.nn.functional.linear(x, w, b)    tmp_0 = torch.nn.functional.linear(x, w, b)
    tmp_1 = torch.tanh(tmp_0)                      torch.Tensor.tanh_(tmp_0)
    tmp_2 = torch.Tensor.__add__(x, tmp_1)         torch.Tensor.add_(tmp_0, x)
    tmp_3 = torch.Tensor.__mul__(tmp_2, 0.5)       torch.Tensor.mul_(tmp_0, 0.5)
  (readers of tmp_1, tmp_2, tmp_3 read tmp_0)
"""

from ..aten import inplace_unary, returns_new
from ..attrs import InputRef, OutputRef
from ..effects import var_attr_names, writes_tensors
from ._util import rename_uses

# Ops are found by their canonical ATen name (`OpDef.aten`), whatever their
# spelling: `torch.tanh(t)`, `t.tanh()`, `F.tanh(t)` alike. Elementwise ops
# of one tensor take their in-place form where ATen says it writes the same
# values (runtime/aten.py `inplace_unary`); the binary ones are these:
# canonical name -> (in-place op type, may the temporary be the second operand).
_BINARY = {
    "add": ("torch.Tensor.add_", True), "mul": ("torch.Tensor.mul_", True),
    "sub": ("torch.Tensor.sub_", False), "div": ("torch.Tensor.div_", False),
}
# Keyword arguments that change nothing (`F.relu(x, inplace=False)`) and that
# the in-place call drops; `max_pool2d` returns a new tensor whatever its
# keywords say, except for `return_indices=True` (two results: not `_plain`).
_NEUTRAL_KWARGS = ({}, {"inplace": False})


def _plain(op, fresh_only=False):
    """A call with one output and no keyword argument that matters."""
    kwargs = op.attrs.get("kwargs") or {}
    return ("args" in op.attrs and (kwargs in _NEUTRAL_KWARGS or fresh_only and "max_pool" in op.type)
            and op.attrs.get("out") == OutputRef(0) and set(op.inputs) == {"X"}
            and len(op.output_names) == 1 and not op.sub_blocks())


def run(ctx):
    program = ctx.program
    if writes_tensors(program.blocks, ctx.get_op_def):
        return
    uses = {}
    for block in program.blocks:
        for op in block.ops:
            for name in op.input_names + var_attr_names(op):
                uses[name] = uses.get(name, 0) + 1
    for name in ctx.fetch_names:
        uses[name] = uses.get(name, 0) + 1
    rename = {}
    for block in program.blocks:
        fresh = {}  # temporaries of this block made by a fresh-result op
        for op in block.ops:
            ins = [rename.get(n, n) for n in op.input("X")]
            opdef = ctx.get_op_def(op.type)
            target = _target(op, opdef.aten, ins, block, fresh, uses) if _plain(op) else None
            if target is not None:
                new_type, args = target
                (out,) = op.output_names
                dead = ins[args[0].index]
                op.type = new_type
                op.attrs = {**op.attrs, "args": args, "kwargs": {}, "out": None}
                op.inputs = {"X": list(op.input("X"))}
                op.outputs = {"Out": []}
                rename[out] = dead
                uses[dead] = uses.pop(out, 0)
                continue
            # A `once` result (hoist_invariants) is reused by later trips: never written.
            if returns_new(opdef) and _plain(op, fresh_only=True) and not op.attrs.get("once"):
                fresh[op.output_names[0]] = block.vars.get(op.output_names[0])
    if rename:
        # Chains (tmp_1 -> tmp_0, tmp_2 -> tmp_1) resolve to the first name.
        for name in rename:
            while rename[name] in rename:
                rename[name] = rename[rename[name]]
        for block in program.blocks:
            rename_uses(block, rename)
        ctx.fetch_names = [rename.get(n, n) for n in ctx.fetch_names]


def _target(op, aten, ins, block, fresh, uses):
    """(in-place op type, its arguments) when `op` (calling ATen's `aten`)
    can write into a dead temporary among its inputs; None otherwise."""
    args = op.attrs["args"]
    out = block.vars.get(op.output_names[0])
    if inplace_unary(aten) and len(args) == 1:
        candidates, new_type = [0], f"torch.Tensor.{aten}_"
    elif aten in _BINARY and len(args) == 2:
        new_type, swap = _BINARY[aten]
        candidates = [0, 1] if swap else [0]
    else:
        return None
    for pos in candidates:
        ref = args[pos] if pos < len(args) else None
        if not isinstance(ref, InputRef):
            continue
        name = ins[ref.index]
        var = fresh.get(name)
        if (var is None or out is None or uses.get(name) != 1 or ins.count(name) != 1
                or var.dtype != out.dtype or var.dims != out.dims or -1 in var.dims):
            continue
        other = [a for i, a in enumerate(args) if i != pos]
        return new_type, (ref, *other)
    return None
