"""Hoist constants out of the per-call path.

A `fill_constant` allocates a 0-d tensor on every call. When every op that
reads it makes a fresh result from it (arithmetic and comparisons and the
other ops of runtime/aten.py's `returns_new`, which never return or alias an
input, and never write it), one tensor made at
compile time serves every call: the op is removed and its readers get the
tensor itself as a constant argument (a global of the generated code).

Before:                                       After:
    tmp_3 = fill_constant(0.5, torch.float32)     tmp_4 = torch.Tensor.__mul__(x, <tensor 0.5>)
    tmp_4 = torch.Tensor.__mul__(x, tmp_3)
"""

from ..aten import returns_new
from ..attrs import InputRef
from ..effects import var_attr_names
from ._util import all_ops, arg_inputs, is_call


def _substitute(tree, index, value):
    if isinstance(tree, InputRef):
        return value if tree.index == index else InputRef(tree.index - (tree.index > index))
    if isinstance(tree, tuple) and type(tree) is tuple:
        return tuple(_substitute(t, index, value) for t in tree)
    if isinstance(tree, list):
        return [_substitute(t, index, value) for t in tree]
    if isinstance(tree, dict):
        return {k: _substitute(v, index, value) for k, v in tree.items()}
    return tree


def run(ctx):
    program = ctx.program
    readers, passing = {}, {}
    for _, op in all_ops(program):
        # A cond/while lists in X the outer names its sub-blocks read: those
        # sub-block ops are the real readers (not of a name the op's own
        # `args` pass on: a `checkpoint` hands its block those itself).
        through = set(op.input("X")) - set(arg_inputs(op, op.attrs.get("args", ()))) if op.sub_blocks() else set()
        for name in set(op.input_names) | set(var_attr_names(op)):
            if name in through and name not in var_attr_names(op) and op.input_names.count(name) == 1:
                passing.setdefault(name, []).append(op)
            else:
                readers.setdefault(name, []).append(op)
    for block in program.blocks:
        for op in list(block.ops):
            if op.type != "fill_constant" or op.input_names or not is_call(op):
                continue
            (name,) = op.output("Out")
            users = readers.get(name, [])
            if (name in ctx.fetch_names or not users
                    or not all(returns_new(ctx.get_op_def(u.type)) and is_call(u) and u.input("X").count(name) == 1
                               and set(u.inputs) == {"X"} for u in users)):
                continue
            value = ctx.get_op_def("fill_constant").kernel(*op.attrs["args"])
            for user in users:
                index = user.input("X").index(name)
                user.attrs["args"] = _substitute(user.attrs["args"], index, value)
                user.inputs["X"] = [n for n in user.input("X") if n != name]
            for owner in passing.get(name, []):
                owner.inputs["X"] = [n for n in owner.input("X") if n != name]
            block.ops.remove(op)
