"""The op library: every op type a program may contain, with its PyTorch
kernel and its shape/dtype inference, plus the explicit control-flow API.

Importing `ops` fills the registry and installs op capture on Variables."""

from . import autograd_function, capture, framework, numpy_ufuncs, optimizer_ops, torch_ops  # noqa: F401 - registration side effects
from . import control_flow  # noqa: F401
from .control_flow import cond, while_loop
from .registry import get_op_def, is_registered, registered_types

__all__ = ["cond", "while_loop", "get_op_def", "is_registered", "registered_types"]
