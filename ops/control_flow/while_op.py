"""The `while` op: `while cond_fn(*vs): vs = body_fn(*vs)`, a graph op as
soon as the condition is a Variable.

A graph loop traces its condition and body once into sub-blocks, with one
Variable per loop variable; when a trip changes what a variable is (a
dimension, a number becoming a tensor, an array's first element) the spec
widens and the body is traced again, until a trace leaves every spec as
it found it.
"""

import ast
import dataclasses

import torch

from runtime.effects import has_effects
from runtime.errors import ConversionError
from runtime.ir import TENSOR_ARRAY, Variable, dtype_name, torch_dtype

from .. import framework, number_paths, tracer
from ..recording import graph_condition, graph_tensor, number_or_tensor, record, stands_for_number
from ..registry import OpDef, op_for_callable, register
from ..user_frames import SYMBOLIC_TYPES, error_at_user_line, user_origin, user_origin_at_site
from . import array_lengths, identity
from .cond_op import cond
from .sides import site_key
from .undefined import Undefined
from .values import as_var, check_pred, check_rank, differing_dtype, outer_reads, output_label, relaxed, var_base

_MAX_TRACES = 6
_PLACES = ("before the loop", "after one iteration")


def _emit_while(op, gen):
    loop_vars = op.attrs["loop_vars"]
    body_outs = op.attrs["body_outs"]
    init = [gen.assign(gen.store(v), gen.load(x)) for v, x in zip(loop_vars, op.input("Init"))]
    # Results of loop-invariant ops (runtime/passes/hoist_invariants.py):
    # None before the loop, computed in the first trip, kept across trips.
    once = [n for o in op.attrs["body_block"].ops if o.attrs.get("once") for n in o.output("Out")]
    init += [gen.assign(gen.store(n), ast.Constant(None)) for n in once]
    cond_stmts = gen.emit_block(op.attrs["cond_block"], keep=[op.attrs["cond_out"]])
    test = gen.load(op.attrs["cond_out"])  # as in _emit_cond: `not v` is `not bool(v)`
    stop = ast.If(test=ast.UnaryOp(op=ast.Not(), operand=test), body=[ast.Break()], orelse=[])
    body = gen.emit_block(op.attrs["body_block"], keep=set(body_outs) | set(loop_vars) | set(once))
    rebind = []
    if loop_vars:
        rebind = [gen.assign(ast.Tuple(elts=[gen.store(v) for v in loop_vars], ctx=ast.Store()),
                             ast.Tuple(elts=[gen.load(o) for o in body_outs], ctx=ast.Load()))]
    loop = ast.While(test=ast.Constant(True), body=cond_stmts + [stop] + body + rebind, orelse=[])
    results = [gen.assign(gen.store(o), gen.load(v)) for o, v in zip(op.output("Out"), loop_vars)]
    if once:
        results.append(ast.Delete(targets=[ast.Name(id=gen.local(n), ctx=ast.Del()) for n in once]))
    return init + [loop] + results


register(OpDef("while", emit=_emit_while, inputs=("Init", "X"), outputs=("Out",),
               attrs=("cond_block", "body_block", "loop_vars", "cond_out", "body_outs"),
               var_attrs=("loop_vars", "cond_out", "body_outs")))


class _Spec:
    """What one loop variable is at the top of every iteration."""

    def __init__(self, value, name, key=None):
        self.name = name
        self.key = key  # the loop's decision key (ops/number_paths.py), None where it has none
        # A Python number (or the 0-d constant a converted loop made of one)
        # has a weak dtype: the first iteration's tensor dtype wins, as in
        # eager `total = 0; for ...: total += t.mean()`.
        self.python_number = (isinstance(value, (int, float, bool)) and not isinstance(value, torch.Tensor)) \
            or (isinstance(value, Variable) and value.python_literal)
        self.kind = value.kind if isinstance(value, Variable) else (TENSOR_ARRAY if isinstance(value, list) else "tensor")
        # Whether no trip's value requires grad (widened as trips are traced):
        # `h.requires_grad` after a loop whose values never require grad is False.
        self.stop = _stops_gradient(value)
        self.shape = (tuple(value.dims) if isinstance(value, Variable) else tuple(value.shape)
                      if isinstance(value, torch.Tensor) else ())
        if isinstance(value, (Variable, torch.Tensor)):
            self.dtype = value.dtype
        elif self.python_number:
            self.dtype = framework.python_number_dtype(value)
        else:
            self.dtype = None
        self.elem_known = getattr(value, "elem_known", True)
        self.number = stands_for_number(value)  # until an iteration makes it a tensor
        # The user's name once trips disagree on number or tensor (ops.recording.number_or_tensor).
        self.varies = number_or_tensor(value)
        # A number/tensor value of an `if` some trip gives it, not decided yet (ops/number_paths.py).
        self.pending = number_paths.pending(value)
        # A number some trip gives of another type than the value before it
        # (`s = 0.5`, then `s = 3`): carried widened, so after zero trips or
        # after some, the Python type may not be eager's (`_trips_decided`).
        self.mixed_numbers = False
        self.start_dtype = self.dtype  # (a number's: what the first trip reads)

    def describe(self, var):
        """`var` with what this spec knows beyond its shape and dtype."""
        var.elem_known = self.elem_known
        var.python_number = self.number
        var.layout_unknown = True  # the first trip's value's, or a later trip's (ops/infer.py)
        if self.varies:
            var.number_or_tensor = self.varies
        if self.pending is not None:
            var.pending_number = self.pending
        elif self.python_number and not self.number and self.key is not None \
                and _truncates(self.start_dtype, self.dtype):
            # A number the trips make a tensor of a narrower kind (`s = 0.5`,
            # then `s = i * 1` of an int64 `i`): the first trip reads 0.5,
            # the loop variable would hold 0. Where that shows, the loop is
            # decided with its first trip traced apart (`_trips_decided`).
            number_paths.PEELED.add(self.key)
            var.pending_number = number_paths.Pending(self.key, self.start_dtype, False)
        return var

    def widen(self, nv, label):
        """Take in `nv`, the value a trip gives the variable: True when the
        spec changed (the body is traced again); an error for a change no
        loop variable may make (kind, a tensor's dtype, rank)."""
        changed = False
        if not self.varies and (self.number != stands_for_number(nv) or number_or_tensor(nv)):
            # A number on the first trip and a tensor after it (or the
            # other way round): `isinstance` has no one answer.
            self.varies = number_or_tensor(nv) or label
            changed = True
        if self.pending is None and number_paths.pending(nv) is not None:
            self.pending = number_paths.pending(nv)  # (later trips and the loop's result hold it)
            changed = True
        was_number = self.python_number or self.number
        if self.number and not stands_for_number(nv):
            self.number = False
            changed = True
        if nv.kind != self.kind:
            raise error_at_user_line(f"loop variable {label} changes from a {self.kind} to a {nv.kind} in the loop")
        if self.stop and not _stops_gradient(nv):
            self.stop = False  # (a trip made it require grad: the body is traced again with that)
            changed = True
        if self.kind == TENSOR_ARRAY and not self.elem_known:
            if getattr(nv, "elem_known", False):
                self.shape, self.dtype, self.elem_known = nv.dims, nv.dtype, True
                changed = True
            return changed
        if nv.dtype != self.dtype:
            kind = number_paths.number_kind
            if self.number and stands_for_number(nv) and kind(nv.dtype) != kind(self.dtype):
                self.mixed_numbers = True  # (another Python type, not another width of one)
            if was_number:
                # Python arithmetic keeps a number (`n + 0.5` of an int is a
                # float); a tensor it meets makes it that tensor's dtype. A
                # narrower number (a bool where it is a float) is carried
                # widened: the spec stays, and the body is not traced again
                # (it was, until no trace settled: `s = bool(c) if p else s`).
                dtype = torch.promote_types(self.dtype, nv.dtype) if stands_for_number(nv) else nv.dtype
                if dtype != self.dtype:
                    self.dtype = dtype
                    return True
            else:
                raise differing_dtype(f"loop variable {label}", (dtype_name(self.dtype), nv.dtype_name), _PLACES,
                                      "cast it so the dtype stays the same")
        check_rank(f"loop variable {label}", (self.shape, nv.shape), _PLACES, "its rank must stay the same")
        shape = relaxed(self.shape, nv.dims)
        if shape != self.shape:
            self.shape = shape
            changed = True
        return changed


def _truncates(number_dtype, dtype):
    """Whether a number of `number_dtype` loses its kind in `dtype` (a float
    in an integer tensor, an int in a bool one), not just precision."""
    kind = number_paths.number_kind
    return number_dtype is not None and dtype is not None and kind(number_dtype) > kind(dtype)


def _stops_gradient(value):
    if isinstance(value, Variable):
        return value.kind != TENSOR_ARRAY and value.stop_gradient
    if isinstance(value, torch.Tensor):
        return not value.requires_grad
    return not isinstance(value, list)  # (a Python number requires none; a list becomes a tensor array)


def _is_loop_carried(value):
    return isinstance(value, (Variable, torch.Tensor, int, float, bool, list) + SYMBOLIC_TYPES) and not isinstance(value, Undefined)


def while_loop(cond_fn, body_fn, loop_vars, names=None, return_names=(), maybe_undefined=()):
    """`while cond_fn(*vs): vs = body_fn(*vs)`, returning the final values; a
    graph `while` op as soon as the condition is a Variable.

    In a graph loop, Python numbers become 0-d tensors and lists become
    tensor arrays; a loop variable whose shape changes between iterations
    gets -1 in the changing dimensions (the body is traced again); a dtype
    change is a ConversionError naming the variable. `body_fn` must be
    re-runnable from its arguments. Names in `return_names` and
    `maybe_undefined` may start undefined (a zeros placeholder until the
    body assigns them; the caller tells a run whether it did).
    """
    values = list(loop_vars)
    tr = tracer.current()
    while True:
        mark = tr.mark()
        c = graph_condition(cond_fn(*values))
        if isinstance(c, Variable):
            check_pred(c)
            # This evaluation only told us the loop is a graph loop: the
            # `while` op computes its condition in its own block.
            # (A test with no effects may be evaluated once more: `_trips_decided`.)
            pure_test = not any(has_effects(op) for op in _since(tr, mark))
            tr.rollback(mark)
            key = site_key(user_origin_at_site(tr.entry_frame))
            if not pure_test:
                key = number_paths.undecidable(key)  # (`_trips_decided` evaluates the test once more)
            if key in number_paths.DECIDED:
                return _trips_decided(cond_fn, body_fn, values, names, return_names, maybe_undefined, key)
            result, numbers = _graph_while(cond_fn, body_fn, values, names, return_names, maybe_undefined, key)
            if key is not None:
                for i, exact in numbers:  # (zero trips leave them numbers: decided where that shows)
                    number_paths.note(result[i], key, values[i], result[i].dtype, exact)
                    if not exact:
                        number_paths.PEELED.add(key)  # (decided, its first trip is traced apart)
            return result
        if isinstance(c, torch.Tensor):
            c = bool(c)
        if not c:
            return values
        values = list(body_fn(*values))
        if len(values) != len(loop_vars):
            raise ConversionError(f"while_loop body returned {len(values)} values for {len(loop_vars)} loop variables")


def _since(tr, mark):
    """The ops recorded in the current block since `mark`."""
    return tr.block.ops[mark.blocks[tr.block.idx][0]:] if tr.block.idx < len(mark.blocks) else tr.block.ops


def _trips_decided(cond_fn, body_fn, values, names, return_names, maybe_undefined, key):
    """A loop whose trips change a Python number's type (`s = 0.1`, then `s =
    s + t` on every trip, a tensor; or `s = 3`, an int), where the trace
    used the result in a way that shows (ops/number_paths.py): eager has
    the number after zero trips, and after any the type the trips give. The
    loop is `if test: loop` with the test evaluated once more before it, and
    that `if` (at the loop's site, decided) converts the side the inputs
    take; a run taking the other is a decision (d2s/decisions.py): a program
    for runs with trips, one for runs with none.

    Where trips give a number of another type than the one before the loop
    (`number_paths.PEELED`), a graph loop would carry one type for both:
    its first trip is traced apart from the values as they are (`if test:
    (first trip; loop)`), so the loop carries the type the trips give. Only
    there: the first trip's ops are then ops of their own, not the loop's
    (the executor still takes a `for` loop's first row from the loop's one
    `unbind`: runtime/passes/loop_slices.py). A loop whose later trips
    still change the type keeps it pending at the decided site: where that
    shows, the conversion is refused."""
    peel = key in number_paths.PEELED

    def loop():
        start = values
        if peel:
            tr = tracer.current()
            mark = tr.mark()
            start = list(body_fn(*values))
            if len(start) != len(values):
                raise ConversionError(f"while_loop body returned {len(start)} values for {len(values)} loop variables")
            if any(op.type in ("raise", "decision_failed") for op in _since(tr, mark)):
                return start  # (the first trip never ends: it raises, or fails where these inputs take no trip)
        result, numbers = _graph_while(cond_fn, body_fn, start, names, return_names, maybe_undefined, key)
        for i, exact in numbers:
            if peel or not exact:
                number_paths.note(result[i], key, start[i], result[i].dtype, False)  # (no one type still)
            else:
                result[i].number_or_tensor = None  # a tensor after the trip this side runs
        return result

    return cond(graph_condition(cond_fn(*values)), loop, lambda: list(values), names=names,
                return_names=return_names)


@dataclasses.dataclass
class _Trip:
    """One trace of the loop: its blocks, the condition's Variable, the
    body's arguments and results, and which of them the op carries."""

    body: object
    cblock: object
    cond: Variable
    args: list
    carried: list
    new: list


def _graph_while(cond_fn, body_fn, values, names, return_names, maybe_undefined=(), key=None):
    tr = tracer.current()
    parent = tr.block
    origin = user_origin()
    values = [graph_tensor(v) for v in values]  # run-time sizes carried by the loop: 0-d tensors
    specs = _initial_specs(values, names, return_names, maybe_undefined, key)
    for _attempt in range(_MAX_TRACES):
        mark = tr.mark()
        trip = _trace_trip(tr, cond_fn, body_fn, values, specs, names)
        if not _settle(tr, trip, values, specs, names, return_names):
            break
        tr.rollback(mark)
    else:
        raise error_at_user_line(f"the shapes of the loop variables did not settle after {_MAX_TRACES} traces")
    # (index, exact) of the numbers the loop's site decides (`_trips_decided`).
    numbers = [(i, not specs[i].mixed_numbers) for i in trip.carried
               if _number_to_decide(specs[i], values[i], trip.new[i], trip.args[i])]
    return _append_while(tr, parent, origin, trip, values, specs, names), numbers


def _number_to_decide(spec, value, new, arg):
    """Whether the loop variable is a Python number before the loop that
    every trip makes a tensor, or one some trip gives another type (not
    exact: the merged type may be neither path's). A name with no value
    before the loop (first assigned in it, or a `return` inside it) has
    nothing to decide; the loop's other variables still do."""
    if isinstance(value, Undefined):
        return False
    if spec.number:
        return spec.mixed_numbers
    return (spec.python_number and spec.kind != TENSOR_ARRAY
            # (the variable itself, written in place on every trip: `total += t`)
            and (not number_or_tensor(new) or new is arg)
            and not stands_for_number(new))


def _initial_specs(values, names, return_names, maybe_undefined, key=None):
    """Per loop variable: a `_Spec`; "constant" for a Python object the loop
    must not change; "undefined" for a name with no value before the loop;
    None for one that may start undefined (a returned value, a name the
    caller tracks): a zeros placeholder until the body assigns it."""
    specs = []
    for i, v in enumerate(values):
        if isinstance(v, Undefined):
            name = names[i] if names and i < len(names) else None
            specs.append(None if name in return_names or name in maybe_undefined else "undefined")
        elif _is_loop_carried(v):
            specs.append(_Spec(v, output_label(names, i, return_names), key))
        else:
            specs.append("constant")
    return specs


def _trace_trip(tr, cond_fn, body_fn, values, specs, names):
    """Trace the condition and the body once, from one Variable per spec."""
    program = tr.program
    body = tr.new_block()
    carried, args = [], []
    for i, (v, spec) in enumerate(zip(values, specs)):
        if isinstance(spec, _Spec):
            var = body.create_var(name=program.unique_name(var_base(names, i, "loop_var")), shape=spec.shape,
                                  dtype=spec.dtype or "float32", kind=spec.kind, stop_gradient=spec.stop)
            carried.append(i)
            args.append(spec.describe(var))
            identity.note(var, (v, identity.ANY))  # later trips: what the body made of it
        else:
            args.append(v)
    cblock = program.create_block(body.idx)
    with tr.block_guard(cblock):
        c = cond_fn(*args)
        c = as_var(c) if not isinstance(c, Variable) else c
    check_pred(c)
    with tr.block_guard(body):
        new = list(body_fn(*args))
    return _Trip(body, cblock, c, args, carried, new)


def _settle(tr, trip, values, specs, names, return_names):
    """Check each value the trip gives against its spec, widening the
    specs; True when one changed (the loop is traced again)."""
    changed = False
    for i, (v, spec) in enumerate(zip(trip.new, specs)):
        label = output_label(names, i, return_names)
        if spec == "constant":
            if v is not values[i]:
                raise error_at_user_line(f"loop variable {label} is a Python {type(values[i]).__name__} that the "
                                         "loop body changes; only tensors and numbers can change in a tensor loop")
            continue
        if spec == "undefined" or (spec is None and isinstance(v, Undefined)):
            if not isinstance(v, Undefined):
                raise error_at_user_line(
                    f"{label} is first assigned inside a loop over a tensor condition and used after it; "
                    f"it must be defined before the loop")
            continue
        if spec is None:  # a return value first produced inside the loop
            with tr.block_guard(trip.body):
                probe = as_var(v)
            specs[i] = _Spec(probe, label)
            specs[i].shape = tuple(d if isinstance(d, int) and d != -1 else 1 for d in probe.dims)  # 1: a placeholder's size
            changed = True
            continue
        if isinstance(v, Undefined) or v is None:
            raise error_at_user_line(f"loop variable {label} has no value after an iteration of the loop")
        literal = not isinstance(v, (Variable, torch.Tensor))
        with tr.block_guard(trip.body):
            # A literal keeps its own type where the variable is a number
            # (`s = 3` where `s` was 0.5: an int; given 0.5's float64 it was
            # 3.0, and 0.5 given an int's int64 was 0); a tensor's dtype
            # where it is a tensor (a Python number meeting it).
            nv = as_var(v, spec.dtype if literal and not spec.number else None)
        trip.new[i] = nv
        changed = spec.widen(nv, label) or changed
    return changed


def _initial_value(v, spec):
    """The value before the loop, in the parent block, as the spec's type."""
    if isinstance(v, Undefined):
        return framework.zeros_of(spec.shape, spec.dtype)
    var = as_var(v, spec.dtype if spec.python_number else None)
    if spec.python_number and not spec.number and spec.kind != TENSOR_ARRAY:
        # A number a trip makes a tensor (`total = 0; total += x.mean()`):
        # eager rebinds it to a tensor of that tensor's dtype and device, so
        # the loop variable starts on the program's device (a 0-d CPU number
        # could not be added into in place from a GPU value), the device the
        # program's values report (followed when the program moves).
        return record(op_for_callable(torch.Tensor.to), torch.Tensor.to, (var,),
                      {"device": tracer.current().program.device, "dtype": spec.dtype})
    if var.dtype != spec.dtype and spec.kind != TENSOR_ARRAY:
        var = framework.cast(var, spec.dtype)
    return var


def _append_while(tr, parent, origin, trip, values, specs, names):
    """The `while` op of the settled trace; returns the loop's results."""
    program = tr.program
    init = [_initial_value(values[i], specs[i]) for i in trip.carried]
    for i in trip.carried:
        if specs[i].number and trip.new[i].dtype != torch_dtype(specs[i].dtype):
            # A narrower number carried widened (a bool or int where it is a
            # float): the loop variable holds the dtype its spec declares.
            with tr.block_guard(trip.body):
                trip.new[i] = framework.cast(trip.new[i], specs[i].dtype)
                trip.new[i].python_number = True
    outs = [specs[i].describe(parent.create_var(
        name=program.unique_name(var_base(names, i, "loop_out")), shape=specs[i].shape, dtype=specs[i].dtype,
        kind=specs[i].kind, stop_gradient=specs[i].stop or not torch_dtype(specs[i].dtype).is_floating_point))
        for i in trip.carried]
    loop_names = [trip.args[i].name for i in trip.carried]
    inputs = [n for n in outer_reads([trip.body, trip.cblock]) if n not in loop_names]
    parent.append_op("while", inputs={"Init": init, "X": inputs}, outputs={"Out": outs},
                     attrs={"cond_block": trip.cblock, "body_block": trip.body, "loop_vars": loop_names,
                            "cond_out": trip.cond.name, "body_outs": [trip.new[i].name for i in trip.carried]},
                     origin=origin)
    array_lengths.after_loop(tr, trip, values, outs)
    result = list(trip.new)
    for o, i in zip(outs, trip.carried):
        result[i] = o
        # Zero trips: the value before the loop; else the last trip's.
        identity.note(o, (values[i],) if trip.new[i] is trip.args[i] else (values[i], trip.new[i]))
    for i, spec in enumerate(specs):
        if spec == "constant" or spec == "undefined" or spec is None:
            result[i] = values[i]
    return result
