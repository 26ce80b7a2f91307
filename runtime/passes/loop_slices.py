"""Slice a sequence once before a loop instead of once per step.

`for t in range(n): ... x[:, t] ...` reads one slice of a loop-invariant
tensor per iteration: a `__getitem__` op (argument parsing, a new view, an
autograd node) every step. The slices are the views `x.unbind(1)` returns
all at once, so the pass makes them once, before the loop, and each step
picks one with Python indexing. Values are the same views of the same
memory, and the gradient reaching `x` is the same (each element gets
exactly its own slice's gradient), so this is exact; an index past the end
is an IndexError as before.

Applies when the index is the loop's counter (a loop variable), alone or
after full slices (`x[t]`, `x[:, t]`, `x[:, :, t]`, and `torch.select(x,
d, t)`, which `for row in x` makes), the sequence is defined outside the
loop, and nothing in the loop writes in place. For `for row in x` this is
also what eager does (`iter(x)` is `x.unbind(0)`): the gradient reaching
`x` is summed in one node, in eager's order, not one per step.

Before:                                          After:
    Out=[..] = while(.., X=[x, ..])                  x_slices = unbind_slices(x, 1)
  block 1:                                           Out=[..] = while(.., X=[x, x_slices, ..])
    tmp_7 = torch.Tensor.__getitem__(x, (:, ctr))  block 1:
                                                     tmp_7 = py.index(x_slices, ctr)
"""

import ast

import torch

from ..attrs import InputRef, OutputRef
from ..effects import writes_tensors
from ..ir import TENSOR_ARRAY, Operator
from ..optable import OpDef, is_internal, register
from ._util import find_var


def _emit_index(op, gen):
    seq, i = (gen.arg_expr(a, op.input("X")) for a in op.attrs["args"])
    return [gen.assign(gen.store(op.output("Out")[0]), ast.Subscript(value=seq, slice=i, ctx=ast.Load()))]


if not is_internal("unbind_slices"):
    register(OpDef("unbind_slices", kernel=torch.Tensor.unbind, internal=True))
    register(OpDef("py.index", kernel=lambda seq, i: seq[i], emit=_emit_index,
                   internal=True, takes_python_ints=True))


def _slice_dim(index):
    """The dimension a `__getitem__` index selects with its last element
    (the counter), or None when it is anything but full slices then it."""
    if index == InputRef(1):
        return 0
    if not isinstance(index, tuple) or type(index) is not tuple or not index or index[-1] != InputRef(1):
        return None
    if any(part != slice(None) for part in index[:-1]):
        return None
    return len(index) - 1


def _names_defined(block):
    names = set(block.vars)
    for op in block.ops:
        names.update(op.output_names)
        for sub in op.sub_blocks():
            names |= _names_defined(sub)
    return names


def run(ctx):
    program = ctx.program
    for block in program.blocks:
        for op in list(block.ops):
            if op.type != "while":
                continue
            body, test = op.attrs["body_block"], op.attrs["cond_block"]
            inside = _names_defined(body) | _names_defined(test) | set(op.attrs["loop_vars"])
            if writes_tensors([body, test], ctx.get_op_def):
                continue
            made = {}

            def rewrite(inner_block):
                """Rewrite the slicing ops of `inner_block` (and its sub-blocks);
                whether any was rewritten there."""
                done = False
                for inner in inner_block.ops:
                    for sub in inner.sub_blocks():
                        if rewrite(sub):
                            done = True
                            inner.inputs["X"] = inner.input("X") + [s for s in made.values()
                                                                    if s not in inner.input("X")]
                    slices = _slices_for(inner, op, block, inside, made, program)
                    if slices is not None:
                        inner.type = "py.index"
                        inner.inputs["X"] = [slices, inner.input("X")[1]]
                        inner.attrs = {"args": (InputRef(0), InputRef(1)), "kwargs": {}, "out": OutputRef(0)}
                        done = True
                return done

            rewrite(body)


def _slices_for(inner, loop, block, inside, made, program):
    """The name of the slices variable `inner` can read instead of slicing
    (created before `loop` on first use), or None if it does not qualify."""
    if inner.attrs.get("kwargs") or len(inner.input("X")) != 2:
        return None
    if inner.type == "torch.Tensor.__getitem__" and len(inner.attrs["args"]) == 2:
        seq_arg, index = inner.attrs["args"]
        dim = _slice_dim(index)
    elif (inner.type == "torch.select" and len(inner.attrs["args"]) == 3
          and type(inner.attrs["args"][1]) is int and inner.attrs["args"][1] >= 0
          and inner.attrs["args"][2] == InputRef(1)):
        seq_arg, dim = inner.attrs["args"][0], inner.attrs["args"][1]  # `for row in x`: x.select(0, ctr)
    else:
        return None
    seq, ctr = inner.input("X")
    var = find_var(program, seq)
    if (seq_arg != InputRef(0) or dim is None or seq in inside or ctr not in loop.attrs["loop_vars"]
            or var is None or dim >= len(var.shape) or inner.attrs.get("out") != OutputRef(0)):
        return None
    slices = made.get((seq, dim))
    if slices is None:
        slices = program.unique_name(f"{seq}_slices")
        block.create_var(name=slices, shape=(), dtype=var.dtype, kind=TENSOR_ARRAY,
                         stop_gradient=var.stop_gradient)
        block.ops.insert(block.ops.index(loop), Operator(
            block, "unbind_slices", {"X": [seq]}, {"Out": [slices]},
            {"args": (InputRef(0), dim), "kwargs": {}, "out": OutputRef(0)}, inner.origin))
        loop.inputs["X"] = loop.input("X") + [slices]
        made[(seq, dim)] = slices
    return slices


