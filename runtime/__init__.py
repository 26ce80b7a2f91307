"""The IR (Program, Block, Operator, Variable), Scope, Executor, verification
and serialisation. Imports nothing from `d2s`."""

from .errors import ConversionError, ModelFormatError, OpRuntimeError, ProgramError
from .ir import (Block, Operator, Program, Variable, data, default_main_program,
                 default_startup_program, program_guard)
from .executor import CPUPlace, CUDAPlace, Executor, Scope, global_scope
from .io import load_inference_model, save_inference_model

__all__ = [
    "Block", "CPUPlace", "CUDAPlace", "ConversionError", "Executor", "ModelFormatError",
    "OpRuntimeError", "Operator", "Program", "ProgramError", "Scope", "Variable", "data",
    "default_main_program", "default_startup_program", "global_scope", "load_inference_model",
    "program_guard", "save_inference_model",
]
