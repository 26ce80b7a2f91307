"""Fast level: loop-invariant ops of a `while` body run once per loop.

An op of a loop body whose inputs the loop never changes (defined before
the loop, or results of other such ops) computes the same value on every
trip. It is marked `once`: codegen sets its result to None before the loop
and the body computes it only while it is None, so it runs in the first
trip, at its own place, and later trips reuse it:

    v_t = None
    while True:
        ...
        if v_t is None:
            v_t = k_mul(v_w, 2.0)
        ...
    del v_t

Running it in the first trip rather than before the loop keeps everything
eager does: a loop that makes no trip never runs it, and a failing op fails
at the same point, after the same ops. The value is the same tensor on
every trip (same kernel, same inputs). It is a fast-level pass because of
gradients: eager makes one result per trip and autograd sends each trip's
gradient back through its own copy of the op; here the contributions to
the one result are summed first and go back once, which rounds differently
(within the fast level's tolerance, docs/performance.md).

Marked: call-style ops at the top level of the body, with results, that are
pure (no in-place write, no random draw, no print or check, not
`training_only`, not making a new list (`new_object`: each trip's `[]` is
a list of its own), not under a `no_grad` block of their own), emitted as plain
calls. Loops with any in-place write (`array_append` aside: it writes only
the list, which the loop carries, so nothing reading it is invariant) are
left alone, and so are ops reading anything the loop (its test, its body or
blocks nested in them) assigns. `inplace` never writes into a `once`
result (runtime/passes/inplace.py).

A `once` result is one tensor where eager makes one per trip. Inside the
loop nothing can tell (nothing writes in place there), but two trips' values
kept past the loop would be one object, and a later in-place write to one
would show in the other. So a loop is left alone when a `once` result, or
anything that may alias it (the result of an op reading it that is not
known to return a new tensor, a branch or loop yielding or starting from it), is appended to
a list or carried out of the loop by a loop variable.

Before:                                        After:
    Out=[..] = while(..)                           Out=[..] = while(..)
  block 1 (the body):                            block 1:
    tmp_5 = torch.Tensor.__mul__(w, 2.0)           tmp_5 = torch.Tensor.__mul__(w, 2.0)  {once}
    tmp_6 = torch.Tensor.__add__(h_0, tmp_5)       tmp_6 = torch.Tensor.__add__(h_0, tmp_5)
"""

from ..aten import returns_new
from ..effects import is_pure, var_attr_names, writes_tensors
from ..optable import get_op_def
from ..run_modes import has_mode


def _assigned(blocks):
    """Every name an op of `blocks` (or of blocks nested in them) assigns or lists."""
    names = set()
    stack = list(blocks)
    while stack:
        block = stack.pop()
        names.update(block.vars)
        for op in block.ops:
            names.update(op.output_names)
            stack += op.sub_blocks()
    return names


def _ops(blocks):
    stack = list(blocks)
    while stack:
        block = stack.pop()
        for op in block.ops:
            yield op
            stack += op.sub_blocks()


def _candidate(op, ctx):
    opdef = ctx.get_op_def(op.type)
    return ("args" in op.attrs and op.output_names and op.attrs.get("out") is not None
            and not has_mode(op) and not op.sub_blocks() and opdef.emit is None
            and not (not is_pure(op, ctx.get_op_def) or opdef.internal or opdef.new_object
                     or op.type.startswith("py.")))


def run(ctx):
    for block in ctx.program.blocks:
        for op in block.ops:
            if op.type == "while":
                _mark(op, ctx)


def _mark(loop, ctx):
    body, test = loop.attrs["body_block"], loop.attrs["cond_block"]
    if writes_tensors([body, test], ctx.get_op_def):
        return
    varying = _assigned([body, test]) | set(loop.attrs["loop_vars"])
    invariant, marked = set(), []
    for op in body.ops:
        reads = set(op.input_names) | set(var_attr_names(op))
        if _candidate(op, ctx) and all(n not in varying or n in invariant for n in reads):
            marked.append(op)
            invariant.update(op.output_names)
    if invariant and not _escapes(invariant, loop, body):
        for op in marked:
            op.attrs = {**op.attrs, "once": True}


def _escapes(invariant, loop, body):
    """Whether a value that may be (a view of) an invariant result leaves the
    loop: appended to a list, or yielded as a loop variable's next value."""
    alias = set(invariant)
    grew = True
    while grew:  # a fixpoint: blocks nested in the body may read aliases made after them
        grew = False
        for op in _ops([body]):
            outs = set(op.output_names)
            if outs <= alias or returns_new(get_op_def(op.type)) and not op.sub_blocks():
                continue
            # A branch or loop yields what its blocks compute (visited here
            # too) or what it starts from: its other inputs only feed those.
            reads = set(var_attr_names(op)) | set(op.inputs.get("Init", ())) if op.sub_blocks() else op.input_names
            if set(reads) & alias:
                alias |= outs
                grew = True
    appended = {n for op in _ops([body]) if op.type == "array_append" for n in op.input_names[1:]}
    return bool(alias & (appended | set(loop.attrs["body_outs"])))
