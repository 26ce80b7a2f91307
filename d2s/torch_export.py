"""`d2s.export`: a d2s program as a `torch.export.ExportedProgram`, its
data-dependent control flow as `torch.cond` / `while_loop`, so that what
consumes exported programs (AOTInductor packaging, `torch.onnx.export`,
ExecuTorch) takes d2s programs.

    exported = d2s.export(model, input_spec=[d2s.InputSpec([None, 8])])
    exported.module()(x)                              # == model(x)
    torch.onnx.export(exported, dynamo=True)          # ONNX with If / Loop

Programs whose loop state changes shape (growing tensors) or that hold
tensor arrays (lists appended in a loop) are refused with the reason
(`d2s.ExportError`): torch's control-flow operators cannot hold them;
`d2s.onnx.export` can. See docs/deployment.md.
"""

import torch

from runtime.torch_export import ProgramModule, TorchExportError, export_program

from .onnx import _resolve

ExportError = TorchExportError


def export(obj, input_spec=None):
    """The `torch.export.ExportedProgram` of `obj`: a declarative function or
    module (its program for `input_spec`, or of its latest call), a
    `TranslatedLayer`, or a saved model directory. Dimensions of -1
    (InputSpec `None`) are dynamic; parameters are buffers."""
    with torch.no_grad():
        program, feeds, fetches, params, sizes = _resolve(obj, input_spec)
        module = ProgramModule(program, feeds, fetches, params)
    return export_program(module, sizes)
