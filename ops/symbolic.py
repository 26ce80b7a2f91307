"""Symbolic shapes: a dimension known only at run time is a symbol of
PyTorch's own `ShapeEnv`, and shape inference runs kernels on fake tensors
(`FakeTensorMode`), as `torch.export` does.

    x: float32[s0, 16]                         InputSpec([None, 16])
    n = x.size(0)          -> torch.SymInt s0  (no op: a value known by its symbol)
    torch.zeros(n * 2, 3)  -> float32[2*s0, 3]; the op's size argument is
                              computed when the program runs, as a Python int:
        tmp_0 = size(x, 0)
        tmp_1 = operator.mul(tmp_0, 2)
        tmp_2 = torch.zeros(tmp_1, 3)

While tracing, sizes are `torch.SymInt`s, so torch's own Python code
(`torch.zeros(input.size(0), hidden)` in `nn.LSTMCell`) works on them
unchanged. A SymInt or SymBool that reaches an op argument or a graph
condition is *materialized*: its expression is turned into ops over the
run-time sizes of the tensors its symbols came from (`materialize`).

Decisions torch takes on symbols while tracing (`s0 != 1` for broadcasting,
`s1 == 3` for a matmul's reduction dimension) are guards of the `ShapeEnv`,
decided on the example sizes; each becomes an `assert` op evaluated when the
program runs, so a program never silently computes with an assumption its
input breaks.

The IR keeps only the text of each symbolic dimension ("s0", "2*s0"), so
`runtime` needs neither sympy nor a ShapeEnv. This module is imported on the
first dynamic dimension of a trace: a static trace does not pay for sympy.
"""

import contextlib
import dataclasses
import logging
import math
import operator

import sympy
import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import GuardSource, Source
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, free_unbacked_symbols
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._sympy import functions as sym_fns
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges
from torch.utils._sympy.printers import PythonPrinter

from runtime.attrs import InputRef, OutputRef
from runtime.ir import SCALAR, TENSOR_ARRAY, Variable

from .cold_start import add_wrapper, drop_idle_trace_handler, shape_env
from . import symbolic_ints
from .framework import scalar_op_type
from .user_frames import user_name, user_origin


def hint_of(env, expr):
    """The example value of a symbolic expression, without a guard:
    `ShapeEnv.guarding_hint_or_throw` where torch has it, else its older
    name, `size_hint` (torch 2.11)."""
    hint = getattr(env, "guarding_hint_or_throw", None)
    return hint(expr) if hint is not None else env.size_hint(expr)


_PRINTER = PythonPrinter()


class SpecializesSize(RuntimeError):
    """A kernel wanted a symbolic size as a Python int."""


@dataclasses.dataclass(frozen=True)
class _DimSource(Source):
    """Where a symbol comes from, for ShapeEnv's messages ("x.size(0)")."""

    label: str = ""

    @property
    def _name_template(self):
        return self.label

    @property
    def guard_source(self):
        return GuardSource.CONSTANT


# sympy node -> (op type, Python function the op runs), for materialize.
_BINARY = {
    sympy.Add: operator.add, sympy.Mul: operator.mul, sym_fns.FloorDiv: operator.floordiv,
    sym_fns.PythonMod: operator.mod, sympy.Mod: operator.mod, sym_fns.Mod: operator.mod,
    sympy.Pow: operator.pow, sym_fns.Max: max, sym_fns.Min: min, sympy.Max: max, sympy.Min: min,
    sympy.Eq: operator.eq, sympy.Ne: operator.ne, sympy.Lt: operator.lt, sympy.Le: operator.le,
    sympy.Gt: operator.gt, sympy.Ge: operator.ge, sympy.And: operator.and_, sympy.Or: operator.or_,
    sym_fns.IntTrueDiv: operator.truediv,
}
# Functions of one argument: `math.ceil(h / 2)` of a size is CeilToInt(IntTrueDiv(h, 2)).
_UNARY = {sympy.Not: operator.not_, sym_fns.CeilToInt: math.ceil, sym_fns.FloorToInt: math.floor}


def _operator_of(expr):
    """The Python operator of a sympy node, by its class or the nearest
    base that has one: torch's CleanDiv (a FloorDiv it knows to be exact,
    after a view by 16 of a size) is a FloorDiv."""
    return next((_BINARY[t] for t in type(expr).__mro__ if t in _BINARY), None)


class Shapes:
    """The ShapeEnv and FakeTensorMode of one trace, and what links its
    symbols to the program: display names, the (Variable, dim) each symbol
    is read from at run time, and the Variables already computing an
    expression."""

    def __init__(self, tracer):
        self.tracer = tracer
        drop_idle_trace_handler()
        self.env = shape_env(specialize_zero_one=False)
        self._guard_ints = False
        self.env.evaluate_sym_node = self._evaluate_sym_node
        self._mode = None
        self._display = {}      # sympy symbol -> display symbol s<k>
        self._symints = {}      # dim text -> SymInt
        self.sources = {}       # sympy symbol -> (Variable, dim[, a, b]): var.size(dim) is a * symbol + b
        self._values = {}       # sympy expr -> Variable computing it at run time
        self.scalars = {}       # id(SCALAR Variable) -> its SymInt/SymBool
        self._numbers = {}      # sympy symbol -> "int(t)": the run-time number it stands for
        self._fake_vars = {}    # id(fake tensor) -> (it, the Variable it stands for)
        # A fake made since the flag was cleared has not its Variable's strides (see `fake`).
        self.layout_approximated = False
        self._item_vars = {}    # unbacked symbol of a fake's `.item()` -> that Variable
        self.emitted = 0        # how many ShapeEnv guards have become assert ops

    def follow(self, var, before):
        """`var` now stands for another value (an in-place op gave its
        tensor new sizes: ops/recording.py), `before` for the one it stood
        for: sizes read from the old value are read from `before` (each
        change logged, so that a rollback puts it back)."""
        for table in (self.sources, self._fake_vars, self._item_vars):
            for key, entry in list(table.items()):
                if entry is var or (isinstance(entry, tuple) and any(e is var for e in entry)):
                    self.tracer.log_write(table, key)
                    table[key] = before if entry is var else tuple(before if e is var else e for e in entry)

    # -- symbols ---------------------------------------------------------------------
    def _evaluate_sym_node(self, node, *args, **kwargs):
        # A kernel reading a symbolic size as a plain int (C++ composite ops
        # such as max_pool1d, `int(n)` in Python) would fix that size to its
        # example for the rest of the trace: refuse, so inference falls back
        # to real runs at two sizes (ops/infer.py) and the symbol stays free.
        if self._guard_ints and node.pytype is int and node.expr.free_symbols:
            raise SpecializesSize(str(node.expr))
        return ShapeEnv.evaluate_sym_node(self.env, node, *args, **kwargs)

    @property
    def mode(self):
        """The FakeTensorMode, made on first use: constructing one imports
        torch._dynamo, most of a first conversion's time."""
        if self._mode is None:
            # No fallback kernels: running a real kernel would fix every size to its example.
            self._mode = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=True,
                                        allow_fallback_kernels=False)
        return self._mode

    @contextlib.contextmanager
    def active(self, meta=False):
        """Symbolic sizes for one inference: on meta tensors (`meta`), else
        on fake tensors. Both run the same meta kernels; fake tensors also
        handle what a meta tensor cannot (data-dependent outputs, `.item()`,
        real tensors among the arguments). The Python dispatcher runs
        composite ops' decompositions on SymInts (as torch.export does);
        without it their C++ bodies read sizes as ints, fixing each to its
        example."""
        self._guard_ints = True
        try:
            with contextlib.ExitStack() as stack:
                if not meta:
                    # FakeTensorMode logs a kernel's failure as an error before raising it;
                    # inference handles it (another way to infer, or the user's error).
                    stack.enter_context(_quiet(logging.getLogger("torch._subclasses.fake_tensor")))
                if not meta:
                    stack.enter_context(self.mode)
                # Above the fake mode too: its `.item()` symbols get their Variables' example hints.
                stack.enter_context(_Items(self, meta))
                stack.enter_context(enable_python_dispatcher())
                yield
        finally:
            self._guard_ints = False

    def new_symbol(self, hint, label):
        # Not `positive`: sympy would then take `0 < s0` as true by assumption.
        # A size's range is [0, oo): batch 0 and 1 are sizes like any other.
        sym = self.env.create_symbol(int(hint), _DimSource(label), dynamic_dim=DimDynamic.DYNAMIC, positive=None)
        self.env.var_to_range[sym] = ValueRanges(0, int_oo)
        self.env._update_version_counter()
        return self._name(sym, hint)

    def _name(self, sym, hint):
        self._display[sym] = sympy.Symbol(f"s{len(self._display)}", integer=True, nonnegative=True)
        return self.env.create_symintnode(sym, hint=int(hint))

    def symbolize(self, var, hints=None):
        """Give each run-time dimension of `var` (-1 or an unknown text) a new
        symbol read from `var` when the program runs."""
        dims = list(var.dims)
        for i, d in enumerate(dims):
            if isinstance(d, str) and d in self._symints:
                continue
            if d == -1 or isinstance(d, str):
                # An example size of 0 or 1 would make torch specialize the
                # symbol to it (broadcasting, strides): trace with 2 instead.
                hint = max(hints[i], 2) if hints is not None else 8
                s = self.new_symbol(hint, f"{var.name}.size({i})")
                if var.kind != TENSOR_ARRAY:  # an array's shape is its elements'
                    self.sources[s.node.expr] = (var, i)
                dims[i] = self.text(s)
        var.shape = dims

    def hint(self, d):
        """The example size of dimension `d` (an int or an expression's
        text), 8 when unknown."""
        if isinstance(d, int):
            return d if d >= 0 else 8
        s = self._symints.get(d)
        try:
            return int(hint_of(self.env, s.node.expr)) if s is not None else 8
        except Exception:  # noqa: BLE001 - no hint: the stand-in
            return 8

    def text(self, d):
        """The IR form of a dimension: an int, or the expression's text."""
        if isinstance(d, int):
            return d
        d = self.backed(d)
        expr = self.env.simplify(d.node.expr)
        if expr.is_number:
            return int(expr)
        text = _PRINTER.doprint(expr.xreplace(self._display))
        self._symints.setdefault(text, d)
        return text

    def backed(self, d):
        """`d` with symbols of data-dependent sizes (nonzero, masks) replaced
        by fresh symbols with a sample size, so later ops can reason on them."""
        expr = d.node.expr
        unbacked = free_unbacked_symbols(expr)
        if not unbacked:
            return d
        fresh = {u: self.new_symbol(self._item_hint(u), f"{u}").node.expr for u in unbacked}
        new = expr.xreplace(fresh)
        return self.env.create_symintnode(new, hint=int(hint_of(self.env, new)))

    def _item_hint(self, u):
        """The example value of the tensor whose `.item()` made symbol `u`
        (ops/examples.py), else a stand-in."""
        var = self._item_vars.get(u)
        return 8 if var is None else self.tracer.example_int(var, 8)

    def symint(self, text, var=None, dim=None):
        """The SymInt of a dimension's text (a fresh symbol if unknown)."""
        if isinstance(text, int) and text != -1:
            return text
        s = self._symints.get(text)
        if s is None and var is not None and var.kind != TENSOR_ARRAY and dim is not None \
                and var.dims[dim] == text:
            # A dimension of `var` not yet given its symbol (a size a tensor
            # `if` merges, read by `x.size()` before any op takes `x`): the
            # symbol its fake will have, with its example hint. A symbol of
            # its own would be a second, unrelated size of the same
            # dimension (`x.expand(x.size(0), n)` then fails to trace).
            self.symbolize(var, getattr(var, "size_hints", None))
            s = self._symints.get(var.dims[dim])
        if s is None:
            s = self.new_symbol(8, f"{getattr(var, 'name', '?')}.size({dim})")
            if var is not None and var.kind != TENSOR_ARRAY:
                self.sources[s.node.expr] = (var, dim)
        return s

    def python_int(self, var):
        """A SCALAR Variable holding, when the program runs, the Python int
        that the 0-d integer tensor `var` stands for (`int(t)`, `t.item()`).
        While tracing it is a new symbol, read from that Variable: a check on
        it is a check of the run-time number."""
        value = self.new_symbol(self.tracer.example_int(var, 8), f"int({var.name})")
        out = self._append(scalar_op_type(int), [var], (InputRef(0),), value, block=var.block)
        self._values[value.node.expr] = out
        self._numbers[value.node.expr] = f"int({user_name(var)})"
        return out

    def note_source(self, sym, var, dim):
        """Remember that `var.size(dim)` reads symbol `sym` at run time; for a
        size `a * s + b` (whole a > 0 and b, as `torch.cat` of a tensor array
        makes: ops/infer.py), that `(var.size(dim) - b) // a` reads `s`."""
        expr = sym.node.expr
        if isinstance(expr, sympy.Symbol):
            if self._needs_source(expr):
                self.sources[expr] = (var, dim)
            return
        b, terms = expr.as_coeff_add()
        if len(terms) != 1 or not b.is_Integer:
            return
        a, s = terms[0].as_coeff_Mul()
        if isinstance(s, sympy.Symbol) and a.is_Integer and a > 0 and self._needs_source(s):
            self.sources[s] = (var, dim, int(a), int(b))

    def _needs_source(self, expr):
        """Whether symbol `expr` has no source the code being traced can
        read: none yet, or one in a branch or loop body already traced (each
        trip of a Python loop over `if`s of tensors makes its tensors of the
        symbol's size in its own branch)."""
        known = self.sources.get(expr)
        if known is None:
            return True
        if self._usable(known[0]):
            return False
        self.tracer.log_write(self.sources, expr)  # a rolled-back trial trace puts the old one back
        return True

    # -- fake tensors ---------------------------------------------------------------------
    def fake(self, var, length=2, meta=False):
        """A fake tensor standing for `var` (a list of them for a tensor array,
        a SymInt for a scalar); a meta tensor with symbolic sizes if `meta`."""
        if var.kind == SCALAR:
            return self.scalars[id(var)]
        if any(d == -1 or (isinstance(d, str) and d not in self._symints) for d in var.dims):
            self.symbolize(var, getattr(var, "size_hints", None))
        sizes = [self.symint(d, var, i) for i, d in enumerate(var.dims)]
        device = "meta" if meta else var.device
        # Its strides where tracing knows them (a transposed feed, a view of
        # one), so that a view of it gets eager's strides (`x.stride()` read after).
        strides = getattr(var, "strides", None)
        if var.kind == TENSOR_ARRAY or strides is None or len(strides) != len(sizes):
            strides = None
        else:
            strides = [self.symint(st) if isinstance(st, str) else st for st in strides]
        with contextlib.nullcontext() if meta else self.mode:
            t = torch.empty(sizes, dtype=var.dtype, device=device)
            if strides is not None and not all(map(_same_size, t.stride(), strides)):
                if all(type(n) is int for n in list(sizes) + strides):
                    t = torch.empty_strided(sizes, strides, dtype=var.dtype, device=device)
                else:
                    # With symbolic sizes a stand-in of these strides makes
                    # every later kernel reason on them (twice the time to
                    # convert a fold of patches) and adds size checks of its
                    # own (`s0 != 0`): taken contiguous, and the op's
                    # outputs' layout unknown (ops/infer.py `infer`).
                    self.layout_approximated = True
            if var.kind == TENSOR_ARRAY:
                return [torch.empty(sizes, dtype=var.dtype, device=device) for _ in range(length)]
        self._fake_vars[id(t)] = (t, var)
        return t

    # -- materializing ----------------------------------------------------------------------
    def materialize(self, value):
        """A Variable computing the SymInt/SymBool `value` when the program
        runs (or a plain Python value when it is a constant)."""
        return self._emit(self.env.simplify(value.node.expr), value)

    def _emit(self, expr, value=None):
        if expr in (sympy.true, sympy.false):
            return bool(expr)
        if expr.is_number:
            return int(expr)
        var = self._values.get(expr)
        if var is not None and self._usable(var):
            return var
        if isinstance(expr, sympy.Symbol):
            src = self.sources.get(expr)
            if src is None or not self._usable(src[0]):
                return None
            x, dim, *line = src
            if not line:
                var = self._append("size", [x], (InputRef(0), dim), self._symbolic(expr, value), block=x.block)
            else:
                a, b = line
                var = self._append("size", [x], (InputRef(0), dim), self._symbolic(a * expr + b, None),
                                   block=x.block)
                if b:
                    var = self._binary(operator.sub, var, b, a * expr, value if a == 1 else None)
                if a != 1:
                    var = self._binary(operator.floordiv, var, a, expr, value)
        else:
            unary = _UNARY.get(type(expr))
            fn = unary or _operator_of(expr)
            if fn is None:
                return None
            args = list(expr.args)
            if isinstance(expr, sympy.Pow) and not (args[1].is_Integer and args[1] >= 0):
                return None
            parts = [self._emit(a) for a in args]
            if any(p is None for p in parts):
                return None
            var = parts[0]
            for k, p in enumerate(parts[1:], 1):
                partial = expr.func(*args[:k + 1]) if k + 1 < len(args) else expr
                var = self._binary(fn, var, p, partial, value if partial is expr else None)
            if unary is not None:
                var = self._binary(fn, var, None, expr, value)
        self._values[expr] = var
        return var

    def _binary(self, fn, a, b, expr, value):
        vars_ = [v for v in (a, b) if not isinstance(v, (int, bool, type(None)))]
        refs = {id(v): InputRef(i) for i, v in enumerate(vars_)}
        args = tuple(refs.get(id(v), v) for v in ((a,) if b is None else (a, b)))
        blocks = [v.block for v in vars_]
        block = max(blocks, key=lambda b: len(_ancestors(b))) if blocks else None
        return self._append(scalar_op_type(fn), vars_, args, self._symbolic(expr, value), block=block)

    def _symbolic(self, expr, value):
        if value is not None:
            return value
        if _is_bool(expr):
            return self.env.create_symboolnode(expr)
        if isinstance(expr, (sym_fns.IntTrueDiv, sym_fns.FloatTrueDiv)):
            return self.env.create_symfloatnode(expr, hint=float(hint_of(self.env, expr)))
        return self.env.create_symintnode(expr, hint=int(hint_of(self.env, expr)))

    def _usable(self, var):
        block = var.block
        program = self.tracer.program
        alive = block.idx < len(program.blocks) and program.blocks[block.idx] is block \
            and block.vars.get(var.name) is var
        return alive and self.tracer.block.is_under(block)

    def _append(self, op_type_, inputs, args, value, block=None):
        """One op computing a Python number from `inputs`; its SCALAR output."""
        block = block if block is not None and self.tracer.block.is_under(block) else self.tracer.block
        dtype = "bool" if isinstance(value, torch.SymBool) else "float64" if isinstance(value, torch.SymFloat) \
            else "int64"
        out = block.create_var(name=block.program.unique_name("size"), shape=(), dtype=dtype, kind=SCALAR,
                               stop_gradient=True)
        block.append_op(op_type_, inputs={"X": inputs}, outputs={"Out": [out]},
                        attrs={"args": args, "kwargs": {}, "out": OutputRef(0)}, origin=user_origin())
        self.scalars[id(out)] = value
        return out

    # -- guards ----------------------------------------------------------------------------
    def drop_shape_neutral_guards(self, start, ranges, same_shape_at):
        """Forget the guards since `start` on one symbol that do not change
        the op's output shapes: torch's kernels also decide memory layout or
        overlap checks on sizes (`s0 != 1`, `s0 < 16`), which the real
        kernel re-decides when the program runs. A guard goes when
        `same_shape_at({symbol: size, ...})` holds at sizes that break it (0
        and 1 first, then larger ones; one symbol at a time, the others at
        their example sizes, then all at once): the op's real output shapes
        there are what the symbolic result says. The symbol's range is restored, so nothing
        later assumes the broken sizes away. Every other guard stays a check."""
        guards = self.env.guards
        kept = guards[:start]
        for guard in guards[start:]:
            expr = guard.expr
            syms = sorted(expr.free_symbols, key=str)
            if syms and all(sym in ranges for sym in syms):
                # Break it one symbol at a time, the others at their example
                # sizes (`s0 != s0*s1` of a view: s1 = 1 breaks it).
                hints = {sym: int(self.env.backed_var_to_val.get(sym, 8)) for sym in syms}
                breaking = []
                for sym in syms:
                    sizes = dict.fromkeys((0, 1, 2, 3, hints[sym] + 1, 16, 64, 2 * hints[sym] + 1, 1000))
                    breaking += [p for p in ({sym: v} for v in sizes) if _holds(expr, hints, p) is False][:3]
                if len(syms) > 1:  # and all at once (`s0*s1 != 1` breaks only there)
                    breaking += [p for p in (dict.fromkeys(syms, v) for v in (0, 1, 2, 3))
                                 if _holds(expr, hints, p) is False][:2]
                if _shape_neutral(breaking, lambda p: same_shape_at(self._with_equals(p, syms))):
                    for sym in syms:
                        self.env.var_to_range[sym] = ranges[sym]
                    self.env._update_version_counter()
                    continue
            kept.append(guard)
        if len(kept) != len(guards):
            guards[:] = kept

    def _with_equals(self, point, fixed):
        """`point` with the symbols tracing found equal to its own (`s3 ==
        s1` of a broadcast, either way round) at the same sizes, except
        those in `fixed` (the guard's own: probing `s0 == s1` must break it).
        Those equalities stay checks of their own."""
        out = dict(point)
        for sym, size in point.items():
            for other, value in self.env.replacements.items():
                if other is sym and getattr(value, "is_Symbol", False) and value not in fixed:
                    out.setdefault(value, size)
                elif value == sym and other not in fixed:
                    out.setdefault(other, size)
        return out

    def new_guards(self):
        """(check, message) for each guard ShapeEnv has recorded since the
        last call: what this trace assumed about run-time sizes. `check` is
        a Variable computing the assumption when the program runs."""
        out = []
        guards = self.env.guards
        while self.emitted < len(guards):
            expr = guards[self.emitted].expr
            self.emitted += 1
            # Not simplified: ShapeEnv would substitute what the guard decided (s1 -> 3).
            check = self._emit(expr)
            if isinstance(check, Variable):
                out.append((check, f"this program was converted for inputs where {self.describe(expr)}; "
                                   "an input breaks that assumption (convert again for such inputs)"))
            # A constant check holds by construction; None: its symbols are not readable here.
        return out

    def finish(self, program):
        """Rewrite every symbolic dimension with what tracing decided
        (`w: [s1, s2]` becomes `[3, s2]` after a guard `s1 == 3`)."""
        for var in program.all_vars():
            if any(isinstance(d, str) for d in var.dims):
                var.shape = [self.text(self._symints[d]) if d in self._symints else d for d in var.dims]

    def describe(self, expr):
        shown = expr.xreplace(self._display)
        if isinstance(shown, (sympy.Eq, sympy.Ne)):  # one order for `s0 == s1`, however torch wrote it
            shown = type(shown)(*sorted(shown.args, key=lambda a: (a.is_number, str(a))), evaluate=False)
        text = _PRINTER.doprint(shown)
        where = []
        for sym in sorted(expr.free_symbols, key=lambda sym: int(str(self._display.get(sym, "s0"))[1:])):
            src = self.sources.get(sym)
            if src is not None:
                read = f"{src[0].name}.size({src[1]})"
                if len(src) == 4:
                    read = f"({read} - {src[3]}) // {src[2]}" if src[3] else f"{read} // {src[2]}"
                where.append(f"{self._display.get(sym, sym)} = {read}")
            elif sym in self._numbers:
                where.append(f"{self._display.get(sym, sym)} = {self._numbers[sym]}")
        return text + (f" ({', '.join(where)})" if where else "")


@contextlib.contextmanager
def _quiet(logger):
    disabled = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = disabled


def _same_size(a, b):
    """Whether two sizes (ints or SymInts) are one expression."""
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return a.node.expr == b.node.expr
    return type(a) is int and type(b) is int and a == b


class _Items(TorchDispatchMode):
    """`.item()` of a symbolic tensor (a kernel reading a 0-d integer tensor
    as an int: `x[:, t]`, `x.reshape(b, n)`): a new unbacked symbol, the
    same one for each read of one tensor, noted with the Variable the
    tensor stands for so that the sized symbol made of it later gets that
    Variable's example value as its hint (`Shapes.backed`), not a stand-in
    whose decisions would follow the made-up number. On meta tensors
    (`meta`) this mode makes the symbol as FakeTensorMode would; above
    fake tensors, FakeTensorMode makes it. Every other op goes on."""

    _ITEM = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)

    def __init__(self, shapes, meta):
        super().__init__()
        self.shapes = shapes
        self.env = shapes.env
        self.meta = meta
        self.memo = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in self._ITEM:
            return func(*args, **(kwargs or {}))
        (arg,) = args
        if id(arg) not in self.memo:
            fake, var = self.shapes._fake_vars.get(id(arg), (None, None))
            exact = symbolic_ints.value_of(self.shapes.tracer, var) if fake is arg else None
            if exact is not None:  # a size computed as a tensor: its expression (ops/symbolic_ints.py)
                self.memo[id(arg)] = (arg, exact)
                return exact
            value = self._new(arg) if self.meta else func(*args, **(kwargs or {}))
            if fake is arg and isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
                self.shapes._item_vars[value.node.expr] = var  # a Variable's number: its example value is the hint
            self.memo[id(arg)] = (arg, value)  # the tensor too: its id stays its own
        return self.memo[id(arg)][1]

    def _new(self, arg):
        if arg.dtype.is_floating_point:
            return self.env.create_unbacked_symfloat()
        if arg.dtype == torch.bool:
            return self.env.create_unbacked_symbool()
        if not arg.dtype.is_complex:
            return self.env.create_unbacked_symint()
        raise NotImplementedError(f"item() of a {arg.dtype} meta tensor")


add_wrapper(_Items.__dict__["__torch_dispatch__"])


def _shape_neutral(points, same_shape_at):
    """Whether the op's output shapes are what the symbolic result says at
    each of `points` where it says anything (at least one): a point where
    the result has no size (`s5 // nh` at nh = 0, which raises when a
    program computes it) neither confirms nor refutes."""
    confirmed = False
    for point in points:
        same = same_shape_at(point)
        if same is False:
            return False
        confirmed = confirmed or same is True
    return confirmed


def _holds(expr, hints, point):
    """The truth of `expr` at `point`, symbols not in it at their `hints`.
    All symbols at once, by `xreplace`: each node rebuilt from numbers
    evaluates itself (`subs`, one symbol at a time, simplified the partly
    substituted expression each time: minutes for MobileViT's nested
    ceil/floor sizes)."""
    values = {sym: sympy.Integer(v) for sym, v in {**hints, **point}.items()}
    try:
        out = expr.xreplace(values)
    except Exception:  # noqa: BLE001 - e.g. a division by zero
        return None
    return True if out == sympy.true else False if out == sympy.false else None


def _is_bool(expr):
    # sympy.Symbol is also a sympy Boolean: test the boolean forms themselves.
    return expr.is_Relational or isinstance(expr, (sympy.logic.boolalg.BooleanFunction,
                                                   sympy.logic.boolalg.BooleanAtom))


def _ancestors(block):
    out = []
    while block is not None:
        out.append(block)
        block = block.parent
    return out
