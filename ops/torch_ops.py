"""The torch ops a program may call, derived from torch's own declarations.

Every public function of `torch`, `torch.nn.functional`, `torch.linalg`,
`torch.special` and `torch.fft` that torch declares overridable
(`torch.overrides.get_overridable_functions()`: the functions that take
tensors), every `torch.Tensor` method and property torch declares, and the
factory functions (the ignored functions whose native schema takes a
`device` and returns a Tensor: `torch.zeros`, `torch.randn`, ...) becomes a
call-style op whose type is its public name (`torch.nn.functional.conv2d`,
`torch.Tensor.softmax`) and whose kernel is that very function, so the
executor runs exactly what eager PyTorch runs. Shape/dtype inference is
shared: the kernel runs on meta tensors (`ops/infer.py`).

Effects come from torch's conventions too: a trailing `_` (and the in-place
operators `__iadd__`, `__setitem__`, ...) writes the first argument; a
`generator` argument in the native schema (and dropout) draws random numbers.

Left out, by the explicit DENYLIST below: what must never run inside a
program (I/O and serialization, global or process state, hooks, storage and
pointer access, conversions to Python or numpy objects). Tensor metadata
known while tracing (`.dim()`, `.size()`, `.stride()`, `.is_complex()`, ...,
see METADATA) is answered by capture from the Variable, not recorded.

The table is the loading allowlist: a saved program names nothing else. A
name listed here that torch does not have fails at import.
"""

import torch
import torch.nn.functional as F
from torch.overrides import get_ignored_functions, get_overridable_functions

from runtime.optable import FirstUse
from runtime.optable import callable_key as _key

from .aten_names import aten_call
from .packed_sequences import RULES as SHAPE_RULES
from .registry import OpDef, is_registered, register

NAMESPACES = (
    ("torch", torch),
    ("torch.nn.functional", F),
    ("torch.linalg", torch.linalg),
    ("torch.special", torch.special),
    ("torch.fft", torch.fft),
)

TO_PYTHON = "conversion to Python or numpy objects"

# Never inside a program, never loaded. Each entry: (namespace, names, why).
DENYLIST = (
    ("torch", "save load from_file", "I/O and serialization"),
    ("torch", "manual_seed seed initial_seed set_default_dtype "
              "set_default_device set_default_tensor_type set_num_threads set_num_interop_threads "
              "set_printoptions set_grad_enabled set_anomaly_enabled set_flush_denormal "
              "use_deterministic_algorithms set_deterministic_debug_mode set_warn_always "
              "set_float32_matmul_precision compile", "global or process state"),
    ("torch.Tensor", "register_hook register_post_accumulate_grad_hook retain_grad backward "
                     "record_stream share_memory_ pin_memory", "hooks, autograd and process state"),
    ("torch.Tensor", "data_ptr const_data_ptr storage untyped_storage storage_type set_ is_set_to "
                     "is_shared is_pinned __dlpack__ __dlpack_device__ "
                     "__setstate__ apply_ map_ map2_ module_load", "storage and pointer access"),
    ("torch.Tensor", "item tolist numpy __array__ __array_wrap__ __bool__ __nonzero__ __int__ "
                     "__long__ __float__ __complex__ __index__ __format__ __repr__ __reduce_ex__ "
                     "__deepcopy__ __contains__", TO_PYTHON),
)

# Tensor metadata: known while tracing, answered from the Variable by
# ops/capture.py (never an op, never frozen from a value).
METADATA = """
dim ndimension size numel nelement stride is_complex is_floating_point is_signed get_device
element_size is_contiguous is_same_size is_inference is_conj is_neg dim_order __len__
"""

# Functions torch computes a Python bool from tensor values with: recorded
# as ops returning a 0-d bool tensor, so `if torch.equal(a, b):` becomes a
# graph branch instead of a value frozen at build time.
TO_BOOL_TENSOR = {"equal", "allclose", "is_nonzero", "_nested_tensor_from_mask_left_aligned"}

_INPLACE_OPERATORS = {
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
    "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__idiv__",
    "__imatmul__",
}


def _lookup(prefix, name):
    """The callable or descriptor `prefix.name`; None where this torch has no such name."""
    owner = torch.Tensor if prefix == "torch.Tensor" else dict(NAMESPACES)[prefix]
    return owner.__dict__.get(name, getattr(owner, name, None)) if owner is torch.Tensor else getattr(owner, name, None)


def missing_names():
    """The denylisted and metadata names this torch does not have. Another
    release may lack some (torch 2.11 has no `Tensor.const_data_ptr`): there
    is nothing to deny or answer then. On the release CI pins, the tests
    require this to be empty, so that a misspelt name cannot hide here."""
    names = [(prefix, name) for prefix, names, _ in DENYLIST for name in names.split()]
    names += [("torch.Tensor", name) for name in METADATA.split()]
    return [f"{prefix}.{name}" for prefix, name in names if _lookup(prefix, name) is None]


def _denied():
    """{callable: (qualified name, why)} for every denylisted name this torch has."""
    denied = {}
    for prefix, names, why in DENYLIST:
        for name in names.split():
            value = _lookup(prefix, name)
            if value is None:
                continue
            getter = value.__get__ if isinstance(value, property) or type(value).__name__ == "getset_descriptor" else None
            for obj in (value, getter):
                if obj is not None:
                    denied[_key(obj)] = (f"{prefix}.{name}", why)
    return denied


DENIED = _denied()
METADATA_NAMES = frozenset(METADATA.split())


def denied(fn):
    """(qualified name, why) when `fn` is on the denylist, else None."""
    # torch may re-wrap its own functions later (importing torch._dynamo wraps
    # torch.manual_seed); functools.wraps leaves the original in __wrapped__.
    for _ in range(4):
        try:
            hit = DENIED.get(_key(fn))
        except TypeError:
            return None
        if hit is not None or getattr(fn, "__wrapped__", None) is None:
            return hit
        fn = fn.__wrapped__
    return None


def _overloads(fn):
    """The ATen overloads of a native function (`torch.lstm`: lstm.input, lstm.data)."""
    packet = getattr(torch.ops.aten, getattr(fn, "__name__", "") or "", None)
    if packet is None:
        return []
    try:
        return [getattr(packet, o) for o in packet.overloads()]
    except (AttributeError, RuntimeError):
        return []


def _schemas(fn):
    return [o._schema for o in _overloads(fn)]


def _is_factory(fn):
    """A native function with TensorOptions (a `device` argument) returning a Tensor."""
    return any(any(a.name == "device" for a in s.arguments) and any(str(r.type) == "Tensor" for r in s.returns)
               for s in _schemas(fn))


def _is_random(name, fn):
    """It may draw from a generator: Python-level dropout and its kin by
    name; a native function torch tags `nondeterministic_seeded` (its
    random functions, and kernels with a dropout probability inside:
    attention's `dropout_p`, the RNN kernels' `dropout`, whose ops draw
    unless that probability is 0: runtime/effects.py `draws`) or that takes
    a generator."""
    return "dropout" in name or name in ("rrelu", "gumbel_softmax") or any(
        torch.Tag.nondeterministic_seeded in o.tags or any(a.name == "generator" for a in o._schema.arguments)
        for o in _overloads(fn))


def _is_inplace(name):
    return (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_OPERATORS


def _bool_tensor(fn):
    def kernel(*args, **kwargs):
        return torch.tensor(fn(*args, **kwargs))
    kernel.__name__ = fn.__name__
    return kernel


# Functions that write tensor arguments their schemas do not mark as
# written (so neither the name nor `mutates` tells): batch and instance
# norm's running statistics in training mode (also through the native
# functions the composites call, whose schemas say nothing either),
# embedding's and embedding_bag's weight under max_norm, a fake-quant
# observer's statistics. Their ops are effects: never dropped, merged,
# hoisted or replayed for an example.
WRITES_UNDECLARED = frozenset({"batch_norm", "instance_norm", "embedding", "embedding_bag", "native_batch_norm",
                               "miopen_batch_norm", "fused_moving_avg_obs_fake_quant"})


def _add(type_name, name, fn, **flags):
    if is_registered(type_name) or denied(fn) is not None:
        return
    if name in WRITES_UNDECLARED:
        flags["side_effect"] = True
    kernel = _bool_tensor(fn) if name in TO_BOOL_TENSOR else fn
    # Schemas are looked up for the ops a program uses, not for all at import.
    random = FirstUse(_is_random, name, fn)
    # A kernel that is not the callable (a bool made a tensor) is no ATen call.
    aten, wrapper = aten_call(type_name, fn) if kernel is fn else (None, None)
    register(OpDef(type_name, kernel=kernel, mutates=_is_inplace(name), random=random,
                   infer=SHAPE_RULES.get(type_name), aten=aten, wrapper=wrapper, **flags), fn)


OVERRIDABLE = {_key(f) for fs in get_overridable_functions().values() for f in fs}
FACTORIES = {_key(f) for f in get_ignored_functions() if callable(f) and _is_factory(f)}
# Python-level compute functions torch lists as "ignored" (they only call
# other torch functions), named here so that a saved program may use them.
PYTHON_LEVEL = (
    ("torch.nn.functional", "hardsigmoid hardswish sigmoid tanh upsample upsample_bilinear upsample_nearest"),
    ("torch.Tensor", "unflatten"),
    # Private native functions torch's own code calls (nn.utils.weight_norm;
    # `_shape_as_tensor`, the sizes as a tensor, in fairseq's positional
    # embeddings; nn.utils.rnn's packed sequences, ops/packed_sequences.py).
    ("torch", "_weight_norm _shape_as_tensor _pack_padded_sequence _pad_packed_sequence"),
    # The fused inference kernels nn.MultiheadAttention and
    # nn.TransformerEncoderLayer call without gradients (ops/ambient_modes.py).
    ("torch", "_native_multi_head_attention _transformer_encoder_layer_fwd"),
    # nn.TransformerEncoder's check that a padding mask is left-aligned (a
    # bool of the mask's values: a decision, ops/capture.py `_decided_bool`).
    ("torch", "_nested_tensor_from_mask_left_aligned"),
)
# Tensor properties whose value is a tensor; the others (shape, dtype,
# device, requires_grad, ...) are metadata.
TENSOR_PROPERTIES = "T mT H mH real imag data"


def _register_namespaces():
    for prefix, module in NAMESPACES:
        for name in sorted(dir(module)):
            if name.startswith("_"):
                continue
            fn = getattr(module, name, None)
            if not callable(fn) or isinstance(fn, type):
                continue
            if _key(fn) in FACTORIES:
                _add(f"{prefix}.{name}", name, fn, factory=True)
            elif _key(fn) in OVERRIDABLE and name not in METADATA_NAMES:
                _add(f"{prefix}.{name}", name, fn)
            elif _is_inplace(name) and _key(getattr(module, name[:-1], None)) in OVERRIDABLE and _schemas(fn):
                # `torch.tanh_(x)`: the in-place form of a declared function (a native op of its own)
                _add(f"{prefix}.{name}", name, fn)


def _register_tensor():
    for name in TENSOR_PROPERTIES.split():
        getter = _lookup("torch.Tensor", name).__get__
        register(OpDef(f"torch.Tensor.{name}", kernel=getter), getter)
    for name in sorted(dir(torch.Tensor)):
        fn = getattr(torch.Tensor, name, None)
        if name in METADATA_NAMES or not callable(fn) or isinstance(fn, type):
            continue
        if _key(fn) in OVERRIDABLE or _key(fn) in FACTORIES:  # `x.new_zeros`: a factory on a tensor
            _add(f"torch.Tensor.{name}", name, fn)
    # The legacy constructors `x.new(...)`, `x.new_tensor(data)`: they copy
    # x's dtype/device, so they are methods, not factories.
    for name in ("new", "new_tensor"):
        _add(f"torch.Tensor.{name}", name, _lookup("torch.Tensor", name))


def _set_data(tensor, value):
    """`param.data = value`: the parameter takes `value`'s contents, outside
    autograd. Programs have fixed shapes and dtypes, so a value of another
    shape or dtype is an error (at build time, from inference)."""
    if value.shape != tensor.shape or value.dtype != tensor.dtype:
        raise ValueError(f"`.data = ...` changes {tuple(tensor.shape)}/{tensor.dtype} to "
                         f"{tuple(value.shape)}/{value.dtype}; a program keeps shapes and dtypes")
    with torch.no_grad():
        tensor.copy_(value)


def _set_rng_state(new_state):
    """`torch.set_rng_state`. Shape inference runs kernels on tensors without
    data (meta, fake): for those it only answers that nothing is returned."""
    if new_state.is_meta or type(new_state) is not torch.Tensor:
        return None
    return torch.set_rng_state(new_state)


# The CPU generator's state, read and written when the program runs, in
# program order with its random ops (random=True: never merged, moved or
# dropped). Python functions that torch's function modes do not see:
# converted code's calls reach them through `python_level_op`.
RNG_STATE_OPS = {
    torch.get_rng_state: OpDef("torch.get_rng_state", kernel=torch.get_rng_state, random=True,
                               factory=True),
    torch.set_rng_state: OpDef("torch.set_rng_state", kernel=_set_rng_state, random=True,
                               side_effect=True),
}


def _grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """`torch._grouped_mm`, a mixture of experts' matmul (transformers'
    Mixtral, Qwen-MoE). Its meta kernel is CUDA's (bfloat16 only), so shape
    inference on meta or fake tensors gets the output from here; the real
    kernel runs on real tensors (float32 on CPU)."""
    if not (mat_a.is_meta or isinstance(mat_a, torch._subclasses.FakeTensor)):
        return torch._grouped_mm(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)
    if mat_a.dim() == 2:
        size = [offs.size(0), mat_a.size(0), mat_b.size(1)] if mat_b.dim() == 2 else [mat_a.size(0), mat_b.size(-1)]
    else:
        size = [mat_a.size(1), mat_b.size(1)] if mat_b.dim() == 2 else [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
    return mat_a.new_empty(size, dtype=out_dtype or mat_a.dtype)


def python_level_op(fn):
    """The OpDef for a torch Python function that capture modes do not see
    (its body reads process state outside torch's dispatch), or None."""
    try:
        opdef = RNG_STATE_OPS.get(fn)
    except TypeError:  # unhashable callable
        return None
    return opdef


def _register_python_level():
    for fn, opdef in RNG_STATE_OPS.items():
        register(opdef, fn)
    register(OpDef("torch._grouped_mm", kernel=_grouped_mm), torch._grouped_mm)
    # nn.utils.rnn.pad_sequence's native function (its sizes follow its inputs' sizes).
    register(OpDef("torch._C._nn.pad_sequence", kernel=torch._C._nn.pad_sequence), torch._C._nn.pad_sequence)
    setter = _lookup("torch.Tensor", "data").__set__
    register(OpDef("torch.Tensor.data.__set__", kernel=_set_data, mutates=True), setter)
    for prefix, names in PYTHON_LEVEL:
        for name in names.split():
            _add(f"{prefix}.{name}", name, _lookup(prefix, name))


_register_namespaces()
_register_tensor()
_register_python_level()
