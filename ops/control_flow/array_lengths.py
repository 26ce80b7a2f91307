"""How long a list a graph loop fills is, where the program says it.

    outs = []
    for t in range(x.size(1)):   # a graph loop: x.size(1) is known only when the program runs
        outs.append(h)
    y = torch.stack(outs, 1) + x

The list is a tensor array whose length is a run-time number. An op that
reads it (`stack`, `cat`) is inferred for several lengths and its output
gets a length symbol (ops/infer.py); a fresh one knows nothing, so `y + x`
could not be shown to broadcast as eager's does (the stacked length is
x.size(1)), and the trace failed. Where the loop says it, the length is
that expression instead:

  - before the loop: `[]` holds 0 items, `[a, b]` 2, and each `append` in
    the same block adds one (an append under a tensor `if` is one path's:
    the length is then unknown);
  - after a loop whose test is `i + c < n`, with `i` a loop variable
    starting at a known int `i0` that each trip adds 1 to, `c` an int and
    `n` a value from before the loop (a size, an int): it makes
    `max(n - i0 - c, 0)` trips, and
    a list appended `k` times at the top level of its body (never under an
    `if` or inner loop there) grows by `k` per trip. `for t in range(n)`
    lowers to such a loop; a `break` or `return` in it adds a flag to the
    test, and its length stays unknown.

The length is an int or a SymInt of the trace's ShapeEnv (`array.items_known`),
exact on every run, so the decisions it lets tracing make hold for every
input the program takes.
"""

import torch

from runtime.attrs import InputRef
from runtime.ir import TENSOR_ARRAY, Variable

from .. import symbolic_ints, tracer
from ..examples import producer


def known_length(array):
    """The number of items `array` holds on every run, or None."""
    return vars(array).get("items_known")  # (not getattr: a Variable answers unknown names as a tensor)


def set_length(array, length):
    """Note `array`'s length (None: unknown); a rollback puts it back."""
    tr = tracer.current()
    tr.log_write(array.__dict__, "items_known")
    array.items_known = length


def appended(array):
    """After `array.append(x)` recorded in the current block."""
    known = known_length(array)
    same_block = array.block is tracer.current().block
    set_length(array, known + 1 if known is not None and same_block else None)


def after_loop(tr, trip, values, outs):
    """Note the length of each list the `while` of `trip` returns in `outs`
    (one per carried value), where the loop says it (see the module)."""
    arrays = [(o, i) for o, i in zip(outs, trip.carried) if o.kind == TENSOR_ARRAY]
    if not arrays:
        return
    blocks = [b for b in trip.body.program.blocks if b.is_under(trip.body) or b is trip.cblock]
    trips = _trips(tr, trip, values, blocks)
    for out, i in arrays:
        before = known_length(values[i]) if isinstance(values[i], Variable) else None
        per_trip = _appends_per_trip(trip, trip.args[i], trip.new[i], blocks)
        if trips is not None and before is not None and per_trip is not None:
            set_length(out, before + per_trip * trips)


def _trips(tr, trip, values, blocks):
    """max(n - i0 - c, 0) for a loop tested by `i + c < n` (see the module), else None."""
    test = _producer(trip.cond)
    if test is None or test.type != "torch.Tensor.__lt__" or test.attrs.get("kwargs") \
            or tuple(test.attrs.get("args", ())) != (InputRef(0), InputRef(1)):
        return None
    counter_name, bound_name = test.input("X")
    loop_names = [a.name if isinstance(a, Variable) else None for a in trip.args]
    offset = 0
    shifted = _producer(trip.cblock.find_var(counter_name))
    if shifted is not None:  # `range(1, n)` tests `i + 1 < n`
        offset = _plus_constant(shifted)
        if offset is None:
            return None
        counter_name = shifted.input("X")[0]
    if counter_name not in loop_names or bound_name in loop_names \
            or _written_in(blocks, counter_name) or _written_in(blocks, bound_name):
        return None  # (an in-place write to either: `i.add_(1)`, `n.sub_(1)`)
    j = loop_names.index(counter_name)
    step = _producer(trip.new[j]) if isinstance(trip.new[j], Variable) else None
    if step is None or step.input("X") != [counter_name] or _plus_constant(step) != 1:
        return None
    bound = trip.cblock.find_var(bound_name)
    if bound.block.is_under(trip.body):
        return None  # made by the loop itself: not known to stay the same across trips
    start = values[j] if type(values[j]) is int else symbolic_ints.value_of(tr, values[j])
    bound = symbolic_ints.value_of(tr, bound)
    if start is None or bound is None:
        return None
    return torch.sym_max(bound - start - offset, 0)


def _plus_constant(op):
    """c for an op `x + c` of an int constant c, else None."""
    args = tuple(op.attrs.get("args", ()))
    if op.type != "torch.Tensor.__add__" or op.attrs.get("kwargs") or len(args) != 2 or args[0] != InputRef(0) \
            or type(args[1]) is not int:
        return None
    return args[1]


def _written_in(blocks, name):
    return any(name in op.output_names for block in blocks for op in block.ops)


def _appends_per_trip(trip, carried, new, blocks):
    """How many items one trip of the body appends to the list it carries
    as `carried` (and returns as `new`): its top-level `array_append`s;
    None where another op of the loop's blocks writes or passes it on."""
    if not isinstance(carried, Variable) or new is not carried:
        return None
    name, count = carried.name, 0
    for block in blocks:
        for op in block.ops:
            if name in op.output_names:
                if block is trip.body and op.type == "array_append" and op.input("X")[0] == name:
                    count += 1
                else:
                    return None
    return count


def _producer(var):
    found = producer(var)  # the last op of its block that writes it
    return found[0] if found is not None else None
