"""Example values: what a Variable holds for the call being traced.

A number read from a tensor while tracing (`int(t)`, `x.new(int(n))`,
`torch.arange(0, int(t))`) is a run-time value, so it becomes a size symbol.
ShapeEnv decides every size comparison on a symbol's *hint* and records the
decision as a guard, which the program checks when it runs. With a made-up
hint those decisions follow the made-up number: a program traced from an
input that would pass every check still fails its own checks (or the trace
fails, `cat` refusing sizes that differ only for the made-up number).

The call being traced has real arguments, so a value computed from them by
pure kernels is known: this module replays the recorded ops that produce a
Variable on the example inputs (the feeds' tensors, the bound parameters and
buffers, the hints of size symbols) and gives its value as the hint. Nothing
is assumed from it that is not checked: the hint only chooses which guards
are recorded, and every guard stays a run-time check.

Only ops that cannot be observed are replayed: no random or training-only
op, nothing with sub-blocks, and a bounded number of ops and elements (the
replay runs on the real example data). An in-place op is replayed on a copy
of the tensor it writes, and only where that tensor is the replay's own: made
by an op that shares no memory with its inputs (`torch.zeros_like(mask)
.masked_fill_(mask, -inf)`, as torch's `F._canonical_mask` builds a mask).
Each read is of the value its op saw: the last write before it; a tensor
read after a write to memory it may share (a view of it, or it a view),
through any name, is unknown, and so is one a branch or loop body writes
in place (`if c and acc.add_(1).sum() > 2`), read after that write: the
value before the block is not it (until 2026-11-30 both were read as
before the write, the side was replayed wrong, and a call converted again
until the limit of 8 programs failed).
"""

import bisect

import torch

from runtime.aten import returns_new
from runtime.attrs import OutputRef, ReturnType
from runtime.effects import draws, written_in_place
from runtime.ir import SCALAR, TENSOR_ARRAY
from runtime.optable import get_op_def, is_registered

from .infer import _call, _without_function_modes

MAX_OPS = 64            # ops replayed for one value
MAX_ELEMENTS = 1 << 16  # elements of any tensor the replay reads or makes


class _Unknown(Exception):
    pass


def example_int(tracer, var, real_sizes=False):
    """The Python int `var` (a one-element integer tensor) holds for the
    example inputs of this trace, or None when it cannot be told by replaying
    pure ops. Sizes known only at run time are their symbols' hints, as the
    trace has them (a size of 1 is traced as 2: what the trace decides on
    sizes must follow its hints). `real_sizes`: the value for the example
    inputs as they are, their sizes read from their tensors (what a run on
    them computes: a `.view(batch, -1)` of an example of batch 1 fails at
    the hint 2), else as the trace has them."""
    if not tracer.examples:
        return None
    value = _example(tracer, var, True) if real_sizes else None
    return _example(tracer, var, False) if value is None else value


def _replayed(tracer, var, real_sizes, most=MAX_ELEMENTS):
    """The Python ints of the integer tensor (or the number) `var` holds for
    the example inputs, or None where the replay cannot tell or they are
    more than `most`."""
    try:
        with _without_function_modes(), torch._C.DisableTorchFunction(), torch.no_grad():
            value = _Replay(tracer, real_sizes).value(var)
            if isinstance(value, torch.Tensor):
                if value.dtype.is_floating_point or value.dtype.is_complex or value.numel() > most:
                    return None
                return value.reshape(-1).tolist()
    except Exception:  # noqa: BLE001 - anything the replay cannot do: no example, the stand-in hint
        return None
    return [value] if isinstance(value, (int, bool)) else None


def _example(tracer, var, real_sizes):
    values = _replayed(tracer, var, real_sizes, most=1)
    return int(values[0]) if values is not None and len(values) == 1 else None


def example_ints(tracer, var):
    """The Python ints the integer tensor `var` holds for the example inputs
    of this trace, flattened (sizes as the trace has them), or None where
    replaying pure ops cannot tell (see `example_int`)."""
    return _replayed(tracer, var, False) if tracer.examples else None


def constant_value(tracer, var):
    """The tensor `var` holds on every run, or None: when pure ops compute
    it from constants alone (`torch.tensor(x.shape)` of static sizes: no
    feed, parameter, size symbol or random draw), and no op writes in place
    a tensor made from it. Asked at the global block only: inside a branch
    or loop body a later trip may change what an outer tensor holds before
    the ops that do it are recorded."""
    if tracer.block is not tracer.program.global_block():
        return None
    replay = _Replay(tracer, constants_only=True)
    try:
        with _without_function_modes(), torch._C.DisableTorchFunction(), torch.no_grad():
            value = replay.value(var)
    except Exception:  # noqa: BLE001 - not computed from constants alone
        return None
    if not isinstance(value, torch.Tensor) or written_from(tracer.program, {key[1] for key in replay.memo}):
        return None
    return value


def written_from(program, names):
    """Whether an op that writes in place reads one of `names`, or a
    tensor an op made from them (a view: `t.view(-1).add_(1)`)."""
    reached, grew = set(names), True
    while grew:
        grew = False
        for block in program.blocks:
            for op in block.ops:
                if not {n for ns in op.inputs.values() for n in ns} & reached:
                    continue
                if get_op_def(op.type).mutates:
                    return True
                outs = {n for ns in op.outputs.values() for n in ns} - reached
                grew = grew or bool(outs)
                reached |= outs
    return False


class _Replay:
    def __init__(self, tracer, real_sizes=False, constants_only=False):
        self.tracer = tracer
        self.real_sizes = real_sizes
        self.constants_only = constants_only  # no feed, bound value or size symbol: `constant_value`
        self.memo = {}   # (block index, name, position of the op that wrote it or None) -> value
        # Memo keys of values sharing memory with an input of their op (views,
        # `contiguous()` of a contiguous tensor) -> the tensors whose memory
        # they share: {(name, position of the op that made it, -1 for an input)}.
        self.views = {}
        self.budget = MAX_OPS
        self._writers = {}  # block index -> {name: positions of the ops writing it}, built once per replay
        self._write_positions = {}  # block index -> positions of the ops writing a tensor in place

    def _producer(self, var, before):
        """The last op of `var`'s block that writes it before the op at
        position `before` (None: the last so far), which output it is, and
        its position; through an index of the block's writers."""
        block = var.block
        writers = self._writers.get(block.idx)
        if writers is None:
            writers = self._writers[block.idx] = {}
            for position, op in enumerate(block.ops):
                names = set(op.output("Out"))
                if op.sub_blocks():
                    names |= _writes(op)  # (an in-place write in a branch or loop body)
                for name in names:
                    writers.setdefault(name, []).append(position)
        positions = writers.get(var.name, ())
        i = bisect.bisect_left(positions, len(block.ops) if before is None else before)
        if i == 0:
            return None
        op = block.ops[positions[i - 1]]
        outs = op.output("Out")
        # -1: written in place inside the op's blocks, not one of its outputs (unknown).
        return op, outs.index(var.name) if var.name in outs else -1, positions[i - 1]

    def value(self, var, before=None):
        """What `var` holds for the examples when the op at position
        `before` of its block runs (None: after the last op so far)."""
        found = self._producer(var, before)
        key = (var.block.idx, var.name, None if found is None else found[2])
        if key not in self.memo:
            self.memo[key] = self._compute(var, found)
        made_at = -1 if found is None else found[2]
        roots = self.views.get(key) or frozenset({(var.name, made_at)})
        if self._aliased_write(var.block, roots, made_at, before):
            # Written through another name since (a view of it, or it is a
            # view): the replay's copy would not show it.
            raise _Unknown(var.name)
        return self.memo[key]

    def _compute(self, var, found):
        tr = self.tracer
        if var.kind == TENSOR_ARRAY or (self.constants_only and var.kind == SCALAR):
            raise _Unknown(var.name)
        if var.kind == SCALAR:
            # `real_sizes`: a size read from an example tensor is that tensor's
            # size (the symbol's hint is 2 where the example's size is 0 or 1).
            if found is not None and self.real_sizes:
                try:
                    return self._run(*found)
                except _Unknown:
                    pass
            sym = tr.shapes.scalars.get(id(var)) if tr._shapes is not None else None
            hint = getattr(getattr(sym, "node", None), "hint", None)
            if hint is None:
                raise _Unknown(var.name)
            return hint
        if found is not None:  # also an input written in place: not the example any more
            return self._run(*found)
        if self.constants_only:
            raise _Unknown(var.name)
        example = tr.examples.get(var.name)
        if example is None:
            example = tr.program.bound.get(var.name)
        if example is None:
            raise _Unknown(var.name)
        return _small(example)

    def _run(self, op, index, position):
        self.budget -= 1
        if index < 0:
            raise _Unknown(op.type)
        if op.type == "cond" and self.budget >= 0 and not self.constants_only:
            # The output of the side the example takes (a `return` flag, a
            # value one side sets): what that side's block computed.
            side = "true" if bool(self._input(op.block.find_var(op.input("Cond")[0]), op.block, position)) else "false"
            block = op.attrs[f"{side}_block"]
            return self.value(block.find_var(op.attrs[f"{side}_outs"][index]))
        if op.type == "checkpoint" and self.budget >= 0 and not self.constants_only:
            # (ops/control_flow/checkpoint_op.py) what its block computed
            return self.value(op.attrs["block"].find_var(op.attrs["outs"][index]))
        if self.budget < 0 or op.sub_blocks() or not is_registered(op.type):
            raise _Unknown(op.type)
        opdef = get_op_def(op.type)
        # Only ops nothing but their outputs observes: their kernels run on the
        # call's real tensors, and a side effect (batch norm's running
        # statistics in training mode, a draw) would happen a second time.
        if opdef.kernel is None or opdef.side_effect or opdef.training_only or draws(op) \
                or "args" not in op.attrs or (self.constants_only and op.attrs.get("autocast")):
            raise _Unknown(op.type)
        block = op.block
        names = op.input("X")
        variables = [block.find_var(n) for n in names]
        inputs = [self._input(v, block, position) for v in variables]
        if opdef.mutates:
            # On a copy of the replay's own tensor: the example's tensors stay as they are.
            if index != 0 or not self._own(block, names[0], position):
                raise _Unknown(op.type)
            inputs[0] = inputs[0].clone()
            _call(opdef.kernel, op.attrs["args"], op.attrs.get("kwargs", {}), inputs, False)
            return _small(inputs[0])
        if op.attrs.get("out") is None:
            raise _Unknown(op.type)
        result = _small(_pick(op.attrs["out"], _call(opdef.kernel, op.attrs["args"], op.attrs.get("kwargs", {}),
                                                      inputs, False), index))
        if isinstance(result, torch.Tensor) and _shares_memory(result, inputs):
            if any(v.block is not block for v in variables):
                raise _Unknown(op.type)
            roots = set()
            for v in variables:
                made = self._producer(v, position)
                made_at = -1 if made is None else made[2]
                roots |= self.views.get((block.idx, v.name, made_at), {(v.name, made_at)})
            self.views[(block.idx, op.output("Out")[index], position)] = frozenset(roots)
        return result

    def _input(self, var, block, position):
        """What `var` holds when the op at `position` of `block` reads it.
        A variable of an enclosing block is read as of the `cond` or `while`
        op there whose body holds `block`."""
        while block is not var.block and block.parent_idx >= 0:
            if any(_writes(op) for op in block.ops[:position]):
                # Written in place in this block before the read (`if c and
                # acc.add_(1).sum() > 2`): the value before the block is not it.
                raise _Unknown(var.name)
            parent = block.parent
            position = next((i for i, op in enumerate(parent.ops) if block in op.sub_blocks()), None)
            if position is None:  # the op is being traced: after the parent's last op so far
                position = len(parent.ops)
            block = parent
        if block is not var.block:
            raise _Unknown(var.name)
        return self.value(var, position)

    def _aliased_write(self, block, roots, made_at, before):
        """Whether an op before position `before` (None: the end so far)
        writes in place the memory of `roots` through a name other than a
        root's own before the view at `made_at` was taken (which the view's
        value shows): a sibling view, or a view made from this one. Names are
        followed from the roots' making on: any op reading one may return a
        view of it. Most blocks write nothing in place: no scan then."""
        writes = self._write_positions.get(block.idx)
        if writes is None:
            writes = self._write_positions[block.idx] = [i for i, op in enumerate(block.ops) if _writes(op)]
        start = min(at for _, at in roots) + 1
        end = len(block.ops) if before is None else min(before, len(block.ops))
        if bisect.bisect_left(writes, end) == bisect.bisect_left(writes, start):
            return False
        names = {name for name, _ in roots}
        own = set(names)
        for position in range(start, end):
            op = block.ops[position]
            written = _writes(op)
            if written & names and not (position < made_at and written <= own):
                return True
            if not _inputs(op).isdisjoint(names) and not _fresh(op):
                names.update(op.output("Out"))
        return False

    def _own(self, block, name, position):
        """Whether the tensor `name` holds before the op at `position` is one
        only the replay holds: an op of this block made it (or wrote it in
        place since) sharing no memory with its inputs. A view of it taken
        before the write and read after it is unknown (`_aliased_write`)."""
        found = self._producer(block.find_var(name), position)
        return found is not None and found[0].block is block and (block.idx, name, found[2]) not in self.views


def _shares_memory(result, inputs):
    """Whether `result` shares memory with an input (a view of one), read
    from their storages: a kernel's result may be a view of memory of its
    own (`linear` of a 3-d input reshapes its product), which no name shares."""
    address = result.untyped_storage().data_ptr()
    return any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == address for t in inputs)


def _writes(op):
    """The names `op`, or an op of its sub-blocks, writes in place."""
    found = {written_in_place(op)} - {None}
    for sub in op.sub_blocks():
        for inner in sub.ops:
            found |= _writes(inner)
    return found


def _fresh(op):
    """Whether `op` returns memory of its own (its ATen schema says so), never a view of an input."""
    return not op.sub_blocks() and is_registered(op.type) and returns_new(get_op_def(op.type))


def _inputs(op):
    """The names `op`, or an op of its sub-blocks, takes as inputs."""
    found = {n for names in op.inputs.values() for n in names}
    for sub in op.sub_blocks():
        for inner in sub.ops:
            found |= _inputs(inner)
    return found


def producer(var):
    """The last op of `var`'s block that writes it, and which output it is
    (a replay reads through its own index of the writers: `_Replay._producer`)."""
    for op in reversed(var.block.ops):
        names = op.output("Out")
        if var.name in names:
            return op, names.index(var.name)
    return None


def _pick(tree, result, index):
    """The part of `result` that the op's output tree names OutputRef(index)."""
    if isinstance(tree, ReturnType):  # `torch.sort(x)`: values, indices
        tree = tree.items
    if isinstance(tree, OutputRef):
        if tree.index == index:
            return result
        raise _Unknown("output")
    if isinstance(tree, (list, tuple)) and isinstance(result, (list, tuple)) and len(tree) == len(result):
        for t, r in zip(tree, result):
            try:
                return _pick(t, r, index)
            except _Unknown:
                continue
    raise _Unknown("output")


def _small(value):
    if isinstance(value, torch.Tensor) and (value.numel() > MAX_ELEMENTS or value.device.type == "meta"):
        raise _Unknown("large")
    return value
