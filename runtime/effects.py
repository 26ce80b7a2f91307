"""What one op of a program does besides making its outputs: the one place
every pass, pruning for saving and the translator ask it.

The facts of an op *type* are its OpDef's flags (`optable.py`: `mutates`,
`random`, `side_effect`, `new_object`, `training_only`, `var_attrs`); this
module turns them into the facts of an op *in a program*, where sub-blocks,
attributes that name variables and views sharing memory come in:

    written_in_place(op)      the name an in-place op writes (`x.add_(1)`: x), or None
    var_attr_names(op)        the variables its attributes name (a cond's true_outs,
                              a while's loop_vars), read from the op's schema
    draws(op)                 whether a run of it draws from a generator (dropout in
                              eval mode or of probability 0 does not)
    has_effects(op)           whether running it does more than compute its outputs
    is_pure(op)               droppable when unused, mergeable, runnable once for many
    writes_tensors(blocks)    whether an op of them (or of their sub-blocks) writes
                              a tensor in place
    alias_groups(program)     names that may share memory (views, ops that may
                              return their input, cond / while outputs)
    footprint(op, aliases)    names read, names written (through aliases) and
                              whether it acts on state that outlives the run

Before this module each pass spelled these out itself (dce's own purity
walk, pruning's, every `op.input("X")[0]` of a mutating op, attribute names
guessed from any string value).
"""

from . import modes
from .optable import get_op_def
from .replay import viewed

# Beyond views (replay.viewed): methods that return their tensor itself when
# it already is what they ask for (`x.to(torch.float32)` of a float32 `x`),
# and `rebind` (ops/recording.py), which always does.
_MAY_RETURN_SELF = {"to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long", "short",
                    "bool", "byte", "char", "cpu", "cuda", "requires_grad_", "rebind"}


def written_in_place(op, get=get_op_def):
    """The name `op` writes in place (the table puts the written tensor
    first among its inputs), or None for an op that writes nothing."""
    if get(op.type).mutates and op.input("X"):
        return op.input("X")[0]
    return None


def var_attr_names(op, get=get_op_def):
    """The variable names `op`'s attributes hold, in the order of the
    op type's `var_attrs` (each a name or a list of names)."""
    names = []
    for key in get(op.type).var_attrs:
        value = op.attrs.get(key)
        if isinstance(value, str):
            names.append(value)
        elif isinstance(value, (list, tuple)):
            names += value
    return names


def draws(op, get=get_op_def):
    """Whether a run of `op` draws from a generator: its type may
    (`OpDef.random`), and its arguments do not say it will not: a mode
    argument that is the constant False (dropout in eval mode) or a dropout
    probability that is the constant 0 (attention's `dropout_p=0.0`, an
    RNN's `dropout=0.0`: torch returns before drawing)."""
    if not get(op.type).random:
        return False
    return modes.mode_value(op) is not False and modes.dropout_value(op) != 0


def has_effects(op, get=get_op_def):
    """Whether running `op` does more than compute its outputs: an in-place
    write, a draw, a print or check (or an undeclared write, `side_effect`),
    a training step. Such an op is never run twice or dropped."""
    opdef = get(op.type)
    return opdef.mutates or opdef.side_effect or opdef.training_only or draws(op, get)


def is_pure(op, get=get_op_def):
    """Nothing observes `op` but its outputs: no effects, it has outputs,
    and so is every op of its sub-blocks."""
    if has_effects(op, get) or not op.output_names:
        return False
    return all(is_pure(inner, get) for sub in op.sub_blocks() for inner in sub.ops)


def writes_tensors(blocks, get=get_op_def):
    """Whether an op of `blocks` or of their sub-blocks writes a tensor in
    place (which a view of it may share; an append to a tensor array writes
    a Python list, which no view shares)."""
    stack, seen = list(blocks), set()
    while stack:
        block = stack.pop()
        if id(block) in seen:
            continue
        seen.add(id(block))
        for op in block.ops:
            if get(op.type).writes_tensor:
                return True
            stack += op.sub_blocks()
    return False


def alias_groups(program):
    """{name: the names whose memory it may share}, for the names some op
    makes a view of or may return as they are: views (replay.viewed),
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


def footprint(op, aliases, get=get_op_def):
    """(names read, names written, acts on state that outlives the run) of
    `op` with its sub-blocks and the names its attributes list (a branch may
    yield an outer variable no op of the branch reads). An in-place write
    reaches every name in its target's alias group; one into module state
    (batch norm's num_batches_tracked += 1, `self.cache[:, i] = k`) is an
    effect, wanted or not by a fetch, as a print or a check is."""
    reads = set(op.input_names) | set(var_attr_names(op, get))
    writes = set(op.output_names)
    side_effect = get(op.type).side_effect
    target = written_in_place(op, get)
    if target is not None:
        written = aliases.get(target, {target})
        writes |= written
        state = op.block.program.global_block().vars
        side_effect = side_effect or any(state[n].persistable for n in written if n in state)
    for sub in op.sub_blocks():
        for inner in sub.ops:
            r, w, s = footprint(inner, aliases, get)
            reads |= r | w
            writes |= w
            side_effect = side_effect or s
    return reads, writes, side_effect
