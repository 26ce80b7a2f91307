"""What branches and loops carry: the named variables of the generated branch
and loop functions, read and written through their closure cells.

The transformers turn a branch or loop body into a function that declares
the names it carries ``nonlocal``; ``State`` reads and writes those names
through the function's closure cells, so a name that has no value yet reads
as ``Undefined(name)`` instead of failing. ``convert_load`` turns such a
value back into Python's own ``UnboundLocalError`` where the code reads it.
"""

import torch

from ops import control_flow as cf
from ops import framework as fw
from ops.capture import is_symbolic_value
from runtime.ir import Variable

Undefined = cf.Undefined


def is_var(value):
    # A SymInt/SymBool is a size (or a comparison of sizes) known only at run time.
    return isinstance(value, Variable) or is_symbolic_value(value)


class State:
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


def convert_load(value):
    """A read of a variable that may be unbound. Equivalent Python: ``return
    value`` (Python itself raises for a truly unbound name); a value the
    helpers left ``Undefined`` raises the same ``UnboundLocalError``."""
    if isinstance(value, Undefined):
        value.unbound()
    return value


def constant(value):
    """A 0-d graph tensor for a Python number, with the dtype ``torch.tensor``
    gives it (floats: the default dtype)."""
    dtype = torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else None
    return fw.fill_constant(value, dtype or torch.get_default_dtype())


def as_bool_var(value):
    return value if is_var(value) or isinstance(value, torch.Tensor) else constant(bool(value))


def loop_init(value):
    """A graph loop's initial value: Python numbers become 0-d tensors of the
    dtype ``torch.tensor`` would give them, Python lists become tensor arrays."""
    if isinstance(value, (bool, int, float)):
        var = constant(value)
        var.python_literal = True  # its dtype is weak, as the number's (ops/control_flow.py _Spec)
        return var
    if type(value) is list:
        return fw.array_from_list(value) if value else fw.array_create()
    return value
