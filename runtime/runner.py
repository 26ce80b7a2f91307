"""One way to run a compiled program, with one input policy.

`Executor.run`, declarative calls (`StaticFunction`), `TracedLayer` and
`TranslatedLayer` all turn their inputs into feed tensors with
`convert_input` and call the generated function through `run`:

  - a feed is a tensor, a numpy array or a Python number/nested list of
    numbers; anything else (a string, None, an object) is a TypeError that
    names the feed;
  - dtype: a tensor or numpy array whose dtype differs from the feed's is
    cast only where numpy's "safe" rule allows (every value representable:
    float32 -> float64, int32 -> int64, int16 -> float32; not float64 ->
    float32, int64 -> float32); Python numbers and lists, which have no
    dtype of their own (numpy's NEP 50 "weak" scalars), take the feed's when
    the kind keeps or widens (bool -> integer -> floating -> complex): 2.7
    fed to an int64 feed is a TypeError naming the feed, never a silent
    truncation to 2;
  - shape: the rank and every static dimension must match (-1 in the
    feed's shape is any size), else a ValueError naming the feed;
  - a generator feed (a `torch.Generator` argument of the traced function)
    takes a `torch.Generator`, which the program's random ops draw from
    (advancing it, as eager does); anything else is a TypeError naming it.
"""

import numpy as np
import torch

from .errors import OpRuntimeError
from .ir import GENERATOR, dtype_name
from .passes import check_level
from .run_modes import check_caller_modes

_KINDS = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _kind(dtype):
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def same_kind_cast(src, dst):
    """Whether a Python value of `src` may be fed where `dst` is expected."""
    return src == dst or _kind(src) <= _kind(dst)


# bfloat16, which numpy lacks: 8 significant bits (int8 and uint8 fit).
_BFLOAT16_FROM = {torch.bool, torch.uint8, torch.int8}
_BFLOAT16_TO = {torch.float32, torch.float64, torch.complex64, torch.complex128}


def safe_cast(src, dst):
    """Whether a `src` tensor may be fed where `dst` is expected: numpy's
    "safe" casting, every `src` value representable in `dst`."""
    if src == dst:
        return True
    if torch.bfloat16 in (src, dst):
        return src in _BFLOAT16_FROM if dst == torch.bfloat16 else dst in _BFLOAT16_TO
    try:
        return bool(np.can_cast(np.dtype(dtype_name(src)), np.dtype(dtype_name(dst)), "safe"))
    except TypeError:  # a dtype numpy does not know: only the same one
        return False


def convert_input(value, name, dtype, shape, what="feed", device=None):
    """`value` as a tensor for the feed `name` of `dtype` and `shape`, by the
    policy above. Tensors of the right dtype are passed as they are."""
    label = f"{what} {name!r}"
    weak = not isinstance(value, (torch.Tensor, np.ndarray, np.generic))  # a Python number or list
    if isinstance(value, torch.Tensor):
        tensor = value
    elif isinstance(value, (np.ndarray, np.generic, bool, int, float, complex, list, tuple)):
        array = np.asarray(value)
        if array.dtype == object:  # e.g. a list of 0-d tensors
            try:
                tensor = torch.tensor(value)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"{label} expects a tensor of {dtype_name(dtype)}, got {_describe(value)}") from None
        elif array.dtype.kind not in _KINDS:
            raise TypeError(f"{label} expects a tensor of {dtype_name(dtype)}, got {_describe(value)}")
        else:
            # A read-only array (a numpy scalar's) is copied: torch wants writable memory.
            tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
    else:
        raise TypeError(f"{label} expects a tensor of {dtype_name(dtype)}, got {_describe(value)}")
    if tensor.dtype != dtype:
        if weak and not same_kind_cast(tensor.dtype, dtype):
            raise TypeError(f"{label} expects {dtype_name(dtype)}, got {dtype_name(tensor.dtype)}: casting would "
                            f"lose information (only casts that keep or widen the kind are made: bool -> int -> "
                            f"float -> complex); convert it explicitly")
        if not weak and not safe_cast(tensor.dtype, dtype):
            raise TypeError(f"{label} expects {dtype_name(dtype)}, got {dtype_name(tensor.dtype)}: numpy's 'safe' "
                            f"casting rule refuses it (some values would change); convert it explicitly, e.g. "
                            f"`.to(torch.{dtype_name(dtype)})`, if that is what you mean")
        tensor = tensor.to(dtype)
    check_shape(tensor, name, shape, what)
    if device is not None and tensor.device != device:
        tensor = tensor.to(device)
    return tensor


def check_shape(tensor, name, shape, what="feed"):
    if len(shape) != tensor.dim() or any(d not in (-1, s) for d, s in zip(shape, tensor.shape)):
        raise ValueError(f"{what} {name!r} expects shape {list(shape)} (-1: any size), got {list(tensor.shape)}")


def _describe(value):
    if value is None:
        return "None"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, np.ndarray):
        return f"a numpy array of {value.dtype}"
    return f"a {type(value).__name__}"


def convert_inputs(values, feed_vars, what="feed", device=None):
    """`convert_feed` for each (value, Variable), after checking the count."""
    if len(values) != len(feed_vars):
        names = ", ".join(v.name for v in feed_vars)
        raise TypeError(f"expected {len(feed_vars)} input(s) ({names}), got {len(values)}")
    return [convert_feed(v, var, what, device) for v, var in zip(values, feed_vars)]


class Feeds:
    """`convert_inputs` for a fixed list of feed Variables, the common case
    first: a plain tensor of the feed's dtype, rank and static sizes is
    passed as it is, checked in one pass; anything else takes
    `convert_inputs` (and its errors)."""

    def __init__(self, feed_vars, what="feed"):
        self.vars = list(feed_vars)
        self.what = what
        # Per feed: (dtype, rank, ((dim, size), ...) of its static sizes); a
        # generator feed's dtype None sends it to `convert_inputs`.
        self._plain = [(None if v.kind == GENERATOR else v.dtype, len(v.shape),
                        tuple((i, d) for i, d in enumerate(v.shape) if d != -1)) for v in self.vars]

    def convert(self, values):
        if len(values) == len(self._plain):
            for value, (dtype, rank, static) in zip(values, self._plain):
                if type(value) is not torch.Tensor or value.dtype is not dtype:
                    break
                shape = value.shape
                if len(shape) != rank:
                    break
                for i, d in static:
                    if shape[i] != d:
                        break
                else:
                    continue
                break
            else:
                return values
        return convert_inputs(values, self.vars, self.what)


def convert_feed(value, var, what="feed", device=None):
    """`value` for the feed Variable `var`: `convert_input` for a tensor
    feed, the generator itself for a generator feed."""
    if var.kind == GENERATOR:
        if not isinstance(value, torch.Generator):
            raise TypeError(f"{what} {var.name!r} expects a torch.Generator (the program's random ops draw from "
                            f"it), got {_describe(value)}")
        return value
    return convert_input(value, var.name, var.dtype, var.shape, what, device)


def run(entry, inputs, params):
    """Call a CompiledBlock on checked inputs and the persistable values;
    failures name the op and the user line that created it."""
    return run_compiled(entry, [*inputs, *params])


class Transposes:
    """The transposed weights a fast-level function compiled for grad mode
    off takes after the parameters (`CompiledBlock.derived`, made by
    runtime/passes/pretranspose.py). They are views made once and remade
    whenever a weight's tensor, storage, version or `requires_grad`, or the
    grad/inference mode changed: a view made under no_grad carries no
    gradient, one made from a swapped `.data` reads the old storage."""

    def __init__(self):
        self._sources = self._state = None
        self._views = []

    def get(self, sources):
        # `_version`: after an in-place update of a weight (an optimizer
        # step) autograd would rebuild the old view's gradient function as a
        # slow generic `as_strided` one; a fresh `t()` costs less.
        state = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                 [id(t) for t in sources], [t.data_ptr() for t in sources],
                 [t.requires_grad for t in sources], [t._version for t in sources])
        if state != self._state:
            self._state = state
            self._views = [t.t() for t in sources]
        return self._views


class LeveledProgram:
    """One program run the way a declarative call runs it, for the runners
    that are not declarative calls (`Executor.run`, `TracedLayer`, a model
    from `jit.load`, through `d2s.Graph`'s own StaticFunction): the passes
    of level `optimize` (runtime/passes), native segments, and with grad
    mode off the variant that reuses dead temporaries in place (with its
    pretransposed weights at the fast level). The compiled functions are
    made on first use and remade when the program's version changes."""

    def __init__(self, executor, program, feed_names, fetch_names, optimize="default"):
        self.executor = executor
        self.program = program
        self.feed_names = list(feed_names)
        self.fetch_names = list(fetch_names)
        self.optimize = check_level(optimize)
        self._entries = {}  # grad mode off? -> (program version, CompiledBlock)
        self._transposes = Transposes()
        self._feeds = (None, None)  # (program version, Feeds)

    def feeds(self, what="feed"):
        """The program's feed Variables as a `Feeds` (remade when the program changes)."""
        version, feeds = self._feeds
        if version != self.program._version:
            block = self.program.global_block()
            feeds = Feeds([block.vars[n] for n in self.feed_names], what)
            self._feeds = (self.program._version, feeds)
        return feeds

    def entry(self, tensors=()):
        """The CompiledBlock a call makes now (grad mode on: the one that
        records autograd; off: the in-place variant). `tensors`: the call's
        feeds; on a device other than the program's (a saved model moved to
        a GPU), the program's device-following attributes name theirs, as a
        trace on that device would (runtime/ir.py `Program.device`)."""
        key = not torch.is_grad_enabled()
        device = tensors[0].device if tensors and isinstance(tensors[0], torch.Tensor) else None
        if device is not None and device != self.program.device:
            key = (key, device)
        cached = self._entries.get(key)
        if cached is not None and cached[0] == self.program._version:
            return cached[1]
        entry = self.executor.compiled_for_call(self.program, self.feed_names, self.fetch_names, self.optimize,
                                                device)
        self._entries[key] = (self.program._version, entry)
        return entry

    def call(self, entry, tensors, params, lookup):
        """Run `entry` (from `entry()`) on checked inputs and the values of
        its parameters; `lookup(name)`: a parameter's current value, for the
        transposes (fast level, grad mode off)."""
        check_caller_modes(self.program)
        args = [*tensors, *params]
        if entry.derived:
            args += self._transposes.get([lookup(n) for n in entry.derived])
        return run_compiled(entry, args)


def run_compiled(entry, args):
    """Call a CompiledBlock, turning a failure into an error that shows the op
    and the user line that created it."""
    try:
        return entry.fn(*args)
    except Exception as exc:  # noqa: BLE001 - re-raised with context below
        reraise(entry, exc)


def reraise(entry, exc):
    """Raise `exc`, caught from calling `entry.fn`, as an error that shows
    the op and the user line that created it (`exc` itself when no op of
    the program failed)."""
    op = _failing_op(entry, exc.__traceback__)
    if op is None:
        raise exc
    raise _op_error(exc, op) from exc


def _failing_op(entry, tb):
    op = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == entry.fn.__code__.co_filename:
            op = entry.line_ops.get(tb.tb_lineno, op)
        tb = tb.tb_next
    return op


def _op_error(exc, op):
    where = ""
    if op.origin:
        filename, lineno, line = op.origin
        where = f'\n  created at File "{filename}", line {lineno}' + (f"\n    {line}" if line else "")
    message = f"{type(exc).__name__}: {exc}\n  while running op: {op.to_string()}{where}"
    if isinstance(exc, AssertionError) or op.type in ("raise", "check_all_true", "array_read", "check_int64"):
        # A check the user wrote (`assert`, `raise` under a tensor condition)
        # raises the exception type and message the user chose; torch's own
        # argument checks (check_all_true) raise the ValueError torch raises;
        # a list read past its end (`ys[5]` of a tensor array) Python's IndexError;
        # a Python int past int64 (check_int64) an OverflowError.
        try:
            return type(exc)(f"{exc}{where}")
        except TypeError:  # an exception class with a richer constructor
            pass
    return OpRuntimeError(message)
