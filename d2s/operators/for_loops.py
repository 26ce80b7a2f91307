"""``for`` loops: the iteration protocol the lowered ``for`` uses
(``convert_for_iter/test/next``) and the graph forms of ``range``,
``enumerate`` and ``zip``.

A ``for`` over a Python sequence runs (and unrolls) in Python; over a tensor,
a tensor array or a ``range`` with a tensor bound it iterates a graph index.
"""

import torch

from ops import framework as fw
from ops import tracer
from ops.recording import size as variable_size
from ops.user_frames import error_at_user_line
from runtime.errors import ConversionError
from runtime.ir import TENSOR_ARRAY, Variable

from .logical import convert_logical_and
from .state import is_var


class _GraphIterable:
    """Something a ``for`` loop iterates as a graph loop, by index ``i`` (a 0-d
    int64 tensor): ``has(i)`` and ``get(i)``. Anything else iterates it in
    Python, as eager code would (``list(zip(*hidden))``, ``h, c = zip(...)``):
    over a tensor's rows when its length is known while tracing."""


class Rows(_GraphIterable):
    """The rows of a tensor, or the elements of a tensor array."""

    def __init__(self, value):
        self.value = value

    def length(self):
        if self.value.kind == TENSOR_ARRAY:
            return fw.array_length(self.value)
        if not self.value.shape:
            raise error_at_user_line("iteration over a 0-d tensor")  # torch's own message
        return variable_size(self.value, 0)  # a SymInt when known only at run time

    def has(self, i):
        return i < self.length()

    def get(self, i):
        if self.value.kind == TENSOR_ARRAY:
            return fw.array_read(self.value, i)
        # A view, as in eager iteration: `row *= 2` writes into the tensor.
        row = torch.select(self.value, 0, i)
        _mark_for_rows(row)
        return row

    def __iter__(self):
        return iter(self.value)  # the rows (unbind), refused when their number is known only at run time


def _mark_for_rows(row):
    """Mark the op that made `row` as a `for` loop's row (`for_rows`): eager
    iterates a tensor over the views `x.unbind(0)` makes once as the loop
    starts, so autograd sums the gradient of all rows in one node. The
    executor then slices the same way (runtime/passes/loop_slices.py) and
    the gradient is eager's to the bit, even where an op reads `x` beside
    its rows on every trip; a per-trip `x[t]` the user wrote stays per trip."""
    if not is_var(row):
        return
    for op in reversed(tracer.current().block.ops):
        if row.name in op.output("Out"):
            if op.type == "torch.select":
                op.attrs["for_rows"] = True
            return


class _Range(_GraphIterable):
    def __init__(self, start, stop, step):
        if not is_var(step) and step == 0:
            raise error_at_user_line("range() arg 3 must not be zero")
        self.start, self.stop, self.step = start, stop, step

    def get(self, i):
        value = i
        if is_var(self.step) or self.step != 1:
            value = value * self.step
        if is_var(self.start) or self.start != 0:
            value = value + self.start
        return value

    def has(self, i):
        value = self.get(i)
        if not is_var(self.step):
            return value < self.stop if self.step > 0 else value > self.stop
        return torch.where(self.step > 0, value < self.stop, value > self.stop)

    def __iter__(self):
        raise error_at_user_line("a range() whose bounds are known only when the program runs can only be "
                                 "iterated by a `for` loop (a graph loop), not turned into Python items")

    def __reversed__(self):
        """``reversed(range(start, stop, step))``: ``range(last, start - step,
        -step)`` with ``last`` the range's last item (``start - step`` when
        it is empty, which makes the reversed range empty too)."""
        step = self.step
        if is_var(step):
            raise error_at_user_line("reversed() of a range() whose step is known only when the program runs")
        if step > 0:
            count = (self.stop - self.start + step - 1) // step
        else:
            count = (self.start - self.stop - step - 1) // -step
        if isinstance(count, Variable):
            count = torch.clamp(count, min=0)
        else:
            count = torch.sym_max(count, 0)  # a run-time size (SymInt), or a Python int
        return _Range(self.start + (count - 1) * step, self.start - step, -step)


class _Enumerate(_GraphIterable):
    def __init__(self, inner, start):
        self.inner, self.start = inner, start

    def has(self, i):
        return self.inner.has(i)

    def get(self, i):
        return (i + self.start if is_var(self.start) or self.start != 0 else i), self.inner.get(i)

    def __iter__(self):
        return enumerate(self.inner, self.start)


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

    def __iter__(self):
        return zip(*self.inners)


class _PythonItems(_GraphIterable):
    """A Python sequence zipped with tensors: indexed by a graph index."""

    def __init__(self, items):
        self.items = items

    def has(self, i):
        return i < len(self.items)

    def get(self, i):
        return _python_item(self.items, i)

    def __iter__(self):
        return iter(self.items)


def _graph_iterable(value):
    if isinstance(value, _GraphIterable):
        return value
    if is_var(value):
        return Rows(value)
    return _PythonItems(value if isinstance(value, (range, list, tuple)) else list(value))


class PythonItemsInGraphLoop(ConversionError):
    """A loop over a Python sequence of objects (modules, strings, ...) that
    a tensor may end early: ``convert_while`` unrolls it instead of making a
    graph loop, which could not index the objects by a run-time counter."""


def _python_item(items, i, error=ConversionError):
    """``items[i]`` for a Python sequence and a graph index."""
    if isinstance(items, range):
        return items.start + i * items.step
    values = list(items)
    if all(isinstance(v, (Variable, torch.Tensor, int, float, bool)) for v in values) and values:
        tensors = [v for v in values if isinstance(v, (Variable, torch.Tensor))]
        if tensors:
            # Numbers beside tensors take the tensors' dtype (one array holds them).
            values = [v if isinstance(v, (Variable, torch.Tensor)) else fw.fill_constant(v, tensors[0].dtype)
                      for v in values]
        item = fw.array_read(fw.array_from_list(values), i)
        if not tensors:
            item.python_number = True  # `for c in (1.5, 2.5)`: a Python number on every trip, as eagerly
        return item
    exc = error_at_user_line(
        "this loop over a Python sequence became a graph loop (its condition depends on a tensor, "
        "e.g. through a tensor-dependent break or return), so its items must be tensors or numbers; "
        "loop over range(len(items)) with a tensor condition inside instead")
    raise error(exc.message, exc.filename, exc.lineno)


def refuse_outliving(iterator, what):
    """Refuse drawing from an iterator the call's arguments, globals, closure
    cells or modules hold: it outlives the call, so drawn from while the
    program is built, the program would repeat that draw on every run,
    where eager draws again on every call (`next(batches)`, `for b in
    batches` on a global iterator). An iterator the function makes itself
    (`next(iter(self.blocks))`) is its own. Other draws (`list(batches)`)
    are found after the trace (d2s/python_writes.py `Watch`)."""
    trace = tracer.active()
    held = trace.watch.iterators.get(id(iterator)) if trace is not None and trace.watch is not None else None
    if held is not None and held[1] is iterator:
        raise error_at_user_line(
            f"{what} `{held[0]}`, a {type(iterator).__name__} that outlives the call: the program would "
            "hold what it drew while it was built and repeat it on every run, where eager code draws again on "
            "every call; draw outside the declarative function and pass the value as an argument")


def convert_for_iter(iterable):
    """Start iterating ``iterable``: returns ``(iterable, index)``.

    Equivalent Python: ``return list(iterable), 0``. Tensors, tensor arrays and
    the graph forms of ``range``/``enumerate``/``zip`` start a graph index.
    """
    if is_var(iterable) or isinstance(iterable, _GraphIterable):
        return _graph_iterable(iterable), fw.fill_constant(0, torch.int64)
    if isinstance(iterable, (range, list, tuple, str)):
        return iterable, 0
    refuse_outliving(iterable, "this loop draws from")
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
    if is_var(i):
        return _python_item(items, i, PythonItemsInGraphLoop), i + 1
    return items[i], i + 1


def convert_range(*args):
    """``range(*args)``; a graph range when a bound is a graph tensor."""
    if not any(is_var(a) for a in args):
        return range(*args)
    if len(args) == 1:
        return _Range(0, args[0], 1)
    if len(args) == 2:
        return _Range(args[0], args[1], 1)
    return _Range(*args)


def convert_enumerate(iterable, start=0):
    """``enumerate(iterable, start)``; graph form for tensors and graph ranges."""
    if is_var(iterable) or isinstance(iterable, _GraphIterable) or is_var(start):
        return _Enumerate(_graph_iterable(iterable), start)
    return enumerate(iterable, start)


def convert_zip(*iterables):
    """``zip(*iterables)``; graph form when any of them is a tensor or graph range."""
    if any(is_var(it) or isinstance(it, _GraphIterable) for it in iterables):
        return _Zip([_graph_iterable(it) for it in iterables])
    return zip(*iterables)
