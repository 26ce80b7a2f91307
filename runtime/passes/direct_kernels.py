"""Python wrappers of `torch.nn.functional` replaced by the C kernel they call.

`F.embedding`, `F.relu`, `F.max_pool2d`, `F.dropout` and `F.softmax` are
Python functions: each call checks for `__torch_function__` overrides,
normalises its arguments and then calls one C function (`torch.embedding`,
`torch.relu`, ...). When the arguments that steer the wrapper are constants
of the op, the program calls that C function with the arguments the
wrapper would pass: the same kernel on the same values (bit-identical, the
same RNG draws for dropout), about 0.5-1 us less per call.

A rewrite is made only when the wrapper would take exactly one path for
every run, decided by constants:

  - `F.embedding(input, weight, padding_idx, max_norm, ...)`: `max_norm`
    None (the renormalising path writes the weight); `padding_idx` None
    (passed as -1) or a constant that the wrapper would accept, made
    non-negative as the wrapper does with the weight's static first size;
  - `F.relu(input, inplace=False)` -> `torch.relu(input)`;
  - `F.max_pool2d(...)` with `return_indices=False` -> `torch.max_pool2d`
    (a `stride` of None is passed as `[]`, as the wrapper does);
  - `F.dropout(input, p, training, inplace=False)` with a constant `p` in
    [0, 1] (the wrapper raises otherwise) -> `torch.dropout(input, p, training)`;
  - `F.softmax(input, dim, dtype=None)` with a constant int `dim` ->
    `Tensor.softmax(input, dim)`.

What the wrapper's `__torch_function__` check would do for a tensor
subclass with an override, the C function does too (it dispatches the
override with itself as the function).

Before:                                                 After:
    tmp_1 = torch.nn.functional.embedding(                  tmp_1 = torch.embedding(weight, tok, -1,
        tok, weight, padding_idx=None, max_norm=None,           False, False)
        norm_type=2.0, scale_grad_by_freq=False,
        sparse=False)
    tmp_2 = torch.nn.functional.relu(tmp_1, inplace=False)  tmp_2 = torch.relu(tmp_1)
"""

from ..attrs import InputRef
from ..aten import bind_args
from ._util import all_ops

_MISSING = object()

# op type -> (new op type, parameter names, defaults of the trailing parameters, rewrite)
_SIGNATURES = {}


def _rewrite(op_type, new_type, names, defaults):
    def register(fn):
        _SIGNATURES[op_type] = (new_type, names, defaults, fn)
        return fn
    return register


def _const(value):
    """Whether `value` is an argument fixed by the program (no input in it)."""
    if isinstance(value, InputRef):
        return False
    if isinstance(value, (list, tuple)):
        return all(_const(v) for v in value)
    if isinstance(value, slice):
        return all(_const(v) for v in (value.start, value.stop, value.step))
    return True


@_rewrite("torch.nn.functional.embedding", "torch.embedding",
          ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse"),
          (None, None, 2.0, False, False))
def _embedding(a, weight_var):
    if a["max_norm"] is not None or not _const(a["padding_idx"]) or not _const(a["scale_grad_by_freq"]) \
            or not _const(a["sparse"]):
        return None
    pad = a["padding_idx"]
    if pad is None:
        pad = -1
    elif not isinstance(pad, int) or isinstance(pad, bool):
        return None
    else:
        rows = weight_var.dims[0] if weight_var is not None and weight_var.dims else -1
        if rows < 0:
            return None  # the wrapper's range check needs the size: keep the wrapper
        if pad > 0 and pad >= rows or pad < 0 and pad < -rows:
            return None  # the wrapper raises: keep it, so the run raises as eager does
        pad = pad if pad >= 0 else rows + pad
    return [a["weight"], a["input"], pad, a["scale_grad_by_freq"], a["sparse"]]


@_rewrite("torch.nn.functional.relu", "torch.relu", ("input", "inplace"), (False,))
def _relu(a, _):
    return [a["input"]] if a["inplace"] is False else None


@_rewrite("torch.nn.functional.max_pool2d", "torch.max_pool2d",
          ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"),
          (None, 0, 1, False, False))
def _max_pool2d(a, _):
    if a["return_indices"] is not False:
        return None
    stride = [] if a["stride"] is None else a["stride"]
    return [a["input"], a["kernel_size"], stride, a["padding"], a["dilation"], a["ceil_mode"]]


@_rewrite("torch.nn.functional.dropout", "torch.dropout", ("input", "p", "training", "inplace"),
          (0.5, True, False))
def _dropout(a, _):
    p = a["p"]
    if a["inplace"] is not False or not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0 \
            or not isinstance(a["training"], bool):
        return None
    return [a["input"], p, a["training"]]


@_rewrite("torch.nn.functional.softmax", "torch.Tensor.softmax", ("input", "dim", "_stacklevel", "dtype"),
          (None, 3, None))
def _softmax(a, _):
    dim = a["dim"]
    if a["dtype"] is not None or not isinstance(dim, int) or isinstance(dim, bool):
        return None
    return [a["input"], dim]


def run(ctx):
    for block, op in all_ops(ctx.program):
        spec = _SIGNATURES.get(op.type)
        if spec is None or "args" not in op.attrs or set(op.inputs) != {"X"}:
            continue
        new_type, names, defaults, rewrite = spec
        bound = bind_args(op, names, defaults)
        if bound is None:
            continue
        weight = bound.get("weight")
        weight_var = None
        if isinstance(weight, InputRef):
            name = op.input("X")[weight.index]
            weight_var = next((b.vars[name] for b in ctx.program.blocks if name in b.vars), None)
        args = rewrite(bound, weight_var)
        if args is not None:
            op.type = new_type
            op.attrs = {**op.attrs, "args": args, "kwargs": {}}
