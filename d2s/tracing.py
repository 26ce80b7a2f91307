"""`TracedLayer`: capture a layer's forward, called on example inputs, into a
program without converting its source.

Tracing records the ops a call runs. Python control flow on tensor values
cannot be recorded this way (it would freeze the branch taken), so it is an
error that points at the line: decorate such a forward with `@declarative`.
"""

import torch

from ops.capture import CaptureMode
from ops.tracer import Tracer
from runtime.errors import ConversionError
from runtime import runner
from runtime.executor import Executor
from runtime.io import save_inference_model
from runtime.ir import Program, program_guard

from . import module_state
from .module_watch import same_plain_value
from .translator import select_by_index
from .translator_state import STATE


class TracedLayer:
    """`optimize`: the level of passes and native code a call runs
    ("default" or "fast", as for `declarative`; None: the translator's,
    `ProgramTranslator().optimize`)."""

    def __init__(self, program, feed_vars, fetch_vars, optimize=None):
        self.program = program
        self.feed_vars = feed_vars
        self.fetch_vars = fetch_vars
        self._run = runner.LeveledProgram(Executor(), program, [v.name for v in feed_vars],
                                          [v.name for v in fetch_vars], optimize or STATE.optimize)
        self._run.entry()  # compiled now, as before: a program that cannot compile fails at trace time

    @staticmethod
    def trace(layer, inputs, optimize=None):
        """Run `layer(*inputs)` eagerly and capture it; returns (outputs, traced)."""
        inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        outputs = layer(*inputs)
        program = Program()
        hints = {id(t): n for n, t in list(layer.named_parameters()) + list(layer.named_buffers())}
        if inputs:
            program.device = inputs[0].device
        if isinstance(layer, torch.nn.Module):
            program.mode = "train" if layer.training else "eval"
        modules = list(layer.modules()) if isinstance(layer, torch.nn.Module) else []
        before = module_state.snapshot(modules)  # as the eager call left them
        with program_guard(program, Program()), Tracer(program, hints), module_state.restored_on_error(before):
            feeds = [program.global_block().create_var(name=f"input_{i}", shape=tuple(t.shape), dtype=t.dtype,
                                                       is_data=True, stop_gradient=True)
                     for i, t in enumerate(inputs)]
            for var, t in zip(feeds, inputs):  # an input on another device than the first has its own
                if t.device != program.device:
                    var.own_device = t.device
            with CaptureMode():
                out = layer(*feeds)
            _refuse_state_writes(layer, before)
        fetch = list(out) if isinstance(out, (list, tuple)) else [out]
        program.verify()
        return outputs, TracedLayer(program, feeds, fetch, optimize)

    def __call__(self, *inputs):
        """Run the program on inputs like the example ones (runtime.runner's
        input policy: same shapes, dtypes cast only when safe)."""
        tensors = self._run.feeds("input").convert(inputs)
        entry = self._run.entry(tensors)
        bound = self.program.bound
        results = self._run.call(entry, tensors, [bound[n] for n in entry.param_names], bound.__getitem__)
        return results[0] if len(results) == 1 else list(results)

    def save_inference_model(self, dirname, feed=None, fetch=None):
        """Save for deployment; `feed`/`fetch` pick inputs/outputs by index."""
        feeds = select_by_index(self.feed_vars, feed, "feed", "the traced layer has {n} input(s)")
        fetches = select_by_index(self.fetch_vars, fetch, "fetch", "the traced layer has {n} output(s)")
        save_inference_model(dirname, [v.name for v in feeds], fetches, Executor(), main_program=self.program)




def _refuse_state_writes(layer, before):
    """ConversionError when the captured call assigned a module attribute
    or buffer (`self.h = h`, `self.calls += 1`), after putting each back as
    the eager call left it (the capture is a second call of the forward):
    the traced layer records ops, and would repeat this call's state on
    every run where eager carries it on (`@declarative` writes it after each
    run)."""
    for module, attrs, buffers in before:
        for now, old in ((vars(module), attrs), (module._buffers, buffers)):
            changed = [k for k in list(now) + [k for k in old if k not in now]
                       if now.get(k, _MISSING) is not old.get(k, _MISSING)
                       and not same_plain_value(now.get(k, _MISSING), old.get(k, _MISSING))]
            if changed:
                module_state.restore(before)
                raise ConversionError(
                    f"TracedLayer.trace: the forward assigns `{type(module).__name__}.{changed[0]}`, which a traced "
                    "layer cannot carry from one run to the next (it records the call's ops, and would repeat this "
                    "call's state on every run); decorate the forward with @d2s.declarative, whose programs write "
                    "it after each run")


_MISSING = object()
