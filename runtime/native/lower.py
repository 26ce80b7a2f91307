"""Which program ops a native segment runs, and how (see segment.cpp).

Each entry maps an ATen operator (an op's canonical name, `OpDef.aten`:
every spelling of `add` reaches the one entry; for an op that calls no
operator with its own arguments, such as `F.cross_entropy`, its type) to an
opcode of segment.cpp
and builds its operands from the op's arguments exactly as torch's Python
binding reads them (a wrapper's through runtime/aten.py `bind`), so the C++
side makes the binding's ATen call:

  - a tensor argument is a register (`reg`); a list of them `regs`;
  - a Python number where the binding takes a Tensor (`x + 1`, `x * 0.5`:
    add, sub, mul, div read numbers as tensors) is a wrapped-number 0-d
    tensor (`wrapped`), exactly what the binding makes; where it takes a
    Scalar (`x > 0`, `x ** 2`) it is a Scalar of the same Python type;
  - an `int[2]` parameter given one int is that int twice, as the binding
    expands it.

An op that does not fit its entry (other keyword arguments, a tensor where a
constant is expected, a string padding, ...) is simply not lowered: it stays
a Python statement. No op here draws random numbers, and the in-place ones
(`INPLACE`) join a segment only when they write a tensor the segment made
(`fresh_names`), so a segment that falls back to Python has done nothing
observable.

Before (Python statements):                After (one segment):
    v_tmp_0 = k_linear(v_x, v_w, v_b)          v_tmp_2 = seg_1(v_x, v_w, v_b)
    v_tmp_1 = k_tanh(v_tmp_0)                  # linear(r0, r1, r2) -> r3; tanh(r3) -> r4;
    v_tmp_2 = k___add__(v_x, v_tmp_1)          # add(r0, r4, 1) -> r5; outputs [r5]
"""

import torch

from ..aten import bind
from ..attrs import InputRef, OutputRef
from ..ir import TENSOR
from ..optable import get_op_def
from ..run_modes import has_mode
from . import families

_INT64 = 2 ** 63


class Ref:
    """A tensor input of the op, by variable name (a register once placed)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class Refs:
    """A list of tensor inputs (a TensorList argument)."""

    __slots__ = ("names",)

    def __init__(self, names):
        self.names = list(names)


class _NoFit(Exception):
    """The op's arguments do not fit its entry: keep it in Python."""


# -- operand builders: each returns ("kind", value) or raises _NoFit --------------------

class _Args:
    """The bound arguments of one op, read as the binding reads them."""

    def __init__(self, bound, inputs, tensor_names, block=None, fused=False):
        self.bound = bound
        self.inputs = inputs
        self.tensor_names = tensor_names
        self.block = block  # where the op is: its inputs' variables (`var`)
        self.fused = fused  # the fast level's one autograd node per segment call

    def var(self, key):
        """The program's variable of a tensor argument (its dtype and rank:
        fixed for the program)."""
        return self.block.find_var(self._name(self.bound[key]))

    def _name(self, value):
        if not isinstance(value, InputRef):
            raise _NoFit
        name = self.inputs[value.index]
        if name not in self.tensor_names:
            raise _NoFit  # a tensor array, a Python value: not a plain tensor
        return name

    def tensor(self, key):
        return ("reg", Ref(self._name(self.bound[key])))

    def opt_tensor(self, key):
        return ("none", None) if self.bound[key] is None else self.tensor(key)

    def tensor_or_wrapped(self, key):
        """A Tensor parameter that the binding fills from a number too."""
        value = self.bound[key]
        return ("wrapped", _number(value)) if not isinstance(value, InputRef) else self.tensor(key)

    def tensor_or_scalar(self, key):
        """Overloads on Tensor and Scalar: a number picks the Scalar one."""
        value = self.bound[key]
        return ("scalar", _number(value)) if not isinstance(value, InputRef) else self.tensor(key)

    def tensors(self, key):
        value = self.bound[key]
        if not isinstance(value, (list, tuple)) or not value:
            raise _NoFit
        return ("regs", Refs(self._name(v) for v in value))

    def scalar(self, key):
        return ("scalar", _number(self.bound[key]))

    def integer(self, key):
        value = self.bound[key]
        if type(value) is not int or not -_INT64 <= value < _INT64:
            raise _NoFit
        return ("scalar", value)

    def opt_integer(self, key):
        return ("none", None) if self.bound[key] is None else self.integer(key)

    def boolean(self, key):
        if type(self.bound[key]) is not bool:
            raise _NoFit
        return ("scalar", self.bound[key])

    def floating(self, key):
        value = self.bound[key]
        if type(value) not in (int, float):
            raise _NoFit
        return ("scalar", float(value))

    def ints(self, key, size=None):
        """An int list; with `size` (an `int[size]` parameter) one int stands for `size` copies."""
        value = self.bound[key]
        if type(value) is int and size is not None:
            value = [value] * size
        if isinstance(value, torch.Size):
            value = list(value)
        if not isinstance(value, (list, tuple)) or any(type(v) is not int for v in value):
            raise _NoFit
        return ("ints", [int(v) for v in value])

    def dims(self, key):
        """`dim` of a reduction: an int or a sequence of ints."""
        value = self.bound[key]
        return ("ints", [value]) if type(value) is int else self.ints(key)

    def opt_dtype(self, key):
        value = self.bound[key]
        if value is None:
            return ("none", None)
        if not isinstance(value, torch.dtype):
            raise _NoFit
        return ("dtype", value)

    def string(self, key):
        if type(self.bound[key]) is not str:
            raise _NoFit
        return ("str", self.bound[key])

    def equals(self, key, *allowed):
        if not any(self.bound[key] is a or type(self.bound[key]) is type(a) and self.bound[key] == a
                   for a in allowed):
            raise _NoFit


def _number(value):
    if type(value) not in (bool, int, float) or type(value) is int and not -_INT64 <= value < _INT64:
        raise _NoFit
    return value


# -- the table ---------------------------------------------------------------------------

# canonical name (OpDef.canonical: the ATen operator, else the op type) ->
# (parameter names, defaults of the trailing ones, build(args) -> (opcode,
# operands)). Every op type calling that operator (`torch.add`, `x.add`,
# `x + y`; `F.relu(x)` through its wrapper) lowers through the one entry.
TABLE = {}


def _entry(atens, names, defaults=()):
    def register(build):
        for aten in atens.split():
            TABLE[aten] = (tuple(names.split()), tuple(defaults), build)
        return build
    return register


def _unary(opcode):
    _entry(opcode, "input")(lambda a: (opcode, [a.tensor("input")]))


for _name in families.UNARY + ("t", "detach", "contiguous", "silu"):
    _unary(_name)


@_entry("gelu", "input approximate", ("none",))
def _gelu(a):
    return "gelu", [a.tensor("input"), a.string("approximate")]


def _arith(opcode, aten, alpha):
    names = "input other alpha" if alpha else "input other"

    def build(a):
        ops = [a.tensor("input"), a.tensor_or_wrapped("other")]
        return opcode, ops + ([a.scalar("alpha")] if alpha else [])
    _entry(aten, names, (1,) if alpha else ())(build)


_arith("add", "add", alpha=True)
_arith("sub", "sub", alpha=True)
_arith("rsub", "rsub", alpha=True)
_arith("mul", "mul", alpha=False)
_arith("div", "div", alpha=False)


def _binary_tensors(opcode):
    _entry(opcode, "input other")(lambda a: (opcode, [a.tensor("input"), a.tensor("other")]))


for _name in ("matmul", "mm", "bmm", "maximum", "minimum", "logical_and", "logical_or"):
    _binary_tensors(_name)


def _tensor_or_scalar(opcode, aten):
    _entry(aten, "input other")(lambda a: (opcode, [a.tensor("input"), a.tensor_or_scalar("other")]))


for _name in ("pow", "eq", "ne", "lt", "le", "gt", "ge"):
    _tensor_or_scalar(_name, _name)
_tensor_or_scalar("and_", "__and__")
_tensor_or_scalar("or_", "__or__")
_tensor_or_scalar("xor_", "__xor__")


@_entry("where", "condition input other")
def _where(a):
    return "where", [a.tensor("condition"), a.tensor("input"), a.tensor("other")]


@_entry("masked_fill", "input mask value")
def _masked_fill(a):
    return "masked_fill", [a.tensor("input"), a.tensor("mask"), a.tensor_or_scalar("value")]


def _sum_like(name):
    @_entry(name, "input dim keepdim dtype", (None, False, None))
    def build(a):
        if a.bound["dim"] is None:
            a.equals("keepdim", False)
            return name, [a.tensor("input"), a.opt_dtype("dtype")]
        return name + "_dim", [a.tensor("input"), a.dims("dim"), a.boolean("keepdim"), a.opt_dtype("dtype")]


_sum_like("sum")
_sum_like("mean")


def _amax_like(name):
    @_entry(name, "input dim keepdim", ((), False))
    def build(a):
        return name, [a.tensor("input"), a.dims("dim"), a.boolean("keepdim")]


_amax_like("amax")
_amax_like("amin")


def _all_like(name):
    @_entry(name, "input dim keepdim", (None, False))
    def build(a):
        if a.bound["dim"] is None:
            a.equals("keepdim", False)
            return name, [a.tensor("input")]
        return name + "_dim", [a.tensor("input"), a.integer("dim"), a.boolean("keepdim")]


_all_like("all")
_all_like("any")


def _arg_reduce(name):
    @_entry(name, "input dim keepdim", (None, False))
    def build(a):
        return name, [a.tensor("input"), a.opt_integer("dim"), a.boolean("keepdim")]


_arg_reduce("argmax")
_arg_reduce("argmin")


@_entry("max", "input")
def _max_all(a):
    return "max_all", [a.tensor("input")]


@_entry("min", "input")
def _min_all(a):
    return "min_all", [a.tensor("input")]


def _shape_args(op, first):
    """`x.view(2, 3)` and `x.view((2, 3))` alike: the int list after the tensor."""
    args = op.attrs["args"]
    if op.attrs.get("kwargs") or len(args) < first + 1:
        return None
    rest = list(args[first:])
    if len(rest) == 1 and isinstance(rest[0], (list, tuple, torch.Size)):
        rest = list(rest[0])
    return {"input": args[0], "shape": rest}


# Tensor methods taking their int list as varargs too (`x.view(2, 3)`).
_VARARG_SHAPES = {"view", "reshape", "permute", "expand"}


@_entry("reshape", "input shape")
def _reshape(a):
    return "reshape", [a.tensor("input"), a.ints("shape")]


@_entry("permute", "input dims")
def _permute(a):
    return "permute", [a.tensor("input"), a.ints("dims")]


@_entry("flatten", "input start_dim end_dim", (0, -1))
def _flatten(a):
    return "flatten", [a.tensor("input"), a.integer("start_dim"), a.integer("end_dim")]


@_entry("unsqueeze", "input dim")
def _unsqueeze(a):
    return "unsqueeze", [a.tensor("input"), a.integer("dim")]


@_entry("squeeze", "input dim", (None,))
def _squeeze(a):
    if a.bound["dim"] is None:
        return "squeeze", [a.tensor("input")]
    return "squeeze_dim", [a.tensor("input"), a.integer("dim")]


@_entry("transpose", "input dim0 dim1")
def _transpose(a):
    return "transpose", [a.tensor("input"), a.integer("dim0"), a.integer("dim1")]


@_entry("select", "input dim index")
def _select(a):
    return "select", [a.tensor("input"), a.integer("dim"), a.integer("index")]


@_entry("linear", "input weight bias", (None,))
def _linear(a):
    return "linear", [a.tensor("input"), a.tensor("weight"), a.opt_tensor("bias")]


@_entry("addmm", "input mat1 mat2")
def _addmm(a):
    return "addmm", [a.tensor("input"), a.tensor("mat1"), a.tensor("mat2")]


def _conv(name, size):
    @_entry(name, "input weight bias stride padding dilation groups",
            (None, 1, 0, 1, 1))
    def build(a):
        return name, [a.tensor("input"), a.tensor("weight"), a.opt_tensor("bias"), a.ints("stride", size),
                      a.ints("padding", size), a.ints("dilation", size), a.integer("groups")]


_conv("conv1d", 1)
_conv("conv2d", 2)


@_entry("max_pool2d", "input kernel_size stride padding dilation ceil_mode", ((), 0, 1, False))
def _max_pool2d(a):
    return "max_pool2d", [a.tensor("input"), a.ints("kernel_size", 2), a.ints("stride", 2),
                          a.ints("padding", 2), a.ints("dilation", 2), a.boolean("ceil_mode")]


@_entry("avg_pool2d", "input kernel_size stride padding ceil_mode count_include_pad divisor_override",
        (None, 0, False, True, None))
def _avg_pool2d(a):
    stride = ("ints", []) if a.bound["stride"] is None else a.ints("stride", 2)
    return "avg_pool2d", [a.tensor("input"), a.ints("kernel_size", 2), stride, a.ints("padding", 2),
                          a.boolean("ceil_mode"), a.boolean("count_include_pad"), a.opt_integer("divisor_override")]


@_entry("adaptive_avg_pool2d", "input output_size")
def _adaptive_avg_pool2d(a):
    return "adaptive_avg_pool2d", [a.tensor("input"), a.ints("output_size", 2)]


@_entry("embedding", "weight input padding_idx scale_grad_by_freq sparse", (-1, False, False))
def _embedding(a):
    return "embedding", [a.tensor("weight"), a.tensor("input"), a.integer("padding_idx"),
                         a.boolean("scale_grad_by_freq"), a.boolean("sparse")]


def _cell(name):
    @_entry(name, "input hx w_ih w_hh b_ih b_hh", (None, None))
    def build(a):
        hx = a.tensors("hx") if name == "lstm_cell" else a.tensor("hx")
        return name, [a.tensor("input"), hx, a.tensor("w_ih"), a.tensor("w_hh"), a.opt_tensor("b_ih"),
                      a.opt_tensor("b_hh")]


for _name in ("gru_cell", "lstm_cell", "rnn_tanh_cell", "rnn_relu_cell"):
    _cell(_name)


def _softmax_like(name):
    @_entry(name, "input dim dtype", (None,))
    def build(a):
        return name, [a.tensor("input"), a.integer("dim"), a.opt_dtype("dtype")]


_softmax_like("softmax")
_softmax_like("log_softmax")


# F.cross_entropy's `reduction` as it passes it on (torch.nn._reduction.get_enum).
_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


# F.cross_entropy is not its operator's binding (`reduction` is a name there,
# an int in cross_entropy_loss's schema), so it has no canonical ATen name:
# the entry is keyed by its type and binds the wrapper's own parameters.
# Without the legacy size_average/reduce it calls cross_entropy_loss(input,
# target, weight, get_enum(reduction), ignore_index, label_smoothing). The
# last operand says whether the fast level's one node can hold it (segment.cpp
# fused_grad_kind): logits (N, C) and int64 class indices (N), no weight, no
# label smoothing. Where it cannot, the fast level leaves it a Python
# statement, which ends the segment before it: in the segment, it would take
# the segment's one node from the ops before it.
@_entry("torch.nn.functional.cross_entropy",
        "input target weight size_average ignore_index reduce reduction label_smoothing",
        (None, None, -100, None, "mean", 0.0))
def _cross_entropy(a):
    a.equals("size_average", None)
    a.equals("reduce", None)
    reduction = a.bound["reduction"]
    if type(reduction) is not str or reduction not in _REDUCTIONS:
        raise _NoFit  # the Python path raises eager's error
    operands = [a.tensor("input"), a.tensor("target"), a.opt_tensor("weight"), ("scalar", _REDUCTIONS[reduction]),
                a.integer("ignore_index"), a.floating("label_smoothing")]
    logits, classes = a.var("input"), a.var("target")
    fusable = (a.bound["weight"] is None and operands[5][1] == 0.0 and logits.dim() == 2 and
               logits.dtype.is_floating_point and classes.dim() == 1 and classes.dtype == torch.int64)
    if a.fused and not fusable:
        raise _NoFit
    return "cross_entropy", operands + [("scalar", fusable)]


@_entry("layer_norm", "input normalized_shape weight bias eps cudnn_enable", (None, None, 1e-5, True))
def _layer_norm(a):
    return "layer_norm", [a.tensor("input"), a.ints("normalized_shape"), a.opt_tensor("weight"),
                          a.opt_tensor("bias"), a.floating("eps"), a.boolean("cudnn_enable")]


def _join(name):
    @_entry(name, "tensors dim", (0,))
    def build(a):
        return name, [a.tensors("tensors"), a.integer("dim")]


_join("cat")
_join("stack")


# In place (the `inplace` pass, grad mode off): the segment runs them only on
# a temporary an earlier op of the same segment made (see `writes`), so a
# segment that falls back has still written nothing the Python path reads.
INPLACE = set()  # opcodes, and the canonical names of their ops
for _name in families.UNARY_INPLACE:
    _unary(_name + "_")
    INPLACE.add(_name + "_")
for _name, _alpha in (("add", True), ("sub", True), ("mul", False), ("div", False)):
    _arith(_name + "_", _name + "_", alpha=_alpha)
    INPLACE.add(_name + "_")


def writes(op, lowered):
    """The variable an in-place op writes, or None for a pure op."""
    opcode, operands = lowered
    return operands[0][1].name if opcode in INPLACE else None


# Results that may share storage with an operand (a view, or the operand
# itself: `contiguous()` of a contiguous tensor).
ALIASING = {"contiguous", "t", "detach", "view", "reshape", "flatten", "unsqueeze", "squeeze", "squeeze_dim",
            "transpose", "permute", "expand", "select"}


def fresh_names(op, lowered):
    """The names `op` leaves holding a tensor that only the segment can see:
    results of ops that make a new tensor, and an in-place write into such a
    tensor. An in-place op may only write one of these (segment.cpp's
    fallback contract: nothing the Python path reads has been written)."""
    opcode, _ = lowered
    if opcode in INPLACE:  # codegen ends the run before one that writes anything else
        return set(op.output_names)
    return set() if opcode in ALIASING else set(out_names(op))


def _factory(op, name):
    args, kwargs = op.attrs["args"], dict(op.attrs.get("kwargs") or {})
    dtype = kwargs.pop("dtype", None)
    if kwargs or not args:
        return None
    size = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple, torch.Size)) else list(args)
    if any(type(v) is not int for v in size) or dtype is not None and not isinstance(dtype, torch.dtype):
        return None
    return name, [("ints", size), ("none", None) if dtype is None else ("dtype", dtype)]


def lower(op, tensor_names, once=False, fused=False):
    """(opcode name, operands) for `op`, or None when a segment cannot hold it.
    `tensor_names`: the variables known to be plain tensors. `once`: lower a
    hoisted invariant too (a flow runs it alone, while its result is unset).
    `fused`: the segments record one autograd node per call (the fast level)."""
    if "args" not in op.attrs or set(op.inputs) - {"X"} or has_mode(op) or \
            op.attrs.get("once") and not once:
        return None
    try:
        opdef = get_op_def(op.type)
    except KeyError:
        return None
    name = opdef.canonical  # the ATen operator, or the type of an op that calls none exactly
    out = op.attrs.get("out")
    in_place = out is None and name in INPLACE
    if not isinstance(out, OutputRef) and name != "lstm_cell" and not in_place:
        return None
    if name == "lstm_cell" and not _pair_out(out):
        return None
    if name in ("zeros", "ones"):
        return _factory(op, name)
    inputs = op.input("X") if "X" in op.inputs else []
    if name in _VARARG_SHAPES and op.type.startswith("torch.Tensor."):
        bound = _shape_args(op, 1)
        if bound is None:
            return None
        a = _Args(bound, inputs, tensor_names)
        try:
            return name, [a.tensor("input"), a.ints("shape")]
        except _NoFit:
            return None
    entry = TABLE.get(name)
    if entry is None:
        return None
    names, defaults, build = entry
    bound = bind(op, opdef, names, defaults)
    if bound is None:
        return None
    try:
        return build(_Args(bound, inputs, tensor_names, op.block, fused))
    except _NoFit:
        return None


def _pair_out(out):
    items = getattr(out, "items", out)
    return isinstance(items, tuple) and len(items) == 2 and items == (OutputRef(0), OutputRef(1))


def tensor_names(program):
    """Names of variables that hold plain tensors when the program runs."""
    return {name for block in program.blocks for name, var in block.vars.items() if var.kind == TENSOR}


def out_names(op):
    names = op.output("Out")
    out = op.attrs.get("out")
    if out is None:
        return []
    if isinstance(out, OutputRef):
        return [names[out.index]]
    items = getattr(out, "items", out)
    return [names[o.index] for o in items]
