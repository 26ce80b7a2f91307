"""`linear` on a parameter as `addmm` with the weight transposed once
(fast level, calls with grad mode off).

`F.linear(x, w, b)` with a 2-d `x` is, inside PyTorch, `addmm(b, x, w.t())`
(`mm(x, w.t())` without a bias): one `t()` view per call and layer. Here
the weight's transpose is a derived argument of the generated function,
made by the caller once and reused while it stays valid (the same tensor,
storage, version and `requires_grad`, and the same grad/inference mode;
see `ConcreteProgram._transposes` in d2s/static_function.py), and the op
calls `addmm` / `mm` on it directly: the very kernels and inputs `linear`
uses, so values are bit-identical on CPU. Only the variant for calls with
grad mode off has it: with autograd on, a view shared between calls would
sum a weight's gradient contributions in another order, and after an
optimizer step autograd rebuilds such a view's backward as a slow generic
`as_strided` one (measured: the training step 10% slower). It is a
fast-level pass because the view outlives a call.

Only weights that are parameters of the program (bound persistables, never
feeds), 2-d inputs and programs with no in-place writes of their own.

Before:                                       After (w_t: a derived argument, w.t()):
    tmp_0 = torch.nn.functional.linear(x, w, b)   tmp_0 = torch.addmm(b, x, w_t)
"""

from ..attrs import InputRef
from ..effects import writes_tensors
from ..run_modes import has_mode
from ._util import find_var


def run(ctx):
    program = ctx.program
    if writes_tensors(program.blocks, ctx.get_op_def):
        return
    derived = {}  # weight name -> its transpose's name
    for block in program.blocks:
        for op in block.ops:
            spec = _linear_args(op, program)
            if spec is None:
                continue
            x, w, b = spec
            if w not in derived:
                var = find_var(program, w)
                name = program.unique_name(w + "_t")
                program.global_block().create_var(name=name, shape=tuple(reversed(var.dims)), dtype=var.dtype)
                derived[w] = name
            ins = [x, derived[w]] + ([b] if b is not None else [])
            op.type = "torch.addmm" if b is not None else "torch.mm"
            op.inputs = {"X": ins}
            refs = [InputRef(i) for i in range(len(ins))]
            op.attrs = {**op.attrs, "args": tuple(refs[2:] + refs[:2]) if b is not None else tuple(refs),
                        "kwargs": {}}
    # A cond/while lists the outer names its sub-blocks read.
    names = set(derived.values())
    for block in program.blocks:
        for op in block.ops:
            if op.sub_blocks():
                read = names & set(_reads(op))
                op.inputs["X"] = op.input("X") + sorted(read - set(op.input("X")))
    # The codegen takes these as trailing arguments: name -> source parameter.
    program.derived_transposes = {t: w for w, t in derived.items()}


def _reads(op):
    for sub in op.sub_blocks():
        for inner in sub.ops:
            yield from inner.input_names
            yield from _reads(inner)


def _linear_args(op, program):
    """(x, weight, bias or None) of a `linear` this pass rewrites, else None."""
    if op.type != "torch.nn.functional.linear" or op.attrs.get("kwargs") or has_mode(op):
        return None
    args, ins = op.attrs.get("args", ()), op.input("X")
    if not 2 <= len(args) <= 3 or not all(isinstance(a, InputRef) for a in args[:2]):
        return None
    bias = args[2] if len(args) == 3 else None
    if bias is not None and not isinstance(bias, InputRef):
        return None
    x, w = find_var(program, ins[args[0].index]), find_var(program, ins[args[1].index])
    b = find_var(program, ins[bias.index]) if bias is not None else None
    if (x is None or w is None or len(x.dims) != 2 or len(w.dims) != 2 or not w.persistable
            or w.name not in program.bound or (b is not None and len(b.dims) != 1)):
        return None
    return x.name, w.name, (b.name if b is not None else None)
