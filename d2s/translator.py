"""`ProgramTranslator`: the process-wide switch (`enable`), the default
optimisation level, and the inspection entry points (converted code,
programs, saving the latest call's program)."""

import torch

from runtime.executor import Executor
from runtime.io import save_inference_model
from runtime.passes import check_level

from . import argument_writes, conversion, module_state, python_writes
from .decorator import declarative
from .static_function import StaticFunction
from .translator_state import STATE


class ProgramTranslator:
    """The process-wide switch and inspection entry points."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    @property
    def enable_to_static(self):
        """Whether declarative functions run as programs (see `enable`)."""
        return STATE.enable_to_static

    @enable_to_static.setter
    def enable_to_static(self, value):
        STATE.enable_to_static = value

    @property
    def _last(self):
        return STATE.last

    @_last.setter
    def _last(self, concrete):
        STATE.last = concrete

    def enable(self, enable_to_static=True):
        """False: every declarative function runs eagerly, as plain PyTorch."""
        if not isinstance(enable_to_static, bool):
            raise TypeError("enable() takes a bool")
        self.enable_to_static = enable_to_static

    @property
    def optimize(self):
        """The optimisation level of declarative functions that do not name
        one: "default" or "fast" (settable)."""
        return STATE.optimize

    @optimize.setter
    def optimize(self, level):
        STATE.optimize = check_level(level)

    @staticmethod
    def _static(fn):
        """The StaticFunction of `fn`: itself, the forward of a module (what
        `declarative(module)` returns, or any module: converted without
        changing it), or a new one for a plain function."""
        if isinstance(fn, StaticFunction):
            return fn
        if isinstance(fn, torch.nn.Module):
            forward = fn.forward
            if isinstance(forward, StaticFunction):
                return forward
            return StaticFunction(type(fn).forward, instance=fn)
        return declarative(fn)

    def get_output(self, fn, *args, **kwargs):
        """Run `fn` as a static program (even when translation is disabled)."""
        static = self._static(fn)
        saved, self.enable_to_static = self.enable_to_static, True
        try:
            return static(*args, **kwargs)
        finally:
            self.enable_to_static = saved

    def get_func(self, fn):
        """The converted Python function."""
        static = self._static(fn)
        converted = conversion.convert_function(static._function)
        return converted.__get__(static._instance) if static._instance is not None else converted

    def get_code(self, fn):
        """The converted source code, as a string."""
        return conversion.get_code(self._static(fn)._function)

    def get_program(self, fn, *args, **kwargs):
        """(main_program, startup_program, inputs, outputs) for these arguments."""
        concrete = self._static(fn).get_concrete_program(*args, **kwargs)
        self._last = concrete
        outputs = concrete.outputs
        if any(isinstance(leaf, _SYMBOLIC) for leaf in torch.utils._pytree.tree_leaves(outputs)):
            # A returned size (`y.shape[0]` after a growing loop) is a SymInt
            # while tracing; the program computes it into a fetched variable.
            try:
                outputs = _fetchable(concrete.out_tree, concrete.fetch_vars)
            except _Unknown:
                pass
        return concrete.main_program, concrete.startup_program, concrete.inputs, outputs

    def save_inference_model(self, dirname, feed=None, fetch=None):
        """Save the program of the latest declarative call; `feed`/`fetch`
        select inputs/outputs by index (default: all)."""
        concrete = self._last
        if concrete is None:
            raise ValueError("no declarative function has run yet: call it once before saving")
        argument_writes.refuse_saving(concrete, "save_inference_model")
        python_writes.refuse_saving(concrete.python_writes, "save_inference_model")
        module_state.refuse_carried(module_state.carried_attributes(concrete), "an inference model")
        inputs = select_by_index(concrete.inputs, feed, "feed", "the latest call has {n} input(s)")
        outputs = select_by_index(concrete.fetch_vars, fetch, "fetch", "the latest call has {n} output(s)")
        save_inference_model(dirname, [v.name for v in inputs], outputs, Executor(),
                             main_program=concrete.main_program)


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _fetchable(tree, fetch):
    """The returned structure `tree` (see `_output_tree`) with the fetched
    variables in place; _Unknown for a structure this does not know."""
    tag, body = tree
    if tag in ("fetch", "number"):
        return fetch[body]
    if tag == "const":
        return body
    if tag is dict:
        return {key: _fetchable(value, fetch) for key, value in body.items()}
    if tag in (list, tuple) or isinstance(tag, type) and issubclass(tag, tuple) and hasattr(tag, "_fields"):
        items = [_fetchable(item, fetch) for item in body]
        return tag(*items) if hasattr(tag, "_fields") else tag(items)
    raise _Unknown


class _Unknown(Exception):
    """A returned structure `_fetchable` does not know."""


def select_by_index(items, indices, what, count):
    """`[items[i] for i in indices]` (all of `items` when `indices` is None),
    with an error naming `what` for an index that is not a position."""
    if indices is None:
        return list(items)
    if isinstance(indices, int) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
        raise TypeError(f"{what} must be a list of positions (ints), got {indices!r}")
    for i in indices:
        if not -len(items) <= i < len(items):
            valid = f"0..{len(items) - 1}" if items else "none"
            raise ValueError(f"{what} index {i} is out of range: {count.format(n=len(items))} "
                             f"(valid positions: {valid})")
    return [items[i] for i in indices]
