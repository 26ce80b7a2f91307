"""The ONNX lowering of each op type: `LOWERINGS[op_type](graph, op, block)`
appends nodes to `graph` and returns the ONNX value(s) of the op's `Out`
outputs (None for an op without outputs).

Lowerings are written for the ops the tested models use (the quickstart
model, the digits classifier, the LSTM tagger and the GRU greedy decoder of
examples/) and their close relatives; an op without one is an
`OnnxExportError` naming the op and the user's line. torch.onnx's own
exporter is not used per op: it needs the dynamo stack (onnxscript) and
is neither offline-safe nor deterministic enough here.

Arguments come from the op's call attributes (`args`, `kwargs`): `$in`
references become ONNX values, everything else stays a Python constant and
becomes a Constant node of the dtype the operation runs in, as torch's type
promotion would pick it.
"""

import ast

import torch

from .attrs import InputRef
from .ir import TENSOR_ARRAY, dtype_name
from .onnx_export import op_error


class Value:
    """An ONNX value standing for the program variable `var`."""

    def __init__(self, name, var):
        self.name = name
        self.var = var

    @property
    def dtype(self):
        return self.var.dtype_name


class Call:
    """An op's call arguments bound to parameter names, `$in` refs as Values."""

    def __init__(self, graph, op, block, params):
        self.graph, self.op, self.block = graph, op, block
        resolve = lambda v: self._resolve(v)
        args = [resolve(a) for a in op.attrs.get("args", ())]
        kwargs = {k: resolve(v) for k, v in op.attrs.get("kwargs", {}).items()}
        self.values = {}
        names = [p.split("=")[0] for p in params]
        defaults = {p.split("=")[0]: ast.literal_eval(p.split("=")[1]) for p in params if "=" in p}
        starred = [i for i, n in enumerate(names) if n.startswith("*")]
        if starred:
            # `*size`: it takes the remaining positional arguments; the
            # parameters after it are keyword-only.
            at = starred[0]
            self.values[names[at][1:]] = tuple(args[at:])
            args = args[:at]
            names = names[:at] + names[at + 1:]
            positional = at
        else:
            positional = len(names)
        if len(args) > positional:
            raise op_error(op, f"takes at most {positional} positional arguments here, got {len(args)}")
        self.values.update(zip(names, args))
        for key, value in kwargs.items():
            if key.startswith("_"):
                continue  # torch internals such as _stacklevel
            if key not in names and not (names and key in defaults):
                raise op_error(op, f"argument {key!r} is not supported by its ONNX lowering")
            self.values[key] = value
        for key, value in defaults.items():
            self.values.setdefault(key, value)
        missing = [n for n in names if n not in self.values]
        if missing:
            raise op_error(op, f"missing argument(s) {missing}")

    def _resolve(self, value):
        if isinstance(value, InputRef):
            name = self.op.input("X")[value.index]
            return Value(self.graph.read(name), self.block.find_var(name))
        if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
            return type(value)(self._resolve(v) for v in value) if isinstance(value, list) else \
                tuple(self._resolve(v) for v in value)
        return value

    def __getitem__(self, key):
        return self.values[key]

    def out(self, i=0):
        return self.block.find_var(self.op.output("Out")[i])

    def constant(self, key):
        value = self.values[key]
        if isinstance(value, Value) or (isinstance(value, (list, tuple)) and any(isinstance(v, Value) for v in value)):
            raise op_error(self.op, f"argument {key!r} must be a constant for ONNX, but it is computed")
        return value

    def tensor(self, value, dtype):
        """ONNX value of `value` (a Value or a Python number) as `dtype`."""
        if isinstance(value, Value):
            if value.dtype == dtype:
                return value.name
            return self.graph.node("Cast", [value.name], name_hint="cast", to=_elem(dtype))
        if isinstance(value, (bool, int, float)):
            return self.graph.const(value, dtype)
        raise op_error(self.op, f"unsupported operand {value!r}")

    def ints(self, value):
        """A 1-D int64 ONNX value from ints and 0-d int Values (a shape)."""
        if isinstance(value, Value):
            if value.var.ndim == 0:
                return self.graph.node("Unsqueeze", [self.tensor(value, "int64"), self.graph.const([0], "int64")])
            return self.tensor(value, "int64")
        items = list(value) if isinstance(value, (list, tuple, torch.Size)) else [value]
        if all(isinstance(v, int) for v in items):
            return self.graph.const(items, "int64")
        parts = [self.ints(v) if isinstance(v, Value) else self.graph.const([v], "int64") for v in items]
        return self.graph.node("Concat", parts, axis=0)


def _elem(dtype):
    from .onnx_export import elem_type
    return elem_type(dtype)


def _common(a, b):
    """The dtype torch computes `a <op> b` in (Values and Python numbers):
    torch's own promotion, asked with stand-ins of the same dtype and rank
    class (0-d or not)."""
    def stand_in(x):
        if isinstance(x, Value):
            return torch.empty((1,) * min(x.var.ndim, 1), dtype=x.var.dtype, device="meta")
        return x
    return dtype_name(torch.result_type(stand_in(a), stand_in(b)))


# -- table -------------------------------------------------------------------------------

LOWERINGS = {}


def lowering(*op_types):
    def register(fn):
        for t in op_types:
            LOWERINGS[t] = fn
        return fn
    return register


def _names(base, *prefixes):
    return [p + base for p in prefixes]


_TORCH, _TENSOR, _F = "torch.", "torch.Tensor.", "torch.nn.functional."


def _unary(onnx_op, *op_types):
    @lowering(*op_types)
    def lower(g, op, block):
        c = Call(g, op, block, ["input", "inplace=False"])
        return g.node(onnx_op, [c.tensor(c["input"], c.out().dtype_name)])
    return lower


for _onnx, _base in [("Tanh", "tanh"), ("Sigmoid", "sigmoid"), ("Relu", "relu"), ("Exp", "exp"),
                     ("Log", "log"), ("Abs", "abs"), ("Neg", "neg"), ("Sqrt", "sqrt"), ("Sin", "sin"),
                     ("Cos", "cos"), ("Not", "logical_not"), ("Floor", "floor"), ("Ceil", "ceil")]:
    _unary(_onnx, *_names(_base, _TORCH, _TENSOR, _F))
_unary("Abs", _TENSOR + "__abs__")
_unary("Neg", _TENSOR + "__neg__")


def _binary(onnx_op, op_types, reverse=False, compare=False):
    @lowering(*op_types)
    def lower(g, op, block):
        c = Call(g, op, block, ["input", "other", "alpha=1"])
        a, b = c["input"], c["other"]
        if c["alpha"] != 1:
            raise op_error(op, "alpha != 1 has no ONNX lowering here")
        if reverse:
            a, b = b, a
        dtype = _common(a, b) if compare else c.out().dtype_name
        return g.node(onnx_op, [c.tensor(a, dtype), c.tensor(b, dtype)])
    return lower


_binary("Add", _names("add", _TORCH, _TENSOR) + [_TENSOR + "__add__", _TENSOR + "__radd__"])
_binary("Sub", _names("sub", _TORCH, _TENSOR) + [_TENSOR + "__sub__"])
_binary("Sub", [_TENSOR + "__rsub__"], reverse=True)
_binary("Mul", _names("mul", _TORCH, _TENSOR) + [_TENSOR + "__mul__", _TENSOR + "__rmul__"])
_binary("Div", _names("div", _TORCH, _TENSOR) + [_TENSOR + "__truediv__"])
_binary("Div", [_TENSOR + "__rtruediv__"], reverse=True)
_binary("Pow", _names("pow", _TORCH, _TENSOR) + [_TENSOR + "__pow__"])
for _onnx, _bases in [("Greater", ("gt", "__gt__")), ("Less", ("lt", "__lt__")), ("Equal", ("eq", "__eq__")),
                      ("GreaterOrEqual", ("ge", "__ge__")), ("LessOrEqual", ("le", "__le__"))]:
    _binary(_onnx, _names(_bases[0], _TORCH, _TENSOR) + [_TENSOR + _bases[1]], compare=True)


@lowering(*_names("ne", _TORCH, _TENSOR), _TENSOR + "__ne__")
def _ne(g, op, block):
    return g.node("Not", [LOWERINGS[_TENSOR + "__eq__"](g, op, block)])


def _logical(onnx_op, bitwise_op, op_types):
    @lowering(*op_types)
    def lower(g, op, block):
        c = Call(g, op, block, ["input", "other"])
        dtype = c.out().dtype_name
        if dtype == "bool" or op.type.startswith(_TORCH + "logical") or op.type.startswith(_TENSOR + "logical"):
            return g.node(onnx_op, [c.tensor(c["input"], "bool"), c.tensor(c["other"], "bool")])
        return g.node(bitwise_op, [c.tensor(c["input"], dtype), c.tensor(c["other"], dtype)])
    return lower


_logical("And", "BitwiseAnd", _names("logical_and", _TORCH, _TENSOR) + [_TENSOR + "__and__", _TENSOR + "__rand__"])
_logical("Or", "BitwiseOr", _names("logical_or", _TORCH, _TENSOR) + [_TENSOR + "__or__", _TENSOR + "__ror__"])
_logical("Xor", "BitwiseXor", _names("logical_xor", _TORCH, _TENSOR) + [_TENSOR + "__xor__"])


# -- reductions ---------------------------------------------------------------------------

def reduce(g, onnx_op, x, axes, keepdims):
    """`onnx_op` over `axes` (None: all), with axes as an attribute or an
    input as the opset wants."""
    as_input = onnx_op == "ReduceSum" or g.lowering.opset >= 18
    if axes is None:
        return g.node(onnx_op, [x], keepdims=int(keepdims))
    if as_input:
        return g.node(onnx_op, [x, g.const(list(axes), "int64")], keepdims=int(keepdims))
    return g.node(onnx_op, [x], axes=list(axes), keepdims=int(keepdims))


def _dims(dim):
    return None if dim is None else list(dim) if isinstance(dim, (list, tuple)) else [dim]


def _reduction(onnx_op, op_types):
    @lowering(*op_types)
    def lower(g, op, block):
        c = Call(g, op, block, ["input", "dim=None", "keepdim=False", "dtype=None"])
        out = c.out().dtype_name
        return reduce(g, onnx_op, c.tensor(c["input"], out), _dims(c.constant("dim")), c["keepdim"])
    return lower


_reduction("ReduceMean", _names("mean", _TORCH, _TENSOR))
_reduction("ReduceSum", _names("sum", _TORCH, _TENSOR))


def _all_any(onnx_op, op_types):
    @lowering(*op_types)
    def lower(g, op, block):
        c = Call(g, op, block, ["input", "dim=None", "keepdim=False"])
        as_int = g.node("Cast", [c.tensor(c["input"], "bool")], to=_elem("int32"))
        reduced = reduce(g, onnx_op, as_int, _dims(c.constant("dim")), c["keepdim"])
        return g.node("Cast", [reduced], to=_elem("bool"))
    return lower


_all_any("ReduceMin", _names("all", _TORCH, _TENSOR))
_all_any("ReduceMax", _names("any", _TORCH, _TENSOR))


@lowering(*_names("argmax", _TORCH, _TENSOR))
def _argmax(g, op, block):
    c = Call(g, op, block, ["input", "dim=None", "keepdim=False"])
    x = c["input"].name
    dim = c.constant("dim")
    if dim is None:
        x, dim = g.node("Reshape", [x, g.const([-1], "int64")]), 0
    return g.node("ArgMax", [x], axis=dim, keepdims=int(c["keepdim"]))


# -- neural network ------------------------------------------------------------------------

def _matmul_t(g, x, w):
    return g.node("MatMul", [x, g.node("Transpose", [w], perm=[1, 0])])


@lowering(_F + "linear")
def _linear(g, op, block):
    c = Call(g, op, block, ["input", "weight", "bias=None"])
    y = _matmul_t(g, c["input"].name, c["weight"].name)
    return y if c["bias"] is None else g.node("Add", [y, c["bias"].name])


@lowering(*_names("softmax", _TORCH, _TENSOR, _F), *_names("log_softmax", _TORCH, _TENSOR, _F))
def _softmax(g, op, block):
    c = Call(g, op, block, ["input", "dim=None", "dtype=None"])
    if c.constant("dim") is None:
        raise op_error(op, "softmax without dim has no ONNX lowering here")
    onnx_op = "LogSoftmax" if op.type.endswith("log_softmax") else "Softmax"
    return g.node(onnx_op, [c.tensor(c["input"], c.out().dtype_name)], axis=c["dim"])


@lowering(_F + "dropout", _TORCH + "dropout")
def _dropout(g, op, block):
    c = Call(g, op, block, ["input", "p=0.5", "training=True", "inplace=False"])
    if c["training"] and c["p"] != 0:
        raise op_error(op, "dropout in training mode is random; export the model in eval mode (model.eval())")
    return g.node("Identity", [c["input"].name])


@lowering(_F + "embedding")
def _embedding(g, op, block):
    c = Call(g, op, block, ["input", "weight", "padding_idx=None", "max_norm=None", "norm_type=2.0",
                            "scale_grad_by_freq=False", "sparse=False"])
    if c["max_norm"] is not None:
        raise op_error(op, "embedding with max_norm rewrites its weight in place; no ONNX lowering")
    return g.node("Gather", [c["weight"].name, c.tensor(c["input"], "int64")], axis=0)


def _pair(value, n=2):
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


@lowering(_TORCH + "conv2d", _F + "conv2d")
def _conv2d(g, op, block):
    c = Call(g, op, block, ["input", "weight", "bias=None", "stride=1", "padding=0", "dilation=1", "groups=1"])
    padding = c.constant("padding")
    if isinstance(padding, str):
        raise op_error(op, f"padding={padding!r} has no ONNX lowering here; give the padding as numbers")
    pads = _pair(padding)
    inputs = [c["input"].name, c["weight"].name] + ([c["bias"].name] if c["bias"] is not None else [])
    return g.node("Conv", inputs, strides=_pair(c.constant("stride")), pads=pads + pads,
                  dilations=_pair(c.constant("dilation")), group=c.constant("groups"))


@lowering(_F + "max_pool2d", _TORCH + "max_pool2d")
def _max_pool2d(g, op, block):
    c = Call(g, op, block, ["input", "kernel_size", "stride=None", "padding=0", "dilation=1", "ceil_mode=False",
                            "return_indices=False"])
    if c["return_indices"]:
        raise op_error(op, "max_pool2d with return_indices has no ONNX lowering here")
    kernel = _pair(c.constant("kernel_size"))
    stride = _pair(c.constant("stride")) if c["stride"] not in (None, [], ()) else kernel
    pads = _pair(c.constant("padding"))
    return g.node("MaxPool", [c["input"].name], kernel_shape=kernel, strides=stride, pads=pads + pads,
                  dilations=_pair(c.constant("dilation")), ceil_mode=int(c["ceil_mode"]))


@lowering(_F + "batch_norm")
def _batch_norm(g, op, block):
    c = Call(g, op, block, ["input", "running_mean", "running_var", "weight=None", "bias=None", "training=False",
                            "momentum=0.1", "eps=1e-05"])
    if c["training"]:
        raise op_error(op, "batch norm in training mode updates its statistics; export in eval mode (model.eval())")
    x = c["input"]
    channels = c["running_mean"].var.shape[0]
    scale = c["weight"].name if c["weight"] is not None else g.const([1.0] * channels, x.dtype)
    bias = c["bias"].name if c["bias"] is not None else g.const([0.0] * channels, x.dtype)
    return g.node("BatchNormalization", [x.name, scale, bias, c["running_mean"].name, c["running_var"].name],
                  epsilon=float(c["eps"]))


def _gates(g, c, n):
    """x @ w_ih^T + b_ih and h @ w_hh^T + b_hh, each split into `n` chunks."""
    def affine(x, w, b):
        y = _matmul_t(g, x, c[w].name)
        return y if c[b] is None else g.node("Add", [y, c[b].name])
    split = lambda y: g.node("Split", [y, g.const([c["w_ih"].var.shape[0] // n] * n, "int64")], n_out=n, axis=-1)
    return affine, split


@lowering(_TORCH + "gru_cell")
def _gru_cell(g, op, block):
    c = Call(g, op, block, ["input", "hx", "w_ih", "w_hh", "b_ih=None", "b_hh=None"])
    affine, split = _gates(g, c, 3)
    i_r, i_z, i_n = split(affine(c["input"].name, "w_ih", "b_ih"))
    h_r, h_z, h_n = split(affine(c["hx"].name, "w_hh", "b_hh"))
    r = g.node("Sigmoid", [g.node("Add", [i_r, h_r])])
    z = g.node("Sigmoid", [g.node("Add", [i_z, h_z])])
    n = g.node("Tanh", [g.node("Add", [i_n, g.node("Mul", [r, h_n])])])
    # h' = (1 - z) * n + z * h = n + z * (h - n)
    return g.node("Add", [n, g.node("Mul", [z, g.node("Sub", [c["hx"].name, n])])])


@lowering(_TORCH + "lstm_cell")
def _lstm_cell(g, op, block):
    c = Call(g, op, block, ["input", "hx", "w_ih", "w_hh", "b_ih=None", "b_hh=None"])
    h, cell = c["hx"]
    affine, split = _gates(g, c, 4)
    gates = g.node("Add", [affine(c["input"].name, "w_ih", "b_ih"), affine(h.name, "w_hh", "b_hh")])
    i, f, gg, o = split(gates)
    i, f, o = (g.node("Sigmoid", [v]) for v in (i, f, o))
    new_c = g.node("Add", [g.node("Mul", [f, cell.name]), g.node("Mul", [i, g.node("Tanh", [gg])])])
    new_h = g.node("Mul", [o, g.node("Tanh", [new_c])])
    return new_h, new_c


# -- shapes and indexing --------------------------------------------------------------------------

@lowering("shape")
def _shape(g, op, block):
    c = Call(g, op, block, ["input"])
    return g.node("Shape", [c["input"].name])


@lowering(*_names("reshape", _TORCH, _TENSOR), _TENSOR + "view")
def _reshape(g, op, block):
    c = Call(g, op, block, ["input", "*shape"])
    shape = c["shape"]
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        shape = shape[0]
    return g.node("Reshape", [c["input"].name, c.ints(list(shape))])


@lowering(*_names("flatten", _TORCH, _TENSOR))
def _flatten(g, op, block):
    c = Call(g, op, block, ["input", "start_dim=0", "end_dim=-1"])
    rank = c["input"].var.ndim
    start, end = c.constant("start_dim") % max(rank, 1), c.constant("end_dim") % max(rank, 1)
    shape = g.node("Shape", [c["input"].name])
    parts = []
    if start > 0:
        parts.append(g.node("Slice", [shape, g.const([0], "int64"), g.const([start], "int64")]))
    parts.append(g.const([-1], "int64"))
    if end < rank - 1:
        parts.append(g.node("Slice", [shape, g.const([end + 1], "int64"), g.const([rank], "int64")]))
    return g.node("Reshape", [c["input"].name, g.node("Concat", parts, axis=0)])


@lowering(_TENSOR + "__getitem__")
def _getitem(g, op, block):
    c = Call(g, op, block, ["input", "index"])
    x = c["input"].name
    index = c["index"] if isinstance(c["index"], tuple) else (c["index"],)
    if any(i is Ellipsis or i is None for i in index):
        raise op_error(op, "indexing with ... or None has no ONNX lowering here")
    axis = 0
    for item in index:
        if isinstance(item, slice):
            if item != slice(None):
                if any(isinstance(v, Value) for v in (item.start, item.stop, item.step)):
                    raise op_error(op, "slices with computed bounds have no ONNX lowering here")
                start = 0 if item.start is None else item.start
                stop = 2**62 if item.stop is None else item.stop
                step = 1 if item.step is None else item.step
                x = g.node("Slice", [x, g.const([start], "int64"), g.const([stop], "int64"),
                                     g.const([axis], "int64"), g.const([step], "int64")])
            axis += 1
        elif isinstance(item, (int, Value)) and not isinstance(item, bool):
            if isinstance(item, Value) and (item.var.ndim != 0 or item.var.dtype.is_floating_point
                                            or item.dtype == "bool"):
                raise op_error(op, "indexing with a tensor that is not an integer scalar has no ONNX lowering here")
            x = g.node("Gather", [x, c.tensor(item, "int64")], axis=axis)
        else:
            raise op_error(op, f"index {item!r} has no ONNX lowering here")
    return x


def _factory(fill):
    def lower(g, op, block):
        c = Call(g, op, block, ["*size", "out=None", "dtype=None", "layout=None", "device=None",
                                "requires_grad=False", "pin_memory=False"])
        size = c["size"]
        if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
            size = size[0]
        dtype = c.out().dtype_name
        from onnx import numpy_helper
        import numpy as np
        from .onnx_export import _NUMPY
        value = numpy_helper.from_array(np.array([fill], dtype=_NUMPY[dtype]))
        return g.node("ConstantOfShape", [c.ints(list(size))], value=value)
    return lower


lowering(_TORCH + "zeros")(_factory(0))
lowering(_TORCH + "ones")(_factory(1))


@lowering(*_names("unsqueeze", _TORCH, _TENSOR))
def _unsqueeze(g, op, block):
    c = Call(g, op, block, ["input", "dim"])
    return g.node("Unsqueeze", [c["input"].name, g.const([c.constant("dim")], "int64")])


@lowering(_TORCH + "stack", _TORCH + "cat")
def _stack(g, op, block):
    c = Call(g, op, block, ["tensors", "dim=0"])
    new_axis = int(op.type.endswith("stack"))
    tensors, dim = c["tensors"], c.constant("dim")
    if isinstance(tensors, Value) and tensors.var.kind == TENSOR_ARRAY:
        return g.node("ConcatFromSequence", [tensors.name], axis=dim, new_axis=new_axis)
    items = [c.tensor(t, c.out().dtype_name) for t in tensors]
    if new_axis:
        items = [g.node("Unsqueeze", [t, g.const([dim], "int64")]) for t in items]
    return g.node("Concat", items, axis=dim)


# -- framework ops -----------------------------------------------------------------------------

@lowering("fill_constant")
def _fill_constant(g, op, block):
    c = Call(g, op, block, ["value", "dtype"])
    if isinstance(c["value"], Value):  # a run-time size as a 0-d tensor
        return c.tensor(c["value"], c.out().dtype_name)
    return g.const(c.constant("value"), c.out().dtype_name)


# -- run-time sizes (SCALAR variables: 0-d tensors in ONNX) -----------------------------------

@lowering("size")
def _size(g, op, block):
    c = Call(g, op, block, ["input", "dim"])
    return g.node("Gather", [g.node("Shape", [c["input"].name]), g.const(c.constant("dim"), "int64")], axis=0)


def _scalar(onnx_op, fn_names, compare=False):
    @lowering(*fn_names)
    def lower(g, op, block):
        c = Call(g, op, block, ["a", "b"])
        dtype = "bool" if onnx_op in ("And", "Or") else "int64"
        out = g.node(onnx_op, [c.tensor(c["a"], dtype), c.tensor(c["b"], dtype)])
        return out
    return lower


# Sizes are >= 0, so ONNX's truncating integer Div is Python's floor division here.
for _onnx, _fn in [("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("Div", "floordiv"), ("Mod", "mod"),
                   ("Pow", "pow"), ("Equal", "eq"), ("Less", "lt"), ("LessOrEqual", "le"), ("Greater", "gt"),
                   ("GreaterOrEqual", "ge"), ("And", "and_"), ("Or", "or_")]:
    _scalar(_onnx, ["operator." + _fn])
_scalar("Max", ["builtins.max"])
_scalar("Min", ["builtins.min"])


@lowering("operator.ne")
def _scalar_ne(g, op, block):
    return g.node("Not", [LOWERINGS["operator.eq"](g, op, block)])


@lowering("operator.not_", "operator.neg")
def _scalar_unary(g, op, block):
    c = Call(g, op, block, ["a"])
    if op.type == "operator.neg":
        return g.node("Neg", [c.tensor(c["a"], "int64")])
    return g.node("Not", [c.tensor(c["a"], "bool")])


@lowering("check_sizes")
def _check_sizes(g, op, block):
    # ONNX has no assertion op: an exported model does not check what
    # conversion assumed about input sizes (the limit is in docs/deployment.md).
    return None


@lowering("cast")
def _cast(g, op, block):
    c = Call(g, op, block, ["input", "dtype"])
    return g.node("Cast", [c["input"].name], to=_elem(c.out().dtype_name))


@lowering("array_create")
def _array_create(g, op, block):
    return g.node("SequenceEmpty", [], dtype=_elem(block.find_var(op.output("Out")[0]).dtype_name))


@lowering("array_append")
def _array_append(g, op, block):
    c = Call(g, op, block, ["array", "value"])
    out = g.node("SequenceInsert", [c["array"].name, c.tensor(c["value"], c["array"].dtype)])
    # In place in the program: the array variable itself now holds the new sequence.
    g.define(op.input("X")[0], out)
    return out


@lowering("array_length")
def _array_length(g, op, block):
    return g.node("SequenceLength", [Call(g, op, block, ["array"])["array"].name])


@lowering("array_read")
def _array_read(g, op, block):
    c = Call(g, op, block, ["array", "index"])
    return g.node("SequenceAt", [c["array"].name, c.tensor(c["index"], "int64")])
