"""Helpers the passes share: walking uses of names."""

from ..attrs import InputRef
from ..optable import get_op_def
from ..run_modes import has_mode


def all_ops(program):
    """(block, op) for every op of every block."""
    for block in program.blocks:
        for op in block.ops:
            yield block, op


def is_call(op, n_inputs=None):
    """A call-style op with a plain `out = kernel(*args)` shape."""
    return ("args" in op.attrs and not op.attrs.get("kwargs") and not has_mode(op)
            and (n_inputs is None or len(op.input("X")) == n_inputs))


def arg_inputs(op, args):
    """The input names that InputRefs at the top level of `args` point to (None for constants)."""
    ins = op.input("X")
    return [ins[a.index] if isinstance(a, InputRef) else None for a in args]


def find_var(program, name):
    """The Variable called `name` in any block of `program`, or None."""
    for block in program.blocks:
        if name in block.vars:
            return block.vars[name]
    return None


def rename_uses(block, rename):
    """Make every op of `block` (and of its sub-blocks) read `rename[n]` for each name n it reads or lists."""
    for op in block.ops:
        for slot, names in op.inputs.items():
            op.inputs[slot] = [rename.get(n, n) for n in names]
        for key in get_op_def(op.type).var_attrs:
            value = op.attrs[key]
            # A while's loop_vars name its body's own variables, never an outer one.
            if isinstance(value, str):
                op.attrs[key] = rename.get(value, value)
            elif key != "loop_vars":
                op.attrs[key] = [rename.get(v, v) for v in value]
        for sub in op.sub_blocks():
            rename_uses(sub, rename)
