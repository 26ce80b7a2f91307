"""d2s: turn PyTorch code with Python control flow into static programs.

    import d2s

    @d2s.declarative
    def f(x):
        if x.sum() > 0:        # becomes a `cond` op
            return x * 2
        return -x

See docs/user_guide.md.
"""

import ops as _ops  # noqa: F401 - fills the op registry and installs capture on Variables
from ops.control_flow import cond, while_loop
from runtime import (CPUPlace, CUDAPlace, ConversionError, Executor, ModelFormatError, Program, Scope,
                     data, default_main_program, default_startup_program, global_scope, program_guard)
from runtime import io as _io
from runtime._debug import set_verbosity

from . import conversion, jit, onnx, optimizer
from .graph import Graph
from .cuda_graphs import cuda_graph
from .decorator import declarative, to_static
from .input_spec import InputSpec
from .static_function import StaticFunction
from .translator import ProgramTranslator
from .torch_export import ExportError, export
from .tracing import TracedLayer

__version__ = "0.1.0"


def save_inference_model(dirname, feeded_var_names, target_vars, executor, main_program=None):
    """Save the part of `main_program` that computes `target_vars` from the
    feeds, with its parameters, as program.json + params.safetensors."""
    return _io.save_inference_model(dirname, feeded_var_names, target_vars, executor, main_program)


def load_inference_model(dirname, executor):
    """-> [program, feed_target_names, fetch_targets]; validates before running anything."""
    return _io.load_inference_model(dirname, executor)


def set_code_level(level=100):
    """Print converted code after the `level`-th transformer of the pipeline."""
    conversion.set_code_level(level)


__all__ = [
    "CPUPlace", "CUDAPlace", "ConversionError", "Executor", "ExportError", "Graph", "InputSpec", "ModelFormatError", "Program",
    "ProgramTranslator", "Scope", "StaticFunction", "TracedLayer", "cond", "cuda_graph", "data", "declarative",
    "default_main_program", "default_startup_program", "export", "global_scope", "load_inference_model",
    "optimizer", "program_guard", "save_inference_model", "set_code_level", "set_verbosity", "to_static",
    "while_loop",
]
