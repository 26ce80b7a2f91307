"""Programs converted under decisions that a run may break.

A program holds what tracing decided for the inputs it was converted from
and checks it when it runs (DESIGN, Semantics 3 and 8):

- size assumptions (`check_sizes` ops: `s0 != 1` for a `zip` over rows,
  `(s0 % s1) != 0` for a reshape), and
- the side of a tensor `if` d2s could convert only for inputs that take it
  (`decision_failed` ops, ops/control_flow/sides.py): the branches give values
  no program output holds on both paths (`None` and a tensor), or tracing
  the side never taken fails (`if q_len == 1:` holding a view valid only
  for length 1).

A run whose inputs break a decision raises `DecisionFailed`. The call then
converts again for those inputs, as a failed guard in torch.compile
recompiles, and keeps both programs under the same cache key: each key
has a group of programs, the most recent one first in the cache, and a
failure tries the others before converting again. Each program counts
toward the many-programs warning. A saved program holds one of them and
raises the DecisionFailed (naming the decision) for inputs it cannot serve.

A failed run is run again only when nothing it did before the check can
be seen: an in-place write to an input or a parameter, a random draw or a
print before it would happen twice, so such a program refuses instead. An
in-place write into a temporary the run made itself (`h * w` on a linear's
result, run as `mul_` by the in-place pass) is made afresh by the second
run, and does not stop it, nor does one into what a loop carries or an `if`
gives when every value it may be is such a temporary (a cache's counter
in a decoding loop, `count += 1`); a write into anything that may share a
caller's memory (a view of an input, a value a branch or loop hands on
from one) still does.

The program converted again may fail on these inputs too, at a decision a
later part of the run takes (a later trip of a decoding loop): the call
then converts again once more, keeping the sides taken so far, up to
MAX_PROGRAMS programs a key. Where the second failure is at the `if`
whose other side the first one asked for, the call takes both sides of it
(on different trips), which no program can hold: refused naming it.
Draws from a generator are an exception: the states of the generators a
run may draw from (a `torch.Generator` the call passed, and torch's
default ones where the program draws from them: training dropout before
a transformers mask decision) are kept before the run and put back before
running again (`generator_states`), so the draws are made once, as eager
makes them.
"""

import torch

from ops import control_flow, path_reads
from runtime import runner
from runtime.effects import draws, var_attr_names, written_in_place
from runtime.errors import ConversionError, DecisionFailed
from runtime.ir import GENERATOR
from runtime.optable import get_op_def, is_registered
from runtime.aten import fresh_by_schema, returns_new

from . import varying_sizes


# The programs one cache key may hold, each converted under other decisions.
MAX_PROGRAMS = 8

# Composite operators (their schemas cannot say it) and Python wrappers
# whose result is memory of their own, as every path of theirs ends in a
# kernel making it: the normalisations and pools a CNN writes into in place
# (`bn(x).relu_()`, timm's `ReLU(inplace=True)` after each BatchNorm). Not
# in runtime/aten.py's FRESH: batch norm in training writes its running
# statistics, which the passes' uses of that list (an op writing none of
# its inputs) would not allow.
NEW_MEMORY = frozenset((
    "batch_norm layer_norm group_norm instance_norm adaptive_avg_pool1d adaptive_avg_pool2d "
    "adaptive_avg_pool3d torch.nn.functional.batch_norm torch.nn.functional.layer_norm "
    "torch.nn.functional.group_norm torch.nn.functional.instance_norm torch.nn.functional.adaptive_avg_pool1d "
    "torch.nn.functional.adaptive_avg_pool2d torch.nn.functional.adaptive_avg_pool3d "
    "torch.nn.functional.hardswish").split())


class Group:
    """The programs of one cache key, each converted under other decisions."""

    __slots__ = ("programs",)

    def __init__(self, first):
        self.programs = [first]


def global_generators(program, device=None):
    """torch's default generators a run of `program` draws from (a random
    op given no generator feed: training dropout), the CPU one and that of
    its CUDA device (`device`, else the program's); () where it draws from none."""
    if not any(is_registered(op.type) and draws(op) and not _draws_from_a_feed(op)
               for block in program.blocks for op in block.ops):
        return ()
    device = device or getattr(program, "device", None)
    if device is not None and device.type == "cuda":
        return (torch.default_generator, torch.cuda.default_generators[
            device.index if device.index is not None else torch.cuda.current_device()])
    return (torch.default_generator,)


def generator_states(feeds, generators=()):
    """(generator, its state) for each generator among a call's feeds and
    each of `generators` (`global_generators`), taken before the run (see
    the module docstring): every generator the run may draw from."""
    return [(g, g.get_state()) for g in (*(f for f in feeds if type(f) is torch.Generator), *generators)]


def _restores(states, concrete):
    """Whether `states` (`generator_states`) hold every generator a run of
    `concrete` may draw from (a call's generators are all in them)."""
    kept = {id(g) for g, _ in states}
    return bool(states) and all(id(g) in kept for g in concrete.global_generators)


def restore_generators(states):
    for g, state in states:
        g.set_state(state)


def rerun(static, key, concrete, args, kwargs, tensors, failure, form=None, states=(), retried=False):
    """The result of the call whose run of `concrete` raised `failure`
    (a DecisionFailed): another program of the key's group whose decisions
    hold for these inputs, else one converted for them now (`form`: how the
    caller passed the arguments, StaticFunction._as_called; `states`: the
    states of its generators before the run, `generator_states`; `retried`:
    `concrete` was converted for this call, which failed on it too)."""
    failing = _refuse_repeated_effects(concrete, failure, _restores(states, concrete))
    if retried:
        _refuse_both_sides(concrete, failing, failure)
        path_reads.refuse_both(getattr(concrete, "decided_reads", {}), failing, failure)
    group = concrete.decisions or Group(concrete)
    concrete.decisions = group
    cache = static.program_cache
    for other in group.programs:
        if other is concrete or not _fits(other, tensors):
            continue
        restore_generators(states)
        try:
            result = other.run(tensors, (args, kwargs))
        except DecisionFailed as again:
            _refuse_repeated_effects(other, again, _restores(states, other))
            continue
        _hold(cache, key, group)
        cache.put(key, other)  # the most recent first: the next such call is a plain hit
        cache.last = other
        return result
    _hold(cache, key, group)
    # The side this run took, for `if`s whose side the example inputs
    # cannot tell by replay (they depend on in-place writes, loops): the
    # trace converts that side where it cannot tell.
    sides = dict(getattr(concrete, "decided_sides", {}))
    sides.update(_side_taken(failing))
    # What this run had at a read whose answer depends on the path (strides, requires_grad).
    reads = dict(getattr(concrete, "decided_reads", {}))
    reads.update(path_reads.taken(failing, failure))
    cache.last_decision = str(failure).splitlines()[0]  # named by the many-programs warning
    with control_flow.forcing(sides, fallback=True), path_reads.forcing(reads):
        try:
            fresh = static._build(key, args, kwargs, exact=True, form=form, varying=concrete.varying)
        except ConversionError:
            if not concrete.varying:
                raise
            # Code this side runs needs what tracing cannot follow at
            # run-time sizes (a layout's strides): converted for these
            # sizes, as a first conversion falls back to them
            # (StaticFunction._miss), and the sizes stay exact from now on.
            key = static.cache_key(args, kwargs)[0]
            varying_sizes.stay_exact(cache, key)
            fresh = static._build(key, args, kwargs, exact=True, form=form)
    fresh.decided_sides = sides
    fresh.decided_reads = reads
    fresh.decisions = group
    group.programs.append(fresh)
    cache.last = fresh
    restore_generators(states)  # (converting drew nothing from them)
    try:
        return fresh.run(tensors, (args, kwargs))
    except DecisionFailed as again:
        # The new program decided another `if` or size for a side these
        # inputs leave later in the run (a decoding loop's later trip):
        # convert again, keeping the sides taken so far.
        if len(group.programs) >= MAX_PROGRAMS:
            raise
        return rerun(static, key, fresh, args, kwargs, tensors, again, form, states, retried=True)


def _refuse_both_sides(concrete, failing, failure):
    """Raise ConversionError when `failing` is the `if` whose other side
    `concrete` was converted for, by this call's earlier try: the call takes
    both sides (on different trips of a loop), which one program cannot
    hold, since their values cannot be merged."""
    decided = getattr(concrete, "decided_sides", {})
    for site, side in _side_taken(failing).items():
        if decided.get(site, side) != side:
            holder = _holder(failing)
            raise ConversionError(
                f"{failure}\nd2s cannot convert this call: that `if` takes both sides within it (on different "
                "trips of a loop), and a program holds one side of an `if` whose sides give values that cannot "
                "be merged; give both sides values of one type (a tensor on both, not None or a number on one; `2.0` "
                "beside a float, not `2`)",
                *holder.origin[:2]) from None


def _side_taken(failing):
    """{site key: side} of the `if` whose side-not-converted raised at
    `failing` (a `decision_failed` op first in a cond's block), else {}."""
    if failing is None or failing.type != "decision_failed":
        return {}  # (a check in a branch decides a size or a layout, not a side)
    holder = _holder(failing) if failing.block.parent_idx >= 0 else None
    if holder is None or holder.type != "cond" or not holder.origin:
        return {}
    return {control_flow.site_key(holder.origin): holder.attrs["true_block"] is failing.block}


def _hold(cache, key, group):
    """Every program of the group under a key of its own as well: they count
    toward the many-programs warning, and the cache's size bound holds them."""
    for i, program in enumerate(group.programs):
        cache.put((("decided", i),) + key, program)


def _fits(concrete, tensors):
    """Whether the feeds' static sizes are these tensors' (a program
    converted for a size of 1 checks it at its start; this skips the run)."""
    return all(d == n for var, t in zip(concrete.inputs, tensors) if var.dims and len(var.dims) == t.dim()
               for d, n in zip(var.dims, t.shape) if type(d) is int and d >= 0)


def _refuse_repeated_effects(concrete, failure, generators_restored=False):
    """Raise `failure` (naming why) when the failed run did something
    observable before its check, which running again would repeat; else
    the op that raised it (None: it failed before running any)."""
    if failure.before_run:
        return None  # (nothing ran)
    op = None
    for entry in (concrete.compiled, concrete._inference):
        op = op or (entry is not None and runner._failing_op(entry, failure.__traceback__)) or None
    op = op or _decision_op(concrete, failure)
    if op is None:
        raise failure
    effect = _effect_before(op, generators_restored)
    if effect is None:
        return op
    where = f" (created at {effect.origin[0]}:{effect.origin[1]})" if effect.origin else ""
    raise RuntimeError(
        f"{failure}\nd2s cannot convert again and rerun this call: before the check, the program ran "
        f"`{effect.type}`{where}, which changes state a second run would change again (an in-place "
        "write to an input or parameter, a random draw, a print); call it once with inputs that take this "
        "path before any other, or move the decision before that op") from None


def _decision_op(concrete, failure):
    """The one `decision_failed` op whose message `failure` carries, where
    the traceback names no op (a native segment ran it); else None."""
    text = str(failure)
    found = [op for block in concrete.main_program.blocks for op in block.ops
             if op.type == "decision_failed" and op.attrs["args"][0] == text]
    return found[0] if len(found) == 1 else None


def _effect_before(failing, generators_restored=False):
    """An observable op the run executed before `failing` (a draw is not,
    where `generators_restored`: the states of every generator the run may
    draw from were kept, `generator_states`): in each block from `failing`'s
    out to the global one, the ops before it (with their blocks); of a
    `while` holding it, every op of its blocks (earlier trips ran them all).
    A `cond`'s other side and what a `checkpoint`'s block does after the
    check did not run."""
    candidates = []
    op = failing
    while op.block.parent_idx >= 0:
        holder = _holder(op)
        if holder is None:
            return None
        if holder.type == "while":
            candidates += [o for b in holder.sub_blocks() for o in _walk(b.ops)]
        else:
            candidates += _walk(op.block.ops[:op.block.ops.index(op)])
        op = holder
    ops = op.block.ops
    candidates += _walk(ops[:ops.index(op)] if op in ops else ops)
    return next((o for o in candidates if o is not failing and _observable(o, generators_restored)), None)


def _holder(op):
    """The op in the parent block whose sub-block holds `op`'s block."""
    block = op.block
    parent = block.program.blocks[block.parent_idx]
    return next((o for o in parent.ops if block in o.sub_blocks()), None)


def _walk(ops):
    for op in ops:
        yield op
        for block in op.sub_blocks():
            yield from _walk(block.ops)


def _observable(op, generators_restored=False):
    if op.type == "print":
        return True
    if not is_registered(op.type):
        return False
    opdef = get_op_def(op.type)
    if opdef.random and generators_restored:
        return False  # the generators it may draw from are put back before the run is repeated
    if opdef.random:
        # dropout in eval mode (`train=False`, a constant of the program)
        # draws nothing: every transformers model runs one before its masks;
        # nor does attention with `dropout_p=0.0`
        return draws(op)
    if not opdef.mutates:
        return False
    return not _temporary(op.block.program, written_in_place(op))


def _temporary(program, name, seen=None):
    """Whether `name` (what an in-place op writes: its first input) can only
    be memory the run itself made, which a second run makes afresh: traced
    back through what gives it, every path ends at an op returning a new
    tensor (`linear`, `x * w`: the in-place pass writes into such results;
    `clone`, a factory), never at a feed, a parameter or a tensor bound from
    outside that a view, `dropout` in eval mode or a branch may hand on."""
    seen = set() if seen is None else seen
    if name in seen:
        return True
    seen.add(name)
    held = [b.vars[name] for b in program.blocks if name in b.vars]
    if name in program.bound or any(v.persistable or v.is_data for v in held):
        return False
    writers = [op for block in program.blocks for op in block.ops if name in op.output_names
               and not (is_registered(op.type) and get_op_def(op.type).mutates)]
    # A loop variable is given, at the loop's start, its initial value, and
    # after each trip, the body's result for it.
    carried = [[op.input("Init")[i], op.attrs["body_outs"][i]] for block in program.blocks for op in block.ops
               if op.type == "while" for i, v in enumerate(op.attrs["loop_vars"]) if v == name]
    if not writers and not carried:
        return False  # made where we cannot see
    for op in writers:
        if _fresh(op):
            continue
        read = _sources(op, name) if op.sub_blocks() else op.input_names
        if not all(_temporary(program, n, seen) for n in read):
            return False
    return all(_temporary(program, n, seen) for sources in carried for n in sources)


def _sources(op, name):
    """The names whose values an op with blocks gives its output `name`: a
    `cond`'s output is one side's, a `while`'s its loop variable's, a
    `checkpoint`'s its block's; another op may give any it reads."""
    if op.type in ("cond", "while", "checkpoint") and name in op.output("Out"):
        i = op.output("Out").index(name)
        if op.type == "cond":
            return [op.attrs["true_outs"][i], op.attrs["false_outs"][i]]
        if op.type == "checkpoint":
            return [op.attrs["outs"][i]]
        return [op.attrs["loop_vars"][i]]
    return op.input_names + var_attr_names(op)


def _fresh(op):
    """An op whose result is a tensor of its own, whatever its inputs: a
    new result (runtime/aten.py `returns_new`: an in-place write into it
    changes nothing a caller holds) or a factory, which reads sizes only (`torch.zeros`
    at a run-time size; not `as_tensor` or a sparse constructor, which may
    hand on the tensors they are given)."""
    if op.sub_blocks() or "out" in (op.attrs.get("kwargs") or {}):
        return False
    if not op.input_names or is_registered(op.type) and (returns_new(get_op_def(op.type))
                                                         or get_op_def(op.type).canonical in NEW_MEMORY
                                                         or fresh_by_schema(get_op_def(op.type).aten)):
        return True
    if is_registered(op.type) and get_op_def(op.type).new_object:
        return True  # a list of its own (`[x[:, 0]]` a loop appends to): appending to it changes no item
    name = op.type.rsplit(".", 1)[-1]
    return (is_registered(op.type) and get_op_def(op.type).factory and name != "as_tensor"
            and not name.startswith("sparse"))


def _draws_from_a_feed(op):
    """Whether `op` draws from a generator the call passed (`generator=g`
    with `g` a generator feed), not from torch's global generator."""
    return any(getattr(_find(op.block, n), "kind", None) == GENERATOR for n in op.input_names)


def _find(block, name):
    while True:
        if name in block.vars:
            return block.vars[name]
        if block.parent_idx < 0:
            return None
        block = block.program.blocks[block.parent_idx]
