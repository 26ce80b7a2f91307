"""The program IR: Program -> Blocks -> Operators and Variables.

A `Program` is a list of `Block`s; block 0 is the global block and every other
block names its parent (`parent_idx`). Control-flow ops (`cond`, `while`) refer
to their sub-blocks through block attributes, so nesting is first-class: a
name is resolved in its own block first, then in the parents.

An `Operator` has a `type` (a key of the op table, `runtime/optable.py`, which `ops/` fills), named inputs
and outputs (slot -> list of variable names) and attributes. A `Variable` has a
`name`, a `shape` (-1 for a dimension known only at run time), a `dtype`, and
the `persistable` / `stop_gradient` flags. Persistable variables hold state
that outlives one run (parameters, buffers, lifted constants); the program
keeps a reference to the tensor each one is bound to.

This module knows nothing about kernels: `ops` fills the hooks that let a
`Variable` take part in torch calls, and the executor looks kernels up in the
registry.
"""

import contextlib
import threading

import torch

from .errors import ProgramError
from .optable import get_op_def

# The printer, DOT writer, verifier and serializer are built on the classes
# below (they import this module); the methods that reach them (`to_string`,
# `to_dot`, `verify`) import them when called: "lazy: above ir".

# dtype names are the IR's spelling; torch dtypes are what users and kernels see.
_DTYPE_NAMES = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32",
    torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool", torch.complex64: "complex64", torch.complex128: "complex128",
}
_DTYPES = {name: dt for dt, name in _DTYPE_NAMES.items()}

TENSOR = "tensor"
TENSOR_ARRAY = "tensor_array"
# A Python number at run time (a size, or arithmetic on sizes): shape ().
SCALAR = "scalar"
# A `torch.Generator` fed to the program (an argument of a declarative call):
# the ops that take `generator=` draw from the one each run is given.
GENERATOR = "generator"


def dtype_name(dtype):
    """'float32' for torch.float32, 'float32', or anything naming a dtype."""
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(_DTYPES)}")
        return dtype
    if dtype in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype]
    if dtype is float:
        return "float32"
    if dtype is int:
        return "int64"
    if dtype is bool:
        return "bool"
    raise ValueError(f"unsupported dtype {dtype!r}")


def torch_dtype(dtype):
    """torch.float32 for 'float32' or torch.float32."""
    return _DTYPES[dtype_name(dtype)]


def _normalize_shape(shape):
    if shape is None:
        return ()
    out = []
    for d in shape:
        if d is None:
            out.append(-1)
        elif isinstance(d, int) and not isinstance(d, bool) and d >= -1:
            out.append(int(d))
        elif isinstance(d, str) and d:
            out.append(d)  # a symbolic dimension: "s0", "2*s0"
        else:
            raise ValueError(f"bad dimension {d!r} in shape {shape!r}: use an int >= 0, a symbol such as "
                             "'s0', or -1/None for unknown")
    return tuple(out)


def contiguous_strides(shape):
    """The strides of a new tensor of `shape` (what `torch.empty` gives):
    `is_contiguous()` also holds for other strides of a dimension of size 1,
    which a read of strides sees."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def is_symbolic(dim):
    """Whether a dimension is known only at run time (a symbol or -1)."""
    return isinstance(dim, str) or dim == -1


class Variable:
    """A symbolic value in a block: a tensor (or a tensor array) that exists
    only when the program runs.

    In user code a Variable behaves like a tensor: `ops` installs
    `__torch_function__` and the Python operators, so `torch.matmul(x, w)`,
    `x.sum(1)` or `x + 1` append operators to the current block.
    """

    # Filled by `ops.capture`: handlers for torch functions and tensor methods.
    _torch_function_hook = None
    _method_hook = None
    _requires_grad_hook = None
    _number_hash_hook = None  # refuses `n in {...}` in user code for a Python number read from a tensor

    # Facts tracing records on a Variable, with their defaults. Declared here
    # so that reading one never reaches `__getattr__` (which looks up tensor
    # methods); `Program.copy` keeps them; saving keeps `elem_known` only
    # (the others matter while tracing).
    python_number = False  # a 0-d value eager code has as a Python number (ops/recording.py stands_for_number)
    python_literal = False  # made from a number literal: its dtype is weak (ops/control_flow/while_op.py _Spec)
    number_or_tensor = None  # the user's name, when eager has it as a number on some paths, a tensor on others
    pending_number = None  # such a value not decided yet: ops/number_paths.py Pending
    elem_known = True  # tensor arrays: False while no path has given it an element (shape and dtype unknown)
    strides = None  # the strides eager gives this value (ops/infer.py), when tracing knows them
    # True where tracing cannot know the layout at all (a value a tensor `if`
    # or loop merges, or one an op made from such a value): a stand-in for it
    # is a guess, so an op's outputs get no strides from it (ops/infer.py).
    layout_unknown = False
    grad_leaf = False  # a leaf flagged to require grad (`requires_grad_()`): so even without gradients
    # As torch.Tensor's. NumPy operands of Python operators reach the
    # Variable's `__array_ufunc__` (below), which calls the tensor operator
    # (`np.float64(2.0) * x` is `x.__rmul__(np.float64(2.0))`), as eager does.
    __array_priority__ = 1000

    def __init__(self, block, name, shape=(), dtype="float32", persistable=False,
                 stop_gradient=False, kind=TENSOR, is_data=False):
        self.block = block
        self.name = name
        self._shape = _normalize_shape(shape)
        self._dtype = dtype_name(dtype)
        self.persistable = persistable
        self.stop_gradient = stop_gradient
        self.kind = kind
        self.is_data = is_data

    # -- IR view -----------------------------------------------------------
    @property
    def shape(self):
        """The shape (a torch.Size, as a tensor's) with -1 for every dimension
        known only at run time."""
        return torch.Size(-1 if isinstance(d, str) else d for d in self._shape)

    @shape.setter
    def shape(self, value):
        self._shape = _normalize_shape(value)

    @property
    def dims(self):
        """The shape with symbolic dimensions as their expressions ("s0", "2*s0")."""
        return self._shape

    @property
    def dtype(self):
        """The torch dtype, so that user code like `torch.zeros(3, dtype=x.dtype)` works."""
        return _DTYPES[self._dtype]

    @dtype.setter
    def dtype(self, value):
        self._dtype = dtype_name(value)

    @property
    def dtype_name(self):
        return self._dtype

    @property
    def ndim(self):
        return len(self._shape)

    def dim(self):
        return len(self._shape)

    # A value's device while tracing: the program's (the device of its first
    # tensor argument, one object: runtime/ir.py Program.device), except a
    # feed on another device, which has its own. The IR tracks no device per
    # value beyond that: a value computed from such a feed reports the
    # program's.
    own_device = None

    @property
    def device(self):
        return self.own_device or self.block.program.device

    @property
    def requires_grad(self):
        # While tracing, the caller's mode decides it for values ops made
        # (ops/ambient_modes.py `requires_grad`, installed by ops).
        if Variable._requires_grad_hook is not None:
            return Variable._requires_grad_hook(self)
        return not self.stop_gradient

    @requires_grad.setter
    def requires_grad(self, value):
        # `x.requires_grad = v` is `x.requires_grad_(v)`: an op while tracing,
        # which raises eager's error when the program runs on a non-leaf.
        if Variable._method_hook is None:
            raise AttributeError("requires_grad of a program variable is set by tracing `x.requires_grad_(v)`")
        Variable._method_hook(self, "requires_grad_")(value)

    def is_floating_point(self):
        return self.dtype.is_floating_point

    # Plain-Python answers torch's own Python code asks of any tensor.
    is_nested = False
    is_sparse = False
    is_quantized = False
    is_meta = False
    layout = torch.strided

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def to_string(self):
        flags = []
        if self.persistable:
            flags.append("persistable")
        if self.is_data:
            flags.append("data")
        if self.stop_gradient and not (self.persistable or self.is_data):
            flags.append("stop_gradient")
        if self.kind == GENERATOR:
            head = f"{self.name}: {self.kind}"
        elif self.kind != TENSOR:
            head = f"{self.name}: {self.kind}<{self._dtype}>"
        else:
            head = f"{self.name}: {self._dtype}[{', '.join(str(d) for d in self._shape)}]"
        return head + (f" ({', '.join(flags)})" if flags else "")

    def __format__(self, spec):
        # f"{x}", format(x), str(x), repr(x): eager's text shows the tensor's
        # values, which a program has only when it runs. The capture hook
        # refuses it in the user's code (the text would be this one,
        # silently); the project's own messages get it.
        if Variable._method_hook is not None:
            Variable._method_hook(self, "__format__")()
        return format(f"Variable({self.to_string()})", spec)

    def __str__(self):
        return self.__format__("")

    __repr__ = __str__

    # -- tensor behaviour (hooks installed by ops.capture) --------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return cls._torch_function_hook(func, args, kwargs or {})

    def __getattr__(self, name):
        # Only reached for names the class does not define: tensor methods.
        if name.startswith("__") or Variable._method_hook is None:
            raise AttributeError(name)
        if self.kind == GENERATOR:
            raise AttributeError(
                f"`{name}` of the torch.Generator {self.name!r}: a generator passed to a declarative function is "
                "an input of its program, which only the ops that draw from it (`generator=...`) use when it runs; "
                "seed or read it outside the function")
        return Variable._method_hook(self, name)

    # Identity semantics: Variables are graph nodes, `==` builds an op. A
    # Variable standing for a Python number (`int(t)`, `t.tolist()`) would
    # be a dict key or set member by identity where eager's number is one by
    # value: the hook refuses that in the user's code (ops/capture.py).
    def __hash__(self):
        if self.python_number and Variable._number_hash_hook is not None:
            Variable._number_hash_hook(self)
        return object.__hash__(self)


# Python operators a Variable supports; each forwards to the tensor method of
# the same name, so `x + y` records exactly what eager `x + y` runs.
_OPERATORS = [
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
    "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
    "__rmod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__",
    "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__",
    "__lshift__", "__rshift__", "__neg__", "__pos__", "__abs__", "__invert__",
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    "__getitem__", "__setitem__",
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
    "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__imatmul__",
    # Conversions to Python values: the capture hook rejects them with a
    # message pointing at the line (the translator converts them first).
    "__bool__", "__int__", "__float__", "__index__", "__len__", "__iter__",
    "__complex__", "__array__", "__reduce_ex__",
    # round()/math.floor()/ceil()/trunc(): of a Variable standing for a
    # Python float (`round(float(t))`), the Python int; a tensor has none.
    "__round__", "__floor__", "__ceil__", "__trunc__",
    # NumPy ufuncs (`np.sqrt(x)`): ops of their own, or the operator above
    # for a NumPy operand (`arr * x`), chosen by the capture hook.
    "__array_ufunc__",
]


def _make_operator(name):
    def method(self, *args, **kwargs):
        return Variable._method_hook(self, name)(*args, **kwargs)
    method.__name__ = name
    return method


for _name in _OPERATORS:
    setattr(Variable, _name, _make_operator(_name))


class Operator:
    """One op of a block: `type`, named inputs/outputs, attributes.

    `inputs` and `outputs` map a slot name to a list of variable names.
    Attributes holding a `Block` are sub-block references. `origin` is the
    (filename, lineno, source line) of the user code that created the op.
    """

    def __init__(self, block, type, inputs=None, outputs=None, attrs=None, origin=None):
        self.block = block
        self.type = type
        self.inputs = {k: list(v) for k, v in (inputs or {}).items()}
        self.outputs = {k: list(v) for k, v in (outputs or {}).items()}
        self.attrs = dict(attrs or {})
        self.origin = origin

    def input(self, slot):
        return self.inputs.get(slot, [])

    def output(self, slot):
        return self.outputs.get(slot, [])

    @property
    def input_names(self):
        return [n for names in self.inputs.values() for n in names]

    @property
    def output_names(self):
        return [n for names in self.outputs.values() for n in names]

    def sub_blocks(self):
        return [v for v in self.attrs.values() if isinstance(v, Block)]

    def to_string(self):
        from .printer import op_to_string  # lazy: above ir (see the top)
        return op_to_string(self)

    def __repr__(self):
        return f"Operator({self.to_string()})"


class Block:
    def __init__(self, program, idx, parent_idx=-1):
        self.program = program
        self.idx = idx
        self.parent_idx = parent_idx
        self.ops = []
        self.vars = {}

    @property
    def parent(self):
        return None if self.parent_idx < 0 else self.program.blocks[self.parent_idx]

    def create_var(self, name=None, shape=(), dtype="float32", **kwargs):
        name = name or self.program.unique_name("tmp")
        if name in self.vars:
            raise ProgramError(f"variable {name!r} already exists in block {self.idx}")
        var = Variable(self, name, shape, dtype, **kwargs)
        self.vars[name] = var
        self.program._changed()
        return var

    def is_under(self, ancestor):
        """True if `ancestor` is this block or one of its parents."""
        block = self
        while block is not None:
            if block is ancestor:
                return True
            block = block.parent
        return False

    def has_var(self, name):
        return name in self.vars

    def find_var(self, name):
        """The variable `name` as seen from this block (own vars, then parents')."""
        block = self
        while block is not None:
            if name in block.vars:
                return block.vars[name]
            block = block.parent
        raise KeyError(f"variable {name!r} is not visible from block {self.idx}")

    def var(self, name):
        return self.find_var(name)

    def append_op(self, type, inputs=None, outputs=None, attrs=None, origin=None):
        as_names = lambda d: {k: [v if isinstance(v, str) else v.name for v in vs] for k, vs in (d or {}).items()}
        op = Operator(self, type, as_names(inputs), as_names(outputs), attrs, origin)
        self.ops.append(op)
        if self.program.default_dtype is None:
            self.program.default_dtype = torch.get_default_dtype()
        self.program._changed()
        return op

    def truncate(self, num_ops, var_names):
        """Drop the ops after the first `num_ops`, and the variables `var_names`."""
        del self.ops[num_ops:]
        for name in var_names:
            del self.vars[name]
        self.program._changed()

    def to_string(self):
        from .printer import block_to_string  # lazy: above ir (see the top)
        return block_to_string(self)


class Program:
    """A static program. `blocks[0]` is the global block."""

    def __init__(self):
        self.blocks = [Block(self, 0, -1)]
        self._name_counters = {}
        self._version = 0
        # persistable variable name -> the tensor it is bound to (parameters,
        # buffers and lifted constants keep the identity of the user's tensor,
        # so optimizer updates and in-place buffer updates stay shared).
        self.bound = {}
        self._device = torch.device("cpu")
        # The `training` mode ("train" / "eval") of the modules it was traced
        # with, None when none; a saved model records it (runtime/modes.py).
        self.mode = None
        # The autocast it was traced in (runtime/run_modes.py `traced_autocast`),
        # None when off; a program that is not retraced per call runs only there.
        self.autocast = None
        # The default dtype it was built (traced) under, read when its first
        # op is appended (a program made before, `default_main_program()`,
        # is built later): its factories and constants took their dtypes
        # from it, and so did the promotion of integer tensors with Python
        # floats (`arange(n) * 0.5`); a program that is not retraced per
        # call runs only under it (run_modes.py). None: no op yet.
        self.default_dtype = None

    # -- structure -----------------------------------------------------------
    def global_block(self):
        return self.blocks[0]

    def block(self, idx):
        return self.blocks[idx]

    def create_block(self, parent_idx=0):
        block = Block(self, len(self.blocks), parent_idx)
        self.blocks.append(block)
        self._changed()
        return block

    def truncate_blocks(self, num_blocks):
        """Drop the blocks after the first `num_blocks`."""
        del self.blocks[num_blocks:]
        self._changed()

    def unique_name(self, prefix):
        n = self._name_counters.get(prefix, 0)
        while True:
            name = f"{prefix}_{n}"
            n += 1
            if not any(name in b.vars for b in self.blocks):
                break
        self._name_counters[prefix] = n
        return name

    def _changed(self):
        self._version += 1

    # -- the device ------------------------------------------------------------
    # A traced value's `.device` is this object (Variable.device), so an
    # attribute recorded from it (`torch.zeros(n, device=x.device)`,
    # `y.to(x.device)`) holds this very object: that attribute follows the
    # device the program runs on, where a device the user spelled out
    # (`device="cpu"`, `torch.device("cuda")`) is another object and stays as
    # written, as eager keeps it. Setting the device rewrites the followers,
    # so a program traced on one device runs on another as a trace there
    # would (a saved model loaded onto a GPU; runtime/attrs.py saves them as
    # `$program_device`).
    @property
    def device(self):
        return self._device

    @device.setter
    def device(self, device):
        old, self._device = self._device, device
        if old is device:
            return
        changed = False
        for block in self.blocks:
            for op in block.ops:
                for key, value in op.attrs.items():
                    new = _with_device(value, old, device)
                    if new is not value:
                        op.attrs[key] = new  # each program's ops own their attrs dicts (`copy`)
                        changed = True
        if changed:
            self._changed()

    def on_device(self, device):
        """This program run on `device`: itself on its own device, else a
        copy on `device`, whose device-following attributes name it (and
        whose passes see it: runtime/passes/scalars.py keeps a GPU feed a
        tensor, as eager's `i < n` of it is a GPU bool)."""
        if device is None or device == self._device:
            return self
        moved = self.copy()
        moved.device = device
        return moved

    def all_vars(self):
        for block in self.blocks:
            yield from block.vars.values()

    def data_vars(self):
        return [v for v in self.global_block().vars.values() if v.is_data]

    def persistable_vars(self):
        return [v for v in self.global_block().vars.values() if v.persistable]

    def bind(self, name, tensor):
        self.bound[name] = tensor
        self._changed()

    # -- text, checks, copies -------------------------------------------------
    def to_string(self):
        from .printer import program_to_string  # lazy: above ir (see the top)
        return program_to_string(self)

    __str__ = to_string

    def to_dot(self, feed_names=None, fetch_names=()):
        """Graphviz DOT text: ops as nodes, variables as edges, sub-blocks as
        clusters inside their cond/while (see runtime/dot.py)."""
        from .dot import program_to_dot  # lazy: above ir (see the top)
        return program_to_dot(self, feed_names, fetch_names)

    def verify(self):
        from .verify import verify_program  # lazy: above ir (see the top)
        verify_program(self)
        return self

    def copy(self):
        """A structural copy: new blocks, ops and variables (with every fact
        a Variable carries); attribute values other than blocks and lists
        are shared, as nothing mutates them; bound tensors are shared."""
        new = Program()
        new.blocks = [Block(new, b.idx, b.parent_idx) for b in self.blocks]
        for old, block in zip(self.blocks, new.blocks):
            for name, var in old.vars.items():
                v = object.__new__(type(var))  # not copy.copy: Variables refuse pickling protocols
                v.__dict__.update(var.__dict__)
                v.block = block
                block.vars[name] = v
        for old, block in zip(self.blocks, new.blocks):
            for op in old.ops:
                attrs = {k: new.blocks[v.idx] if isinstance(v, Block) else (list(v) if isinstance(v, list) else v)
                         for k, v in op.attrs.items()}
                block.ops.append(Operator(block, op.type, op.inputs, op.outputs, attrs, op.origin))
        new.bound = dict(self.bound)
        # The attributes are this program's objects: its device object too
        # (not the setter, which would look for the new program's own).
        new._device, new.mode, new.autocast, new.default_dtype = self._device, self.mode, self.autocast, \
            self.default_dtype
        new._name_counters = dict(self._name_counters)
        return new

    def clone(self, for_test=False):
        """A deep copy of the structure; bound tensors are shared, not copied.
        `for_test=True` drops backward and optimizer ops."""
        copy = self.copy()
        if for_test:
            from .prune import training_readers  # lazy: prune builds on this module
            block = copy.global_block()
            trained = training_readers(block)  # and the ops that read gradients (a clip)
            block.ops = [op for op in block.ops if not get_op_def(op.type).training_only and id(op) not in trained]
        return copy


def _with_device(value, old, new):
    """`value` with each leaf that is the object `old` replaced by `new`
    (containers rebuilt, never changed in place: copies share them)."""
    if value is old:
        return new
    if type(value) in (list, tuple):
        items = [_with_device(v, old, new) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return items if type(value) is list else tuple(items)
    if type(value) is dict:
        items = {k: _with_device(v, old, new) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    return value


# -- default programs and guards ----------------------------------------------
_state = threading.local()


def _defaults():
    if not hasattr(_state, "main"):
        _state.main = Program()
        _state.startup = Program()
    return _state


def default_main_program():
    return _defaults().main


def default_startup_program():
    return _defaults().startup


@contextlib.contextmanager
def program_guard(main_program, startup_program=None):
    """Ops and variables created inside go to `main_program` (and parameter
    initialisation / optimizer state to `startup_program`)."""
    if not isinstance(main_program, Program):
        raise TypeError(f"program_guard expects a Program, got {type(main_program).__name__}")
    state = _defaults()
    saved = state.main, state.startup
    state.main = main_program
    if startup_program is not None:
        state.startup = startup_program
    try:
        yield
    finally:
        state.main, state.startup = saved


def data(name, shape, dtype="float32"):
    """A feed Variable of the current main program. `None` or -1 marks a
    dimension known only at run time."""
    block = default_main_program().global_block()
    return block.create_var(name=name, shape=shape, dtype=dtype, is_data=True, stop_gradient=True)

