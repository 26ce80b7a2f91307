"""``seq[i]`` where ``seq`` is a Python tuple or list and ``i`` an int known
only when the program runs (it depends on a tensor: ``c[int(x.sum() > 0)]``,
a counter a tensor loop carries).

Python indexes the sequence with a Python int; in a program the index is a
graph tensor, so the items become one tensor array read at that index, with
Python's bounds check (``IndexError`` when a run goes out of range, as
eager raises it). Items of one Python number type, or tensors of one dtype,
can be staged. Modules or functions (an `nn.ModuleList` of experts) are
picked when called: a `cond` per item, so the run calls the one its index
names (`ChosenAtRunTime`). A sequence of anything else is refused at the
user's line.
"""

import torch

from ops import control_flow as cf
from ops import framework as fw
from ops.recording import stands_for_number
from ops.user_frames import error_at_user_line, user_origin
from runtime.ir import Variable

from .calls import convert_call
from .fstrings import RunTimeText
from .logical import any_match, number_matches
from .state import is_var


def convert_getitem(seq, index):
    """Equivalent Python: ``return seq[index]``."""
    if isinstance(index, RunTimeText):
        return _by_text(seq, index)
    if type(seq) is dict and isinstance(index, Variable) and stands_for_number(index):
        return _by_number(seq, index)
    if not ((type(seq) in (tuple, list) or isinstance(seq, torch.nn.ModuleList)) and is_var(index)):
        return seq[index]
    index = fw.fill_constant(index, torch.int64) if not isinstance(index, Variable) else index
    items = list(seq)
    if items and all(callable(v) and not isinstance(v, (Variable, torch.Tensor, type)) for v in items):
        return ChosenAtRunTime(items, _integer_index(index, type(seq).__name__), type(seq).__name__)
    if isinstance(seq, torch.nn.ModuleList):
        return seq[index]
    return _read(seq, index)


def _integer_index(index, kind):
    if index.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool) \
            or index.shape:
        raise error_at_user_line(
            f"a Python {kind} indexed by a tensor that is not an integer number "
            f"({index.dtype_name}{list(index.shape)}); index it by an int")
    return index if index.dtype == torch.int64 else fw.cast(index, torch.int64)


def _read(seq, index):
    """`seq[index]` of numbers or tensors: a tensor array read at run time."""
    index = _integer_index(index, type(seq).__name__)
    items = list(seq)
    numbers = {type(v) for v in items if isinstance(v, (bool, int, float))}
    tensors = [v for v in items if isinstance(v, (Variable, torch.Tensor))]
    if not items or not (len(numbers) == 1 and not tensors or len(tensors) == len(items)
                         and len({(v.dtype, v.dim()) if isinstance(v, torch.Tensor) else (v.dtype, len(v.shape))
                                  for v in tensors}) == 1):
        raise error_at_user_line(
            f"a Python {type(seq).__name__} indexed by an int known only when the program runs must hold numbers "
            "of one type or tensors of one dtype and rank, to be read at run time; this one holds "
            f"{sorted({type(v).__name__ for v in items})}: pick the value with `if`/`elif` on the index instead")
    _check_bounds(index, len(items), type(seq).__name__)
    item = fw.array_read(fw.array_from_list(items), index)
    if numbers:
        item.python_number = True  # a Python number, as eager's item
    return item


def _by_number(mapping, key):
    """`table[n]` of a dict keyed by numbers, `n` a number read from a
    tensor (`int(t)`): the value whose key equals `n`, as Python's hash
    lookup finds it (`2.0` finds `2`), read at run time as `seq[i]` is (the
    values numbers of one type, tensors of one dtype and rank, or modules
    picked when called); `KeyError` when a run's number is no key. By the
    Variable's identity the lookup would find nothing."""
    pairs = number_matches(key, mapping, hashed=True)
    if not pairs:
        raise error_at_user_line(
            "a dict indexed by a Python number read from a tensor, whose keys are not numbers: no key can "
            "equal it; index it by a key it holds")
    keys, matches = [k for k, _ in pairs], [same for _, same in pairs]
    position = fw.fill_constant(0, torch.int64)
    for i, same in enumerate(matches[1:], 1):
        position = position + same.long() * i
    found = any_match(matches)

    def missing():
        fw.raise_(KeyError("no key of the dict equals the number"), origin=user_origin())
        return cf.Unreachable("key")

    cf.cond(found, lambda: (), missing)
    return convert_getitem([mapping[k] for k in keys], position)


def _check_bounds(index, length, kind):
    """``IndexError`` when a run's index is outside ``-length <= index < length``."""
    inside = (index >= -length) & (index < length)

    def out_of_range():
        fw.raise_(IndexError(f"{kind} index out of range"), origin=user_origin())
        return cf.Unreachable("index")

    cf.cond(inside, lambda: (), out_of_range)


def convert_getattr(obj, name, *default):
    """Equivalent Python: ``return getattr(obj, name, *default)``. A name
    spelled by an int known only when the program runs
    (`getattr(self, f"layer_{i}")(x)`) picks among the module's submodules
    (another object's functions) when called."""
    if not isinstance(name, RunTimeText):
        return getattr(obj, name, *default)
    if default:
        raise error_at_user_line(
            f"getattr with a default, of the name {name!r} spelled by an integer known only when the program "
            "runs: which ints name an attribute is known only then; drop the default")
    if isinstance(obj, torch.nn.Module):
        attributes = dict(obj.named_children())
    else:
        attributes = {k: v for k, v in vars(obj).items() if callable(v) and not isinstance(v, (Variable, type))}
    return _by_text(attributes, name, f"{type(obj).__name__}'s attributes",
                    AttributeError(f"'{type(obj).__name__}' object has no attribute {name!r}"))


def _by_text(mapping, text, kind=None, missing=None):
    """`mapping[f"expert_{i}"]` of an nn.ModuleDict or a dict of modules or
    functions, `i` known only when the program runs: the item is picked when
    called; `missing`: what a run raises where the text spells no key."""
    kind = kind or type(mapping).__name__
    if not isinstance(mapping, (torch.nn.ModuleDict, dict)) or not all(
            callable(v) and not isinstance(v, (Variable, torch.Tensor, type)) for v in mapping.values()):
        raise error_at_user_line(
            f"a {kind} indexed by the text {text!r}, which holds an integer known only when the program runs: "
            "only an nn.ModuleDict or a dict of modules or functions can be indexed so (the item is picked "
            "when the run calls it)")
    found = text.matches(list(mapping.keys()))
    if not found:
        raise error_at_user_line(f"no key of this {kind} is spelled {text!r} for any integer: eager raises "
                                 "KeyError here on every call")
    return ChosenByKey([(mapping[key], condition) for key, condition in found], text, kind,
                       missing or KeyError(f"{text!r}: no such key in the {kind}"))


def _call_picked(items, condition, otherwise, args, kwargs):
    """`items[0](...) if condition(0) else items[1](...) if condition(1) else
    ... otherwise()`: a `cond` per item, each test made in the branch where
    the ones before it failed."""
    def pick(j):
        if j == len(items):
            return otherwise()
        return cf.cond(condition(j), lambda: convert_call(items[j])(*args, **kwargs), lambda: pick(j + 1))
    return pick(0)


class _Picked:
    """An item of modules or functions that the run picks: it can be called, not read."""

    _what = ""

    def __getattr__(self, name):
        if name.startswith("_"):  # Python's and d2s's own probes (`__wrapped__`, `__d2s_unwrap__`)
            raise AttributeError(name)
        raise error_at_user_line(f"an item of a {self._kind} picked by {self._what} known only when the program "
                                 f"runs can be called, not read (`.{name}`): call it, or pick the value with "
                                 "`if`/`elif` on what picks it")


class ChosenByKey(_Picked):
    """`mapping[text]` of modules or functions where `text` holds integers
    known only when the program runs: calling it calls the item whose key
    the run's text spells, a `cond` per key it may spell, eager's KeyError
    where it spells none."""

    def __init__(self, choices, text, kind, missing):
        self._choices, self._text, self._kind, self._missing = choices, text, kind, missing
        self._what = f"the text {text!r},"

    def __call__(self, *args, **kwargs):
        def missing():
            fw.raise_(self._missing, origin=user_origin())
            return cf.Unreachable("key")
        return _call_picked([item for item, _ in self._choices], lambda j: self._choices[j][1], missing,
                            args, kwargs)


class ChosenAtRunTime(_Picked):
    """`seq[i]` of modules or functions with an int `i` known only when the
    program runs (`self.experts[idx](x)`): calling it calls the item the
    run's index names, a `cond` per item, with Python's IndexError out of
    range. Gradients reach the parameters of the item called."""

    _what = "an int"

    def __init__(self, items, index, kind):
        self._items, self._index, self._kind = items, index, kind

    def __call__(self, *args, **kwargs):
        n = len(self._items)
        _check_bounds(self._index, n, self._kind)
        position = self._index % n  # Python's index of a negative one (torch's % has the divisor's sign)
        return _call_picked(self._items[:-1], lambda j: position == j,
                            lambda: convert_call(self._items[-1])(*args, **kwargs), args, kwargs)
