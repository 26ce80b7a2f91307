"""Pruning a program to what computing its fetches needs (saving an
inference model keeps only that part).

Before: the training program (forward, loss, optimizer ops, every block).
After:  the ops the fetch targets depend on, their blocks renumbered, the
        variables they mention; checks of inputs that are not fed dropped.
"""

from .optable import get_op_def
from .replay import viewed

# Beyond views (replay.viewed): methods that return their tensor itself when
# it already is what they ask for (`x.to(torch.float32)` of a float32 `x`).
_MAY_RETURN_SELF = {"to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long", "short",
                    "bool", "byte", "char", "cpu", "cuda", "requires_grad_"}


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
    aliases = _alias_groups(copy)
    # Checks of assumed input sizes (op extra "size_check") go with the
    # inputs they read: a check of a data variable that is not fed is dropped.
    unfed = {v.name for v in copy.data_vars() if v.name not in feed_names}
    for op in block.ops:
        reads, writes, _ = _effects(op, get_op_def, aliases)
        if reads & unfed:
            unfed |= writes
    needed = set(fetch_names)
    kept = []
    for op in reversed(block.ops):
        opdef = get_op_def(op.type)
        if opdef.training_only:
            continue
        reads, writes, side_effect = _effects(op, get_op_def, aliases)
        if side_effect and opdef.size_check and reads & unfed:
            continue
        if side_effect or writes & needed:
            kept.append(op)
            needed |= reads
    block.ops = kept[::-1]

    mentioned = set(feed_names) | set(fetch_names)
    for op in block.ops:
        reads, writes, _ = _effects(op, get_op_def, aliases)
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


def _alias_groups(program):
    """{name: the names whose memory it may share}, for the names some op
    makes a view of, or may return as they are: views (replay.viewed),
    `_MAY_RETURN_SELF`, and `cond` / `while` outputs (a branch or a loop of
    no trips may yield an input itself)."""
    parent = {}

    def find(n):
        while parent.setdefault(n, n) != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for block in program.blocks:
        for op in block.ops:
            if op.type in ("cond", "while"):
                names = [*op.input("X"), *op.input("Init"), *op.output_names]
            elif viewed(op) is not None or (op.type.rsplit(".", 1)[-1] in _MAY_RETURN_SELF and op.input("X")):
                names = [op.input("X")[0], *op.output_names]
            else:
                continue
            for a, b in zip(names, names[1:]):
                parent[find(a)] = find(b)
    groups = {}
    for n in parent:
        groups.setdefault(find(n), set()).add(n)
    return {n: groups[find(n)] for n in parent}


def _effects(op, get_op_def, aliases):
    """(names read, names written, has a side effect) of `op`, including
    its sub-blocks and the names its attributes list (a branch may yield an
    outer variable no op of the branch reads)."""
    reads = set(op.input_names)
    writes = set(op.output_names)
    opdef = get_op_def(op.type)
    side_effect = opdef.side_effect
    if opdef.mutates and op.input("X"):
        # An in-place write reaches every tensor that may share the target's
        # memory; one into module state (batch norm's num_batches_tracked
        # += 1, `self.cache[:, i] = k`) is an effect that outlives the run,
        # wanted or not by a fetch.
        target = op.input("X")[0]
        written = aliases.get(target, {target})
        writes |= written
        state = op.block.program.global_block().vars
        side_effect = side_effect or any(state[n].persistable for n in written if n in state)
    for value in op.attrs.values():
        if isinstance(value, str):
            reads.add(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            reads.update(value)
    for sub in op.sub_blocks():
        for inner in sub.ops:
            r, w, s = _effects(inner, get_op_def, aliases)
            reads |= r | w
            writes |= w
            side_effect = side_effect or s
    return reads, writes, side_effect


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
