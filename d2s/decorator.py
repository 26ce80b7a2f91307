"""`declarative` (alias `to_static`): make a function, a method or a
module's `forward` a StaticFunction."""

import inspect

import torch

from runtime.errors import ConversionError
from runtime.passes import check_level

from .module_call import DATA_PARALLEL, call_forward_directly, calling_forward, data_parallel_message
from .operators.calls import module_call_entry, scripted_source
from .static_function import StaticFunction


def declarative(function=None, input_spec=None, optimize=None):
    """Run `function` as a static program (a decorator; also takes a method,
    or an `nn.Module` instance whose `forward` it converts in place).

    `optimize`: "default" (results bit-identical to eager on CPU) or "fast"
    (fused RNN loops and other rewrites exact up to floating-point rounding;
    see docs/performance.md); None follows `ProgramTranslator().optimize`."""
    if optimize is not None:
        check_level(optimize)
    if function is None:
        return lambda f: declarative(f, input_spec=input_spec, optimize=optimize)
    if isinstance(function, StaticFunction):
        return function
    if isinstance(function, DATA_PARALLEL):
        raise ConversionError(f"d2s.declarative({type(function).__name__}(model)): "
                              + data_parallel_message(function))
    if isinstance(function, (torch.jit.ScriptModule, torch.jit.ScriptFunction)):
        # Compiled code, run on real tensors; a scripted module keeps no
        # Python source to convert (a scripted function is converted from its own).
        if scripted_source(function) is not None:
            return declarative(scripted_source(function), input_spec=input_spec, optimize=optimize)
        raise ConversionError(f"d2s.declarative of a TorchScript {type(function).__name__}: TorchScript "
                              "(torch.jit.script, torch.jit.trace) keeps compiled code, not the Python d2s "
                              "converts; give d2s.declarative the Python module or function itself")
    if isinstance(function, torch.nn.Module):
        module = function
        forward = type(module).forward
        if isinstance(forward, StaticFunction):
            return module
        raw = inspect.getattr_static(type(module), "forward", None)
        entry = module_call_entry(type(module))
        if entry is not None:
            # No forward, its own __call__: that is what `module(x)` runs, so
            # it becomes the converted forward, and the module's class one
            # whose __call__ is nn.Module's again (which calls forward).
            object.__setattr__(module, "forward", StaticFunction(entry, input_spec, instance=module,
                                                                 optimize=optimize))
            module.__class__ = calling_forward(type(module))
            return module
        own = module.__dict__.get("forward")  # `self.forward = self._forward` in __init__
        if isinstance(own, StaticFunction):
            return module
        if own is not None:
            if inspect.ismethod(own):
                static = StaticFunction(own.__func__, input_spec, instance=own.__self__, optimize=optimize)
            else:
                static = StaticFunction(own, input_spec, optimize=optimize)
        elif isinstance(raw, staticmethod):
            static = StaticFunction(raw.__func__, input_spec, optimize=optimize)
        elif isinstance(raw, classmethod):
            static = StaticFunction(raw.__func__, input_spec, instance=type(module), optimize=optimize)
        else:
            static = StaticFunction(forward, input_spec, instance=module, optimize=optimize)
        object.__setattr__(module, "forward", static)
        call_forward_directly(module)
        return module
    if inspect.ismethod(function):
        return StaticFunction(function.__func__, input_spec, instance=function.__self__, optimize=optimize)
    if not callable(function):
        raise TypeError(f"declarative expects a function, a method or an nn.Module, got {type(function).__name__}")
    return StaticFunction(function, input_spec, optimize=optimize)


to_static = declarative
