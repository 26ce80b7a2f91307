"""`d2s.jit.save` / `d2s.jit.load`: a declarative layer or function saved as
plain data (program.json + params.safetensors) and loaded, with no model
source, as a `TranslatedLayer`: an `nn.Module` whose weights are trainable
`nn.Parameter`s.
"""

import re

import torch

from runtime import runner
from runtime.executor import Executor
from runtime.io import load_inference_model, save_inference_model
from runtime.ir import torch_dtype

from .graph import Graph
from .static_function import InputSpec, StaticFunction, declarative


def _example(spec):
    """A zeros tensor matching `spec` (dynamic dimensions get size 2) to trace with."""
    if isinstance(spec, torch.Tensor):
        return spec
    if not isinstance(spec, InputSpec):
        raise TypeError(f"input_spec entries must be d2s.InputSpec or tensors, got {type(spec).__name__}")
    return torch.zeros([2 if d == -1 else d for d in spec.shape], dtype=torch_dtype(spec.dtype))


def _static_of(layer_or_function, input_spec):
    if isinstance(layer_or_function, torch.nn.Module):
        forward = layer_or_function.forward
        if not isinstance(forward, StaticFunction):
            forward = declarative(type(layer_or_function).forward).__get__(layer_or_function)
        return forward
    if isinstance(layer_or_function, StaticFunction):
        return layer_or_function
    return declarative(layer_or_function)


def save(layer_or_function, path, input_spec=None):
    """Save the program of `layer_or_function` for the inputs `input_spec`
    describes (InputSpecs, with None for dynamic dimensions, or example
    tensors). Without `input_spec`, the program of the latest call is saved."""
    if isinstance(layer_or_function, Graph):  # its inference part, traced in eval mode
        with layer_or_function.serving() as part:
            return save(part, path, input_spec)
    if isinstance(layer_or_function, TranslatedLayer):
        # Already a program (e.g. a loaded model after fine-tuning): save it as it is.
        save_inference_model(path, layer_or_function.feed_names, layer_or_function.fetch_vars, Executor(),
                             main_program=layer_or_function.program)
        return
    static = _static_of(layer_or_function, input_spec)
    if input_spec is not None:
        specs = [s if isinstance(s, InputSpec) else InputSpec.from_tensor(s) for s in input_spec]
        spec_static = StaticFunction(static._function, specs, instance=static._instance)
        concrete = spec_static.get_concrete_program(*[_example(s) for s in input_spec])
    else:
        concrete = static.concrete_program
        if concrete is None:
            raise ValueError("jit.save without input_spec needs the function to have run once; "
                             "pass input_spec=[d2s.InputSpec([None, ...], 'float32')]")
    save_inference_model(path, [v.name for v in concrete.inputs], concrete.fetch_vars, Executor(),
                         main_program=concrete.main_program)


class TranslatedLayer(torch.nn.Module):
    """A loaded program as a module: call it with tensors (in the saved feed
    order); its weights are parameters, so it can be fine-tuned."""

    def __init__(self, program, feed_names, fetch_vars):
        super().__init__()
        self.program = program
        self.feed_names = list(feed_names)
        self.fetch_vars = list(fetch_vars)
        self._param_keys = {}
        block = program.global_block()
        for name, tensor in sorted(program.bound.items()):
            var = block.vars[name]
            key = re.sub(r"\W", "_", name)
            while key in self._param_keys.values():
                key += "_"
            self._param_keys[name] = key
            if not var.stop_gradient and tensor.dtype.is_floating_point:
                value = torch.nn.Parameter(tensor.detach().clone(), requires_grad=True)
                self.register_parameter(key, value)
            else:
                value = tensor
                self.register_buffer(key, value)
            program.bind(name, value)
        self._compiled = Executor().compiled(program, self.feed_names, [v.name for v in self.fetch_vars])

    def forward(self, *inputs):
        if len(inputs) != len(self.feed_names):
            raise TypeError(f"this model takes {len(self.feed_names)} inputs ({', '.join(self.feed_names)}), "
                            f"got {len(inputs)}")
        block = self.program.global_block()
        tensors = runner.convert_inputs(inputs, [block.vars[n] for n in self.feed_names], "input")
        # Look the values up through the module so .to(), load_state_dict and
        # fine-tuning act on what the program reads.
        params = [self._value(n) for n in self._compiled.param_names]
        results = runner.run(self._compiled, tensors, params)
        return results[0] if len(results) == 1 else tuple(results)

    def _value(self, name):
        key = self._param_keys[name]
        return self._parameters[key] if key in self._parameters else self._buffers[key]


def load(path):
    """Load a model saved by `jit.save` (or any save_inference_model
    directory) as a TranslatedLayer; validates before anything runs."""
    program, feed_names, fetch_vars = load_inference_model(path, Executor())
    return TranslatedLayer(program, feed_names, fetch_vars)
