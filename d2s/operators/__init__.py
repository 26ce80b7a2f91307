"""The run-time helpers that converted code calls, one module per job (as
AutoGraph's ``operators/``).

Every helper decides when it is called: with plain Python values it does
exactly what the Python construct it replaces does (only the taken branch
runs, loops over Python sequences unroll, ``and``/``or`` short-circuit); with
graph tensors (``runtime.ir.Variable``) it builds ops through ``ops``. Each
docstring states the semantics as the equivalent Python.

- ``state``        the variables branches and loops carry (closure cells),
                   ``Undefined`` and ``convert_load``
- ``branches``     ``if``/``else`` and ``a if c else b``
- ``while_loops``  ``while``
- ``for_loops``    the ``for`` iteration protocol, graph ``range``/``enumerate``/``zip``
- ``logical``      ``and``/``or``/``not``, chained comparisons, ``is``
- ``raising``      Python errors in a traced tensor branch -> ``raise`` ops; ``try_scope``
- ``py_builtins``  ``len``, ``.shape``, ``int``/``float``/``bool``, ``print``,
                   ``assert``, ``isinstance``, ``.item()``
- ``augassign``    ``x += v``
- ``list_append``  ``x.append(v)``
- ``rng``          the CPU generator's state (``get/set_rng_state``, ``fork_rng``) as ops
- ``subscripts``   ``seq[i]`` of a Python tuple or list by a run-time int
- ``fstrings``     f-strings; text spelled by a run-time int (``self[f"expert_{i}"]``)
- ``effects``      writes to Python objects in tensor branches and loop bodies
- ``calls``        which code gets converted (``convert_call``, ``convert_method``)

Generated code reaches this package through one closure cell and calls the
names below.
"""

from .augassign import convert_augassign
from .branches import convert_ifelse, convert_ifexp
from .calls import convert_call, convert_method
from .fstrings import convert_fstring
from .for_loops import convert_enumerate, convert_for_iter, convert_for_next, convert_for_test, convert_range, convert_zip
from .list_append import convert_list_append
from .logical import (convert_compare_chain, convert_equal, convert_in, convert_is, convert_is_not,
                      convert_logical_and, convert_logical_not, convert_logical_or, convert_not_equal, convert_not_in)
from .raising import try_scope
from .py_builtins import (convert_assert, convert_cast, convert_isinstance, convert_len, convert_print, convert_shape,
                          convert_type)
from .state import Undefined, convert_load
from .subscripts import convert_getitem
from .while_loops import convert_while

__all__ = [
    "Undefined", "convert_assert", "convert_augassign", "convert_call", "convert_cast", "convert_compare_chain",
    "convert_enumerate",
    "convert_for_iter", "convert_for_next", "convert_for_test", "convert_fstring", "convert_getitem",
    "convert_ifelse", "convert_ifexp",
    "convert_equal", "convert_in", "convert_is", "convert_is_not", "convert_isinstance", "convert_len",
    "convert_list_append", "convert_load", "convert_not_equal", "convert_not_in",
    "convert_logical_and", "convert_logical_not", "convert_logical_or", "convert_method", "convert_print",
    "convert_range", "convert_shape", "convert_type", "convert_while", "convert_zip", "try_scope",
]
