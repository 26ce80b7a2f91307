"""``and`` / ``or`` / ``not``: Python short-circuit evaluation on Python values
and on graph tensors alike.
"""

import operator

import torch

from ops import control_flow as cf
from ops import framework as fw
from ops import tracer
from ops.control_flow import identity
from ops.recording import graph_tensor, stands_for_number
from ops.user_frames import error_at_user_line, user_name
from runtime.errors import ConversionError
from runtime.ir import Variable
from runtime.effects import has_effects

from .effects import Effects
from .raising import raising_as_op
from .state import constant, is_array, is_var, tested


def as_bool_var(value):
    value = graph_tensor(value)
    return value if is_var(value) or isinstance(value, torch.Tensor) else constant(bool(value))


def convert_logical_and(lhs, rhs, test=False):
    """``lhs() and rhs()``: ``rhs()`` runs only where ``lhs()`` is true, as in
    Python, whenever that is observable (see ``_short_circuit``). With a
    graph tensor ``lhs()`` the value is Python's, ``rhs() if lhs() else
    lhs()``: ``torch.logical_and`` where that is the same tensor (both bool,
    same shape), else a ``cond`` that picks it. ``test=True`` where only the
    truth of the result matters (an ``if``/``while`` test, ``not``'s
    operand): ``torch.logical_and`` of any two operands then."""
    a = _tested_operand(lhs(), "and", test)
    if not is_var(a):
        return rhs() if a else a
    return _short_circuit(graph_tensor(a), rhs, torch.logical_and, rhs_when=True, test=test)


def convert_logical_or(lhs, rhs, test=False):
    """``lhs() or rhs()``: ``rhs()`` runs only where ``lhs()`` is false. With
    a graph tensor ``lhs()`` the value is ``lhs() if lhs() else rhs()``, as
    for ``convert_logical_and``."""
    a = _tested_operand(lhs(), "or", test)
    if not is_var(a):
        return a if a else rhs()
    return _short_circuit(graph_tensor(a), rhs, torch.logical_or, rhs_when=False, test=test)


def _tested_operand(value, which, test):
    """`tested(value)`; a list a graph loop fills is refused where its value,
    not only its truth, is the result: eager's `ys or default` is the list
    itself on one path, which one program value cannot be."""
    if is_array(value) and not test:
        raise error_at_user_line(
            f"`{which}` here yields either a list that a tensor loop fills or the other operand, which one program "
            f"value cannot be; test the list's truth in an `if` instead")
    return tested(value)


def _short_circuit(a, rhs, op, rhs_when, test):
    """``a and rhs()`` (``rhs_when`` True) or ``a or rhs()`` for a graph
    tensor ``a``. ``rhs()`` is traced once in place; if it only appended
    total, effect-free ops and ``op`` gives the value Python gives (or only
    the truth matters), the result is that op. Otherwise it is traced again
    inside a ``cond`` on ``a``, so that it runs exactly when Python would run
    it, and the ``cond`` yields Python's value."""
    tr = tracer.current()
    mark = tr.mark()
    effects = Effects((rhs,))
    try:
        b = rhs()
    except ConversionError:
        raise
    except Exception:  # noqa: BLE001 - raised only where Python evaluates rhs: see below
        exact = False
    else:
        # (A Python attribute write rhs() made, `self.hit = True`, is observable too.)
        exact = unobservable_since(tr, mark) and len(tr.python_writes) == mark.writes \
            and (test or _op_is_the_value(a, b))
        if not exact and not test:
            _check_one_value(a, b, "and" if rhs_when else "or")
    _refuse_python_writes(effects, "and" if rhs_when else "or")
    if exact and test:
        return _truth(a, b, rhs_when)
    if exact:
        return op(a, as_bool_var(b))
    tr.rollback(mark)
    pred = _as_bool(a)
    if test:
        evaluated, kept = raising_as_op(lambda: as_bool_var(rhs())), (lambda: pred)
    else:
        evaluated, kept = raising_as_op(lambda: _as_value(rhs())), (lambda: a)
    if rhs_when:
        return cf.cond(pred, evaluated, kept)
    return cf.cond(pred, kept, evaluated)


def _truth(a, b, rhs_when):
    """The truth of ``a and b`` (``rhs_when``) or ``a or b``, both evaluated:
    ``&`` / ``|`` of the operands as bools. Not ``torch.logical_and/or``,
    whose result is made on the first operand's device: a loop's `broke`
    flag or a Python number is a 0-d CPU tensor, and `not broke and i < n`
    with a CUDA `n` would fail there, where Python's `and` does not care;
    ``&`` takes a 0-d CPU operand beside a tensor of any device, as torch's
    arithmetic does."""
    a, b = _as_bool(a), _as_bool(as_bool_var(b))
    return a & b if rhs_when else a | b


def _as_bool(value):
    return value if value.dtype == torch.bool else fw.cast(value, torch.bool)


def _refuse_python_writes(effects, word):
    """``rhs()`` runs on some paths only, and wrote a Python object the
    operands reach (`box.hit = True` in a helper): an `if` stages such a
    write per path (effects.py), an operand cannot; refuse, objects put back."""
    slots = effects.written()
    if slots:
        effects.restore()
        raise error_at_user_line(
            f"the right operand of `{word}` on a tensor writes `{slots[0].name}`, a Python object: it runs "
            f"only on the paths where `{word}` needs it, and d2s stages such writes only in an `if`; write "
            f"`if` statements instead (`if a:` then `if b:`)")


def _op_is_the_value(a, b):
    """``logical_and(a, b)`` is ``b if a else a`` (and ``logical_or`` is
    ``a if a else b``) exactly when both are bool of the same shape."""
    b = graph_tensor(b)
    if isinstance(b, bool):
        return a.dtype == torch.bool and not a.dims
    return (is_var(b) or isinstance(b, torch.Tensor)) and a.dtype == torch.bool and b.dtype == torch.bool \
        and tuple(a.shape) == tuple(b.shape) and -1 not in tuple(a.shape)


def _check_one_value(a, b, word):
    """The ``cond`` yielding Python's value merges ``a`` and ``b``: refuse,
    at the user's line, operands no one program value can be."""
    b = graph_tensor(b)
    if is_var(b) or isinstance(b, torch.Tensor):
        dtype, rank = b.dtype, len(b.shape)
    elif isinstance(b, (bool, int, float)):
        # The `cond` merging a number with a tensor gives the number the tensor's dtype: a float joins the
        # default float dtype (ops/control_flow/merge.py).
        dtype, rank = torch.get_default_dtype() if isinstance(b, float) else fw.python_number_dtype(b), 0
    else:
        return  # _as_value says what is wrong
    if dtype == a.dtype and rank == len(a.shape):
        return
    value = "b if a else a" if word == "and" else "a if a else b"
    raise error_at_user_line(
        f"`a {word} b` with a tensor `a` is Python's value, `{value}`, and here `a` is "
        f"{_describe(a.dtype, len(a.shape))} but `b` is {_describe(dtype, rank)}: one program value cannot be "
        f"either; use it only as a test (`if a {word} b:`), or combine the tensors explicitly "
        f"(`torch.logical_{word}(a, b)`, `torch.where`)")


def _describe(dtype, rank):
    return f"{str(dtype).replace('torch.', '')} of rank {rank}"


def _as_value(value):
    value = graph_tensor(value)
    if is_var(value) or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (bool, int, float)):
        return constant(value)
    raise error_at_user_line(f"`and`/`or` on a tensor yields a {type(value).__name__} on one path and a tensor "
                             "on the other; a program holds one kind of value: make both operands tensors")


def unobservable_since(tr, mark):
    """True when evaluating every op recorded since ``mark`` where Python
    would not is unobservable: no in-place write, random draw or side effect
    (print, assert, raise), and no op that can fail when the program runs
    (see ``_total``)."""
    for block in tr.program.blocks:
        n_ops = mark.blocks[block.idx][0] if block.idx < len(mark.blocks) else 0
        for op in block.ops[n_ops:]:
            if has_effects(op) or not _total(op):
                return False
    return True


# Ops that cannot fail for inputs of the dtypes and shapes seen while tracing
# (a run-time shape that differs where it matters is caught by a check_sizes
# op, itself a side effect). Only these are evaluated on the path where Python
# short-circuits; anything else, `x[k]` with a tensor index above all (`k < n
# and x[k] > 0` must not index x[n]), runs under a cond, only where Python
# runs it. `cond` is total when the ops of its blocks are (they are checked
# one by one); a `while` may not terminate where Python never runs it.
_TOTAL_NAMES = """
__lt__ __le__ __gt__ __ge__ __eq__ __ne__ lt le gt ge eq ne greater less greater_equal less_equal
not_equal logical_and logical_or logical_not logical_xor __and__ __or__ __xor__ __invert__ __rand__
__ror__ __rxor__ bitwise_not __add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __neg__ __pos__
__abs__ __truediv__ __rtruediv__ add sub mul neg negative abs absolute true_divide sum mean any all
prod exp log log1p sqrt tanh sigmoid sin cos sign floor ceil round trunc isnan isinf isfinite
float double half int long bool clone detach contiguous
"""
_TOTAL = frozenset({"cond", "cast", "fill_constant", "assign"}
                   | {f"{ns}.{name}" for name in _TOTAL_NAMES.split() for ns in ("torch", "torch.Tensor")})


# Total on a tensor of static shape with constant arguments (its one input):
# what succeeded while tracing succeeds on every run. A dynamic dimension may
# be 0 (`max` of nothing) or too short (`x[3]`) at run time.
_TOTAL_ON_STATIC = frozenset({"torch.Tensor.__getitem__"} | {
    f"{ns}.{name}" for name in "max min amax amin argmax argmin".split() for ns in ("torch", "torch.Tensor")})


def _total(op):
    if op.type in _TOTAL:
        return True
    if op.type in _TOTAL_ON_STATIC:
        names = op.input_names
        return len(names) == 1 and all(isinstance(d, int) for d in op.block.find_var(names[0]).dims)
    return False


def convert_is(a, b):
    """``a is b``; for graph tensors whether they are one object on every
    path a run can take (ops/control_flow/identity.py)."""
    return identity.same_object(a, b)


def convert_is_not(a, b):
    """``a is not b``."""
    return convert_logical_not(identity.same_object(a, b))


def convert_in(a, b):
    """``a in b``; for a graph tensor ``b``, eager's ``Tensor.__contains__``:
    whether any element equals ``a`` (a number or a tensor), as a bool the
    program computes."""
    if _number_in_container(a, b):
        return _number_found(a, b)
    if not isinstance(b, Variable) or is_array(b):  # a run-time size or a tensor array: Python's own `in`
        return a in b
    if not isinstance(a, (int, float, bool, complex, torch.Tensor, torch.SymInt, torch.SymFloat)) and not is_var(a):
        raise RuntimeError(f"Tensor.__contains__ only supports Tensor or scalar, but you passed in a {type(a)}.")
    found = (a == b).any().detach()  # a new 0-d bool tensor
    found.python_number = True  # eagerly a Python bool, as py_builtins.convert_cast marks `bool(t)`
    return found


def convert_not_in(a, b):
    """``a not in b``."""
    if _number_in_container(a, b) or isinstance(b, Variable) and not is_array(b):
        return convert_logical_not(convert_in(a, b))
    return a not in b


_CONTAINERS = (list, tuple, set, frozenset, dict)


def _number_in_container(a, b):
    """`n in (1, 2)`, `n in {3: ...}` for a graph value standing for a
    Python number (`int(t)`, `t.tolist()`): eager finds the number by value
    (a dict or set by its hash, a list by `==`), where Python's own `in`
    would find the Variable by identity only."""
    return isinstance(a, Variable) and stands_for_number(a) and type(b) in _CONTAINERS


def _number_found(a, b):
    """Whether `a` equals one of the numbers among `b`'s items (a dict's
    keys), a bool the program computes (`number_matches`)."""
    found = any_match([same for _, same in number_matches(a, b, hashed=False)])
    if found is False:
        return False
    found = found.detach()
    found.python_number = True  # eagerly a Python bool
    return found


def number_matches(a, items, hashed):
    """(item, `a == item`) for each number among `items` that `a`, a graph
    value standing for a Python number, may equal; text and None equal no
    number, and among a dict's keys (`hashed`, looked up) neither does a
    tensor (its hash is its identity's). A tensor among the items of `in`
    would ask eager for the truth of a comparison (a list's): refused."""
    pairs = []
    for item in items:
        if isinstance(item, (bool, int, float, complex)) or isinstance(item, Variable) and stands_for_number(item):
            pairs.append((item, a == item))
        elif isinstance(item, (Variable, torch.Tensor)) and not hashed:
            raise error_at_user_line(
                f"`in` of {user_name(a, 'value')}, a Python number read from a tensor, among tensors: eager "
                "compares it with each tensor and asks the truth of the result; compare them with `==` yourself "
                "(`(t == n).any()`)")
    return pairs


def any_match(sames):
    """The `or` of the bools `sames` compute (False for none)."""
    found = False
    for same in sames:
        found = same if found is False else found | same
    return found


def convert_equal(a, b):
    """``a == b`` where a side is written as a list or tuple (`list(x.size())
    == [b, n, t]`): Python compares two lists (or two tuples) item by item,
    asking each pair's truth, and stops at the first pair that differs. A
    pair holding a graph tensor (a count a tensor computes) has a truth
    known when the program runs, so the sequences' equality is the `and` of
    the pairs' truths in that order (``convert_logical_and``), a bool the
    program computes. Any other operands compare as Python compares them."""
    if not _compared_by_items(a, b):
        return a == b
    if len(a) != len(b):
        return False
    return _items_equal(a, b, 0)


def convert_not_equal(a, b):
    """``a != b`` for the operands of ``convert_equal``: a list's `!=` is the
    negation of its `==`."""
    if not _compared_by_items(a, b):
        return a != b
    return convert_logical_not(convert_equal(a, b))


def _compared_by_items(a, b):
    """Two lists or two tuples (a torch.Size, a namedtuple) that Python's
    own item-by-item comparison compares, one of them holding a graph value."""
    same_kind = (isinstance(a, list) and isinstance(b, list)) or (isinstance(a, tuple) and isinstance(b, tuple))
    return same_kind and type(a).__eq__ in (list.__eq__, tuple.__eq__) and \
        type(b).__eq__ in (list.__eq__, tuple.__eq__) and (_holds_graph_value(a) or _holds_graph_value(b))


def _holds_graph_value(items):
    """A graph tensor among `items` (sizes alone compare as Python compares them: the trace decides)."""
    return any(isinstance(v, Variable) or (isinstance(v, (list, tuple)) and _holds_graph_value(v)) for v in items)


def _items_equal(a, b, i):
    if i == len(a):
        return True

    def pair():
        x, y = a[i], b[i]
        if x is y:  # Python's identity shortcut: a tensor equals itself without a comparison
            return True
        same = convert_equal(x, y)  # (nested lists compare item by item too)
        if isinstance(same, Variable) and any(d != 1 for d in same.shape):
            item = user_name(x) if isinstance(x, Variable) else user_name(y) if isinstance(y, Variable) else f"item {i}"
            raise error_at_user_line(
                f"comparing these sequences asks the truth of {item} == its counterpart, a tensor of shape "
                f"{list(same.shape)}, which eager code refuses (Boolean value of Tensor with more than one value "
                "is ambiguous)")
        return same

    return convert_logical_and(pair, lambda: _items_equal(a, b, i + 1), test=True)


_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
            "!=": operator.ne, "is": convert_is, "is not": convert_is_not, "in": convert_in, "not in": convert_not_in}


def convert_compare_chain(first, *steps):
    """``first() op1 b1() op2 b2() ...`` for steps ``(op, b)``: each operand is
    evaluated once, and a later one only where Python evaluates it (after
    every comparison before it held), through ``convert_logical_and``, so a
    graph tensor comparison short-circuits as ``and`` does."""
    def compare(left, i):
        op, operand = steps[i]
        right = operand()
        result = _COMPARE[op](left, right)
        if i + 1 == len(steps):
            return result
        return convert_logical_and(lambda: result, lambda: compare(right, i + 1))
    return compare(first(), 0)


def convert_logical_not(value):
    """``not value``; ``torch.logical_not`` for a graph tensor."""
    value = tested(value)
    if is_var(value):
        return torch.logical_not(graph_tensor(value))
    return not value
