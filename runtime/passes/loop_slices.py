"""Slice a sequence once before a loop instead of once per step.

`for t in range(n): ... x[:, t] ...` reads one slice of a loop-invariant
tensor per iteration: a `__getitem__` op (argument parsing, a new view, an
autograd node) every step. The slices are the views `x.unbind(1)` returns
all at once, so the pass makes them once, before the loop, and each step
picks one with Python indexing. Values are the same views of the same
memory; an index past the end is an IndexError as before.

Applies to ops slicing by the loop's counter (a loop variable), alone or
after full slices (`x[t]`, `x[:, t]`, `x[:, :, t]`, `torch.select(x, d,
t)`), of a sequence defined outside the loop, recorded with no `no_grad`
or autocast of their own, and only where the gradient stays eager's to
the bit:

- a `for` loop's rows (`for row in x`, the select marked `for_rows`):
  always. Eager iterates `x.unbind(0)`, made as the loop starts, so this
  *is* eager's slicing, including the row of a first trip traced ahead of
  the loop (ops/control_flow/while_op.py `_trips_decided`), in-place writes
  and ops reading `x` whole beside its rows;
- a slice the user takes per trip (`x[:, t]`): where eager's per-trip
  gradients sum to the same bits. Each trip's select adds a tensor that is
  zero outside its slice, so one node summing them all is exact when no
  other op of the loop reads `x` (`h + x.sum(1)` interleaves its gradient
  with the slices') and one op reads one slice per trip (two reads of it
  are summed first). No in-place write in the loop (it could change a
  later slice). A sequence no gradient reaches qualifies whatever reads it.

Before:                                          After:
    Out=[..] = while(.., X=[x, ..])                  x_slices = unbind_slices(x, 1)
  block 1:                                           Out=[..] = while(.., X=[x, x_slices, ..])
    tmp_7 = torch.Tensor.__getitem__(x, (:, ctr))  block 1:
                                                     tmp_7 = py.index(x_slices, ctr)
"""

import ast

import torch

from ..attrs import InputRef, OutputRef
from ..effects import var_attr_names, writes_tensors
from ..ir import TENSOR_ARRAY, Operator
from ..optable import OpDef, is_internal, register
from ..run_modes import has_mode
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
            found = []  # (op, (seq, dim, rows), whether in a loop nested in this one)
            _find(body, op, inside, program, False, found)
            if not found:
                continue
            writes = writes_tensors([body, test], ctx.get_op_def)
            groups = {}
            for inner, key, nested in found:
                groups.setdefault(key, []).append((inner, nested))
            made = {}
            # (rows first: their slices may be made ahead of a first trip's row, and others share them)
            for (seq, dim, rows), members in sorted(groups.items(), key=lambda item: not item[0][2]):
                if not rows and not _exact(program, op, seq, members, writes, ctx.get_op_def):
                    continue
                peeled = _peeled_rows(block, op, seq) if rows else []
                slices = _slices(op, block, seq, dim, made, program, members[0][0].origin,
                                 before=peeled[0] if peeled else op)
                for inner in [m for m, _ in members] + peeled:
                    inner.type = "py.index"
                    inner.inputs["X"] = [slices, inner.input("X")[1]]
                    inner.attrs = {"args": (InputRef(0), InputRef(1)), "kwargs": {}, "out": OutputRef(0)}
            if made:
                _capture(body, set(made.values()))


def _find(inner_block, loop, inside, program, nested, found):
    """The slicing ops of `inner_block` and its sub-blocks that could read a
    slice made before `loop` (`nested`: inside a loop within it, run more
    than once per trip)."""
    for inner in inner_block.ops:
        for sub in inner.sub_blocks():
            _find(sub, loop, inside, program, nested or inner.type == "while", found)
        key = _candidate(inner, loop, inside, program)
        if key is not None:
            found.append((inner, key, nested))


def _peeled_rows(block, loop, seq):
    """The rows of `seq` that ops of `block` take before `loop` (back to the
    loop before it): a loop's first trip traced on its own, ahead of the
    loop (ops/control_flow/while_op.py `_trips_decided`). Eager takes that
    row from the same `unbind` as the others, so it reads the same slices."""
    found = []
    for inner in reversed(block.ops[:block.ops.index(loop)]):
        if inner.type == "while":
            break
        if inner.attrs.get("for_rows") and _select_dim(inner) == 0 and inner.input("X")[0] == seq:
            found.insert(0, inner)
    return found


def _exact(program, loop, seq, members, writes, get):
    """Whether slicing `seq` once before `loop` gives eager's gradient (and
    values) for slicing ops `members` the user wrote per trip (`x[:, t]`).
    Values are the same views either way; the gradient reaching `seq` is
    summed in one node instead of one per trip. That is eager's sum to the
    bit when nothing else inside the loop reads `seq` and one op reads one
    slice per trip: every other contribution per trip is an exact zero. An
    op reading `seq` whole beside its slices (`h + x.sum(1)`) interleaves
    its contributions with the slices' in eager's order, and a slice read
    twice per trip sums its two gradients first: there the per-trip form
    stays. In-place writes in the loop keep it too (a write may change
    what a later slice is). A `seq` no gradient reaches has no sum."""
    if writes:
        return False
    var = find_var(program, seq)
    if var is not None and var.stop_gradient:
        return True
    if len(members) != 1 or members[0][1]:
        return False
    return _reads(loop, seq, get, members[0][0]) == 0


def _reads(loop, name, get, skip):
    """How many times the ops of `loop` (its own slots and attributes, and
    every op of its blocks) read `name`, besides op `skip`. A control-flow
    op's `X` lists the outer values its blocks read: those reads are its
    blocks' ops, counted there."""
    count, stack = 0, [loop]
    while stack:
        op = stack.pop()
        if op is skip:
            continue
        subs = op.sub_blocks()
        if not subs:
            count += op.input_names.count(name)
            continue
        count += sum(names.count(name) for slot, names in op.inputs.items() if slot != "X")
        count += var_attr_names(op, get).count(name)
        stack += [inner for sub in subs for inner in sub.ops]
    return count


def _capture(body, slices):
    """List `slices` among the `X` (outer values read) of every control-flow
    op of `body`'s nested blocks that reads one now."""
    for inner in body.ops:
        subs = inner.sub_blocks()
        for sub in subs:
            _capture(sub, slices)
        if subs:
            used = [s for s in slices if s not in inner.input("X") and any(_uses(sub, s) for sub in subs)]
            inner.inputs["X"] = inner.input("X") + sorted(used)


def _uses(block, name):
    for op in block.ops:
        if name in op.input_names or any(_uses(sub, name) for sub in op.sub_blocks()):
            return True
    return False


def _candidate(inner, loop, inside, program):
    """(seq, dim, rows) for an op slicing loop-invariant `seq` along `dim` by
    `loop`'s counter (`rows`: a `for` loop's rows, which eager slices with
    one `unbind` as the loop starts), or None when `inner` is no such op."""
    if not _plain_call(inner):
        return None
    if inner.type == "torch.Tensor.__getitem__" and len(inner.attrs["args"]) == 2:
        seq_arg, index = inner.attrs["args"]
        dim = _slice_dim(index) if seq_arg == InputRef(0) else None
    else:
        dim = _select_dim(inner)  # `for row in x`: x.select(0, ctr)
    if dim is None:
        return None
    seq, ctr = inner.input("X")
    var = find_var(program, seq)
    if var is None or seq in inside or ctr not in loop.attrs["loop_vars"] or dim >= len(var.shape):
        return None
    return seq, dim, bool(inner.attrs.get("for_rows")) and inner.type == "torch.select" and dim == 0


def _plain_call(inner):
    """A call of the op's two inputs, no keywords, one result, and no
    `no_grad` or autocast of its own (the slices have none)."""
    return (not inner.attrs.get("kwargs") and len(inner.input("X")) == 2 and not has_mode(inner)
            and inner.attrs.get("out") == OutputRef(0))


def _select_dim(inner):
    """`d` of a plain `torch.select(seq, d, index)` of the op's two inputs, else None."""
    args = inner.attrs.get("args")
    if (inner.type == "torch.select" and _plain_call(inner) and len(args) == 3 and args[0] == InputRef(0)
            and type(args[1]) is int and args[1] >= 0 and args[2] == InputRef(1)):
        return args[1]
    return None


def _slices(loop, block, seq, dim, made, program, origin, before):
    """The name of the slices of `seq` along `dim`, made on first use ahead
    of op `before` (`loop`, or a row its first trip takes ahead of it)."""
    slices = made.get((seq, dim))
    if slices is None:
        var = find_var(program, seq)
        slices = program.unique_name(f"{seq}_slices")
        block.create_var(name=slices, shape=(), dtype=var.dtype, kind=TENSOR_ARRAY,
                         stop_gradient=var.stop_gradient)
        block.ops.insert(block.ops.index(before), Operator(
            block, "unbind_slices", {"X": [seq]}, {"Out": [slices]},
            {"args": (InputRef(0), dim), "kwargs": {}, "out": OutputRef(0)}, origin))
        loop.inputs["X"] = loop.input("X") + [slices]
        made[(seq, dim)] = slices
    return slices
