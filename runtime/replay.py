"""A run of straight-line ops of a block as a plain Python function of its
inputs, calling the ops' own kernels (the executor's code generator on a
one-block program holding just those ops).

torch's tracers (`torch.export`, `make_fx`) can then see the ATen calls the
kernels make: `runtime/onnx_regions.py` exports such a function with
torch.onnx, `runtime/torch_export.py` stitches them into an
ExportedProgram with `torch.cond` / `while_loop`.

    compiled = region_function(block, ops, ["x", "w"], ["y"])
    (y,) = compiled.fn(x, w)
"""

import dataclasses

from . import traced_numpy
from .codegen import compile_program
from .ir import TENSOR_ARRAY, Block, Program
from .optable import get_op_def


def reads_and_writes(ops):
    """(names the ops read before writing them, names they write), each in
    first-seen order. A mutating op writes its first input."""
    reads, writes = {}, {}
    for op in ops:
        for name in op.input_names:
            if name not in writes:
                reads.setdefault(name)
        if get_op_def(op.type).mutates and op.input("X"):
            writes.setdefault(op.input("X")[0])
        for name in op.output_names:
            writes.setdefault(name)
    return list(reads), list(writes)


def op_reads(op):
    """The names `op` and its sub-blocks read: their ops' inputs, and what a
    side or body yields without making it (a `return` flag left as it was
    before the `if`), which comes from outside."""
    if not op.sub_blocks():
        return set(op.input_names)
    names = set()
    yields = {"true_block": "true_outs", "false_block": "false_outs", "body_block": "body_outs"}
    for key, sub in op.attrs.items():
        if not isinstance(sub, Block):
            continue
        made = set()
        for inner in sub.ops:
            names |= op_reads(inner) - made
            made.update(inner.output_names)
        names |= set(op.attrs.get(yields.get(key), ())) - made
    return (names - set(op.attrs.get("loop_vars", ()))) | set(op.input("Cond") + op.input("Init"))



# Ops whose kernels compute nothing under torch's tracers: a trace would
# hold an empty tensor where the op's result belongs (a silent wrong value).
UNTRACEABLE = {
    "torch._grouped_mm": "torch's tracers cannot compute torch._grouped_mm on CPU float32 (its meta kernel is "
                         "CUDA's, bfloat16 only; d2s's shape inference gives an empty tensor of the result's "
                         "shape, which a trace would keep as the value)",
    "host_clock": "it reads the host's clock (`time.perf_counter()` & co.) when the program runs, which an exported "
                  "graph cannot: a trace would keep the time read while exporting as a constant",
}


def _detach(tensor, *owner):
    return tensor.detach()


# Kernels a tracer runs in place of the eager ones, computing the same
# values: `.data` of a tensor held as a constant (a plain tensor attribute)
# makes torch.export lift a fake tensor as a constant, which it then refuses;
# detach() gives the same tensor.
_TRACED_KERNELS = {"torch.Tensor.data": _detach}


def _traced(opdef, op_type):
    kernel = _TRACED_KERNELS.get(op_type)
    if kernel is not None:
        return dataclasses.replace(opdef, kernel=kernel)
    return traced_numpy.traced(opdef, op_type)


def untraceable(ops):
    """(op, reason) of the first op of `ops` in UNTRACEABLE, or None."""
    for op in ops:
        if op.type in UNTRACEABLE:
            return op, UNTRACEABLE[op.type]
        if op.type.startswith("numpy.") and not traced_numpy.has_torch_form(op.type):
            return op, ("NumPy computes it outside torch (ops/numpy_ufuncs.py), so torch's tracers see only an "
                        "empty tensor of the result's shape, and it has no torch form (runtime/traced_numpy.py); "
                        "compute it with the torch function instead")
    return None


def region_function(block, ops, inputs, outputs, trace_hook=None, op_defs=get_op_def):
    """A CompiledBlock whose `fn(*values of inputs)` returns the tuple of
    values of `outputs`, running `ops` (ops of `block`, none with a
    sub-block) in order; `trace_hook(op)`, if given, is called before each
    op; `op_defs`: the op table (a tracer's may swap kernels)."""
    program = Program()
    target = program.global_block()
    names = set(inputs) | set(outputs)
    for op in ops:
        if op.sub_blocks():
            raise ValueError(f"op {op.type!r} has a sub-block; a region holds straight-line ops only")
        names.update(op.input_names)
        names.update(op.output_names)
    for name in sorted(names):
        var = block.find_var(name)
        if var.kind == TENSOR_ARRAY:
            raise ValueError(f"variable {name!r} is a tensor array; a region holds tensors and numbers only")
        # Every variable is a plain local: parameters come in as arguments.
        copy = target.create_var(name, shape=var.dims, dtype=var.dtype_name, kind=var.kind,
                                 stop_gradient=var.stop_gradient)
        copy.is_data = name in inputs
    for op in ops:
        target.append_op(op.type, op.inputs, op.outputs, op.attrs, op.origin)
    return compile_program(program, list(inputs), list(outputs), lambda t: _traced(op_defs(t), t),
                           trace_hook=trace_hook)


def failing_op(compiled, error):
    """The op of `compiled` (from `region_function`) whose line `error`'s
    traceback passes through last, or None."""
    found, seen = None, set()
    while error is not None and id(error) not in seen:  # torch wraps errors: follow the chain
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code is compiled.fn.__code__:
                found = compiled.line_ops.get(tb.tb_lineno, found)
            tb = tb.tb_next
        error = error.__cause__ or error.__context__
    return found


# Tensor methods and torch functions whose result may share memory with their input.
_VIEW_METHODS = {"view", "view_as", "__getitem__", "transpose", "permute", "t", "T", "mT", "narrow", "select",
                 "expand", "expand_as", "squeeze", "unsqueeze", "flatten", "unflatten", "reshape", "reshape_as",
                 "chunk", "split", "tensor_split", "unbind", "diagonal", "as_strided", "detach", "unfold",
                 "movedim", "moveaxis", "swapaxes", "swapdims", "real", "imag", "view_as_real", "view_as_complex",
                 "contiguous", "alias", "indices", "values", "data"}


def viewed(op):
    """The name whose memory `op`'s results may share, or None."""
    if op.type.rsplit(".", 1)[-1] in _VIEW_METHODS and op.input("X"):
        return op.input("X")[0]
    return None


def view_bases(ops):
    """{result of a view op: the name it views} over `ops` and their sub-blocks."""
    bases = {}
    stack = list(ops)
    while stack:
        op = stack.pop()
        base = viewed(op)
        if base is not None:
            bases.update((out, base) for out in op.output("Out") if out != base)
        for sub in op.sub_blocks():
            stack += sub.ops
    return bases


def written_through(op, bases):
    """The names a mutating `op` may write: its first input and, through
    `bases` (`view_bases`), every tensor that input is a view of
    (`y = x.data; y.copy_(v)` writes `x`)."""
    if not get_op_def(op.type).mutates or not op.input("X"):
        return []
    names, name = [], op.input("X")[0]
    while name is not None and name not in names:
        names.append(name)
        name = bases.get(name)
    return names


def written_roots(ops):
    """Every name the mutating ops of `ops` (sub-blocks included) may write,
    directly or through a view made among these ops, in first-seen order."""
    bases, found, stack = view_bases(ops), {}, list(reversed(ops))
    while stack:
        op = stack.pop()
        found.update(dict.fromkeys(written_through(op, bases)))
        for sub in reversed(op.sub_blocks()):
            stack += reversed(sub.ops)
    return list(found)


def outer_writes(block, op):
    """The names of `block`'s scope that the sub-blocks of `op` (a cond or
    while) write in place, directly or through a view made there. In a
    program the write reaches the tensor itself; exported values are
    immutable, so the exported branch or loop yields their new values, as
    it yields the op's outputs."""
    local, stack = set(), list(op.sub_blocks())
    while stack:
        sub = stack.pop()
        local.update(sub.vars)
        for inner in sub.ops:
            stack += inner.sub_blocks()
    names = written_roots([inner for sub in op.sub_blocks() for inner in sub.ops])
    return [n for n in names if n not in local and _visible(block, n)]


def _visible(block, name):
    try:
        block.find_var(name)
        return True
    except KeyError:
        return False


def state_write(program):
    """(op, name) of the first op that writes in place (directly or through
    a view) a parameter or buffer that the program also reads, or None. An
    exported model keeps no state between runs: with such a write (ActNorm's
    data-dependent init, a counter that scales the output) its later runs
    would differ from the model's later calls. State only written
    (`num_batches_tracked += 1` of a train-mode batch norm) changes no
    later result, so dropping the write is exact."""
    persistable = {v.name for v in program.persistable_vars()}
    ops = [op for b in program.blocks for op in b.ops]
    bases = view_bases(ops)
    written = [written_through(op, bases) for op in ops]
    read = {n for op, names in zip(ops, written) for n in op.input_names if n not in names[:1]}
    for op, names in zip(ops, written):
        state = [n for n in names if n in persistable and n in read]
        if state:
            return op, state[-1]
    return None


class AliasingError(ValueError):
    """`op` writes in place a tensor from outside its region that a view may share."""

    def __init__(self, message, op):
        super().__init__(message)
        self.op = op


def check_aliasing(program, ops, written_inputs):
    """Refuse an in-place write to a tensor from outside the region that a
    view made outside the region may share (a view was made of it, or it is
    one): the write would reach the other tensor in eager, but regions
    exchange values, not memory. (Views inside the region are traced with
    the write, and come out right.)"""
    if not written_inputs:
        return
    views, inside = set(), {id(op) for op in ops}
    for block in program.blocks:
        for op in block.ops:
            if id(op) not in inside and viewed(op) is not None:
                views.update(op.input("X")[:1] + op.output("Out"))
    bases = view_bases(ops)
    for op in ops:
        for name in written_through(op, bases):
            if name in written_inputs and name in views:
                raise AliasingError(f"it writes {name!r} in place, which shares memory with a view, across a "
                                    "branch or loop; exported values cannot alias: write `x = x.op(...)` "
                                    "instead of `x.op_(...)`", op)
