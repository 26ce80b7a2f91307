"""The sizes `jit.save` traces at for `None` dimensions, and the check that
the saved program still takes real sizes there.

Tracing decides what torch decides on sizes (a stride-2 convolution's
output is 1 wide, an adaptive pool keeps it) and records each decision as a
`check_sizes` op. Traced at a made-up size, those decisions are made-up
ones: at 2, a 4x4/stride-4 stem refuses the trace, and a conv + batch norm
saves the check `(...) == 1`, so the loaded model refuses every real image.
So the sizes come from the user's own examples (the latest call of the
function, when its inputs fit the InputSpecs), else from `DEFAULT_SIZES`;
and a traced program whose checks fail at every larger size tried is
refused with the check's text, never saved. Checks failing at some sizes
only are the other side of a decision: `size_paths` traces the function
again where they fail, and jit.save keeps those programs as paths.
"""

import torch

from ops.infer import _call
from runtime.effects import has_effects
from runtime.ir import torch_dtype
from runtime.optable import get_op_def, is_registered

# A dynamic dimension with no example: the batch (dimension 0) at 2, the
# smallest size torch does not specialise, every other one at 64 (a 32x
# downsampling CNN still has 2x2 left; a sequence fits the usual position
# tables). Examples from the user decide instead whenever there are any.
DEFAULT_SIZES = (2, 64)
# Where the traced program at 64 does not serve (the check above refuses it,
# or tracing fails: audio whose conv stack leaves one frame of 64 samples, a
# network that downsamples 64 pixels to nothing), the other dimensions are
# traced again at these larger sizes, in order; the first that serves wins.
LARGER = (256, 1024)
# Sizes near and far from the traced size n at which the saved program
# must accept some input: a check failing at all of them pins the
# dimension to one size (half: a table of at most n positions passes).
PROBES = (("half", lambda n: max(2, n // 2)), ("one more", lambda n: n + 1), ("twice", lambda n: 2 * n),
          ("three times", lambda n: 3 * n))
MAX_OPS = 256  # ops replayed for one check


def sizes_to_try(static, specs):
    """The example sizes to trace at, in order: example_sizes, then, where
    dimensions took the default, the same with LARGER ones."""
    tries = [example_sizes(static, specs)]
    for n in LARGER:
        sizes = example_sizes(static, specs, n)
        if sizes not in tries:
            tries.append(sizes)
    return tries


def example_sizes(static, specs, length=DEFAULT_SIZES[1]):
    """Per spec, the sizes to trace at: the latest call's where its input
    matches the spec (rank, dtype, static sizes), else DEFAULT_SIZES (with
    `length` for dimensions other than the batch)."""
    concrete = static.concrete_program
    called = list(concrete.inputs) if concrete is not None else []
    out = []
    for i, spec in enumerate(specs):
        if not hasattr(spec, "shape"):  # a generator argument
            out.append(None)
            continue
        seen = called[i].dims if i < len(called) and len(called) == len(specs) else None
        if seen is not None and (len(seen) != len(spec.shape) or called[i].dtype_name != spec.dtype
                                 or any(s != -1 and s != d for s, d in zip(spec.shape, seen))):
            seen = None
        out.append([d if d != -1 else (seen[k] if seen is not None and type(seen[k]) is int and seen[k] >= 2
                                       else (DEFAULT_SIZES[0], length)[min(k, 1)])
                    for k, d in enumerate(spec.shape)])
    return out


def example(spec, sizes):
    return torch.zeros(sizes, dtype=torch_dtype(spec.dtype))


def refuse_pinned_sizes(concrete, specs, examples):
    """Raise ValueError when the size checks of `concrete` fail at every
    probe (PROBES of the traced sizes in all dynamic dimensions at once): a
    model saved so would refuse every input but the traced size. Checks the
    replay cannot evaluate (sizes read from tensor data) are left to run
    time."""
    tensors = [(var, spec, t) for var, spec, t in zip(concrete.inputs, specs, examples) if hasattr(spec, "shape")]
    for var, spec, t in tensors:
        pinned = [k for k, (d, now) in enumerate(zip(spec.shape, var.dims)) if d == -1 and type(now) is int]
        if pinned:  # torch decided the size (`x + table`): every other size is refused
            raise ValueError(
                f"cannot save with these None dimensions: traced at {list(t.shape)}, dimension "
                f"{', '.join(map(str, pinned))} of input `{var.name}` can only be {var.dims[pinned[0]]} (the program "
                f"takes {var.dtype_name}{list(var.dims)}), so the saved model would refuse real inputs of other "
                "sizes; give the size in the InputSpec, or call the model on a real input before saving")
    program = concrete.main_program
    block = program.global_block()
    checks = [op for op in block.ops if op.type == "check_sizes"]
    if not checks or not any(-1 in s.shape for _, s, _ in tensors):
        return
    failing = None
    for _, probe in PROBES:
        sizes = [[probe(n) if d == -1 else n for d, n in zip(spec.shape, t.shape)] if hasattr(spec, "shape")
                 else None for spec, t in zip(specs, examples)]
        feeds = _meta_feeds(concrete, sizes)
        if all(f.shape == t.shape for f, (_, _, t) in zip(feeds.values(), tensors)):
            continue  # the traced sizes themselves (half of 2 is 2)
        replay = _Replay(program, feeds)
        failed = [op for op in checks if replay.holds(op) is False]
        if not failed:
            return
        failing = failing or failed[0]
    if failing is None:
        return
    message = failing.attrs["args"][1] if len(failing.attrs.get("args", ())) > 1 else "a size check"
    raise ValueError(
        f"cannot save with these None dimensions: traced at sizes {[list(t.shape) for _, _, t in tensors]}, "
        f"the program holds a check that fails at {', '.join(name for name, _ in PROBES)} those sizes, so the "
        f"saved model would refuse real inputs: {message}. Call the model on a real input before saving (its "
        "sizes are traced), or give the dimension's size in the InputSpec")


# The saved model's other sizes: every size of a dynamic dimension from 1
# to SCAN_FACTOR times the traced one (at most SCAN_MAX) is checked against
# the traced program's size checks, dimensions of one traced size together
# (an image's height and width, a batch of ids and its mask) and each
# alone; at most MAX_FAILED_TRACES sizes that do not trace are tried.
SCAN_FACTOR = 4
SCAN_MAX = 512
MAX_FAILED_TRACES = 3
# Traces in all, each as long as a conversion: a heavy network's save
# (DaViT: 90 s a trace here) stays within a few conversions' time.
MAX_TRACES = 4


def size_paths(retrace, concrete, specs, examples, most):
    """At most `most` (concrete program, example inputs) traced at sizes
    where size checks of `concrete` fail: torch decided on a size (`(h //
    32) != 1`: a feature map one pixel wide takes another path through a
    kernel's checks), and the saved model would refuse every input across
    that decision with DecisionFailed. `retrace(examples)` traces the
    function again for other example inputs. One program per set of
    failing checks, traced at the first size of the scan (nearest the
    traced one) that fails them: the decisions those checks stand for are
    taken the other way there, which is what the inputs failing them need.
    (Only `concrete`'s checks are replayed: a program traced elsewhere reads
    sizes of its own intermediate values, which the replay mostly cannot
    tell.) A size that does not trace (too small for the network, eagerly
    too) is left out, with the others failing the same checks."""
    found, seen, failed = [], set(), 0
    for sizes in _candidates(specs, examples):
        if len(found) >= most or failed >= MAX_FAILED_TRACES or len(found) + failed >= MAX_TRACES:
            break
        signature = _failing_checks(concrete, sizes)
        if not signature or signature in seen:
            continue
        seen.add(signature)
        inputs = [example(spec, shape) if hasattr(spec, "shape") else t for spec, shape, t in zip(specs, sizes, examples)]
        try:
            other = retrace(inputs)
        except Exception:  # noqa: BLE001 - inputs of these sizes stay a DecisionFailed, naming the check
            failed += 1
            continue
        if _failing_checks(other, sizes):
            failed += 1  # (traced, yet its own checks refuse its sizes: nothing gained)
            continue
        found.append((other, inputs))
    return found


def _candidates(specs, examples):
    """Size lists, one per input (None for a generator), nearest the traced
    sizes first: each group of dynamic dimensions of one traced size set to
    every size in the scan, then each dimension alone."""
    traced = [list(t.shape) if hasattr(spec, "shape") else None for spec, t in zip(specs, examples)]
    dims = [(i, k, n) for i, (spec, shape) in enumerate(zip(specs, traced)) if shape is not None
            for k, (d, n) in enumerate(zip(spec.shape, shape)) if d == -1]
    groups = {}
    for i, k, n in dims:
        groups.setdefault(n, []).append((i, k))
    singles = [((i, k),) for i, k, _ in dims] if any(len(g) > 1 for g in groups.values()) else []
    out = []
    for group in [tuple(g) for g in groups.values()] + singles:
        n = traced[group[0][0]][group[0][1]]
        scan = sorted(range(1, min(SCAN_FACTOR * n, SCAN_MAX) + 1), key=lambda s: (abs(s - n), s))
        for size in scan:
            if size == n:
                continue
            shapes = [list(s) if s is not None else None for s in traced]
            for i, k in group:
                shapes[i][k] = size
            out.append(shapes)
    return out


def _failing_checks(concrete, sizes):
    """The size checks of `concrete` that fail at `sizes`, as (block index,
    op index) pairs (empty: it serves them, or the replay cannot tell): those
    of the global block, and of each `cond` side the replay can tell these
    sizes take (a check under MobileViT's size `if` runs on one side only)."""
    program = concrete.main_program
    replay = _Replay(program, _meta_feeds(concrete, sizes))
    failing = []
    todo = [program.global_block()]
    while todo:
        block = todo.pop(0)
        for k, op in enumerate(block.ops):
            replay.budget = MAX_OPS  # each its own (a deep network's checks are hundreds, each a few ops)
            if op.type == "check_sizes" and replay.holds(op) is False:
                failing.append((block.idx, k))
            elif op.type == "cond":
                taken = replay.truth(op.input("Cond")[0])
                if taken is not None:
                    todo.append(op.attrs["true_block" if taken else "false_block"])
    return tuple(failing)


def _meta_feeds(concrete, sizes):
    """{feed name: meta tensor} of `concrete`'s tensor inputs at `sizes`
    (one size list per input, None for a generator)."""
    return {var.name: torch.empty(shape, dtype=torch_dtype(var.dtype_name), device="meta")
            for var, shape in zip(concrete.inputs, sizes) if shape is not None}


class _Unknown(Exception):
    pass


class _Replay:
    """Values of the size arithmetic of a program's global block, on meta
    feeds: `size` ops and the Python operators on their results."""

    def __init__(self, program, feeds):
        self.program = program
        self.values = dict(feeds)
        self.writers = {}
        for block in program.blocks:  # (a `cond` side's names are its own: fresh names program-wide)
            for op in block.ops:
                for name in op.output("Out"):
                    self.writers.setdefault(name, op)
        self.budget = MAX_OPS

    def holds(self, check):
        """True/False: the check at these sizes; None: not known here."""
        try:
            with torch._C.DisableTorchFunction(), torch.no_grad():
                inputs = [self.value(n) for n in check.input("X")]
                value = _call(lambda v, *_: v, check.attrs["args"], {}, inputs, False)
        except Exception:  # noqa: BLE001 - anything the replay cannot do is checked at run time
            return None
        return bool(value) if isinstance(value, (bool, int)) else None

    def truth(self, name):
        """True/False: the value of `name` (a `cond`'s condition) at these
        sizes; None: not known here."""
        try:
            with torch._C.DisableTorchFunction(), torch.no_grad():
                value = self.value(name)
            return bool(value) if isinstance(value, (bool, int)) or (
                isinstance(value, torch.Tensor) and value.numel() == 1 and value.device.type != "meta") else None
        except Exception:  # noqa: BLE001 - not known: its side's checks are left to run time
            return None

    def value(self, name):
        if name in self.values:
            return self.values[name]
        op = self.writers.get(name)
        self.budget -= 1
        if op is not None and op.type == "cond" and self.budget >= 0:
            # The side these sizes take gives the value (MobileViT's `interpolate` flag, set under a size test).
            taken = self.truth(op.input("Cond")[0])
            if taken is None:
                raise _Unknown(name)
            outs = op.attrs["true_outs" if taken else "false_outs"]
            result = self.value(outs[op.output("Out").index(name)])
            self.values[name] = result
            return result
        if op is None or self.budget < 0 or op.sub_blocks() or not is_registered(op.type) \
                or "args" not in op.attrs or op.attrs.get("out") is None:
            raise _Unknown(name)
        opdef = get_op_def(op.type)
        if opdef.kernel is None or has_effects(op):  # it runs on real tensors: no effect twice
            raise _Unknown(name)
        inputs = [self.value(n) for n in op.input("X")]
        if any(isinstance(v, torch.Tensor) and v.device.type == "meta" for v in inputs) and op.type != "size":
            raise _Unknown(name)  # values read from tensor data: only sizes are known here
        # (A tensor made from sizes, `fill_constant` of a size test, holds a known value.)
        result = _call(opdef.kernel, op.attrs["args"], op.attrs.get("kwargs", {}), inputs, False)
        outs = op.output("Out")
        if len(outs) != 1:
            raise _Unknown(name)
        self.values[name] = result
        return result
