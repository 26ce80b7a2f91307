"""The `cond` op: `true_fn() if pred else false_fn()`, a graph op when
`pred` is a Variable."""

import ast

import torch

from runtime.ir import TENSOR_ARRAY, Variable

from .. import tracer
from ..recording import graph_condition
from ..registry import OpDef, register
from ..user_frames import user_origin_at_site
from .merge import IfSite, Unmergeable, merge, unmergeable
from .sides import example_side, side_to_convert, specialise, tracing_side
from .undefined import Unreachable
from .values import check_pred, flatten_outputs, outer_reads, unflatten_outputs


def _emit_cond(op, gen):
    def branch(block, outs):
        body = gen.emit_block(block, keep=outs)
        body += [gen.assign(gen.store(o), gen.load(i)) for o, i in zip(op.output("Out"), outs)]
        return body or [ast.Pass()]

    # `if v:` calls Tensor.__bool__ exactly as bool(v) would (the same error
    # for a tensor of many elements), and costs nothing for a Python bool.
    test = gen.load(op.input("Cond")[0])
    return [ast.If(test=test, body=branch(op.attrs["true_block"], op.attrs["true_outs"]),
                   orelse=branch(op.attrs["false_block"], op.attrs["false_outs"]))]


register(OpDef("cond", emit=_emit_cond, inputs=("Cond", "X"), outputs=("Out",),
               attrs=("true_block", "false_block", "true_outs", "false_outs"),
               var_attrs=("true_outs", "false_outs")))


def cond(pred, true_fn, false_fn, names=None, return_names=(), lines=None, jump=None, one_side=True):
    """`true_fn() if pred else false_fn()`; a graph `cond` op when `pred` is a Variable.

    Each branch returns a value or a tuple/list of values. With a Variable
    `pred` both branches are traced; tensor/number pairs merge into new
    Variables (dimensions that differ become -1), equal Python values pass
    through, and anything else is a ConversionError naming the output
    (`names[i]`; `lines[name]` gives the lines where each branch assigns
    it). A value undefined in one branch becomes a zeros placeholder
    only when its name is in `return_names`, and so does an `Unreachable`
    value (a branch may return one `Unreachable` for all its values: it ends
    in a `raise` op).
    ``jump`` (kind, line): this `if` guards the statements after a
    `break`/`continue` (for the messages). Values of two dtypes or ranks
    make it convert the side the example inputs take (the other a decision
    check), unless ``one_side`` is False (the caller may drop the output
    instead): then they are a ConversionError.
    """
    pred = graph_condition(pred)  # a comparison of run-time sizes decides at run time
    if not isinstance(pred, Variable):
        if isinstance(pred, torch.Tensor):
            pred = bool(pred)
        return true_fn() if pred else false_fn()
    check_pred(pred)
    tr = tracer.current()
    parent = tr.block
    origin = user_origin_at_site(tr.entry_frame)
    site = IfSite(tr, tr.new_block(), None, names, return_names, lines, jump, pred, origin=origin,
                  one_side=one_side)
    with tr.block_guard(site.tblock), tracing_side(tr, pred, True, origin):
        t_out = true_fn()
    site.fblock = tr.new_block()
    with tr.block_guard(site.fblock), tracing_side(tr, pred, False, origin):
        f_out = false_fn()
    t_leaves, t_spec = flatten_outputs(t_out)
    f_leaves, f_spec = flatten_outputs(f_out)
    if isinstance(t_out, Unreachable):  # the true branch raises: the false branch's structure
        t_leaves, t_spec = [t_out] * len(f_leaves), f_spec
    if isinstance(f_out, Unreachable):
        f_leaves, f_spec = [f_out] * len(t_leaves), t_spec
    site.side_dead = isinstance(t_out, Unreachable) or isinstance(f_out, Unreachable)
    mark = tr.mark()
    try:
        if t_spec != f_spec:
            raise unmergeable(
                f"the branches of an `if` on a tensor return different structures ({t_spec} vs {f_spec})")
        spec = t_spec
        merged, outs, t_names, f_names = merge(t_leaves, f_leaves, site, strict=True)
    except Unmergeable:
        # Values no program output can hold on both paths: convert the path
        # these inputs take, and make the other one a decision check.
        taken = side_to_convert(tr, pred, origin, t_leaves, f_leaves)
        tr.rollback(mark)
        dead = specialise(site.tblock, site.fblock, taken, origin, "their values cannot be merged")
        live_leaves, spec = (t_leaves, t_spec) if taken else (f_leaves, f_spec)
        leaves = [dead] * len(live_leaves)
        # Every run that goes on after the `if` took the live side: its
        # Python numbers (a loop's count over Python items) stay numbers.
        site.side_dead = True
        merged, outs, t_names, f_names = merge(
            *((live_leaves, leaves) if taken else (leaves, live_leaves)), site)
    _hint_merged_sizes(tr, pred, outs, t_names, f_names, site.tblock, site.fblock)
    inputs = [n for n in outer_reads([site.tblock, site.fblock]) if n != pred.name]
    parent.append_op("cond", inputs={"Cond": [pred], "X": inputs}, outputs={"Out": outs},
                     attrs={"true_block": site.tblock, "false_block": site.fblock,
                            "true_outs": t_names, "false_outs": f_names}, origin=origin)
    return unflatten_outputs(merged, spec)


def _hint_merged_sizes(tr, pred, outs, t_names, f_names, tblock, fblock):
    """A size that differs between the sides (`F.pad` under `if pad > 0`)
    becomes a new symbol when a later op reads it; ShapeEnv decides every
    comparison on its hint, recording the decision as a run-time check. A
    made-up hint makes made-up checks (`s1 > s8`, failing on real inputs),
    so the hint is the size on the side the example inputs take."""
    if tr._shapes is None or not any(-1 in o.dims for o in outs if o.kind != TENSOR_ARRAY):
        return
    taken = example_side(tr, pred)
    if taken is None:
        return
    block, names = (tblock, t_names) if taken else (fblock, f_names)
    for out, name in zip(outs, names):
        if out.kind == TENSOR_ARRAY or -1 not in out.dims:
            continue
        out.size_hints = tuple(tr.shapes.hint(d) for d in block.find_var(name).dims)

