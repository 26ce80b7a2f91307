"""Pruning a program to what computing its fetches needs (saving an
inference model keeps only that part).

Before: the training program (forward, loss, optimizer ops, every block).
After:  the ops the fetch targets depend on, their blocks renumbered, the
        variables they mention; checks of inputs that are not fed dropped.
"""

from .effects import alias_groups, footprint
from .optable import get_op_def


def prune_program(program, feed_names, fetch_names):
    """A copy of `program` with only what computing `fetch_names` needs.

    Walks the global block backwards: an op is kept if it writes a needed
    name (in-place ops write their first input, which is also an output, and
    every name that may share its memory: `q = x.new_empty(...)` then
    `q[..., :4] = a` writes `q` through a view) or has a side effect (an
    in-place write into a persistable or a view of one), then everything it
    reads becomes needed. A control-flow
    op reads and writes everything its sub-blocks do. Training-only ops are
    always dropped; blocks only dropped ops used are removed and the rest
    renumbered. Global variables nothing kept mentions are removed.
    """
    copy = program.copy()
    block = copy.global_block()
    aliases = alias_groups(copy)
    # Checks of assumed input sizes (op extra "size_check") go with the
    # inputs they read: a check of a data variable that is not fed is dropped.
    unfed = {v.name for v in copy.data_vars() if v.name not in feed_names}
    for op in block.ops:
        reads, writes, _ = footprint(op, aliases)
        if reads & unfed:
            unfed |= writes
    trained = training_readers(block, aliases)
    needed = set(fetch_names)
    kept = []
    for op in reversed(block.ops):
        opdef = get_op_def(op.type)
        if opdef.training_only:
            continue
        reads, writes, side_effect = footprint(op, aliases)
        if id(op) in trained:  # the clip of a `.grad`: training, like the ops it follows
            if writes & needed:
                raise ValueError(f"the targets depend on {sorted(writes & needed)}, computed from gradients "
                                 "(`.grad` after loss.backward()), which a program without its training ops "
                                 "does not have")
            continue
        if side_effect and opdef.size_check and reads & unfed:
            continue
        if side_effect or writes & needed:
            kept.append(op)
            needed |= reads
    block.ops = kept[::-1]

    mentioned = set(feed_names) | set(fetch_names)
    for op in block.ops:
        reads, writes, _ = footprint(op, aliases)
        mentioned |= reads | writes
    unfed = [v.name for v in copy.data_vars() if v.name in mentioned and v.name not in feed_names]
    if unfed:
        raise ValueError(f"the targets depend on data variable(s) {unfed}, which are not in feeded_var_names")
    block.vars = {n: v for n, v in block.vars.items() if n in mentioned}
    _drop_unused_blocks(copy)
    copy.bound = {v.name: program.bound[v.name] for v in copy.persistable_vars() if v.name in program.bound}
    copy.device = program.device
    copy._changed()
    return copy


def _drop_unused_blocks(program):
    used = {0}
    stack = [program.global_block()]
    while stack:
        for op in stack.pop().ops:
            for sub in op.sub_blocks():
                if sub.idx not in used:
                    used.add(sub.idx)
                    stack.append(sub)
    blocks = [b for b in program.blocks if b.idx in used]
    new_index = {b.idx: i for i, b in enumerate(blocks)}
    for b in blocks:
        # Sub-block attributes hold Block objects, so they follow the renumbering.
        b.parent_idx = new_index[b.parent_idx] if b.parent_idx >= 0 else -1
    for i, b in enumerate(blocks):
        b.idx = i
    program.blocks = blocks


def training_readers(block, aliases=None):
    """The ops of `block` (by id) that are not training-only but read a
    value its training-only ops made earlier (`p.grad` after
    `loss.backward()`), directly or through other such ops (a clip's norm
    and its in-place scaling): a program without the training ops cannot
    run them. The parameters an optimizer op updates are not such values:
    an inference program reads them as they are."""
    aliases = alias_groups(block.program) if aliases is None else aliases
    made, readers = set(), set()
    for op in block.ops:
        if get_op_def(op.type).training_only:
            made |= {n for n in op.output_names if not getattr(block.vars.get(n), "persistable", False)}
            continue
        reads, writes, _ = footprint(op, aliases)
        if reads & made:
            readers.add(id(op))
            made |= writes
    return readers
