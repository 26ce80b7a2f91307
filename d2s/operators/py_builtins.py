"""Builtins with a tensor meaning: ``len``, ``x.shape``, ``int``/``float``/``bool``,
``print``, ``assert``, ``isinstance``, and ``t.item()``.
"""

import builtins
import functools
import math

import torch

from ops import control_flow as cf
from ops import framework as fw
from ops import number_paths
from ops import tracer
from ops.control_flow import identity
from ops.recording import graph_tensor, number_or_tensor, size as _variable_size, stands_for_number
from ops.user_frames import error_at_user_line
from ops.wrapped_numbers import number_dtype
from runtime.ir import GENERATOR, Variable

from .for_loops import Rows, convert_enumerate, convert_range, convert_zip, refuse_outliving
from .logical import unobservable_since
from .state import array_truth, is_array, is_var


def convert_len(value):
    """``len(value)``: a Python int when known while converting, else a SymInt."""
    if not is_var(value):
        return len(value)
    return Rows(value).length()


def convert_shape(value):
    """``value.shape``: for a graph tensor a torch.Size of Python ints (known
    dimensions) and SymInts (dimensions known only at run time)."""
    if is_var(value):
        return _variable_size(value)
    return value.shape


# A Python float is a double: float(t) is float64 (ops/wrapped_numbers.py).
_CASTS = {int: torch.int64, float: torch.float64, bool: torch.bool}


def convert_cast(value, kind):
    """``kind(value)`` for ``kind`` in int/float/bool; a cast to a 0-d tensor
    for a graph tensor (float -> float64, int -> int64). Detached: eagerly the
    result is a Python number, which carries no gradient."""
    if not is_var(value):
        return kind(value)
    if is_array(value):  # a Python list eagerly: its truth, or Python's own TypeError
        return array_truth(value) if kind is bool else kind([])
    if kind is int and isinstance(value, torch.SymInt):
        return value  # a run-time size is a Python int already
    src = graph_tensor(value).detach()
    # The number is what the tensor holds now: a cast to its own dtype would
    # be the tensor itself, changed by later in-place ops (`n = int(t); t.add_(1)`).
    out = src.clone() if src.dtype == _CASTS[kind] else fw.cast(src, _CASTS[kind])
    out = out if out.shape == () else out.reshape(())
    out.python_number = True
    return out


def _cast_builtin(kind):
    @functools.wraps(kind)
    def cast(*args, **kwargs):
        if len(args) == 1 and not kwargs and is_var(args[0]):
            return convert_cast(args[0], kind)
        return kind(*args, **kwargs)
    return cast


def convert_divmod(a, b):
    """``divmod(a, b)`` where a number read from a tensor takes part
    (``divmod(int(t), 3)``): Python's ``(a // b, a % b)``, which torch's
    floor division and remainder give on tensors too."""
    if is_var(a) or is_var(b):
        return a // b, a % b
    return divmod(a, b)


def convert_print(*values, sep=" ", end="\n", file=None, flush=False):
    """``print(*values)``; a run-time ``print`` op when a value is a graph tensor."""
    if any(is_var(v) for v in values):
        fw.print_(*values, sep=sep, end=end)
    else:
        print(*values, sep=sep, end=end, file=file, flush=flush)


def convert_assert(test, message=None):
    """``assert test, message()``; a run-time ``assert`` op for a graph tensor."""
    if is_var(test):
        fw.assert_(test, message() if message is not None else "")
    elif not test:
        raise AssertionError(message()) if message is not None else AssertionError()


def convert_isinstance(value, classinfo):
    """``isinstance(value, classinfo)``, where a graph tensor counts as a
    ``torch.Tensor``, and one that stands for a Python number (``t.item()``,
    ``int(t)``, a counter a graph loop carries) as that number: ``bool``,
    ``int`` or ``float`` by its dtype."""
    if isinstance(value, classinfo):
        return True
    if is_var(value):
        answers = {_instance_of(kind, classinfo) for kind in _types(value)}
        if len(answers) > 1:
            raise _no_one_type(value, "isinstance")
        return answers.pop()
    return False


# An instance of each type `_types` gives, asked in its place: `classinfo`
# may be a tuple, a union (`torch.Tensor | None`) or a class whose metaclass
# decides (`torch.autograd.Variable` takes any tensor), as for eager's value.
_EXAMPLES = {torch.Tensor: torch.empty(0), bool: False, int: 0, float: 0.0}


def _instance_of(kind, classinfo):
    example = _EXAMPLES.get(kind)
    if example is None:
        return issubclass(kind, classinfo)
    return isinstance(example, classinfo)


def _types(value):
    """The Python types eager code can have for graph tensor `value`: its
    number type where it stands for a number, `torch.Tensor` where it is one."""
    if getattr(value, "kind", None) == GENERATOR:
        return [torch.Generator]  # a generator argument (a feed of the program)
    if not isinstance(value, Variable):  # a run-time size (SymInt) or a comparison of sizes (SymBool): eagerly a number
        return [bool if isinstance(value, torch.SymBool) else float if isinstance(value, torch.SymFloat) else int]
    number = bool if value.dtype == torch.bool else float if value.dtype.is_floating_point else int
    if number_or_tensor(value):
        return [number, torch.Tensor]
    return [number] if stands_for_number(value) else [torch.Tensor]


def _no_one_type(value, builtin):
    number_paths.observe(value)  # where the side of its `if` is known: decided per path (ops/number_paths.py)
    return error_at_user_line(
        f"{number_or_tensor(value)} is a Python number on some paths and a tensor on others (a tensor loop or "
        f"`if` makes it a tensor on some paths only), so `{builtin}` has no one answer when the program runs; "
        "make it a tensor on every path (e.g. `torch.tensor(0.0)` in place of `0.0`) or a number on every path")


def _item(value):
    """``value.item()`` of a graph tensor: a new 0-d Variable (never ``value``
    itself) that stands for the Python number eager code would have.
    Detached: eagerly a number carries no gradient. A copy, not a view: the
    number is what the tensor held at this point, whatever in-place ops do
    to the tensor later (`n = t.item(); t.add_(1)`)."""
    src = value.detach()
    dtype = number_dtype(src.dtype)  # the Python number's own precision: a float is a double
    out = (src.clone() if src.dtype == dtype else fw.cast(src, dtype)).reshape(())
    out.python_number = True
    return out


# `t.tolist()` makes one graph value per element: past this many, a value
# meant for Python (a list of ids, boxes to print) is not what a program
# should carry one op output at a time.
TOLIST_LIMIT = 4096


def _tolist(value):
    """``value.tolist()`` of a graph tensor of known sizes: nested lists of
    0-d Variables, each standing for the Python number eager code has there
    (as ``_item`` reads one), so `x.split(sizes.tolist())` splits at the
    run's sizes and `int(n)` / `range(n)` of an element decide as they do
    for any number read from a tensor. One copy of the whole tensor, taken
    here: later in-place ops on `value` leave the numbers alone."""
    shape = list(value.shape)
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise error_at_user_line(
            f"`.tolist()` of a tensor whose sizes are known only when the program runs ({tuple(value.shape)}): "
            "the list's length would differ from run to run, which a program cannot give Python; keep the "
            "value a tensor (index it, or `torch.split` it by a tensor of sizes)")
    numel = math.prod(shape)
    if numel > TOLIST_LIMIT:
        raise error_at_user_line(
            f"`.tolist()` of a tensor of {numel} elements while the program is built: each element would be a "
            f"graph value of its own (at most {TOLIST_LIMIT}); keep the value a tensor, or call `.tolist()` on "
            "the function's result outside it")
    if not shape:
        return _item(value)
    src = value.detach()
    dtype = number_dtype(src.dtype)
    flat = (src.clone() if src.dtype == dtype else fw.cast(src, dtype)).reshape(-1)
    numbers = list(flat.unbind(0)) if numel else []
    for number in numbers:
        number.python_number = True

    def nest(start, dims):
        if len(dims) == 1:
            return numbers[start:start + dims[0]]
        step = math.prod(dims[1:])
        return [nest(start + i * step, dims[1:]) for i in range(dims[0])]
    return nest(0, shape)


def convert_max_min(builtin, which):
    """``max(a, b, ...)`` / ``min(a, b, ...)``, or of one iterable, where a
    graph tensor takes part: eager Python keeps ``best`` and takes each
    next ``e`` when ``e > best`` (``e < best`` for min); the graph picks the
    same value with a ``cond`` (``b if b > a else a``). With ``key=``/``default=`` it is
    Python's own (the key function converted)."""
    def call(*args, **kwargs):
        if kwargs or not args:
            if kwargs.get("key") is not None:
                from .calls import convert_call  # lazy: calls imports this module (its builtin table)
                kwargs = dict(kwargs, key=convert_call(kwargs["key"]))
            return builtin(*args, **kwargs)
        items = list(args[0]) if len(args) == 1 else list(args)
        if not any(is_var(v) for v in items):
            return builtin(*args)
        if not items:
            return builtin(items)  # Python's own ValueError
        best = items[0]
        for item in items[1:]:
            best = _pick(best, item, which)
        return best
    return call


def _pick(a, b, which):
    """``b if b > a else a`` (``b < a`` for min), as ``max(a, b)`` does."""
    if not (is_var(a) or is_var(b)):
        return b if (b > a if which == "max" else b < a) else a
    if not any(isinstance(v, Variable) for v in (a, b)):  # run-time sizes: a size expression
        return (torch.sym_max if which == "max" else torch.sym_min)(a, b)
    # A run-time size beside a graph number (`min(i * block + block, seq_len)`
    # with `i` a loop counter): the size's 0-d tensor, as the counter is one.
    a, b = graph_tensor(a), graph_tensor(b)
    _check_one_value(a, b, which)
    pick_b = (b > a) if which == "max" else (b < a)
    if not is_var(pick_b):
        pick_b = torch.as_tensor(pick_b)
    elif any(d != 1 for d in pick_b.shape):
        # Eager asks bool(b > a), which raises for more than one element;
        # torch.where would pick element by element.
        if -1 not in pick_b.shape:
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
        raise error_at_user_line(
            f"{which}(a, b) compares tensors of shape {list(pick_b.shape)}, known only when the program runs: "
            f"eager raises unless they hold one element; use torch.{which}imum(a, b) for elementwise values, "
            f"or make the sizes static")
    # `b if b > a else a`, as Python picks: the value picked is `a` or `b`
    # itself on each path (a Python number stays one, a double; decided per
    # side where their types differ: ops/control_flow/merge.py).
    return cf.cond(pick_b.reshape(()), lambda: b, lambda: a)


def convert_any_all(builtin, which):
    """``any(items)`` / ``all(items)``: Python's ``for e in items: if e:
    return True`` (``if not e: return False`` for all), pulling items one
    at a time. Once an item is a graph tensor the answer is a bool tensor
    known only at run time, and the later items are pulled (computed) on
    every path, also where Python would have stopped: they must be
    unobservable there (effect-free ops that cannot fail, as for
    ``and``/``or``), or the call is refused at the user's line."""
    stop_at = which == "any"

    def call(*args, **kwargs):
        if len(args) != 1 or kwargs:
            return builtin(*args, **kwargs)
        found, it = not stop_at, iter(args[0])
        while True:
            mark = tracer.current().mark() if is_var(found) else None
            try:
                item = next(it)
            except StopIteration:
                return found
            if mark is not None and not unobservable_since(tracer.current(), mark):
                raise error_at_user_line(
                    f"{which}() over items that compute with effects (writes, random numbers, checks) or ops "
                    f"that may fail, after an item known only when the program runs: Python stops at the first "
                    f"{'true' if stop_at else 'false'} item; write the loop out (`for ...: if ...: break`)")
            item = graph_tensor(item)
            if not is_var(item):
                if bool(item) == stop_at:
                    return stop_at  # decided, whatever the graph items before it were
                continue
            if item.shape.numel() != 1:
                raise RuntimeError(f"Boolean value of Tensor with more than one value is ambiguous "
                                   f"(an item of {which}() has shape {list(item.shape)})")
            truth = (item if item.dtype == torch.bool else item != 0).reshape(())
            if not is_var(found):
                found = truth
            else:
                # `|` / `&` of bools, not torch.logical_or/and: those make the result on the first
                # operand's device, and Python's any()/all() mix a CPU item with a GPU one.
                found = found | truth if stop_at else found & truth
    return call


def _check_one_value(a, b, which):
    """Eager ``max(a, b)`` returns ``a`` or ``b`` unchanged; ``torch.where``
    would promote their dtypes and broadcast their shapes, a silent change
    on the path that returns the other one. Two tensors must agree; a Python
    number joins a tensor whose dtype holds it exactly (an int with a float
    tensor, not 2.5 with an int one)."""
    tensors = [v for v in (a, b) if is_var(v) or isinstance(v, torch.Tensor)]
    numbers = [v for v in (a, b) if isinstance(v, (bool, int, float))]
    kinds = {t.dtype for t in tensors}
    ranks = {len(t.shape) for t in tensors}
    exact = len(kinds) == 1 and len(ranks) == 1 and all(
        next(iter(kinds)).is_floating_point or not isinstance(n, float) for n in numbers)
    if not exact:
        described = " and ".join(
            f"{str(v.dtype).replace('torch.', '')} of rank {len(v.shape)}" if is_var(v) or isinstance(v, torch.Tensor)
            else f"a Python {type(v).__name__}" for v in (a, b))
        raise error_at_user_line(
            f"{which}(a, b) returns a or b unchanged, and here they are {described}: one program value cannot "
            f"be either; cast them to one dtype and shape, or use torch.{which}imum(a, b)")


def convert_legacy_variable(data=None, requires_grad=False, volatile=False):
    """``torch.autograd.Variable(t)``: since PyTorch 0.4 a new tensor sharing
    ``t``'s data, detached from its graph, a leaf requiring grad only when
    asked (what eager returns, as a graph op)."""
    if not is_var(data):
        return torch.autograd.Variable(data, requires_grad=requires_grad, volatile=volatile)
    out = data.detach()
    return out.requires_grad_() if requires_grad else out


def convert_type(*args):
    """``type(x)``: ``torch.Tensor`` for a graph tensor (the eager tensor's
    type), or the Python number type it stands for; ``type(name, bases,
    namespace)`` and other values are Python's own."""
    if len(args) == 1 and is_var(args[0]):
        kinds = _types(args[0])
        if len(kinds) > 1:
            raise _no_one_type(args[0], "type")
        return kinds[0]
    return builtins.type(*args)


def convert_next(iterator, *default):
    """`next(it)`, refused on an iterator that outlives the call (`refuse_outliving`)."""
    refuse_outliving(iterator, "`next()` advances")
    return builtins.next(iterator, *default)


def _getattr(obj, name, *default):
    """`getattr`, where a name spelled by a run-time int picks a submodule (operators/subscripts.py)."""
    from .subscripts import convert_getattr  # lazy: subscripts calls convert_call, whose module imports this one
    return convert_getattr(obj, name, *default)


BUILTINS = {
    builtins.type: convert_type,
    builtins.next: convert_next,
    builtins.max: convert_max_min(builtins.max, "max"),
    builtins.min: convert_max_min(builtins.min, "min"),
    builtins.any: convert_any_all(builtins.any, "any"),
    builtins.all: convert_any_all(builtins.all, "all"),
    torch.autograd.Variable: convert_legacy_variable,
    torch.is_tensor: lambda value: convert_isinstance(value, torch.Tensor),
    builtins.divmod: convert_divmod,
    builtins.id: identity.object_id,
    builtins.len: convert_len,
    builtins.print: convert_print,
    builtins.int: _cast_builtin(int),
    builtins.float: _cast_builtin(float),
    builtins.bool: _cast_builtin(bool),
    builtins.range: convert_range,
    builtins.enumerate: convert_enumerate,
    builtins.zip: convert_zip,
    builtins.isinstance: convert_isinstance,
    builtins.getattr: _getattr,
}
