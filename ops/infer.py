"""Shape/dtype inference shared by every captured torch call: run the kernel
on tensors without data.

With static shapes the kernel runs on meta tensors. As soon as an input has
a dimension known only at run time (or is a run-time size), it runs on fake
tensors whose sizes are symbols of the trace's `ShapeEnv` (ops/symbolic.py):
`data("x", [None, 784])` through `nn.Linear(784, 10)` gives `[s0, 10]`, and
`torch.zeros(x.size(0) * 2, 3)` gives `[2*s0, 3]`.

Ops whose output shape depends on values (`nonzero`, boolean masks) get a
fresh symbol for each data-dependent dimension.

A 0-d integer tensor Variable passed where the kernel wants a Python int
(`x.narrow(0, 0, k)`, `x[:k]`) stands in as a fresh symbol, so the output
dimensions that depend on it are symbols too.
"""

import contextlib
import warnings

import torch

from runtime.attrs import InputRef
from runtime.errors import ConversionError
from runtime import run_modes
from runtime.ir import GENERATOR, SCALAR, TENSOR_ARRAY, Variable

from .cold_start import dynamo_free


class Meta:
    """The inferred type of one tensor output (`shape` holds ints and the
    texts of symbolic dimensions)."""

    __slots__ = ("shape", "dtype", "strides", "requires_grad", "grad_leaf", "layout_unknown")

    def __init__(self, shape, dtype, strides=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.strides = strides  # the meta kernel's strides, when every run agrees (`x.stride()`)
        # What autograd said of the meta kernel's result (`note_requires_grad`); None: not asked.
        self.requires_grad = None
        self.grad_leaf = False  # a leaf requiring grad (`requires_grad=True`, `requires_grad_()`)
        self.layout_unknown = False  # made from a stand-in of a guessed layout (`_forget_strides`)


def _meta_input(v):
    """A meta tensor standing for `v`, with its strides when known (a view's
    or a non-contiguous feed's), so that outputs get eager's strides."""
    strides = getattr(v, "strides", None)
    if strides is not None and len(strides) == len(v.dims) and all(type(s) is int for s in strides):
        return torch.empty_strided(v.dims, strides, dtype=v.dtype, device="meta")
    return torch.empty(v.dims, dtype=v.dtype, device="meta")


def layout_unknown(v):
    """Whether the stand-in for `v` guesses its layout (contiguous) where
    eager's may differ: a value a tensor `if` or loop merges, or made from
    one, or module state that is not contiguous (a saved program loads it
    contiguous, so no layout of it is baked in)."""
    if not isinstance(v, Variable) or v.kind != "tensor" or v.strides is not None:
        return False
    if v.persistable:
        bound = v.block.program.bound.get(v.name)
        return isinstance(bound, torch.Tensor) and not bound.is_contiguous()
    return v.layout_unknown


def known_contiguous(v, tracer):
    """Whether tracing knows `v` to be contiguous (dimensions of size 1
    aside, as `is_contiguous` has them): no strides and not
    `layout_unknown` (a value d2s's own ops make, a feed checked so), or
    strides that are contiguous ones."""
    if layout_unknown(v):
        return False
    if v.strides is None:
        return True
    # Symbolic sizes: the contiguous strides of their own symbols (none made
    # here: a value of a branch would become a symbol's source).
    sizes = [d if type(d) is int else tracer.shapes._symints.get(d) for d in v.dims]
    if any(s is None for s in sizes):
        return False
    with torch._C.DisableTorchFunction():  # a stand-in, not an op of the program
        standard = torch.empty(sizes, device="meta").stride()
    if not all(type(d) is int for d in v.dims):
        standard = [tracer.shapes.text(s) for s in standard]
    return all(a == b or d == 1 for a, b, d in zip(v.strides, standard, v.dims))


def _is_symbolic(v):
    return isinstance(v, Variable) and v.kind != GENERATOR and (
        v.kind != "tensor" or any(isinstance(d, str) or d == -1 for d in v.dims))


def _standin_generators(args, kwargs, inputs):
    """`args`/`kwargs` with a fresh `torch.Generator` in place of each
    generator feed (the user's generator, given to the program when it
    runs): inference draws nothing from the generator a run will use."""
    if not any(isinstance(v, Variable) and v.kind == GENERATOR for v in inputs):
        return args, kwargs
    values = [torch.Generator(v.device) if isinstance(v, Variable) and v.kind == GENERATOR else InputRef(i)
              for i, v in enumerate(inputs)]
    return substitute(args, values), substitute(kwargs, values)


def substitute(tree, values):
    """Rebuild an argument tree with `values[i]` in place of InputRef(i)
    (also used by ops.capture to put Python numbers in place of some inputs)."""
    if isinstance(tree, InputRef):
        return values[tree.index]
    if isinstance(tree, torch.Size):
        return tree  # sizes, not data (`x.new(x.size())`)
    if isinstance(tree, list):
        return [substitute(t, values) for t in tree]
    if isinstance(tree, tuple):
        return tuple(substitute(t, values) for t in tree)
    if isinstance(tree, dict):
        return {k: substitute(v, values) for k, v in tree.items()}
    if isinstance(tree, slice):
        return slice(substitute(tree.start, values), substitute(tree.stop, values),
                     substitute(tree.step, values))
    return tree


def _call(fn, args, kwargs, values, factory, device=None):
    call_args, call_kwargs = substitute(args, values), substitute(kwargs, values)
    if factory and device is not None:
        try:
            return fn(*call_args, **dict(call_kwargs, device=device))
        except TypeError:
            pass  # `bernoulli(p)`, `normal(mean, std)`: no device argument; the inputs carry it
    return fn(*call_args, **call_kwargs)


def _int_like(v):
    return isinstance(v, Variable) and v.kind == "tensor" and not v.dims and not v.dtype.is_floating_point \
        and not v.dtype.is_complex


# Kernels whose result's layout is their own, whatever their inputs' (a
# stand-in of a guessed layout cannot mislead them): `.contiguous()`, and
# kernels that write a new contiguous tensor (`linear` folds its input to a
# matrix product's; `layer_norm` and `embedding` allocate theirs
# contiguous). Asking other kernels with a few sample layouts is not
# enough: `reshape` gives contiguous results from contiguous and from
# reversed inputs, and a non-contiguous view from a transpose's.
_LAYOUT_OF_ITS_OWN = (torch.Tensor.contiguous, torch.nn.functional.linear, torch.nn.functional.layer_norm,
                      torch.nn.functional.embedding)


def infer(fn, args, kwargs, inputs, tracer, factory=False, autograd=False):
    """The result structure of `fn(*args, **kwargs)` with tensors replaced by
    `Meta` (SymInts stay SymInts). `args`/`kwargs` hold InputRef(i) for
    `inputs[i]`. `autograd`: `fn` is torch's own function, whose meta run
    can also tell whether each result requires grad (`note_requires_grad`)."""
    # Warnings are the real kernel's to give when the program runs; here
    # they would be about stand-in sizes (an `out=` resized from a symbol).
    with dynamo_free(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if tracer._shapes is not None:
            tracer._shapes.layout_approximated = False
        result = _infer(fn, args, kwargs, inputs, tracer, factory)
        # An input stood in contiguous where its layout is unknown, or is
        # not contiguous at run-time sizes (ops/symbolic.py `fake`).
        guessed = tracer._shapes is not None and tracer._shapes.layout_approximated
        if guessed or any(layout_unknown(v) for v in inputs):
            if fn not in _LAYOUT_OF_ITS_OWN or _may_be_its_input(fn, result):
                _forget_strides(result)
            elif fn is torch.Tensor.contiguous and isinstance(result, Meta) and \
                    not all(isinstance(d, int) for d in result.shape):
                # Run-time sizes: contiguous where none of them is 1, which
                # the read of its strides checks (ops/capture.py `_strides`).
                result.strides = None
        if autograd:
            note_requires_grad(result, fn, args, kwargs, inputs, factory)
        return result


def note_requires_grad(result, fn, args, kwargs, inputs, factory):
    """Set `requires_grad` on the Metas of `result` to what eager's autograd
    gives the kernel's results: an input requiring grad stands in as a meta
    tensor requiring grad (a leaf where eager has one: an input or module
    state; else made by an op), and the kernel runs on them in the trace's
    grad mode (a read of the flag answers for the caller's:
    ops/ambient_modes.py `requires_grad`). `x.detach()`, `torch.zeros_like(x)`, `x.new_ones(2)`
    and `x.data` require no grad; `t.copy_(x)` and `requires_grad=True` do.
    Where that run cannot be made (run-time sizes, a kernel refusing the
    stand-ins), the Metas keep None and the caller's rule applies."""
    if not torch.is_grad_enabled() or run_modes.full_autocast_state() != run_modes.OFF or not all(
            isinstance(v, Variable) and v.kind == "tensor" and not _is_symbolic(v) for v in inputs):
        return  # (a generator feed, a tensor array, a run-time size: the caller's rule)
    try:
        with torch._C.DisableTorchFunction():
            values = [_grad_input(v) for v in inputs]
            flags = _grad_flags(_call(fn, args, kwargs, values, factory, "meta"))
    except Exception:  # noqa: BLE001 - the kernel's own complaint is the plain run's, when it runs
        return
    _set_grad_flags(result, flags)


def _grad_input(v):
    t = _meta_input(v)
    if not v.stop_gradient and (v.dtype.is_floating_point or v.dtype.is_complex):
        t.requires_grad_()
        if not (v.persistable or v.is_data):
            t = t.clone()  # made by an op: not a leaf, as eagerly (in-place ops allowed)
    return t


def _grad_flags(result):
    if isinstance(result, torch.Tensor):
        return result.requires_grad, result.requires_grad and result.is_leaf
    if isinstance(result, (list, tuple)):
        return [_grad_flags(r) for r in result]
    return None


def _set_grad_flags(meta, flags):
    if isinstance(meta, Meta):
        if isinstance(flags, tuple):
            meta.requires_grad, meta.grad_leaf = flags
    elif isinstance(meta, (list, tuple)) and isinstance(flags, list) and len(flags) == len(meta):
        for m, f in zip(meta, flags):
            _set_grad_flags(m, f)


def _infer(fn, args, kwargs, inputs, tracer, factory):
    args, kwargs = _standin_generators(args, kwargs, inputs)
    # Under `torch.autocast` the kernel's dtypes are autocast's, which meta
    # tensors (device "meta") never see: fake tensors keep the device.
    autocast = run_modes.full_autocast_state() != run_modes.OFF
    # The inference runs are real torch calls: keep capture modes out of them.
    if not autocast and not any(_is_symbolic(v) for v in inputs):
        try:
            with torch._C.DisableTorchFunction():
                values = [_meta_input(v) for v in inputs]
                return _to_meta(_call(fn, args, kwargs, values, factory, "meta"), None)
        except Exception as exc:  # noqa: BLE001 - value-dependent or int-valued inputs: go symbolic
            if not any(_int_like(v) for v in inputs) and not _value_dependent(exc):
                raise
    # Fake tensors dispatch through torch functions themselves (decompositions
    # call back into torch.*): pop the capture modes instead of disabling them.
    with _without_function_modes():
        return _infer_symbolic(fn, args, kwargs, inputs, tracer.shapes, factory, meta_first=not autocast)


@contextlib.contextmanager
def _without_function_modes():
    from torch.overrides import _pop_mode, _push_mode
    modes = [_pop_mode() for _ in range(torch._C._len_torch_function_stack())]
    try:
        yield
    finally:
        for mode in reversed(modes):
            _push_mode(mode)


def _value_dependent(exc):
    return isinstance(exc, NotImplementedError) or "data-dependent" in str(exc) or "meta" in str(exc)


def _infer_symbolic(fn, args, kwargs, inputs, shapes, factory, meta_first=True):
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    first_error, value_dependent = None, False
    for as_int in (False, True):
        # Meta tensors with symbolic sizes first: the same meta kernels as
        # fake tensors, without constructing a FakeTensorMode (which imports
        # torch._dynamo). What they cannot run goes to fake tensors.
        for meta in ((True, False) if shapes._mode is None and meta_first else (False,)):
            try:
                return _symbolic_runs(fn, args, kwargs, inputs, shapes, factory, as_int, meta)
            except Exception as exc:  # noqa: BLE001 - maybe a 0-d integer used as an int: try that
                if meta and _meta_only(exc):
                    continue  # fake tensors do what meta tensors cannot
                first_error = first_error or exc
                value_dependent = value_dependent or isinstance(
                    exc, (DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode))
                break  # the op's own complaint, or a limit of the symbols: a fake run meets it too
        if not any(_int_like(v) for v in inputs):
            break
    return _infer_by_samples(fn, args, kwargs, inputs, shapes, factory, first_error, value_dependent)


def _meta_only(exc):
    """Whether `exc` is a limit of meta tensors (no meta kernel, a value
    read, a real tensor among the arguments) rather than the op's own."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    # Guards on `.item()` values: fake tensors answer some reads the meta item cannot.
    return isinstance(exc, (NotImplementedError, GuardOnDataDependentSymNode)) or "meta" in str(exc).lower()


def _symbolic_runs(fn, args, kwargs, inputs, shapes, factory, as_int, meta):
    """The op's result on symbolic inputs (with tensor arrays, one run per
    array length, merged)."""
    arrays = sum(isinstance(v, Variable) and v.kind == TENSOR_ARRAY for v in inputs)
    runs = []
    shapes.layout_approximated = False
    for length in (ARRAY_LENGTHS if arrays else (2,)):
        values = [shapes.fake(v, length, meta) for v in inputs]
        if as_int:
            values = [shapes.new_symbol(shapes.tracer.example_int(v, 1), v.name) if _int_like(v) else x
                      for v, x in zip(inputs, values)]
        _split_sizes(fn, args, kwargs, inputs, values, shapes)
        start, ranges = len(shapes.env.guards), dict(shapes.env.var_to_range)
        with shapes.active(meta):
            runs.append(_call(fn, args, kwargs, values, factory, "meta" if meta else None))
        if not arrays:
            shapes.drop_shape_neutral_guards(start, ranges, lambda sizes: _same_shape_at(
                fn, args, kwargs, inputs, shapes, factory, runs[0], sizes))
    length = next(vars(v).get("items_known") for v in inputs
                  if isinstance(v, Variable) and v.kind == TENSOR_ARRAY) if arrays == 1 else None
    result = _merge_runs(runs, shapes, one_array=arrays == 1, length=length)
    return result  # (an input's fake not in its layout: `infer` forgets the outputs' strides)


_SPLITS = (torch.split, torch.Tensor.split, torch.split_with_sizes, torch.Tensor.split_with_sizes)


def _split_sizes(fn, args, kwargs, inputs, values, shapes):
    """`x.split(sizes, dim)` with sizes known only at run time (`counts.tolist()`):
    the kernel fails unless they add up to the dimension, so on every run the
    last is the dimension less the others. Its symbol is that expression, so
    that `torch.cat` of the pieces has the dimension's own size again (a
    mixture of experts splits its tokens by expert and adds them back with
    `index_add` over all of them)."""
    if fn not in _SPLITS or len(args) < 2 or not isinstance(args[1], (list, tuple)) or not args[1]:
        return
    tensor, sizes, dim = args[0], args[1], args[2] if len(args) > 2 else kwargs.get("dim", 0)
    last = sizes[-1]
    if not (isinstance(tensor, InputRef) and isinstance(last, InputRef) and isinstance(dim, int)
            and _int_like(inputs[last.index]) and isinstance(values[tensor.index], torch.Tensor)):
        return
    x = values[tensor.index]
    if not -x.dim() <= dim < x.dim():
        return  # the kernel's own error
    for size in sizes[:-1]:
        if isinstance(size, InputRef) and _int_like(inputs[size.index]) \
                and not isinstance(values[size.index], torch.SymInt):
            values[size.index] = shapes.new_symbol(shapes.tracer.example_int(inputs[size.index], 1),
                                                   inputs[size.index].name)
    others = [values[s.index] if isinstance(s, InputRef) else s for s in sizes[:-1]]
    if all(isinstance(s, (int, torch.SymInt)) for s in others):
        values[last.index] = x.shape[dim] - sum(others)


def _may_be_its_input(fn, result):
    """`x.contiguous()` is `x` itself where `x.is_contiguous()`, which holds
    whatever the stride of a dimension of size 1 (or of no elements): then
    its strides are its input's (`m.t().contiguous()` of a (1, 3) `m` keeps
    strides (1, 3), not (1, 1)). Where a size is known to be 1 (or 0) its
    strides are unknown; where every size is known and above 1 they are
    its own; run-time sizes: see `infer`."""
    return fn is torch.Tensor.contiguous and isinstance(result, Meta) and any(
        isinstance(d, int) and d <= 1 for d in result.shape)


def _forget_strides(result):
    """The outputs of a run on a stand-in of a guessed layout: their
    strides are the guess's, not eager's, so they are unknown too (a read of
    them is then checked when the program runs: ops/capture.py `_strides`)."""
    if isinstance(result, Meta):
        result.strides = None
        result.layout_unknown = True
    elif isinstance(result, (list, tuple)):
        for item in result:
            _forget_strides(item)


def _same_shape_at(fn, args, kwargs, inputs, shapes, factory, result, sizes):
    """Whether the op's real output shapes, with the symbols of `sizes`
    ({symbol: size}) at those sizes and every other symbol at its example
    size, are what the symbolic result says for that point (a meta run);
    None where the symbolic result has no size at that point (a division
    by a size that is 0 there)."""
    point = {s: int(v) for s, v in shapes.env.backed_var_to_val.items()}
    point.update(sizes)

    def at(d):
        # `_expr`: the symbol itself, not what a guard of this very op replaced it with.
        return int(d.node._expr.xreplace(point)) if isinstance(d, torch.SymInt) else int(d)

    try:
        values = []
        for v in inputs:
            if v.kind == SCALAR:
                values.append(at(shapes.scalars[id(v)]))
            elif v.kind == TENSOR_ARRAY:
                return False
            else:
                values.append([at(shapes.symint(d, v, i)) for i, d in enumerate(v.dims)])
    except Exception:  # noqa: BLE001 - a size without an example: cannot tell, keep the check
        return False
    # Meta only: a real kernel on hand-made inputs may crash the process.
    try:
        concrete = [x if v.kind == SCALAR else torch.empty(x, dtype=v.dtype, device="meta")
                    for v, x in zip(inputs, values)]
        with torch._C.DisableTorchFunction(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. mse_loss's broadcasting warning at the probed size
            real = _call(fn, args, kwargs, concrete, factory, "meta")
    except NotImplementedError:  # no meta kernel: cannot tell, keep the check
        return False
    except Exception:  # noqa: BLE001 - the op itself refuses that size, as eager does: no check needed
        return True
    try:
        return _shapes_match(result, real, at)
    except Exception:  # noqa: BLE001 - no size there (`s5 // nh` at nh = 0): this point tells nothing
        return None


def _shapes_match(symbolic, real, at):
    if isinstance(symbolic, torch.Tensor):
        return isinstance(real, torch.Tensor) and [at(d) for d in symbolic.shape] == list(real.shape)
    if isinstance(symbolic, (list, tuple)):
        return isinstance(real, (list, tuple)) and len(real) == len(symbolic) and all(
            _shapes_match(a, b, at) for a, b in zip(symbolic, real))
    return True


def _infer_by_samples(fn, args, kwargs, inputs, shapes, factory, error, value_dependent):
    """Real runs on small CPU tensors, for ops the fake tensors cannot run
    (value-dependent outputs, or a fake kernel that fails). Two runs with
    different sizes for the symbolic dimensions: an output dimension that
    follows one input symbol is that symbol, one that stays the same is
    static, any other (and every dimension of a value-dependent output) is a
    fresh symbol."""
    runs, seen = [], {}
    # The samples' values are made up: a 0-d integer of 1 is an index past
    # the end of a dimension of size 1 (`x[i - 1]` under `while i <
    # x.size(0)`); 0 indexes any non-empty dimension, tried when 1 fails.
    fills = [1, 0] if any(_int_like(v) for v in inputs) else [1]

    def run(offset, fill):
        values = [_sample(v, shapes, offset, seen, fill) for v in inputs]
        with torch.random.fork_rng(devices=[]):
            return _call(fn, args, kwargs, values, factory)

    for offset in (0, 7):
        try:
            runs.append(run(offset, fills[0]))
        except Exception as exc:  # noqa: BLE001 - the op's own complaint is the fake run's
            if not runs and len(fills) > 1:
                fills.pop(0)
                try:
                    runs.append(run(offset, fills[0]))
                    continue
                except Exception:  # noqa: BLE001 - the first run's complaint is the one to report
                    pass
            if not runs:
                from .symbolic import SpecializesSize  # lazy: sympy; loaded here, as the symbolic run came first
                # ... unless the fake run stopped at our own signal (a size it
                # wanted as an int: its message is the symbol's name, "u0"),
                # which tells the user nothing: then this run's complaint.
                raise (exc if error is None or isinstance(error, SpecializesSize) else error) from None
            break
    if value_dependent or len(runs) == 1:
        return _to_meta(runs[0], shapes, fresh=True)
    return _follow(runs[0], runs[1], seen, shapes)


def _follow(a, b, seen, shapes):
    if isinstance(a, torch.Tensor):
        dims = [x if x == y else shapes.text(seen.get((x, y)) or shapes.new_symbol(x, "size"))
                for x, y in zip(a.shape, b.shape)]
        return Meta(dims, a.dtype)
    if isinstance(a, (list, tuple)) and len(a) == len(b):
        items = [_follow(x, y, seen, shapes) for x, y in zip(a, b)]
        if hasattr(a, "_fields") or type(a).__module__ == "torch.return_types":
            return type(a)(items)
        return type(a)(items) if isinstance(a, tuple) else items
    if not isinstance(a, (list, tuple)) and a == b:
        return a
    raise _depends(a)


def _depends(example):
    what = f"{len(example)} values" if isinstance(example, (list, tuple)) else repr(example)
    return ConversionError(f"the result ({what} for one input size) depends on a dimension known only at run "
                           "time; compute it with tensor ops instead")


def _sample(v, shapes, offset, seen, fill=1):
    """A real value standing for `v`: symbolic sizes are their example size
    plus `offset`; `seen` maps (size, size + offset) to the symbol. Tensors
    are ones; a 0-d integer is `fill`."""
    if not isinstance(v, Variable):
        return v

    def size(sym):
        from .symbolic import hint_of  # lazy: sympy (a symbolic size means the module is loaded)
        hint = int(hint_of(shapes.env, sym.node.expr))
        seen.setdefault((hint, hint + 7), sym)
        return hint + offset

    if v.kind == SCALAR:
        return size(shapes.scalars[id(v)])
    sizes = [size(shapes.symint(d, v, i)) if isinstance(d, str) or d == -1 else d for i, d in enumerate(v.dims)]
    if _int_like(v):
        return torch.full(sizes, fill, dtype=v.dtype)
    make = lambda: torch.ones(sizes, dtype=v.dtype)  # noqa: E731
    return [make() for _ in range(3)] if v.kind == TENSOR_ARRAY else make()


# The lengths a tensor array stands for in the symbolic runs of an op that
# reads it: three, so that a dimension linear in the length is told from one
# that is not.
ARRAY_LENGTHS = (2, 3, 5)


def _merge_runs(runs, shapes, one_array=False, length=None):
    """One run's result as Meta; with several runs (tensor arrays of
    different lengths, `ARRAY_LENGTHS`) a dimension that differs is
    `a * L + b` in one new symbol `L` for the array's length when the op
    reads one array and the runs fit that line with whole `a` and `b`
    (`torch.cat` of [3]-elements: `3 * L`, so `.view(-1, 3)` is
    `[L, 3]`), else a fresh symbol of its own."""
    if len(runs) == 1:
        return _to_meta(runs[0], shapes)
    metas = [_to_meta(r, shapes) for r in runs]
    # The array's length where the program says it (ops/control_flow/array_lengths.py),
    # else the op's own length symbol, made on first use.
    length = ([] if length is None else [length]) if one_array else None
    return _merge(metas, shapes, length)


def _merge(metas, shapes, length):
    a = metas[0]
    if isinstance(a, Meta):
        dims = [d[0] if len(set(d)) == 1 else _merged_dim(d, shapes, length) for d in zip(*(m.shape for m in metas))]
        return Meta(dims, a.dtype)
    if isinstance(a, (list, tuple)) and all(len(m) == len(a) for m in metas):
        items = [_merge(list(parts), shapes, length) for parts in zip(*metas)]
        return type(a)(items) if isinstance(a, tuple) else items
    if not isinstance(a, (list, tuple)) and all(m == a for m in metas):
        return a
    raise _depends(a)


def _merged_dim(sizes, shapes, length):
    """The IR dimension of sizes that differ between the runs (see _merge_runs)."""
    if length is not None and all(type(d) is int for d in sizes):
        (l0, l1, *rest), (d0, d1, *more) = ARRAY_LENGTHS, sizes
        a, b = divmod(d1 - d0, l1 - l0)[0], None
        if a > 0 and (d1 - d0) % (l1 - l0) == 0:
            b = d0 - a * l0
        if b is not None and b >= 0 and all(d == a * n + b for n, d in zip(rest, more)):
            if not length:
                length.append(shapes.new_symbol(8, "array length"))
            return shapes.text(length[0] * a + b)
    return shapes.text(shapes.new_symbol(8, "array length"))


def _to_meta(result, shapes, fresh=False):
    if isinstance(result, torch.Tensor):
        if fresh:
            dims = [shapes.text(shapes.new_symbol(int(s), "data-dependent size")) for s in result.shape]
        elif shapes is None:
            return Meta(result.shape, result.dtype, result.stride())
        else:
            # Strides as the sizes: ints, or the texts of symbolic expressions
            # (a view of a transposed input: `x.stride()` of it is not contiguous's).
            dims = [shapes.text(s) for s in result.shape]
            return Meta(dims, result.dtype, tuple(shapes.text(st) for st in result.stride()))
        return Meta(dims, result.dtype)
    if isinstance(result, (list, tuple)):
        items = [_to_meta(r, shapes, fresh) for r in result]
        if hasattr(result, "_fields") or type(result).__module__ == "torch.return_types":
            return type(result)(items)
        return type(result)(items) if isinstance(result, tuple) else items
    if isinstance(result, torch.SymInt) and shapes is not None:
        t = shapes.text(result)
        return t if isinstance(t, int) else shapes.backed(result)
    return result
