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

from ..attrs import InputRef, OutputRef
from ..effects import var_attr_names, writes_tensors
from ._util import rename_uses

_UNARY = {f"torch.{n}": f"torch.Tensor.{n}_" for n in
          "tanh sigmoid relu exp neg abs sqrt rsqrt sin cos log reciprocal".split()}
_UNARY.update({f"torch.Tensor.{n}": f"torch.Tensor.{n}_" for n in
               "tanh sigmoid relu exp neg abs sqrt rsqrt sin cos log reciprocal".split()})
_UNARY.update({"torch.Tensor.__neg__": "torch.Tensor.neg_", "torch.Tensor.__abs__": "torch.Tensor.abs_",
               "torch.nn.functional.relu": "torch.Tensor.relu_"})
# op type -> (in-place type, may the temporary be the second operand)
_BINARY = {
    "torch.Tensor.__add__": ("torch.Tensor.add_", True), "torch.add": ("torch.Tensor.add_", True),
    "torch.Tensor.__radd__": ("torch.Tensor.add_", False),
    "torch.Tensor.__mul__": ("torch.Tensor.mul_", True), "torch.mul": ("torch.Tensor.mul_", True),
    "torch.Tensor.__rmul__": ("torch.Tensor.mul_", False),
    "torch.Tensor.__sub__": ("torch.Tensor.sub_", False), "torch.sub": ("torch.Tensor.sub_", False),
    "torch.Tensor.__truediv__": ("torch.Tensor.div_", False), "torch.div": ("torch.Tensor.div_", False),
}
# Ops whose result is always a new tensor of its own.
FRESH = set(_UNARY) | set(_BINARY) | {
    "torch.nn.functional.linear", "torch.matmul", "torch.mm", "torch.addmm", "torch.Tensor.__matmul__",
    "torch.conv1d", "torch.conv2d", "torch.conv3d", "torch.nn.functional.conv1d", "torch.nn.functional.conv2d",
    "torch.nn.functional.conv3d", "torch.cat", "torch.stack", "torch.nn.functional.embedding",
    "torch.embedding", "torch.Tensor.softmax", "torch.nn.functional.max_pool2d", "torch.max_pool2d",
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
            target = _target(op, ins, block, fresh, uses) if _plain(op) else None
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
            if op.type in FRESH and _plain(op, fresh_only=True) and not op.attrs.get("once"):
                fresh[op.output_names[0]] = block.vars.get(op.output_names[0])
    if rename:
        # Chains (tmp_1 -> tmp_0, tmp_2 -> tmp_1) resolve to the first name.
        for name in rename:
            while rename[name] in rename:
                rename[name] = rename[rename[name]]
        for block in program.blocks:
            rename_uses(block, rename)
        ctx.fetch_names = [rename.get(n, n) for n in ctx.fetch_names]


def _target(op, ins, block, fresh, uses):
    """(in-place op type, its arguments) when `op` can write into a dead
    temporary among its inputs; None otherwise."""
    args = op.attrs["args"]
    out = block.vars.get(op.output_names[0])
    if op.type in _UNARY:
        candidates, new_type = [0], _UNARY[op.type]
    elif op.type in _BINARY and len(args) == 2:
        new_type, swap = _BINARY[op.type]
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
