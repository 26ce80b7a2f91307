"""Common-subexpression elimination of pure ops.

Two call-style ops of the same type with the same arguments and inputs,
neither random, mutating nor side-effecting, compute the same value: the
second is dropped and its readers read the first one's outputs. Applied
within a block and from a block to the blocks nested in it (an op in a
branch reuses one computed before the `cond`). Tensors that some op of the
program writes in place are left alone: a later in-place write would make
two results that were equal differ, so a program with any in-place write
(other than appending to a tensor array) is left as it is, and nothing that
reads an array some op appends to (or a name assigned twice) is merged. No op making or
reading a tensor array is merged at all: each `[]` is a list of its own (`new_object`), and
an array is appended to through the loop variables that carry it, names this pass does not
follow. Ops whose results
carry gradient are left alone too: autograd would sum the gradient
contributions of the merged readers in another order than eager (a last-bit
difference in the gradient).

Before:                                  After:
    tmp_1 = torch.Tensor.sum(x)              tmp_1 = torch.Tensor.sum(x)
    tmp_2 = torch.Tensor.__gt__(tmp_1, 0)    tmp_2 = torch.Tensor.__gt__(tmp_1, 0)
  block 1 (true branch):                   block 1:
    tmp_3 = torch.Tensor.sum(x)              tmp_4 = torch.Tensor.__mul__(x, tmp_1)
    tmp_4 = torch.Tensor.__mul__(x, tmp_3)
"""

from ..attrs import encode
from ..effects import is_pure, written_in_place, writes_tensors
from ..ir import TENSOR_ARRAY
from ..run_modes import mode_key
from ._util import find_var, rename_uses


def _key(op, rename):
    try:
        args = repr(encode(op.attrs["args"])) + repr(encode(op.attrs.get("kwargs", {})))
    except Exception:  # noqa: BLE001 - an attribute with no stable text form: never merged
        return None
    return (op.type, args, repr(op.attrs.get("out")), mode_key(op),
            tuple(rename.get(n, n) for n in op.input("X")))


def _no_gradient(program, name):
    """Whether no gradient flows through `name`. A merged result that
    carries gradient gets its readers' contributions summed in one node, in
    another order than eager's separate nodes: the gradient would differ in
    the last bit, so such ops are left alone."""
    var = find_var(program, name)
    return var is not None and var.stop_gradient


def _touches_array(program, op):
    for name in op.input_names + op.output_names:
        var = find_var(program, name)
        if var is not None and var.kind == TENSOR_ARRAY:
            return True
    return False


def run(ctx):
    program = ctx.program
    # An in-place write may reach a merged value through a view: programs
    # with any (but appends to tensor arrays) are left as they are.
    if writes_tensors(program.blocks, ctx.get_op_def):
        return
    # Names whose value changes after they are made: an array an append writes
    # (`len(ys)` before and after `ys.append(v)` differ), a name assigned twice.
    written, made = set(), set()
    for block in program.blocks:
        for op in block.ops:
            if (target := written_in_place(op, ctx.get_op_def)) is not None:
                written.add(target)
            written.update(n for n in op.output_names if n in made)
            made.update(op.output_names)
    fetched = set(ctx.fetch_names)
    rename = {}

    def visit(block, seen):
        seen = dict(seen)
        kept = []
        for op in block.ops:
            for sub in op.sub_blocks():
                visit(sub, seen)
            opdef = ctx.get_op_def(op.type)
            key = None
            if ("args" in op.attrs and not op.sub_blocks() and is_pure(op, ctx.get_op_def)
                    and not opdef.factory and not opdef.new_object and op.output_names
                    and not (set(op.input_names) | set(op.output_names)) & written
                    and not set(op.output_names) & fetched and not opdef.internal
                    and all(_no_gradient(program, n) for n in op.output_names)
                    and not _touches_array(program, op)):
                key = _key(op, rename)
            if key is not None and key in seen:
                for mine, theirs in zip(op.output_names, seen[key]):
                    rename[mine] = theirs
                continue
            if key is not None:
                seen[key] = op.output_names
            kept.append(op)
        block.ops = kept

    visit(program.global_block(), {})
    if rename:
        for block in program.blocks:
            rename_uses(block, rename)
