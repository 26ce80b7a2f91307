"""Graph control flow: the `cond` and `while` ops and the explicit API.

`cond(pred, true_fn, false_fn)` and `while_loop(cond, body, loop_vars)` work
on eager values and on Variables alike:

    cond(pred, t, f)            ==  t() if pred else f()
    while_loop(c, b, vs)        ==  while c(*vs): vs = b(*vs)
                                    return vs

With a Variable condition they trace the branches / the body into
sub-blocks and append one op whose outputs are new Variables:

    cond:   Out = cond(Cond, X) {true_block, false_block, true_outs, false_outs}
    while:  Out = while(X)      {cond_block, body_block, loop_vars, cond_out, body_outs}

The executor lowers them to a Python `if` / `while True: ... break` around the
sub-blocks' statements, so gradients flow through the branch and the
iterations actually taken.
"""

import ast
import contextlib
import os
import re

import math

import torch

from runtime.errors import ConversionError
from runtime.ir import TENSOR_ARRAY, Variable, dtype_name, torch_dtype

from . import framework, tracer
from .recording import graph_condition, graph_tensor, lift, number_or_tensor, stands_for_number
from .user_frames import SYMBOLIC_TYPES, error_at_user_line, user_origin
from .registry import OpDef, register


class Undefined:
    """Stands for a name that has no value yet at this point of the program.

    Using it in any way (arithmetic, comparison, attributes, truth, calls,
    iteration) raises Python's own ``UnboundLocalError`` for the name, as
    reading the unbound local would."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Undefined({self.name!r})"

    def unbound(self, *args, **kwargs):
        raise UnboundLocalError(f"cannot access local variable '{self.name}' where it is not associated "
                                "with a value")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self.unbound()

    __bool__ = __call__ = __iter__ = __len__ = __getitem__ = __setitem__ = __neg__ = __invert__ = unbound
    __lt__ = __le__ = __gt__ = __ge__ = unbound
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = unbound
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __matmul__ = __rmatmul__ = unbound
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = unbound
    __torch_function__ = classmethod(lambda cls, func, types, args=(), kwargs=None: _unbound_in(args, kwargs))


def _unbound_in(args, kwargs):
    for value in list(args) + list((kwargs or {}).values()):
        if isinstance(value, Undefined):
            value.unbound()
    return NotImplemented


class Unreachable(Undefined):
    """A branch value that no run reaches the merge with: the branch raises
    (then a branch function returns one ``Unreachable`` for all its values),
    or it has returned from the function, so a later use never sees it. The
    merged value is the other branch's."""


def _tensor_like(value):
    return isinstance(value, (Variable, torch.Tensor) + SYMBOLIC_TYPES) or (
        isinstance(value, (int, float, bool)) and not isinstance(value, Undefined))


def _same_python_value(a, b):
    """Whether two branch values are one Python value (not graph tensors)."""
    if a is b:
        return not isinstance(a, (Variable, torch.Tensor) + SYMBOLIC_TYPES)
    if type(a) is not type(b) or isinstance(a, (Variable, torch.Tensor, Undefined) + SYMBOLIC_TYPES):
        return False
    try:
        equal = bool(a == b)
    except Exception:  # noqa: BLE001 - values that do not compare are not the same value
        return False
    # 0.0 == -0.0, but they are different values (1 / x tells them apart).
    return equal and not (type(a) is float and math.copysign(1.0, a) != math.copysign(1.0, b))


def _label(names, i, return_names=()):
    """How a message names output ``i``: the user's variable, or "the
    returned value" for the compiler's lowered return value."""
    if not names or i >= len(names):
        return f"output {i}"
    return "the returned value" if names[i] in return_names else f"'{names[i]}'"


def _line(lines, name, side):
    line = (lines or {}).get(name, (None, None))[0 if side == "true" else 1]
    return f"line {line}" if line is not None else "its value from before the `if`"


def _flatten(value):
    if isinstance(value, (tuple, list)) and not isinstance(value, Variable):
        return list(value), (type(value), len(value))
    return [value], None


def _unflatten(leaves, spec):
    if spec is None:
        return leaves[0]
    kind, _ = spec
    return kind(leaves) if kind in (tuple, list) else tuple(leaves)


def _as_var(value, dtype=None):
    """A Variable in the current block for a Variable, tensor or number."""
    value = graph_tensor(value)  # sizes carried through branches and loops become 0-d tensors
    if isinstance(value, Variable):
        return value
    if isinstance(value, torch.Tensor):
        return lift(value)
    if isinstance(value, list):
        return framework.array_from_list(value)
    return framework.fill_constant(value, dtype)


def _outer_reads(blocks):
    """Names read by the ops of `blocks` (and their sub-blocks) that none of
    them defines: the values a control-flow op takes from outside."""
    defined, read = set(), []
    stack = list(blocks)
    while stack:
        block = stack.pop()
        defined.update(block.vars)
        for op in block.ops:
            read += op.input_names + op.output_names
            stack += op.sub_blocks()
    return [n for n in dict.fromkeys(read) if n not in defined]


def _check_pred(pred):
    if any(d not in (1, -1) for d in pred.shape):
        raise error_at_user_line(
            f"a condition must be a tensor with one element, but this one has shape "
            f"{list(pred.shape)}; reduce it first (e.g. `.any()` / `.all()`)")


# -- cond ---------------------------------------------------------------------------

def _emit_cond(op, gen):
    def branch(block, outs):
        body = gen.emit_block(block, keep=outs)
        body += [gen.assign(gen.store(o), gen.load(i)) for o, i in zip(op.output("Out"), outs)]
        return body or [ast.Pass()]

    # `if v:` calls Tensor.__bool__ exactly as bool(v) would (the same error
    # for a tensor of many elements), and costs nothing for a Python bool.
    test = gen.load(op.input("Cond")[0])
    return [ast.If(test=test, body=branch(op.attrs["true_block"], op.attrs["true_outs"]),
                   orelse=branch(op.attrs["false_block"], op.attrs["false_outs"]))]


register(OpDef("cond", emit=_emit_cond, inputs=("Cond", "X"), outputs=("Out",),
               attrs=("true_block", "false_block", "true_outs", "false_outs")))


def _merge_branch_values(i, a, b, tblock, fblock, tr, names, return_names, lines, jump=None, strict=False):
    """The parent-level value for output i given each branch's value, plus
    the names each branch yields (None when no op output is needed)."""
    label = _label(names, i, return_names)
    name = names[i] if names and i < len(names) else None
    live_dims = None
    if isinstance(a, Unreachable) or isinstance(b, Unreachable):
        live, dead_block = (b, tblock) if isinstance(a, Unreachable) else (a, fblock)
        if isinstance(live, Undefined) or not _tensor_like(live):
            return live, None  # only the live branch goes on: its Python value, as it is
        with tr.block_guard(dead_block):
            filler = framework.zeros_placeholder(_as_var(live))
        # The dead side raises before it yields: the value has the live
        # side's sizes (symbolic ones too, which the filler's inference does
        # not keep: a mask of fresh sizes then fails to broadcast at save)
        live_dims = live.dims if isinstance(live, Variable) else None
        a, b = (filler, b) if isinstance(a, Unreachable) else (a, filler)
    a_undef, b_undef = isinstance(a, Undefined), isinstance(b, Undefined)
    if a_undef and b_undef:
        return a, None
    if a_undef or b_undef:
        if name not in return_names and jump is not None:  # the guard of the statements after a jump
            kind, jump_line = jump
            raise error_at_user_line(
                f"{label} is assigned at {_line(lines, name, 'true')}, after the `{kind}` at line {jump_line} "
                f"that a tensor decides, but not on the path that takes the `{kind}`, and is not defined "
                "before it; assign it before the loop")
        if name not in return_names:
            side, other = ("true", "false") if b_undef else ("false", "true")
            raise error_at_user_line(
                f"{label} is assigned in the {side} branch ({_line(lines, name, side)}) but not in the {other} "
                "branch of the `if` on a tensor at this line, and is not defined before it; assign it "
                "before the if or in both branches")
        defined = b if a_undef else a
        placeholder_block = tblock if a_undef else fblock
        with tr.block_guard(placeholder_block):
            other = _as_var(defined)
            filler = framework.zeros_placeholder(other)
        a, b = (filler, b) if a_undef else (a, filler)
    if _same_python_value(a, b):
        # Either way the same Python value (`do_return = True` in both arms
        # of an inner `if`): it stays that value, as in eager, so later code
        # can still tell that this path has returned.
        return a, None
    if name in return_names and (a is None) != (b is None) and _tensor_like(b if a is None else a):
        # `return None` (often the implicit one after an `if`/`elif` chain) on
        # one path, a tensor on the other: a program has one output type.
        # `cond` converts the path the example inputs take (see `_specialise`);
        # where it cannot tell which, the None path raises when a run takes it.
        if strict:
            raise _Unmergeable("None on one path, a tensor on the other")
        none_block = tblock if a is None else fblock
        with tr.block_guard(none_block):
            framework.raise_(RuntimeError(
                "this run takes a path on which the function returns None, where other paths return a tensor; "
                "a program returns the same kind of value on every path (d2s staged the tensor path); "
                "return a tensor on every path"), origin=user_origin())
            filler = framework.zeros_placeholder(_as_var(b if a is None else a))
        a, b = (filler, b) if a is None else (a, filler)
    if a is None or b is None or not (_tensor_like(a) and _tensor_like(b)):
        if a is None or b is None:
            none, tensor = ("true", "false") if a is None else ("false", "true")
            raise _unmergeable(
                f"{label} is a tensor in the {tensor} branch ({_line(lines, name, tensor)}) but None in the "
                f"{none} branch ({_line(lines, name, none)}) of the `if` on a tensor at this line; give it a "
                "tensor value in both branches")
        if type(a) is type(b):
            shown = f" ({_short(a)} and {_short(b)})" if isinstance(a, (str, bytes)) else ""
            raise _unmergeable(
                f"{label} is a Python {type(a).__name__} that differs between the branches{shown} of the `if` "
                "on a tensor at this line; a program carries only tensors and numbers out of a tensor `if`: "
                "give it one value on both paths, or compute a tensor (an index, a code) in the branches and "
                "pick the Python value after the program runs")
        raise _unmergeable(
            f"{label} is a Python {type(a).__name__} in the true branch but a {type(b).__name__} in the false "
            "branch of the `if` on a tensor at this line; only tensors and numbers can differ between branches")
    ref = a if isinstance(a, (Variable, torch.Tensor)) else b if isinstance(b, (Variable, torch.Tensor)) else None
    dtype = ref.dtype if ref is not None else None
    with tr.block_guard(tblock):
        va = _as_var(a, dtype if not isinstance(a, (Variable, torch.Tensor)) else None)
    with tr.block_guard(fblock):
        vb = _as_var(b, dtype if not isinstance(b, (Variable, torch.Tensor)) else None)
    if va.kind == vb.kind == TENSOR_ARRAY:
        return _merge_arrays(label, va, vb, tr, names, i)
    numbers = (stands_for_number(va), stands_for_number(vb))
    if va.kind == vb.kind and va.dtype != vb.dtype and numbers[0] != numbers[1]:
        # A Python number on one path, a tensor on the other: the number
        # takes the tensor's dtype, which is what torch reads it as wherever
        # it meets tensors (ops/wrapped_numbers.py).
        if numbers[0]:
            with tr.block_guard(tblock):
                va = framework.cast(va, vb.dtype)
        else:
            with tr.block_guard(fblock):
                vb = framework.cast(vb, va.dtype)
    if va.kind != vb.kind or va.dtype != vb.dtype:
        raise error_at_user_line(
            f"{label} has dtype {va.dtype_name} in the true branch but {vb.dtype_name} in the false "
            "branch of an `if` on a tensor; cast one of them so both agree")
    if len(va.shape) != len(vb.shape):
        raise error_at_user_line(
            f"{label} has shape {list(va.shape)} in the true branch but {list(vb.shape)} in the false "
            "branch of an `if` on a tensor; the ranks must agree")
    shape = live_dims or tuple(x if x == y else -1 for x, y in zip(va.dims, vb.dims))
    parent = tr.block
    out = parent.create_var(name=tr.program.unique_name(_base(names, i, "cond_out")),
                            shape=shape, dtype=va.dtype, kind=va.kind,
                            stop_gradient=va.stop_gradient and vb.stop_gradient)
    out.python_number = numbers[0] and numbers[1]
    varying = number_or_tensor(va) or number_or_tensor(vb) or (label if numbers[0] != numbers[1] else None)
    if varying:  # a number on one path, a tensor on the other
        out.number_or_tensor = varying
    return out, (va.name, vb.name)


def _short(value):
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _merge_arrays(label, va, vb, tr, names, i):
    """A tensor array from each branch: an array with no element yet (an
    empty list on that path) takes the element shape of the other."""
    known = [v for v in (va, vb) if getattr(v, "elem_known", True)]
    if len(known) == 2 and (len(va.shape) != len(vb.shape) or va.dtype != vb.dtype):
        raise error_at_user_line(
            f"{label} holds {va.dtype_name}{list(va.shape)} elements in the true branch but "
            f"{vb.dtype_name}{list(vb.shape)} elements in the false branch of an `if` on a tensor; "
            "append tensors of one rank and dtype on every path")
    ref = known[0] if known else va
    shape = tuple(x if x == y else -1 for x, y in zip(va.dims, vb.dims)) if len(known) == 2 else ref.dims
    out = tr.block.create_var(name=tr.program.unique_name(_base(names, i, "cond_out")),
                              shape=shape, dtype=ref.dtype, kind=TENSOR_ARRAY,
                              stop_gradient=va.stop_gradient and vb.stop_gradient)
    out.elem_known = bool(known)
    return out, (va.name, vb.name)


def cond(pred, true_fn, false_fn, names=None, return_names=(), lines=None, jump=None):
    """`true_fn() if pred else false_fn()`; a graph `cond` op when `pred` is a Variable.

    Each branch returns a value or a tuple/list of values. With a Variable
    `pred` both branches are traced; tensor/number pairs merge into new
    Variables (dimensions that differ become -1), equal Python values pass
    through, and anything else is a ConversionError naming the output
    (`names[i]`; `lines[name]` gives the lines where each branch assigns
    it). A value undefined in one branch becomes a zeros placeholder
    only when its name is in `return_names`, and so does an `Unreachable`
    value (a branch may return one `Unreachable` for all its values: it ends
    in a `raise` op).
    ``jump`` (kind, line): this `if` guards the statements after a
    `break`/`continue` (for the messages).
    """
    pred = graph_condition(pred)  # a comparison of run-time sizes decides at run time
    if not isinstance(pred, Variable):
        if isinstance(pred, torch.Tensor):
            pred = bool(pred)
        return true_fn() if pred else false_fn()
    _check_pred(pred)
    tr = tracer.current()
    parent = tr.block
    origin = user_origin()
    tblock = tr.new_block()
    with tr.block_guard(tblock), _side(tr, pred, True):
        t_out = true_fn()
    fblock = tr.new_block()
    with tr.block_guard(fblock), _side(tr, pred, False):
        f_out = false_fn()
    t_leaves, t_spec = _flatten(t_out)
    f_leaves, f_spec = _flatten(f_out)
    if isinstance(t_out, Unreachable):  # the true branch raises: the false branch's structure
        t_leaves, t_spec = [t_out] * len(f_leaves), f_spec
    if isinstance(f_out, Unreachable):
        f_leaves, f_spec = [f_out] * len(t_leaves), t_spec
    mark = tr.mark()
    try:
        if t_spec != f_spec:
            raise _unmergeable(
                f"the branches of an `if` on a tensor return different structures ({t_spec} vs {f_spec})")
        spec, merged, outs, t_names, f_names = _merge(t_leaves, f_leaves, t_spec, tblock, fblock, tr,
                                                      names, return_names, lines, jump, strict=True)
    except _Unmergeable:
        # Values no program output can hold on both paths: convert the path
        # these inputs take, and make the other one a decision check.
        taken = _forced_side(origin)
        if taken is None:
            # The side the run on these very inputs takes, right after this
            # conversion (checked when it runs): replayed at the inputs' own
            # sizes, which the trace has as 2 where they are 0 or 1.
            taken = _example_side(tr, pred, real_sizes=True)
            if taken is not None and origin:
                tr.example_sides.setdefault(tuple(origin[:2]), taken)
        taken = _forced_side(origin, _FALLBACK) if taken is None else taken
        if taken is None and origin:
            # The side the example inputs took at this very line elsewhere in
            # the trace (a mask helper run for the prompt, then again in the
            # loop that feeds one token at a time, where replay cannot tell).
            taken = tr.example_sides.get(tuple(origin[:2]))
        if taken is None:
            # Which path these inputs take is unknown: the side holding
            # tensors where the other holds None, else the true side; a run
            # taking the other one raises DecisionFailed, and the call
            # converts again for the side that run took (d2s/decisions.py).
            taken = not any(a is None and b is not None for a, b in zip(t_leaves, f_leaves))
        tr.rollback(mark)
        dead = _specialise(tblock, fblock, taken, origin, "their values cannot be merged")
        live_leaves, spec = (t_leaves, t_spec) if taken else (f_leaves, f_spec)
        leaves = [dead] * len(live_leaves)
        spec, merged, outs, t_names, f_names = _merge(
            *((live_leaves, leaves) if taken else (leaves, live_leaves)), spec, tblock, fblock, tr,
            names, return_names, lines, jump)
    _hint_merged_sizes(tr, pred, outs, t_names, f_names, tblock, fblock)
    inputs = [n for n in _outer_reads([tblock, fblock]) if n != pred.name]
    parent.append_op("cond", inputs={"Cond": [pred], "X": inputs}, outputs={"Out": outs},
                     attrs={"true_block": tblock, "false_block": fblock,
                            "true_outs": t_names, "false_outs": f_names}, origin=origin)
    return _unflatten(merged, spec)


def _hint_merged_sizes(tr, pred, outs, t_names, f_names, tblock, fblock):
    """A size that differs between the sides (`F.pad` under `if pad > 0`)
    becomes a new symbol when a later op reads it; ShapeEnv decides every
    comparison on its hint, recording the decision as a run-time check. A
    made-up hint makes made-up checks (`s1 > s8`, failing on real inputs),
    so the hint is the size on the side the example inputs take."""
    if tr._shapes is None or not any(-1 in o.dims for o in outs if o.kind != TENSOR_ARRAY):
        return
    taken = _example_side(tr, pred)
    if taken is None:
        return
    block, names = (tblock, t_names) if taken else (fblock, f_names)
    for out, name in zip(outs, names):
        if out.kind == TENSOR_ARRAY or -1 not in out.dims:
            continue
        out.size_hints = tuple(tr.shapes.hint(d) for d in block.find_var(name).dims)


def _merge(t_leaves, f_leaves, spec, tblock, fblock, tr, names, return_names, lines, jump, strict=False):
    merged, outs, t_names, f_names = [], [], [], []
    for i, (a, b) in enumerate(zip(t_leaves, f_leaves)):
        value, yielded = _merge_branch_values(i, a, b, tblock, fblock, tr, names, return_names, lines, jump,
                                              strict)
        merged.append(value)
        if yielded is not None:
            outs.append(value)
            t_names.append(yielded[0])
            f_names.append(yielded[1])
    return spec, merged, outs, t_names, f_names


# -- branches converted for one side ---------------------------------------------------
# A branch whose values cannot be merged with the other's (None and a
# tensor, different structures), or whose tracing fails (a reshape valid
# only for the sizes that take it), is converted for the side the example
# inputs take. The other side becomes a `decision_failed` op: a run that
# reaches it makes the declarative call convert again for its inputs, which
# take that side (d2s/decisions.py); a saved program refuses such inputs.

_NONE_PATH = "None on one path, a tensor on the other"


# {(file, line): side}: `if`s whose values cannot be merged, converted for
# the side given here instead of the example inputs' (d2s/save_paths.py
# traces each such side for a saved model). `_FALLBACK`: the side where
# replaying the example cannot tell (d2s/decisions.py: the side a run
# took). `forced_used` records which of them tracing met.
_FORCED, _FALLBACK = {}, {}
forced_used = set()


@contextlib.contextmanager
def forcing(sides, fallback=False):
    """Convert the unmergeable `if`s at these user lines for these sides
    (`fallback`: only where the example inputs' side is unknown)."""
    table = _FALLBACK if fallback else _FORCED
    saved = dict(table)
    table.clear()
    table.update(sides)
    forced_used.clear()
    try:
        yield
    finally:
        table.clear()
        table.update(saved)


def _forced_side(origin, table=_FORCED):
    key = tuple(origin[:2]) if origin else None
    if key in table:
        forced_used.add(key)
        return table[key]
    return None


class _Unmergeable(ConversionError):
    """Branch values no program output can hold on both paths."""


def _unmergeable(message):
    err = error_at_user_line(message)
    return _Unmergeable(err.message, err.filename, err.lineno)


def _example_side(tr, pred, real_sizes=False):
    """True/False: the side of `pred` the inputs being traced take; None
    when replaying the ops that compute it cannot tell (`real_sizes`: see
    ops/examples.py)."""
    value = tr.example_int(pred, None, real_sizes)
    return None if value is None else bool(value)


@contextlib.contextmanager
def _side(tr, pred, side):
    tr.sides.append((pred, side))
    try:
        yield
    finally:
        tr.sides.pop()


def decide_failed_side(exc):
    """For an exception raised inside torch or d2s while a side of a tensor
    `if` was traced (a kernel refusing sizes that side never runs with, as
    `view(b, h, 1, d)` under `if q_len == 1` with a symbolic q_len): when the
    example inputs do not take this side (or a side around it), the side
    becomes a `decision_failed` op (converted again when a run takes it)
    and this returns True. False for an error the user's code raised
    itself, or on a side the inputs take: that error is what eager raises."""
    tr = tracer.current()
    if not tr.sides or not raised_by_torch(exc):
        return False
    for pred, side in reversed(tr.sides):
        if _example_side(tr, pred) is (not side):
            origin = user_origin()
            framework.decision_failed(
                f"this program was converted for inputs that do not take this side of a tensor `if` (tracing "
                f"it failed: {type(exc).__name__}: {str(exc)[:200]}); these inputs take it, which d2s "
                "converts when a declarative call first takes it: a saved program holds only the sides its "
                "example inputs took (save from inputs that take this side for a program of its own)",
                origin=origin)
            return True
    return False


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def raised_by_torch(exc):
    """Whether `exc` is torch refusing the sizes it was given: a kernel's
    inference failing (ops/capture.py marks it), or an error raised inside
    torch's own Python code. Not an error the user's code raised (a
    `raise`, an `assert`, `[1, 2][4]`): that one is what eager raises on
    that side, a `raise` op."""
    if getattr(exc, "kernel_failed", False):
        return True
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb.tb_frame.f_code.co_filename, tb.tb_next
    return last is not None and last.startswith(_TORCH_DIR)


def _specialise(tblock, fblock, taken, origin, why):
    """Empty the side not `taken` and make it one `decision_failed` op;
    returns the Unreachable value its outputs are."""
    dead = fblock if taken else tblock
    where = f"{origin[0]}:{origin[1]}" if origin else "a tensor `if`"
    line = f" (`{origin[2]}`)" if origin and origin[2] else ""
    tr = tracer.current()
    with tr.block_guard(dead):
        framework.decision_failed(
            f"this program was converted for inputs that take the {'true' if taken else 'false'} side of the "
            f"`if` at {where}{line} ({why}); these inputs take the other side, which d2s converts when a "
            "declarative call first takes it: a saved program holds only the sides its example inputs took "
            "(save from inputs that take this side for a program of its own)", origin=origin)
    # First in the block: what the side traced before it (up to where its
    # tracing failed) never runs.
    dead.ops.insert(0, dead.ops.pop())
    return Unreachable("decided")


# -- while ----------------------------------------------------------------------------

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
               attrs=("cond_block", "body_block", "loop_vars", "cond_out", "body_outs")))


class _Spec:
    """What one loop variable is at the top of every iteration."""

    def __init__(self, value, name):
        self.name = name
        # A Python number (or the 0-d constant a converted loop made of one)
        # has a weak dtype: the first iteration's tensor dtype wins, as in
        # eager `total = 0; for ...: total += t.mean()`.
        self.python_number = (isinstance(value, (int, float, bool)) and not isinstance(value, torch.Tensor)) \
            or (isinstance(value, Variable) and value.python_literal)
        self.kind = value.kind if isinstance(value, Variable) else (TENSOR_ARRAY if isinstance(value, list) else "tensor")
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
            _check_pred(c)
            # This evaluation only told us the loop is a graph loop: the
            # `while` op computes its condition in its own block.
            tr.rollback(mark)
            return _graph_while(cond_fn, body_fn, values, names, return_names, maybe_undefined)
        if isinstance(c, torch.Tensor):
            c = bool(c)
        if not c:
            return values
        values = list(body_fn(*values))
        if len(values) != len(loop_vars):
            raise ConversionError(f"while_loop body returned {len(values)} values for {len(loop_vars)} loop variables")


def _graph_while(cond_fn, body_fn, values, names, return_names, maybe_undefined=()):
    tr = tracer.current()
    program = tr.program
    parent = tr.block
    origin = user_origin()
    values = [graph_tensor(v) for v in values]  # run-time sizes carried by the loop: 0-d tensors
    specs = []
    for i, v in enumerate(values):
        if isinstance(v, Undefined):
            name = names[i] if names and i < len(names) else None
            specs.append(None if name in return_names or name in maybe_undefined else "undefined")
        elif _is_loop_carried(v):
            specs.append(_Spec(v, _label(names, i, return_names)))
        else:
            specs.append("constant")  # a Python object the loop must not change
    for _attempt in range(6):
        mark = tr.mark()
        body = tr.new_block()
        carried = []
        args = []
        for i, (v, spec) in enumerate(zip(values, specs)):
            if isinstance(spec, _Spec):
                var = body.create_var(name=program.unique_name(_base(names, i, "loop_var")), shape=spec.shape,
                                      dtype=spec.dtype or "float32", kind=spec.kind, stop_gradient=False)
                var.elem_known = spec.elem_known
                var.python_number = spec.number
                if spec.varies:
                    var.number_or_tensor = spec.varies
                carried.append(i)
                args.append(var)
            else:
                args.append(v)
        cblock = program.create_block(body.idx)
        with tr.block_guard(cblock):
            c = cond_fn(*args)
            c = _as_var(c) if not isinstance(c, Variable) else c
        _check_pred(c)
        with tr.block_guard(body):
            new = list(body_fn(*args))
        changed = False
        for i, (v, spec) in enumerate(zip(new, specs)):
            label = _label(names, i, return_names)
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
                with tr.block_guard(body):
                    probe = _as_var(v)
                specs[i] = _Spec(probe, label)
                specs[i].shape = tuple(d if isinstance(d, int) and d != -1 else 1 for d in probe.dims)  # 1: a placeholder's size
                changed = True
                continue
            if isinstance(v, Undefined) or v is None:
                raise error_at_user_line(f"loop variable {label} has no value after an iteration of the loop")
            with tr.block_guard(body):
                nv = _as_var(v, spec.dtype if not isinstance(v, (Variable, torch.Tensor)) else None)
            new[i] = nv
            if not spec.varies and (spec.number != stands_for_number(nv) or number_or_tensor(nv)):
                # A number on the first trip and a tensor after it (or the
                # other way round): `isinstance` has no one answer.
                spec.varies = number_or_tensor(nv) or label
                changed = True
            was_number = spec.python_number or spec.number
            if spec.number and not stands_for_number(nv):
                spec.number = False
                changed = True
            if nv.kind != spec.kind:
                raise error_at_user_line(f"loop variable {label} changes from a {spec.kind} to a {nv.kind} in the loop")
            if spec.kind == TENSOR_ARRAY and not spec.elem_known:
                if getattr(nv, "elem_known", False):
                    spec.shape, spec.dtype, spec.elem_known = nv.dims, nv.dtype, True
                    changed = True
                continue
            if nv.dtype != spec.dtype:
                if was_number:
                    # Python arithmetic keeps a number (`n + 0.5` of an int is a
                    # float); a tensor it meets makes it that tensor's dtype.
                    spec.dtype = torch.promote_types(spec.dtype, nv.dtype) if stands_for_number(nv) else nv.dtype
                    changed = True
                    continue
                raise error_at_user_line(
                    f"loop variable {label} has dtype {_dn(spec.dtype)} before the loop but {nv.dtype_name} "
                    "after one iteration; cast it so the dtype stays the same")
            if len(nv.shape) != len(spec.shape):
                raise error_at_user_line(
                    f"loop variable {label} has shape {list(spec.shape)} before the loop but {list(nv.shape)} "
                    "after one iteration; its rank must stay the same")
            relaxed = tuple(a if a == b else -1 for a, b in zip(spec.shape, nv.dims))
            if relaxed != spec.shape:
                spec.shape = relaxed
                changed = True
        if not changed:
            break
        tr.rollback(mark)
    else:
        raise error_at_user_line("the shapes of the loop variables did not settle after 6 traces")
    # The initial values, converted in the parent block to each spec's type.
    init = []
    for i in carried:
        spec = specs[i]
        v = values[i]
        if isinstance(v, Undefined):
            var = framework.zeros_of(spec.shape, spec.dtype)
        else:
            var = _as_var(v, spec.dtype if spec.python_number else None)
            if var.dtype != spec.dtype and spec.kind != TENSOR_ARRAY:
                var = framework.cast(var, spec.dtype)
        init.append(var)
    outs = [parent.create_var(name=program.unique_name(_base(names, i, "loop_out")), shape=specs[i].shape,
                              dtype=specs[i].dtype, kind=specs[i].kind,
                              stop_gradient=not torch_dtype(specs[i].dtype).is_floating_point)
            for i in carried]
    for o, i in zip(outs, carried):
        o.elem_known = specs[i].elem_known
        o.python_number = specs[i].number
        if specs[i].varies:
            o.number_or_tensor = specs[i].varies
    loop_names = [args[i].name for i in carried]
    inputs = [n for n in _outer_reads([body, cblock]) if n not in loop_names]
    parent.append_op("while", inputs={"Init": init, "X": inputs}, outputs={"Out": outs},
                     attrs={"cond_block": cblock, "body_block": body, "loop_vars": loop_names,
                            "cond_out": c.name, "body_outs": [new[i].name for i in carried]},
                     origin=origin)
    result = list(new)
    for o, i in zip(outs, carried):
        result[i] = o
    for i, spec in enumerate(specs):
        if spec == "constant" or spec == "undefined" or spec is None:
            result[i] = values[i]
    return result


def _base(names, i, default):
    """A variable name for output `i`: the user's name, with what is not a
    name character made `_` (a slot `cache.layers[0].keys` carried by an
    op: `cache_layers_0_keys`), else `default`."""
    name = names[i] if names and i < len(names) else None
    if not isinstance(name, str):
        return default
    name = re.sub(r"\W+", "_", name).strip("_")
    return name if name.isidentifier() else default


def _dn(dtype):
    return dtype_name(dtype)
