"""`d2s.onnx.export`: a d2s program as an ONNX model, control flow included
(`cond` -> If, `while` -> Loop, every other op through torch.onnx's own
ATen-to-ONNX library). Needs `onnx` and `onnxscript`
(`pip install "d2s[onnx]"`).

    d2s.onnx.export(model, "model.onnx", input_spec=[d2s.InputSpec([None, 8])])
    d2s.onnx.export(d2s.jit.load("saved"), "model.onnx")
    d2s.onnx.export("saved", "model.onnx")     # a saved model directory

See docs/deployment.md ("ONNX").
"""

import os

import torch

from ops import ambient_modes
from ops.control_flow.checkpoint_op import without_checkpoints
from runtime.executor import resolve_persistables
from runtime.ir import TENSOR
from runtime.io import read_model
from runtime.onnx_common import OnnxExportError
from runtime.onnx_export import program_to_onnx

from . import module_state
from .input_spec import InputSpec
from .jit import TranslatedLayer, concrete_to_save
from .static_function import StaticFunction
from .translator import ProgramTranslator

ExportError = OnnxExportError


def _from_static(static, input_spec):
    # Traced for an exporter (ONNX, torch.export): torch modules' fused
    # inference kernels have no ONNX translation, and torch.export's own
    # tracing takes their other path: so does this one (ops/ambient_modes.py).
    with ambient_modes.without_fast_paths():
        _, examples, concrete = concrete_to_save(static, input_spec, "d2s.onnx.export")
        if _fused_ops(concrete.main_program):  # the latest call's program, made without gradients
            _, examples, concrete = concrete_to_save(static, _specs_of_latest(static, concrete), "d2s.onnx.export")
    _refuse_carried_state(module_state.carried_attributes(concrete))
    program = concrete.main_program
    feeds = [v.name for v in concrete.inputs]
    fetches = [v.name for v in concrete.fetch_vars]
    names = [v.name for v in program.persistable_vars()]
    tensors = [e for e in examples or () if isinstance(e, torch.Tensor)]
    sizes = {n: tuple(t.shape) for n, t in zip(feeds, tensors)} if len(tensors) == len(feeds) else {}
    return program, feeds, fetches, dict(zip(names, resolve_persistables(program, names))), sizes


def _refuse_carried_state(names):
    module_state.refuse_carried(names, "an exported model", OnnxExportError)


def _specs_of_latest(static, concrete):
    """InputSpecs of the latest call's feeds, to trace it again: only where
    they are the function's leading parameters, in order."""
    names = [v.name for v in concrete.inputs]
    if names != static._feed_names()[:len(names)] or any(v.kind != TENSOR for v in concrete.inputs):
        raise OnnxExportError(
            "the latest call ran without gradients, so its program calls torch's fused inference kernels "
            f"({', '.join(sorted(_fused_ops(concrete.main_program)))}), which exporters do not translate; "
            "pass input_spec to the export so that it traces the unfused path")
    return [InputSpec([None if isinstance(d, str) or d == -1 else d for d in v.dims], v.dtype, v.name)
            for v in concrete.inputs]


def _fused_ops(program):
    return {op.type for block in program.blocks for op in block.ops if op.type in ambient_modes.FAST_KERNELS}


def _unfused(program, feeds, fetches, paths):
    """A saved model's program, or where it calls torch's fused inference
    kernels (saved from a call without gradients) the path saved for the
    other grad mode (d2s/save_paths.py), which takes the general path."""
    if not _fused_ops(program):
        return program, feeds, fetches
    return next(((p, list(f), list(o)) for p, f, o in paths if not _fused_ops(p) and list(f) == list(feeds)),
                (program, feeds, fetches))


def _resolve(obj, input_spec):
    """(program, feed names, fetch names, {parameter name: tensor}, {feed
    name: the shape it was converted at, where known}) of `obj`, each
    checkpointed block run inline (an exported graph has no backward pass
    to compute it again for)."""
    program, feeds, fetches, params, sizes = _resolve_any(obj, input_spec)
    program, fetches = without_checkpoints(program, fetches)
    return program, feeds, fetches, params, sizes


def _resolve_any(obj, input_spec):
    if isinstance(obj, (str, os.PathLike)):
        model = read_model(obj)
        _refuse_carried_state([name for name, _ in model.state_updates])
        program, feeds, fetches = _unfused(model.program, model.feed_names, model.fetch_names,
                                           [(p.program, p.feed_names, p.fetch_names) for p in model.paths])
        return program, feeds, fetches, model.params, {}
    if isinstance(obj, TranslatedLayer):
        _refuse_carried_state([name for name, _ in obj._updates])
        values = {name: obj._lookup(name) for name in obj._slots}
        program, feeds, fetches = _unfused(obj.program, obj.feed_names, [v.name for v in obj.fetch_vars],
                                           [(p, f, [v.name for v in vs]) for p, f, vs, *_ in obj._paths])
        return program, feeds, fetches, values, {}
    if isinstance(obj, (StaticFunction, torch.nn.Module)):
        return _from_static(ProgramTranslator._static(obj), input_spec)
    if callable(obj):
        raise TypeError("d2s.onnx.export takes a declarative function or module, a TranslatedLayer or a "
                        f"saved model directory; decorate {getattr(obj, '__name__', obj)!r} with @d2s.declarative")
    raise TypeError(f"d2s.onnx.export cannot export a {type(obj).__name__}")


def export(obj, f, input_spec=None, opset_version=None, progress=None):
    """Write `obj` as an ONNX model to `f` (a path or a binary file object)
    and return the `onnx.ModelProto`.

    `obj` is a declarative function or module (its program for `input_spec`,
    or of its latest call), a `TranslatedLayer`, or a saved model directory.
    Dimensions of -1 (InputSpec `None`) become symbolic; parameters become
    initializers. The model passes `onnx.checker.check_model(full_check=True)`
    before it is written. An op without an ONNX lowering raises
    `d2s.onnx.ExportError` naming the op and the line that created it.
    `progress(message)`, if given, hears of each stage (the command line
    prints them: large models take a while).
    """
    try:
        import onnx
    except ImportError:
        raise ImportError('d2s.onnx.export needs the onnx package: pip install "d2s[onnx]"') from None
    say = progress or (lambda message: None)
    with torch.no_grad():
        program, feeds, fetches, params, _ = _resolve(obj, input_spec)
        say(f"program: {sum(len(b.ops) for b in program.blocks)} ops in {len(program.blocks)} blocks, "
            f"{len(params)} parameters")
        model = program_to_onnx(program, feeds, fetches, params, opset_version, progress=progress)
    say(f"checking the ONNX model ({len(model.graph.node)} nodes in the main graph)")
    onnx.checker.check_model(model, full_check=True)
    if isinstance(f, (str, os.PathLike)):
        onnx.save(model, os.fspath(f))
    else:
        f.write(model.SerializeToString())
    return model
