"""Shape/dtype inference shared by every captured torch call: run the kernel
on meta tensors.

A dimension that is -1 (known only at run time) is given a stand-in size.
When any input has such a dimension the kernel runs twice, with two different
stand-ins, and every output dimension that differs between the runs is -1:
`data("x", [None, 784])` through `nn.Linear(784, 10)` gives `[-1, 10]`.
Ops whose output shape depends on values (`nonzero`, boolean masks) have no
meta kernel; they run on small CPU tensors instead and all their output
dimensions are -1.

A 0-d integer Variable passed where the kernel wants a Python int (a size
from `x.size(0)`, an index `x[k]`, a slice bound `x[:k]`) stands in as the
stand-in size and also as a small index; the output dimensions that differ
between all those runs are -1.
"""

import torch

from runtime.ir import TENSOR_ARRAY, Variable

# Meta tensors cost no memory, so the stand-in sizes are large and highly
# divisible: `x.view(-1, 8)` must infer for any size the user may feed.
STAND_INS = (5040, 7560)
# Stand-ins for run-time integers used as indices, one per STAND_INS entry.
SMALL_INTS = {5040: 1, 7560: 2}
# Real (CPU) runs and tensor-array lengths use small sizes instead.
SMALL_SIZES = {5040: 8, 7560: 12}


class Meta:
    """The inferred type of one tensor output."""

    __slots__ = ("shape", "dtype", "strides")

    def __init__(self, shape, dtype, strides=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.strides = strides  # the meta kernel's strides, when every run agrees (`x.stride()`)


def _has_unknown(inputs):
    for v in inputs:
        if isinstance(v, Variable) and (v.kind == TENSOR_ARRAY or -1 in v.shape):
            return True
    return False


def _stand_in(value, size, device, as_int, int_value=None):
    if isinstance(value, Variable):
        shape = [size if d == -1 else d for d in value.shape]
        if value.kind == TENSOR_ARRAY:
            length = SMALL_SIZES.get(size, size)
            return [torch.empty(shape, dtype=value.dtype, device=device) for _ in range(length)]
        if as_int and not shape and not value.dtype.is_floating_point:
            # a run-time value used as a Python int: a size, or an index
            if getattr(value, "is_size", False):
                return size  # a dimension of a tensor: exactly that dimension's stand-in
            return size if int_value is None else int_value
        if device == "meta":
            return torch.empty(shape, dtype=value.dtype, device="meta")
        return torch.ones(shape, dtype=value.dtype)
    if isinstance(value, torch.Tensor):
        return value.to("meta") if device == "meta" else value.detach()
    return value


def _substitute(tree, values):
    """Rebuild an argument tree with `values[i]` in place of InputRef(i)."""
    from runtime.attrs import InputRef
    if isinstance(tree, InputRef):
        return values[tree.index]
    if isinstance(tree, torch.Size):
        return tree  # sizes, not data (`x.new(x.size())`)
    if isinstance(tree, list):
        return [_substitute(t, values) for t in tree]
    if isinstance(tree, tuple):
        return tuple(_substitute(t, values) for t in tree)
    if isinstance(tree, dict):
        return {k: _substitute(v, values) for k, v in tree.items()}
    if isinstance(tree, slice):
        return slice(_substitute(tree.start, values), _substitute(tree.stop, values),
                     _substitute(tree.step, values))
    return tree


def _run(fn, args, kwargs, inputs, size, device, as_int, factory, int_value=None):
    values = [_stand_in(v, size, device, as_int, int_value) for v in inputs]
    call_args, call_kwargs = _substitute(args, values), _substitute(kwargs, values)
    if factory and device == "meta":
        try:
            return fn(*call_args, **dict(call_kwargs, device="meta"))
        except TypeError:
            pass  # `bernoulli(p)`, `normal(mean, std)`: no device argument; the inputs are meta
    if device != "meta":
        # A CPU run of a random op must not advance the global generator:
        # the program's own draws at run time must equal eager's.
        with torch.random.fork_rng(devices=[]):
            return fn(*call_args, **call_kwargs)
    return fn(*call_args, **call_kwargs)


def _run_some_way(fn, args, kwargs, inputs, size, factory):
    """Meta first; 0-d integer Variables as ints if tensors are refused; a
    small CPU run for value-dependent ops. Returns (result, exact, as_int)."""
    errors = []
    for device, as_int in (("meta", False), ("meta", True)):
        try:
            return _run(fn, args, kwargs, inputs, size, device, as_int, factory), True, as_int
        except Exception as exc:  # noqa: BLE001 - any failure means "try the next way"
            errors.append(exc)
    # A 0-d integer used as an index (`x[k]`, `x.narrow(0, 0, k)`) can be out
    # of range as a stand-in size; small values are valid indices.
    for small in (SMALL_INTS[size], 0):
        try:
            return _run(fn, args, kwargs, inputs, size, "meta", True, factory, small), True, True
        except Exception:  # noqa: BLE001 - not a valid index for this input; try the next value
            pass
    try:
        return _run(fn, args, kwargs, inputs, SMALL_SIZES.get(size, size), "cpu", True, factory), False, True
    except Exception:  # noqa: BLE001
        raise errors[0] from None


def _merge(runs, exact):
    """Combine several runs' results: tensors become Meta with -1 in the
    dimensions that differ between runs."""
    a = runs[0]
    if isinstance(a, torch.Tensor):
        if not exact:
            return Meta([-1] * a.dim(), a.dtype)
        shape = [dims[0] if len(set(dims)) == 1 else -1 for dims in zip(*(r.shape for r in runs))]
        strides = a.stride() if all(r.stride() == a.stride() for r in runs) else None
        return Meta(shape, a.dtype, strides)
    if isinstance(a, (list, tuple)):
        if any(len(r) != len(a) for r in runs[1:]):
            return Dynamic(a)  # e.g. the pieces of `split` along a run-time dim
        items = [_merge(list(parts), exact) for parts in zip(*runs)]
        if hasattr(a, "_fields") or type(a).__module__ == "torch.return_types":
            return type(a)(items)
        return type(a)(items) if isinstance(a, tuple) else items
    if any(r != a and r is not a for r in runs[1:]):
        return Dynamic(a)
    return a


class Dynamic:
    """A non-tensor result that differs between stand-in sizes, i.e. depends
    on a run-time dimension."""

    def __init__(self, example):
        self.example = example


def infer(fn, args, kwargs, inputs, factory=False):
    """The result structure of `fn(*args, **kwargs)` with tensors replaced by
    `Meta`. `args`/`kwargs` hold InputRef(i) for `inputs[i]`."""
    # The stand-in runs are real torch calls: keep capture modes out of them.
    with torch._C.DisableTorchFunction():
        return _infer(fn, args, kwargs, inputs, factory)


def _infer(fn, args, kwargs, inputs, factory):
    first, exact, as_int = _run_some_way(fn, args, kwargs, inputs, STAND_INS[0], factory)
    if not _has_unknown(inputs) and exact and not as_int:
        return _merge([first], True)
    second, exact2, as_int2 = _run_some_way(fn, args, kwargs, inputs, STAND_INS[1], factory)
    runs = [first, second]
    if (as_int or as_int2) and exact and exact2:
        # A run-time integer stood in as a size; it may instead be an index
        # or a slice bound (`x[k:]` clamps an out-of-range stand-in to an
        # empty slice), so small values must agree too.
        for size in STAND_INS:
            try:
                runs.append(_run(fn, args, kwargs, inputs, size, "meta", True, factory, SMALL_INTS[size]))
            except Exception:  # noqa: BLE001 - the value is not valid as an index here
                pass
    return _merge(runs, exact and exact2)
