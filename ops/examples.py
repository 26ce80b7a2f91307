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

Only ops that cannot be observed are replayed: no in-place, random or
training-only op, nothing with sub-blocks, and a bounded number of ops and
elements (the replay runs on the real example data).
"""

import torch

from runtime.attrs import OutputRef, ReturnType
from runtime.effects import has_effects
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
    if not isinstance(value, torch.Tensor) or written_from(tracer.program, {name for _, name in replay.memo}):
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
        self.memo = {}
        self.budget = MAX_OPS

    def value(self, var):
        key = (var.block.idx, var.name)
        if key not in self.memo:
            self.memo[key] = self._compute(var)
        return self.memo[key]

    def _compute(self, var):
        tr = self.tracer
        if var.kind == TENSOR_ARRAY or (self.constants_only and var.kind == SCALAR):
            raise _Unknown(var.name)
        if var.kind == SCALAR:
            # `real_sizes`: a size read from an example tensor is that tensor's
            # size (the symbol's hint is 2 where the example's size is 0 or 1).
            found = producer(var) if self.real_sizes else None
            if found is not None:
                try:
                    return self._run(*found)
                except _Unknown:
                    pass
            sym = tr.shapes.scalars.get(id(var)) if tr._shapes is not None else None
            hint = getattr(getattr(sym, "node", None), "hint", None)
            if hint is None:
                raise _Unknown(var.name)
            return hint
        found = producer(var)
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

    def _run(self, op, index):
        self.budget -= 1
        if op.type == "cond" and self.budget >= 0 and not self.constants_only:
            # The output of the side the example takes (a `return` flag, a
            # value one side sets): what that side's block computed.
            side = "true" if bool(self.value(op.block.find_var(op.input("Cond")[0]))) else "false"
            block = op.attrs[f"{side}_block"]
            return self.value(block.find_var(op.attrs[f"{side}_outs"][index]))
        if self.budget < 0 or op.sub_blocks() or not is_registered(op.type):
            raise _Unknown(op.type)
        opdef = get_op_def(op.type)
        # Only pure ops: their kernels run on the call's real tensors, and a
        # side effect (batch norm's running statistics in training mode) would
        # happen a second time.
        if opdef.kernel is None or has_effects(op) \
                or op.attrs.get("out") is None or "args" not in op.attrs \
                or (self.constants_only and op.attrs.get("autocast")):
            raise _Unknown(op.type)
        block = op.block
        inputs = [self.value(block.find_var(n)) for n in op.input("X")]
        result = _call(opdef.kernel, op.attrs["args"], op.attrs.get("kwargs", {}), inputs, False)
        return _small(_pick(op.attrs["out"], result, index))


def producer(var):
    """The last op of `var`'s block that writes it, and which output it is."""
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
