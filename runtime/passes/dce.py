"""Dead-code elimination: drop ops whose results nothing observes.

An op is dropped when it is pure (it does not write an input, draw random
numbers, print or check, or update a persistable) and none of its outputs is
read by any op, named by a control-flow op's attributes, or fetched. A `cond`
or `while` is pure when every op of its sub-blocks is. Repeated until
nothing changes.

Before:                                After:
    tmp_0 = torch.tanh(x)                  tmp_1 = torch.relu(x)
    tmp_1 = torch.relu(x)
    fetch: tmp_1
"""

from ..effects import is_pure, var_attr_names
from ._util import all_ops


def run(ctx):
    program = ctx.program
    persistable = {v.name for v in program.persistable_vars()}
    changed = True
    while changed:
        used = set(ctx.fetch_names)
        for _, op in all_ops(program):
            used.update(op.input_names)
            used.update(var_attr_names(op, ctx.get_op_def))
        changed = False
        for block in program.blocks:
            kept = [op for op in block.ops
                    if any(n in used or n in persistable for n in op.output_names) or not is_pure(op, ctx.get_op_def)]
            if len(kept) != len(block.ops):
                block.ops = kept
                changed = True
