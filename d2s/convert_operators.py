"""The run-time helpers that converted code calls.

Every helper decides when it is called: with plain Python values it does
exactly what the Python construct it replaces does (only the taken branch
runs, loops over Python sequences unroll, ``and``/``or`` short-circuit); with
graph tensors (``runtime.ir.Variable``) it builds ops through ``ops``. Each
docstring states the semantics as the equivalent Python.

State passing: the transformers turn a branch or loop body into a function
that declares the names it carries ``nonlocal``. The helpers read and write
those names through the function's closure cells (``_State``), so a name
that has no value yet reads as ``Undefined(name)`` instead of failing.
"""

import builtins
import dis
import functools
import inspect
import operator
import os
import sys
import sysconfig
import types

import torch

from ops import control_flow as cf
from ops import framework as fw
from ops import tracer
from ops.capture import error_at_user_line, size as _variable_size, stands_for_number
from ops.optimizer_ops import record_optimizer_call
from runtime.errors import ConversionError
from runtime.optable import get_op_def
from runtime.ir import TENSOR_ARRAY, Variable

Undefined = cf.Undefined


def _is_var(value):
    return isinstance(value, Variable)


# -- state carried by branches and loops ---------------------------------------

class _State:
    """The named variables a branch or loop carries, as closure cells of the
    generated functions that declare them ``nonlocal``."""

    def __init__(self, functions, names):
        cells = {}
        for fn in functions:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
                cells.setdefault(name, cell)
        self.names = tuple(names)
        self.cells = [cells[n] for n in self.names]

    def get(self, names=None):
        names = self.names if names is None else names
        return tuple(self._read(self.cells[self.names.index(n)], n) for n in names)

    @staticmethod
    def _read(cell, name):
        try:
            return cell.cell_contents
        except ValueError:  # empty cell: the name is not bound yet
            return Undefined(name)

    def set(self, values, names=None):
        names = self.names if names is None else names
        for n, v in zip(names, values):
            self.cells[self.names.index(n)].cell_contents = v

    def snapshot(self):
        """A restorable copy: Python lists keep their identity and contents."""
        values = self.get()
        return [(v, list(v) if type(v) is list else None) for v in values]

    def restore(self, snapshot):
        for cell, (value, contents) in zip(self.cells, snapshot):
            if contents is not None:
                value[:] = contents
            cell.cell_contents = value


# -- if / else -----------------------------------------------------------------------

def convert_ifelse(pred, true_fn, false_fn, state, outputs, return_names=(), return_flags=()):
    """Equivalent Python::

        if pred:
            true_fn()
        else:
            false_fn()
        return state  # the current values of the names in `state`

    With a graph ``pred`` both branches are traced into a ``cond`` op (the
    ``state`` names are restored before each) and the outputs become the
    op's results (the other ``state`` names keep their values from before
    the ``if``, which the branches may have read). A name need only be defined on the paths that reach its
    use: names in ``return_names`` (the lowered return value) may be
    undefined on one side, and so may every name on a side that has
    returned (a flag in ``return_flags`` is True there). A branch that raises
    while it is traced (a ``raise``, a failed ``assert``, an ``IndexError``)
    becomes a ``raise`` op that raises the same exception when the program
    runs and takes that branch.
    """
    st = _State((true_fn, false_fn), state)
    if not _is_var(pred):
        (true_fn if pred else false_fn)()
        return st.get()
    before = st.snapshot()
    tr = tracer.current()
    # Outputs carried as one tensor array: a list that a tensor loop in one
    # branch turned into an array is turned into one in the other branch too.
    arrays = set()
    while True:
        mark = tr.mark()
        seen, specs, leaf_names = {}, {}, []
        branches = [_branch(st, before, fn, side, outputs, arrays, seen, specs, leaf_names,
                            return_names, return_flags)
                    for fn, side in ((true_fn, "true"), (false_fn, "false"))]
        try:
            merged = cf.cond(pred, *branches, names=leaf_names, return_names=tuple(return_names))
        except ConversionError as e:
            became_arrays = _lists_become_arrays(seen, arrays)
            if became_arrays:
                tr.rollback(mark)
                arrays |= became_arrays
                continue
            detailed = _structure_error(specs, outputs) or _branch_error(seen, true_fn, false_fn, outputs,
                                                                         return_names)
            if detailed is None:
                raise
            raise detailed from e
        break
    st.restore(before)
    if isinstance(merged, cf.Unreachable):  # both branches raise: nothing after the `if` runs
        return st.get()
    structure = _structure_error(specs, outputs)
    if structure is not None:
        raise structure
    leaves = iter(merged)
    merged = tuple(_unflatten(leaves, spec) for spec in specs.get("true", specs.get("false")))
    st.set(merged, outputs)
    return st.get()


def _branch(st, before, fn, side, outputs, arrays, seen, specs, leaf_names, return_names, return_flags):
    """The function `cf.cond` traces for one side: run the branch from the
    state `before`, then return its outputs flattened (tuples and lists are
    flattened: the op merges their elements), except the outputs in `arrays`,
    which are tensor arrays. A value no later use can see (the branch
    returned, or it is the return value and undefined) is `Unreachable`; a
    branch that raises yields one `Unreachable` for all its values."""
    def run():
        st.restore(before)
        if isinstance(_raising_as_op(fn)(), cf.Unreachable):
            return cf.Unreachable(side)
        seen[side] = values = st.get(outputs)
        returned = any(values[outputs.index(f)] is True for f in return_flags)
        leaves, specs[side] = [], []
        for k, value in enumerate(values):
            if k in arrays and type(value) is list:
                value = _loop_init(value)
            if isinstance(value, Undefined) and (returned or outputs[k] in return_names):
                value = cf.Unreachable(outputs[k])
            true_spec = specs["true"][k] if side == "false" and "true" in specs else None
            if isinstance(value, Undefined) and true_spec is not None:
                value = _unflatten(iter(lambda: value, None), true_spec)
            flat, spec = _flatten(value)
            leaves += flat
            specs[side].append(spec)
            if side == "true" or "true" not in specs:
                leaf_names.extend([outputs[k]] * len(flat))
        return tuple(leaves)
    return run


def _lists_become_arrays(seen, arrays):
    """Outputs that are a Python list in one branch and a tensor array in the other."""
    if "true" not in seen or "false" not in seen:
        return set()
    def kind(value):
        return "list" if type(value) is list else "array" if _is_var(value) and value.kind == TENSOR_ARRAY else None
    return {k for k, (a, b) in enumerate(zip(seen["true"], seen["false"]))
            if k not in arrays and {kind(a), kind(b)} == {"list", "array"}}


def _flatten(value):
    """(leaves, spec) of nested tuples/lists; spec None for a single value."""
    if isinstance(value, (tuple, list)):
        leaves, specs = [], []
        for v in value:
            flat, spec = _flatten(v)
            leaves += flat
            specs.append(spec)
        return leaves, (type(value), tuple(specs))
    return [value], None


def _unflatten(leaves, spec):
    if spec is None:
        return next(leaves)
    kind, specs = spec
    return kind(_unflatten(leaves, s) for s in specs)


def _describe(spec):
    return "single value" if spec is None else f"{spec[0].__name__} of {len(spec[1])}"


def _structure_error(specs, outputs):
    if "true" not in specs or "false" not in specs:
        return None
    for name, a, b in zip(outputs, specs["true"], specs["false"]):
        if a != b and not (a is None and b is None):
            return error_at_user_line(
                f"{name!r} is a {_describe(a)} in the true branch but a {_describe(b)} in the false branch "
                "of the `if` on a tensor at this line; a Python list or tuple cannot change its length "
                "under a tensor condition: build it the same way in both branches, or use a tensor "
                "(torch.cat / torch.stack / torch.where)")
    return None


def _branch_error(seen, true_fn, false_fn, outputs, return_names):
    """A ConversionError naming the variable and the lines involved, for the
    two mistakes users make most: a name assigned in one branch only, and a
    tensor in one branch but None in the other."""
    if "true" not in seen or "false" not in seen:
        return None
    for name, a, b in zip(outputs, seen["true"], seen["false"]):
        lines = {"true": _store_line(true_fn.__code__, name), "false": _store_line(false_fn.__code__, name)}
        if isinstance(a, Undefined) != isinstance(b, Undefined) and name not in return_names:
            side, other = ("true", "false") if isinstance(b, Undefined) else ("false", "true")
            return error_at_user_line(
                f"{name!r} is assigned in the {side} branch (line {lines[side]}) but not in the {other} "
                f"branch of the `if` on a tensor at this line, and is not defined before it; assign it "
                "before the if or in both branches")
        if (a is None) != (b is None) and not isinstance(a, Undefined) and not isinstance(b, Undefined):
            if name in return_names:
                return error_at_user_line(
                    "the function returns a tensor on some paths and None on others (the `if` on a tensor "
                    "at this line decides which); return a tensor on every path")
            side_none = "true" if a is None else "false"
            side_tensor = "false" if a is None else "true"
            return error_at_user_line(
                f"{name!r} is a tensor in the {side_tensor} branch ({_where(lines[side_tensor])}) but None in "
                f"the {side_none} branch ({_where(lines[side_none])}) of the `if` on a tensor at this line; "
                "give it a tensor value in both branches")
    return None


def _where(line):
    return f"line {line}" if line is not None else "its value from before the `if`"


def _store_line(code, name):
    """The first line where ``code`` (or a function nested in it) assigns ``name``."""
    lines = []
    for ins in dis.get_instructions(code):
        if ins.opname in ("STORE_DEREF", "STORE_FAST", "STORE_NAME") and ins.argval == name:
            lines.append(ins.positions.lineno)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            line = _store_line(const, name)
            if line is not None:
                lines.append(line)
    lines = [l for l in lines if l is not None]
    return min(lines) if lines else None


def convert_load(value):
    """A read of a variable that may be unbound. Equivalent Python: ``return
    value`` (Python itself raises for a truly unbound name); a value the
    helpers left ``Undefined`` raises the same ``UnboundLocalError``."""
    if isinstance(value, Undefined):
        value.unbound()
    return value


def convert_ifexp(pred, true_fn, false_fn):
    """``true_fn() if pred else false_fn()``; a ``cond`` op for a graph ``pred``."""
    if not _is_var(pred):
        return true_fn() if pred else false_fn()
    return cf.cond(pred, true_fn, false_fn)


# -- while ------------------------------------------------------------------------------

def convert_while(test, body, names, return_names=()):
    """Equivalent Python::

        while test():
            body()
        return names  # the final values of the loop variables

    As soon as ``test()`` is a graph tensor the loop becomes a ``while`` op
    over the loop variables ``names`` (the body may be traced more than once).
    Names in ``return_names`` may start undefined.
    """
    st = _State((body,), names)
    tr = tracer.current()
    while True:  # a plain Python loop while the test is a Python value
        mark = tr.mark()
        test_value = test()
        if _is_var(test_value):
            tr.rollback(mark)  # the `while` op evaluates its test in its own block
            break
        if not test_value:
            return st.get()
        body()

    def cond_fn(*values):
        st.set(values)
        return test()

    def body_fn(*values):
        st.set(values)
        body()
        return list(st.get())

    init = [_loop_init(v) for v in st.get()]
    final = cf.while_loop(cond_fn, body_fn, init, names=tuple(names), return_names=tuple(return_names))
    st.set(final)
    return tuple(final)


def _loop_init(value):
    """A graph loop's initial value: Python numbers become 0-d tensors of the
    dtype ``torch.tensor`` would give them, Python lists become tensor arrays."""
    if isinstance(value, (bool, int, float)):
        return _constant(value)
    if type(value) is list:
        return fw.array_from_list(value) if value else fw.array_create()
    return value


# -- for: iteration protocol used by the lowered `for` ---------------------------------------

class _GraphIterable:
    """Something a ``for`` loop iterates as a graph loop, by index ``i`` (a 0-d
    int64 tensor): ``has(i)`` and ``get(i)``."""


class _Rows(_GraphIterable):
    """The rows of a tensor, or the elements of a tensor array."""

    def __init__(self, value):
        self.value = value

    def length(self):
        if self.value.kind == TENSOR_ARRAY:
            return fw.array_length(self.value)
        if not self.value.shape:
            raise error_at_user_line(f"iteration over a 0-d tensor `{self.value.name}`")
        n = self.value.shape[0]
        return n if n != -1 else fw.shape(self.value)[0]

    def has(self, i):
        return i < self.length()

    def get(self, i):
        if self.value.kind == TENSOR_ARRAY:
            return fw.array_read(self.value, i)
        # A view, as in eager iteration: `row *= 2` writes into the tensor.
        return torch.select(self.value, 0, i)


class _Range(_GraphIterable):
    def __init__(self, start, stop, step):
        if not _is_var(step) and step == 0:
            raise error_at_user_line("range() arg 3 must not be zero")
        self.start, self.stop, self.step = start, stop, step

    def get(self, i):
        value = i
        if _is_var(self.step) or self.step != 1:
            value = value * self.step
        if _is_var(self.start) or self.start != 0:
            value = value + self.start
        return value

    def has(self, i):
        value = self.get(i)
        if not _is_var(self.step):
            return value < self.stop if self.step > 0 else value > self.stop
        return torch.where(self.step > 0, value < self.stop, value > self.stop)


class _Enumerate(_GraphIterable):
    def __init__(self, inner, start):
        self.inner, self.start = inner, start

    def has(self, i):
        return self.inner.has(i)

    def get(self, i):
        return (i + self.start if _is_var(self.start) or self.start != 0 else i), self.inner.get(i)


class _Zip(_GraphIterable):
    def __init__(self, inners):
        self.inners = inners

    def has(self, i):
        test = self.inners[0].has(i)
        for inner in self.inners[1:]:
            test = convert_logical_and(lambda t=test: t, lambda inner=inner: inner.has(i))
        return test

    def get(self, i):
        return tuple(inner.get(i) for inner in self.inners)


class _PythonItems(_GraphIterable):
    """A Python sequence zipped with tensors: indexed by a graph index."""

    def __init__(self, items):
        self.items = items

    def has(self, i):
        return i < len(self.items)

    def get(self, i):
        return _python_item(self.items, i)


def _graph_iterable(value):
    if isinstance(value, _GraphIterable):
        return value
    if _is_var(value):
        return _Rows(value)
    return _PythonItems(value if isinstance(value, (range, list, tuple)) else list(value))


def _python_item(items, i):
    """``items[i]`` for a Python sequence and a graph index."""
    if isinstance(items, range):
        return items.start + i * items.step
    values = list(items)
    if all(isinstance(v, (Variable, torch.Tensor, int, float, bool)) for v in values) and values:
        return fw.array_read(fw.array_from_list(values), i)
    raise error_at_user_line(
        "this loop over a Python sequence became a graph loop (its condition depends on a tensor, "
        "e.g. through a tensor-dependent break or return), so its items must be tensors or numbers; "
        "loop over range(len(items)) with a tensor condition inside instead")


def convert_for_iter(iterable):
    """Start iterating ``iterable``: returns ``(iterable, index)``.

    Equivalent Python: ``return list(iterable), 0``. Tensors, tensor arrays and
    the graph forms of ``range``/``enumerate``/``zip`` start a graph index.
    """
    if _is_var(iterable) or isinstance(iterable, _GraphIterable):
        return _graph_iterable(iterable), fw.fill_constant(0, torch.int64)
    if isinstance(iterable, (range, list, tuple, str)):
        return iterable, 0
    return list(iterable), 0


def convert_for_test(items, i):
    """Equivalent Python: ``return i < len(items)``."""
    if isinstance(items, _GraphIterable):
        return items.has(i)
    return i < len(items)


def convert_for_next(items, i):
    """Equivalent Python: ``return items[i], i + 1``."""
    if isinstance(items, _GraphIterable):
        return items.get(i), i + 1
    if _is_var(i):
        return _python_item(items, i), i + 1
    return items[i], i + 1


def convert_range(*args):
    """``range(*args)``; a graph range when a bound is a graph tensor."""
    if not any(_is_var(a) for a in args):
        return range(*args)
    if len(args) == 1:
        return _Range(0, args[0], 1)
    if len(args) == 2:
        return _Range(args[0], args[1], 1)
    return _Range(*args)


def convert_enumerate(iterable, start=0):
    """``enumerate(iterable, start)``; graph form for tensors and graph ranges."""
    if _is_var(iterable) or isinstance(iterable, _GraphIterable) or _is_var(start):
        return _Enumerate(_graph_iterable(iterable), start)
    return enumerate(iterable, start)


def convert_zip(*iterables):
    """``zip(*iterables)``; graph form when any of them is a tensor or graph range."""
    if any(_is_var(it) or isinstance(it, _GraphIterable) for it in iterables):
        return _Zip([_graph_iterable(it) for it in iterables])
    return zip(*iterables)


# -- and / or / not ----------------------------------------------------------------------------

def _constant(value):
    """A 0-d graph tensor for a Python number, with the dtype ``torch.tensor``
    gives it (floats: the default dtype)."""
    dtype = torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else None
    return fw.fill_constant(value, dtype or torch.get_default_dtype())


def _as_bool_var(value):
    return value if _is_var(value) or isinstance(value, torch.Tensor) else _constant(bool(value))


def convert_logical_and(lhs, rhs):
    """``lhs() and rhs()``. With a graph tensor ``lhs()`` the result is
    ``torch.logical_and``; ``rhs()`` runs only where ``lhs()`` is true, as in
    Python, whenever that is observable (see ``_short_circuit``)."""
    a = lhs()
    if not _is_var(a):
        return rhs() if a else a
    return _short_circuit(a, rhs, torch.logical_and, rhs_when=True)


def convert_logical_or(lhs, rhs):
    """``lhs() or rhs()``. With a graph tensor ``lhs()`` the result is
    ``torch.logical_or``; ``rhs()`` runs only where ``lhs()`` is false, as in
    Python, whenever that is observable (see ``_short_circuit``)."""
    a = lhs()
    if not _is_var(a):
        return a if a else rhs()
    return _short_circuit(a, rhs, torch.logical_or, rhs_when=False)


def _short_circuit(a, rhs, op, rhs_when):
    """``op(a, rhs())`` for a graph tensor ``a``. ``rhs()`` is traced once in
    place; if it only appended effect-free ops the result is that op.
    Otherwise (it writes a tensor, draws random numbers, prints, checks, or
    raises while traced) it is traced again inside a ``cond`` on ``a``, so
    that it runs exactly when Python would run it."""
    tr = tracer.current()
    mark = tr.mark()
    try:
        b = rhs()
    except ConversionError:
        raise
    except Exception:  # noqa: BLE001 - raised only where Python evaluates rhs: see below
        pure = False
    else:
        pure = _effect_free_since(tr, mark)
    if pure:
        return op(a, _as_bool_var(b))
    tr.rollback(mark)
    pred = a if a.dtype == torch.bool else fw.cast(a, torch.bool)
    evaluated = _raising_as_op(lambda: _as_bool_var(rhs()))
    if rhs_when:
        return cf.cond(pred, evaluated, lambda: pred)
    return cf.cond(pred, lambda: pred, evaluated)


def _effect_free_since(tr, mark):
    """True when every op recorded since ``mark`` is pure: no in-place write,
    random draw or side effect (print, assert, raise)."""
    for block in tr.program.blocks:
        n_ops = mark.blocks[block.idx][0] if block.idx < len(mark.blocks) else 0
        for op in block.ops[n_ops:]:
            opdef = get_op_def(op.type)
            if opdef.mutates or opdef.random or opdef.extra.get("side_effect"):
                return False
    return True


def _raising_as_op(fn):
    """``fn`` for a branch being traced: an exception it raises (not a
    ConversionError) becomes a ``raise`` op in place of what it recorded,
    and the branch yields ``Unreachable``."""
    def run():
        tr = tracer.current()
        mark = tr.mark()
        try:
            return fn()
        except ConversionError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's error, raised when the branch runs
            tr.rollback(mark)
            fw.raise_(exc)
            return cf.Unreachable("branch")
    return run


def convert_logical_not(value):
    """``not value``; ``torch.logical_not`` for a graph tensor."""
    if _is_var(value):
        return torch.logical_not(value)
    return not value


# -- builtins with a tensor meaning -----------------------------------------------------------

def convert_len(value):
    """``len(value)``: a Python int when known while converting, else a 0-d tensor."""
    if not _is_var(value):
        return len(value)
    return _Rows(value).length()


def convert_shape(value):
    """``value.shape``: for a graph tensor a tuple of Python ints (known
    dimensions) and 0-d tensors (dimensions known only at run time)."""
    if _is_var(value):
        return _variable_size(value)
    return value.shape


_CASTS = {int: torch.int64, float: torch.float32, bool: torch.bool}


def convert_cast(value, kind):
    """``kind(value)`` for ``kind`` in int/float/bool; a cast to a 0-d tensor
    for a graph tensor (float -> float32, int -> int64). Detached: eagerly the
    result is a Python number, which carries no gradient."""
    if not _is_var(value):
        return kind(value)
    out = fw.cast(value.detach(), _CASTS[kind])
    out = out if out.shape == () else out.reshape(())
    out.python_number = True
    return out


def _cast_builtin(kind):
    @functools.wraps(kind)
    def cast(*args, **kwargs):
        if len(args) == 1 and not kwargs and _is_var(args[0]):
            return convert_cast(args[0], kind)
        return kind(*args, **kwargs)
    return cast


def convert_print(*values, sep=" ", end="\n", file=None, flush=False):
    """``print(*values)``; a run-time ``print`` op when a value is a graph tensor."""
    if any(_is_var(v) for v in values):
        fw.print_(*values, sep=sep, end=end)
    else:
        print(*values, sep=sep, end=end, file=file, flush=flush)


def convert_assert(test, message=None):
    """``assert test, message()``; a run-time ``assert`` op for a graph tensor."""
    if _is_var(test):
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
    if _is_var(value):
        kind = torch.Tensor
        if stands_for_number(value):
            kind = bool if value.dtype == torch.bool else float if value.dtype.is_floating_point else int
        kinds = classinfo if isinstance(classinfo, tuple) else (classinfo,)
        return any(isinstance(k, type) and issubclass(kind, k) for k in kinds)
    return False


_AUGMENTED = {
    "+=": (operator.iadd, operator.add), "-=": (operator.isub, operator.sub),
    "*=": (operator.imul, operator.mul), "/=": (operator.itruediv, operator.truediv),
    "//=": (operator.ifloordiv, operator.floordiv), "%=": (operator.imod, operator.mod),
    "**=": (operator.ipow, operator.pow), "@=": (operator.imatmul, operator.matmul),
    "&=": (operator.iand, operator.and_), "|=": (operator.ior, operator.or_),
    "^=": (operator.ixor, operator.xor), "<<=": (operator.ilshift, operator.lshift),
    ">>=": (operator.irshift, operator.rshift),
}


def convert_augassign(symbol, value, operand):
    """``value += operand`` (for ``symbol`` ``'+='``, and so on), returning the
    new value. Equivalent Python: ``return operator.iadd(value, operand)``.
    A graph tensor is updated in place, as in eager (views and other names
    bound to it see the change), unless it stands for a Python number (a
    counter a graph loop carries, ``t.item()``): then other names must not
    see it change (``last = i; i += 1``), so the update is out of place."""
    inplace, binary = _AUGMENTED[symbol]
    return binary(value, operand) if _is_var(value) and stands_for_number(value) else inplace(value, operand)


def convert_list_append(target, value):
    """``target.append(value)``; an ``array_append`` op for a tensor array."""
    if _is_var(target) and target.kind == TENSOR_ARRAY:
        fw.array_append(target, value)
    else:
        target.append(value)


def convert_method(obj, name):
    """``getattr(obj, name)`` for tensor methods that read a value: a graph
    tensor's ``item()`` is a 0-d tensor standing for the number (its value
    exists only at run time; see ``_item``)."""
    if _is_var(obj) and name == "item":
        return lambda: _item(obj)
    return convert_call(getattr(obj, name))


def _item(value):
    """``value.item()`` of a graph tensor: a new 0-d Variable (never ``value``
    itself) that stands for the Python number eager code would have."""
    out = value.reshape(())
    out.python_number = True
    return out


_BUILTINS = {
    builtins.len: convert_len,
    builtins.print: convert_print,
    builtins.int: _cast_builtin(int),
    builtins.float: _cast_builtin(float),
    builtins.bool: _cast_builtin(bool),
    builtins.range: convert_range,
    builtins.enumerate: convert_enumerate,
    builtins.zip: convert_zip,
    builtins.isinstance: convert_isinstance,
}


# -- calls -----------------------------------------------------------------------------------------

# Code from these top-level packages is called as it is, never converted.
_NOT_CONVERTED = frozenset({
    "torch", "numpy", "d2s", "ops", "runtime", "builtins", "gast", "astor", "safetensors",
    "hypothesis", "pytest", "_pytest", "pluggy", "typing_extensions",
})
# ... and so is the standard library, recognised by where its files live
# (a user module may well be called `test` or `types`).
_STDLIB_DIRS = tuple({os.path.join(os.path.realpath(sysconfig.get_paths()[k]), "")
                      for k in ("stdlib", "platstdlib")})
_SITE_DIRS = tuple({os.path.join(os.path.realpath(p), "")
                    for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])})


def _is_user_code(obj):
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] not in _NOT_CONVERTED


def _is_stdlib_file(filename):
    path = os.path.realpath(filename)
    return path.startswith(_STDLIB_DIRS) and not path.startswith(_SITE_DIRS)


def _convertible(fn):
    from . import conversion
    code = fn.__code__
    return (_is_user_code(fn) and not conversion.is_converted(fn)
            and not code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR)
            and not code.co_filename.startswith("<") and not _is_stdlib_file(code.co_filename))


# Factories taking sizes as varargs: torch's argument parser rejects a
# run-time size (a Variable) in `zeros(n, 3)` before any capture hook runs,
# but accepts it in the tuple form `zeros((n, 3))`.
_SIZE_VARARGS = {torch.zeros, torch.ones, torch.empty, torch.rand, torch.randn}


def _call_with_packed_sizes(fn, *sizes, **kwargs):
    if len(sizes) > 1 and any(isinstance(s, Variable) for s in sizes):
        return fn(tuple(sizes), **kwargs)
    return fn(*sizes, **kwargs)


_OPTIMIZERS = (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)


def convert_call(fn):
    """The callable to call in place of ``fn``. Equivalent Python: ``return fn``.

    User functions, lambdas, methods and user modules' ``forward`` are
    converted (once; conversions are cached); builtins with a tensor meaning
    map to their ``convert_*`` helper; everything else (torch, numpy, the
    standard library, d2s itself, classes, C functions) is returned as it is.
    """
    from . import conversion
    from .static_function import DATA_PARALLEL, StaticFunction, data_parallel_message
    try:
        mapped = _BUILTINS.get(fn)
    except TypeError:  # unhashable callable
        mapped = None
    if mapped is not None:
        return mapped
    if fn in _SIZE_VARARGS:
        return functools.partial(_call_with_packed_sizes, fn)
    if isinstance(fn, StaticFunction):
        return convert_call(fn.dygraph_function)
    if isinstance(fn, types.FunctionType):
        return conversion.convert_function(fn) if _convertible(fn) else fn
    if isinstance(fn, DATA_PARALLEL):  # its per-step Python bookkeeping would run once, at build time
        raise error_at_user_line(f"calling a {type(fn).__name__} module inside declarative code: "
                                 + data_parallel_message(fn))
    if isinstance(fn, types.MethodType) and isinstance(fn.__self__, _OPTIMIZERS):
        return record_optimizer_call(fn)  # opt.step() is an op of the program, not a build-time call
    if isinstance(fn, types.MethodType):
        func = fn.__func__
        if isinstance(func, StaticFunction):
            func = func._function
        if isinstance(func, types.FunctionType) and _convertible(func):
            return types.MethodType(conversion.convert_function(func), fn.__self__)
        return fn
    if isinstance(fn, torch.nn.Module) and _is_user_code(type(fn)):
        return _module_forward(fn)
    return fn


def _module_forward(module):
    """A user module's converted ``forward``, bound; the module itself when
    hooks must run (``Module.__call__`` runs them around ``forward``)."""
    from . import conversion
    from .static_function import StaticFunction
    if (module._forward_hooks or module._forward_pre_hooks or torch.nn.modules.module._global_forward_hooks
            or torch.nn.modules.module._global_forward_pre_hooks):
        return module
    forward = module.__dict__.get("forward")
    if isinstance(forward, StaticFunction):
        forward = forward._function
    elif forward is None:
        forward = type(module).forward
        if isinstance(forward, StaticFunction):
            forward = forward._function
    else:
        return module
    if isinstance(forward, types.FunctionType) and _convertible(forward):
        return types.MethodType(conversion.convert_function(forward), module)
    return module
