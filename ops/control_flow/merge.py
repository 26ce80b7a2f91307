"""One parent-level value for each output of a tensor `if`, from the value
each side gives it.

    tensor / tensor         a new Variable (sizes that differ become -1)
    number / tensor         the tensor's dtype; pending where the side the
                            inputs take is known, decided where the trace
                            uses it so the paths differ (ops/number_paths.py)
    same Python value       that value, as in eager
    undefined on one side   a zeros placeholder where a later read cannot
                            happen (the function returned), else an error
    unreachable side        the live side's value (the dead side raises)
    None / tensor return    the None side raises when a run takes it
"""

import dataclasses

import torch

from runtime.errors import ConversionError
from runtime.ir import TENSOR, TENSOR_ARRAY, Variable, dtype_name

from .. import framework, number_paths
from ..infer import known_contiguous, layout_unknown
from ..recording import number_or_tensor, stands_for_number
from ..user_frames import error_at_user_line, user_origin
from ..wrapped_numbers import python_number_dtype
from . import identity
from .sides import example_side, site_key
from .undefined import Undefined, Unreachable
from .values import (as_var, assigned_at, check_rank, differing_dtype, output_label, relaxed, same_python_value,
                     tensor_like, var_base)


class Unmergeable(ConversionError):
    """Branch values no program output can hold on both paths."""


def unmergeable(message):
    err = error_at_user_line(message)
    return Unmergeable(err.message, err.filename, err.lineno)


@dataclasses.dataclass
class IfSite:
    """One tensor `if` whose sides are traced: its blocks, and how messages
    name its outputs (`names[i]`; `lines[name]`: the lines where each side
    assigns it; `jump` (kind, line): the `if` guards the statements after a
    `break`/`continue`)."""

    tr: object
    tblock: object
    fblock: object
    names: object = None
    return_names: tuple = ()
    lines: object = None
    jump: object = None
    pred: object = None  # the condition (a Variable of the parent block)
    origin: object = None  # the user's line (user_frames.Origin), whose site keys its decisions
    # Whether two dtypes or ranks make the `if` convert one side only (see
    # `_unmergeable_where_known`); off while the caller may drop outputs.
    one_side: bool = True
    # A whole side never reaches the merge (it raises on every path, or is
    # a decision check): a run that goes on took the other side.
    side_dead: bool = False

    def name(self, i):
        return self.names[i] if self.names and i < len(self.names) else None

    def label(self, i):
        return output_label(self.names, i, self.return_names)

    def block(self, true_side):
        return self.tblock if true_side else self.fblock


def merge(t_leaves, f_leaves, site, strict=False):
    """Each output's merged value, and the `cond` op's outputs with the
    names each side yields for them."""
    merged, outs, t_names, f_names = [], [], [], []
    for i, (a, b) in enumerate(zip(t_leaves, f_leaves)):
        value, yielded = merge_branch_values(i, a, b, site, strict)
        merged.append(value)
        if yielded is not None:
            outs.append(value)
            t_names.append(yielded[0])
            f_names.append(yielded[1])
    return merged, outs, t_names, f_names


def merge_branch_values(i, a, b, site, strict=False):
    """The parent-level value for output i given each branch's value, plus
    the names each branch yields (None when no op output is needed)."""
    label, name = site.label(i), site.name(i)
    live_dims = None
    sides = (a, b)
    if isinstance(a, Unreachable) or isinstance(b, Unreachable):
        live = b if isinstance(a, Unreachable) else a
        if isinstance(live, Undefined) or not tensor_like(live) or \
                site.side_dead and isinstance(live, (bool, int, float)):
            # Only the live branch goes on: its Python value, as it is. A
            # number too where the other side never goes on: every run
            # after the `if` took this side, so it stays the Python number
            # eager has (the count of a loop over Python items whose body
            # raises, unrolled into one `cond` per item). A name only one
            # side binds keeps its number as a program value, read beside
            # its bound flag.
            return live, None
        a, b, live_dims = _fill_unreachable(a, b, site)
    a_undef, b_undef = isinstance(a, Undefined), isinstance(b, Undefined)
    if a_undef and b_undef:
        return a, None
    if a_undef or b_undef:
        a, b = _fill_undefined(a, b, site, label, name)
    if same_python_value(a, b):
        # Either way the same Python value (`do_return = True` in both arms
        # of an inner `if`): it stays that value, as in eager, so later code
        # can still tell that this path has returned.
        return a, None
    if name in site.return_names and (a is None) != (b is None) and tensor_like(b if a is None else a):
        a, b = _fill_none_return(a, b, site, strict)
    if a is None or b is None or not (tensor_like(a) and tensor_like(b)):
        raise _python_values_differ(a, b, site, label, name)
    value, yielded = _merged_var(i, a, b, site, label, live_dims, strict)
    identity.note(value, sides, site.pred)  # on each path the object that side's value is
    return value, yielded


def _fill_unreachable(a, b, site):
    """The dead side raises before it yields: a zeros placeholder there,
    and the live side's sizes for the merged value (symbolic ones too,
    which the filler's inference does not keep: a mask of fresh sizes then
    fails to broadcast at save)."""
    dead_true = isinstance(a, Unreachable)
    live = b if dead_true else a
    with site.tr.block_guard(site.block(dead_true)):
        filler = framework.zeros_placeholder(as_var(live))
    live_dims = live.dims if isinstance(live, Variable) else None
    return (filler, b, live_dims) if dead_true else (a, filler, live_dims)


def _fill_undefined(a, b, site, label, name):
    """A value one side leaves undefined: a placeholder when it is the
    function's returned value (a path that returned never reads it), else
    the error naming where the other side assigns it."""
    a_undef = isinstance(a, Undefined)
    if name not in site.return_names and site.jump is not None:  # the guard of the statements after a jump
        kind, jump_line = site.jump
        raise error_at_user_line(
            f"{label} is assigned at {assigned_at(site.lines, name, 'true')}, after the `{kind}` at line "
            f"{jump_line} that a tensor decides, but not on the path that takes the `{kind}`, and is not defined "
            "before it; assign it before the loop")
    if name not in site.return_names:
        # A name d2s gives no bound flag (its value, a string, None or a
        # tuple, is no op output: d2s/operators/unbound_names.py): the side
        # these inputs take is converted, bound or not there, as eager has it.
        side, other = ("false", "true") if a_undef else ("true", "false")
        raise unmergeable(
            f"{label} is assigned in the {side} branch ({assigned_at(site.lines, name, side)}) but not in the "
            f"{other} branch of the `if` on a tensor at this line, and is not defined before it")
    defined = b if a_undef else a
    with site.tr.block_guard(site.block(a_undef)):
        filler = framework.zeros_placeholder(as_var(defined))
    return (filler, b) if a_undef else (a, filler)


def _fill_none_return(a, b, site, strict):
    """`return None` (often the implicit one after an `if`/`elif` chain) on
    one path, a tensor on the other: a program has one output type. `cond`
    converts the path the example inputs take (see `sides.specialise`);
    where it cannot tell which, the None path raises when a run takes it."""
    if strict:
        raise Unmergeable("None on one path, a tensor on the other")
    with site.tr.block_guard(site.block(a is None)):
        framework.raise_(RuntimeError(
            "this run takes a path on which the function returns None, where other paths return a tensor; "
            "a program returns the same kind of value on every path (d2s staged the tensor path); "
            "return a tensor on every path"), origin=user_origin())
        filler = framework.zeros_placeholder(as_var(b if a is None else a))
    return (filler, b) if a is None else (a, filler)


def _python_values_differ(a, b, site, label, name):
    """The error for two sides' values that are not both tensors or numbers."""
    if a is None or b is None:
        none, tensor = ("true", "false") if a is None else ("false", "true")
        return unmergeable(
            f"{label} is a tensor in the {tensor} branch ({assigned_at(site.lines, name, tensor)}) but None in "
            f"the {none} branch ({assigned_at(site.lines, name, none)}) of the `if` on a tensor at this line; "
            "give it a tensor value in both branches")
    if type(a) is type(b):
        shown = f" ({_short(a)} and {_short(b)})" if isinstance(a, (str, bytes)) else ""
        return unmergeable(
            f"{label} is a Python {type(a).__name__} that differs between the branches{shown} of the `if` "
            "on a tensor at this line; a program carries only tensors and numbers out of a tensor `if`: "
            "give it one value on both paths, or compute a tensor (an index, a code) in the branches and "
            "pick the Python value after the program runs")
    return unmergeable(
        f"{label} is a Python {type(a).__name__} in the true branch but a {type(b).__name__} in the false "
        "branch of the `if` on a tensor at this line; only tensors and numbers can differ between branches")


def _merged_var(i, a, b, site, label, live_dims, strict=False):
    """A new parent Variable for a tensor or number on each side."""
    tr = site.tr
    ref = a if isinstance(a, (Variable, torch.Tensor)) else b if isinstance(b, (Variable, torch.Tensor)) else None
    # A Python number meeting a tensor takes its dtype (what torch reads it
    # as); meeting another number (`return 7` on one path, `return 0.5` or a
    # run-time bool on the other) it keeps its own: Python's value differs
    # in type by path, which the sides' merge below decides.
    dtype = ref.dtype if ref is not None and not stands_for_number(ref) else None
    places = ("in the true branch", "in the false branch of an `if` on a tensor")
    if dtype is not None and not (tr.decides_numbers and _decision_key(site, strict) is not None):
        # A literal the tensor's dtype cannot hold the kind of (0.5 beside
        # an int64 tensor would be 0), where no trace decides it later
        # (`d2s.cond` / `Executor.run` programs): refused, not truncated.
        kinds = [python_number_dtype(v) if isinstance(v, (bool, int, float, complex)) else None for v in (a, b)]
        if any(k is not None and number_paths.number_kind(k) > number_paths.number_kind(dtype) for k in kinds):
            names = [dtype_name(k) if k is not None else dtype_name(dtype) for k in kinds]
            raise differing_dtype(label, tuple(names), places, "cast one of them so both agree")
    with tr.block_guard(site.tblock):
        va = as_var(a, dtype if not isinstance(a, (Variable, torch.Tensor)) else None)
    with tr.block_guard(site.fblock):
        vb = as_var(b, dtype if not isinstance(b, (Variable, torch.Tensor)) else None)
    if va.kind == vb.kind == TENSOR_ARRAY:
        return _merge_arrays(label, va, vb, site, i)
    numbers = (stands_for_number(va), stands_for_number(vb))
    pending = None
    if va.kind == vb.kind == TENSOR and numbers[0] != numbers[1]:
        pending = _number_beside_tensor(a if numbers[0] else b, va, vb, site, label, strict)
    if va.kind == vb.kind and va.dtype != vb.dtype and numbers[0] != numbers[1]:
        # A Python number on one path, a tensor on the other, where the side
        # is not known (`_number_beside_tensor`): the number takes the
        # tensor's dtype, one value for both paths (documented: rounded to
        # that dtype, a 0-d tensor where eager has the number). Not where the
        # dtype cannot hold its kind (0.5 beside an int64 tensor is 0, True
        # beside nothing lost) and no trace decides it later: refused.
        number, tensor = (va, vb) if numbers[0] else (vb, va)
        kind = number_paths.number_kind
        if kind(number.dtype) > kind(tensor.dtype) and (pending is None or not tr.decides_numbers):
            raise differing_dtype(label, (va.dtype_name, vb.dtype_name), places, "cast one of them so both agree")
        if numbers[0]:
            with tr.block_guard(site.tblock):
                va = framework.cast(va, vb.dtype)
        else:
            with tr.block_guard(site.fblock):
                vb = framework.cast(vb, va.dtype)
    if va.kind == vb.kind and va.dtype != vb.dtype and all(numbers):
        literal = not isinstance(a, (Variable, torch.Tensor)) or not isinstance(b, (Variable, torch.Tensor))
        va, vb, pending = _merge_number_types(a, b, va, vb, site, label, places, strict, literal)
    try:
        if va.kind != vb.kind or va.dtype != vb.dtype:
            raise differing_dtype(label, (va.dtype_name, vb.dtype_name), places, "cast one of them so both agree")
        check_rank(label, (va.shape, vb.shape), places, "the ranks must agree")
    except ConversionError as err:
        if pending is not None:
            # A number on one path, a tensor of another rank on the other (`stack(out).sum(0) if
            # len(out) > 0 else 0.0`): no one value, so one side is converted, the other decided
            # where a run takes it, as for None and a tensor (sides.side_to_convert).
            raise _decided(err, site) from None
        raise _unmergeable_where_known(err, site, strict) from None
    shape = live_dims or relaxed(va.dims, vb.dims)
    out = tr.block.create_var(name=tr.program.unique_name(var_base(site.names, i, "cond_out")),
                              shape=shape, dtype=va.dtype, kind=va.kind,
                              stop_gradient=va.stop_gradient and vb.stop_gradient)
    out.python_number = numbers[0] and numbers[1]
    _merge_layout(out, va, vb, tr)
    varying = number_or_tensor(va) or number_or_tensor(vb) or (label if numbers[0] != numbers[1] else None)
    if varying:  # a number on one path, a tensor on the other
        out.number_or_tensor = varying
    if pending is not None:
        number_paths.note(out, pending[0], pending[1], out.dtype)
    elif number_paths.pending(va) or number_paths.pending(vb):
        out.pending_number = number_paths.pending(va) or number_paths.pending(vb)  # (decided where it came from)
    return out, (va.name, vb.name)


def _number_beside_tensor(number, va, vb, site, label, strict):
    """A Python number on one path, a tensor on the other (`v = t.sum() if
    c else 0.1`; `number`: the number side's value). The merged value is
    pending (ops/number_paths.py): one value of the tensor's dtype until the
    trace uses it where eager's paths differ (returned, `isinstance`, beside
    a float64 or int64 tensor, 0.1 rounded to float32), and then, traced
    again, this `if` converts one side and the other is a decision (the
    side the inputs take, or where replay cannot tell, a guess a run
    corrects: sides.side_to_convert): each path keeps eager's value and
    type exactly. -> (site key, number) to mark the merged value with;
    None in a trace no decision can follow (`d2s.cond` programs)."""
    key = _decision_key(site, strict)
    if key is None:
        return None
    if key in number_paths.DECIDED:
        number_side = "true" if stands_for_number(va) else "false"
        raise _decided(error_at_user_line(
            f"{label} is a Python {_number_type(va if number_side == 'true' else vb)} in the {number_side} branch "
            f"but a tensor in the other branch of the `if` on a tensor at this line"), site)
    return key, number


def _decision_key(site, strict):
    """The key of the site whose merged value may be left pending; None in a
    trace no decision can follow (`d2s.cond` programs, a caller that may
    drop the outputs)."""
    if not (strict and site.pred is not None and site.origin):
        return None
    return site_key(site.origin)


def _decided(err, site):
    """The error for a decided site's merge: Unmergeable (one side converted,
    the other a decision); a plain ConversionError while the caller may
    drop outputs (`one_side` off: d2s/operators/branches.py drops the
    containers no later name reads, then traces the `if` again)."""
    if not site.one_side:
        return ConversionError(err.message, err.filename, err.lineno)
    return Unmergeable(err.message, err.filename, err.lineno)


def _number_type(var):
    return "bool" if var.dtype == torch.bool else "float" if var.dtype.is_floating_point else \
        "complex" if var.dtype.is_complex else "int"


def _merge_number_types(a, b, va, vb, site, label, places, strict, literal):
    """Python numbers of two types (`return 7` on one path, `return 0.5`
    or a bool on the other; `a`, `b` the sides' values): where the side the
    inputs take is known, the `cond` converts that side and the other is a
    decision (each path's value keeps its type, as in Python). Else, where
    one side is a Python literal, both widen to the wider type (bool < int
    < float < complex: the value is kept, never narrowed), and the merged
    value is pending (ops/number_paths.py) as a number beside a tensor is:
    where a trace shows the type (returned, `isinstance`, `i * k` of an
    int64 `i`), that `if` is decided when traced again, converting the
    side replay tells or a guess a run corrects. Two computed numbers
    (`k + t.sum().item()` beside `s * 0.5`) widen only where the merged
    value can be pending; elsewhere (`d2s.cond` programs) they stay an
    error, a literal widens. -> (va, vb, (site key, the narrower side's
    value) or None)."""
    err = differing_dtype(label, (va.dtype_name, vb.dtype_name), places, "cast one of them so both agree")
    decided = _unmergeable_where_known(err, site, strict)
    if decided is not err:
        raise decided
    key = _decision_key(site, strict)
    if key is None and not literal:
        raise err
    if key in number_paths.DECIDED:
        raise _decided(err, site)
    wide = torch.promote_types(va.dtype, vb.dtype)
    narrow = a if va.dtype != wide else b
    with site.tr.block_guard(site.tblock):
        va = framework.cast(va, wide) if va.dtype != wide else va
    with site.tr.block_guard(site.fblock):
        vb = framework.cast(vb, wide) if vb.dtype != wide else vb
    va.python_number = vb.python_number = True  # (a cast of a number is the number, widened)
    return va, vb, (None if key is None else (key, narrow))


def _merge_layout(out, va, vb, tr):
    """`out`'s strides: the sides' where both have the same (`x.t()` on one
    side, `x.t() * 2` on the other), contiguous where both are, else
    unknown (ops/infer.py `layout_unknown`; a read of them is checked when
    the program runs, or refused at run-time sizes: ops/capture.py `_strides`)."""
    if out.kind != TENSOR:
        return
    if not (layout_unknown(va) or layout_unknown(vb)):
        if tuple(out.dims) == tuple(va.dims) == tuple(vb.dims) and va.strides == vb.strides:
            out.strides = va.strides
            return
        if known_contiguous(va, tr) and known_contiguous(vb, tr):
            return  # contiguous on both paths (`F.pad(x)` on one, `x` on the other)
    out.layout_unknown = True


def _unmergeable_where_known(err, site, strict):
    """Two dtypes or two ranks, which one program output cannot hold: where
    the side the example inputs take is known (a declarative trace), the
    `cond` converts that side and makes the other a decision check
    (`Unmergeable`: a run that takes it converts again); else `err`."""
    if strict and site.one_side and site.pred is not None \
            and example_side(site.tr, site.pred, real_sizes=True) is not None:
        return Unmergeable(err.message, err.filename, err.lineno)
    return err


def _short(value):
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _merge_arrays(label, va, vb, site, i):
    """A tensor array from each branch: an array with no element yet (an
    empty list on that path) takes the element shape of the other."""
    known = [v for v in (va, vb) if getattr(v, "elem_known", True)]
    if len(known) == 2 and (len(va.shape) != len(vb.shape) or va.dtype != vb.dtype):
        raise error_at_user_line(
            f"{label} holds {va.dtype_name}{list(va.shape)} elements in the true branch but "
            f"{vb.dtype_name}{list(vb.shape)} elements in the false branch of an `if` on a tensor; "
            "append tensors of one rank and dtype on every path")
    ref = known[0] if known else va
    shape = relaxed(va.dims, vb.dims) if len(known) == 2 else ref.dims
    out = site.tr.block.create_var(name=site.tr.program.unique_name(var_base(site.names, i, "cond_out")),
                                   shape=shape, dtype=ref.dtype, kind=TENSOR_ARRAY,
                                   stop_gradient=va.stop_gradient and vb.stop_gradient)
    out.elem_known = bool(known)
    return out, (va.name, vb.name)
