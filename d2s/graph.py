"""`d2s.Graph`: a whole training (or inference) step as one static program,
in the model of OneFlow's `nn.Graph`, with data-dependent control flow allowed.

    class TrainGraph(d2s.Graph):
        def __init__(self, model, opt):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)                  # torch.optim.*; lr_scheduler= optional
        def build(self, x, y):
            loss = F.cross_entropy(self.model(x), y)  # the model may have tensor if/while
            loss.backward()
            return loss

    g = TrainGraph(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loss = g(x, y)   # one program: zero_grad, forward, backward, optimizer step

`build` is converted and traced like a declarative method (one program per
input signature and per train/eval state of the graph's modules). Inside it
`loss.backward()` appends, for every registered optimizer, `zero_grad`, the
backward ops and the optimizer's own `step` to the program (see
ops/optimizer_ops.py); the optimizer keeps its state, so `torch.optim` state
dicts and lr schedulers work as in eager code. A Graph is an `nn.Module`
holding the modules assigned to it: `train()`/`eval()`, `parameters()` and
`.to()` act on them.
"""

import contextlib
import sys
import time

import torch

from ops.optimizer_ops import backward_steps, optimizer_params
from runtime import _debug
from runtime.errors import ConversionError
from runtime.passes import check_level

from .static_function import StaticFunction
from .translator_state import STATE


class Graph(torch.nn.Module):
    """Subclass it, assign modules in `__init__`, describe one step in `build`."""

    def __init__(self, optimize=None):
        """`optimize`: the level of passes and native code the step runs
        ("default" or "fast", as for `declarative`; None: the translator's,
        `ProgramTranslator().optimize`)."""
        super().__init__()
        self._optimize = None if optimize is None else check_level(optimize)
        self._optimizers = []      # (optimizer, lr_scheduler or None)
        # (optimizer, None or (max_norm, norm_type) of clip_grad_norm_) for each: what
        # `loss.backward()` in build also does, made once for every call (backward_steps).
        self._steps = ()
        self._schedulers = ()  # the lr schedulers of _optimizers, stepped after every call
        self._debug_level = None
        self._build_fn = None

    # -- configuration --------------------------------------------------------------
    def add_optimizer(self, optimizer, lr_scheduler=None, *, clip_grad_max_norm=None, clip_grad_norm_type=2.0):
        """Step `optimizer` (a `torch.optim.Optimizer`) where `build` calls
        `loss.backward()`; step `lr_scheduler` after every call, as an eager
        loop does after `optimizer.step()`. With `clip_grad_max_norm`, the
        gradients of the optimizer's parameters are clipped between backward
        and step, as `torch.nn.utils.clip_grad_norm_(params,
        clip_grad_max_norm, clip_grad_norm_type)` there does."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"add_optimizer expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
        clip = None
        if clip_grad_max_norm is not None:
            if isinstance(clip_grad_max_norm, bool) or not isinstance(clip_grad_max_norm, (int, float)) or \
                    isinstance(clip_grad_norm_type, bool) or not isinstance(clip_grad_norm_type, (int, float)):
                raise TypeError("clip_grad_max_norm and clip_grad_norm_type must be numbers")
            clip = (float(clip_grad_max_norm), float(clip_grad_norm_type))
        if lr_scheduler is not None:
            if not isinstance(lr_scheduler, torch.optim.lr_scheduler.LRScheduler):
                raise TypeError(f"lr_scheduler must be a torch.optim.lr_scheduler.LRScheduler, "
                                f"got {type(lr_scheduler).__name__}")
            if lr_scheduler.optimizer is not optimizer:
                raise ValueError("lr_scheduler was made for another optimizer")
        if self._build_fn is not None and len(self._build_fn.program_cache):
            raise RuntimeError("add_optimizer() after the graph's first call: add optimizers in __init__")
        self._optimizers.append((optimizer, lr_scheduler))
        self._steps += ((optimizer, clip),)
        if lr_scheduler is not None:
            self._schedulers += (lr_scheduler,)

    def build(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define build(self, ...)")

    def forward(self, *args, **kwargs):
        raise TypeError("call the graph itself, g(*args), which runs the program that build() describes")

    def debug(self, v_level=1):
        """The debug ladder for this graph only (0 quiet ... 3 every op as it
        runs; see d2s.set_verbosity): applied while it builds and runs."""
        self._debug_level = int(v_level)
        return self

    @property
    def training_step(self):
        """True when this graph updates parameters (it has an optimizer)."""
        return bool(self._optimizers)

    # -- running --------------------------------------------------------------------------
    def _static(self):
        if self._build_fn is None:
            build = type(self).build
            if build is Graph.build:
                raise NotImplementedError(f"{type(self).__name__} must define build(self, ...)")
            if isinstance(build, StaticFunction):
                build = build._function
            self._build_fn = StaticFunction(build, instance=self, optimize=self._optimize)
        return self._build_fn

    def __d2s_trace_context__(self):
        """What every trace of `build` runs in (StaticFunction._build): its
        `loss.backward()` also zeroes, clips and steps this graph's
        optimizers. Only traces need it, so a call that finds its program
        enters nothing."""
        return backward_steps(self._steps)

    def __call__(self, *args, **kwargs):
        static = self._build_fn
        if static is None:
            static = self._static()
        if not STATE.enable_to_static:  # the same step in plain PyTorch
            return self._eager_step(static.dygraph_function, args, kwargs)
        cache = static.program_cache
        puts = cache.puts
        level = self._debug_level
        start = time.perf_counter()
        if level is None:
            out = static(*args, **kwargs)
        else:
            with _debug.verbosity(level):
                out = static(*args, **kwargs)
        if cache.puts != puts:  # this call built a program
            self._check_built(static.concrete_program, time.perf_counter() - start)
        for scheduler in self._schedulers:
            scheduler.step()
        return out

    def _eager_step(self, build, args, kwargs):
        for optimizer, _ in self._optimizers:
            optimizer.zero_grad()
        out = build(*args, **kwargs)
        for optimizer, clip in self._steps:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(optimizer_params(optimizer), *clip)
        for optimizer, scheduler in self._optimizers:
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
        return out

    def _check_built(self, concrete, seconds):
        steps = [op for op in concrete.main_program.global_block().ops if op.type == "optimizer_step"]
        if self._optimizers and not steps:
            static = self._build_fn
            static.program_cache.clear()
            raise ConversionError(f"{type(self).__name__}.build() never calls loss.backward(), so its "
                                  "optimizers would never step; call loss.backward() in build(), or drop "
                                  "add_optimizer for an inference graph")
        if (self._debug_level or 0) >= 1:
            program = concrete.main_program
            n_ops = sum(len(b.ops) for b in program.blocks)
            print(f"[d2s] graph {type(self).__name__}: built a program of {n_ops} ops in "
                  f"{len(program.blocks)} blocks ({seconds:.2f} s, includes its first run)", file=sys.stderr)

    @property
    def program(self):
        """The program of the latest call (None before the first call)."""
        concrete = self._build_fn.concrete_program if self._build_fn is not None else None
        return None if concrete is None else concrete.main_program

    # -- state ---------------------------------------------------------------------------
    def state_dict(self, *args, **kwargs):
        """Module state plus optimizer and lr scheduler state, to resume training."""
        return {
            "modules": super().state_dict(*args, **kwargs),
            "optimizers": [opt.state_dict() for opt, _ in self._optimizers],
            "lr_schedulers": [s.state_dict() if s is not None else None for _, s in self._optimizers],
        }

    def load_state_dict(self, state_dict, strict=True, assign=False):
        if set(state_dict) != {"modules", "optimizers", "lr_schedulers"}:
            raise ValueError("not a d2s.Graph state dict (expected keys modules, optimizers, lr_schedulers)")
        if len(state_dict["optimizers"]) != len(self._optimizers):
            raise ValueError(f"the state dict holds {len(state_dict['optimizers'])} optimizers, this graph has "
                             f"{len(self._optimizers)}")
        result = super().load_state_dict(state_dict["modules"], strict=strict, assign=assign)
        for (opt, scheduler), opt_state, sched_state in zip(self._optimizers, state_dict["optimizers"],
                                                            state_dict["lr_schedulers"]):
            opt.load_state_dict(opt_state)
            if scheduler is not None and sched_state is not None:
                scheduler.load_state_dict(sched_state)
        return result

    # -- serving ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def serving(self):
        """What `d2s.jit.save(graph, ...)` saves, in eval mode while it does:
        `build` for an inference graph, the model (the one module with
        trainable parameters) for a training graph."""
        if not self._optimizers:
            target = self._static()
        else:
            owners = [(name, m) for name, m in self.named_children()
                      if any(p.requires_grad for p in m.parameters())]
            if len(owners) != 1:
                names = ", ".join(name for name, _ in owners) or "none"
                raise ValueError(f"{type(self).__name__} is a training graph; its inference part is the one module "
                                 f"with trainable parameters, but it has {len(owners)} ({names}): save one with "
                                 "d2s.jit.save(graph.<name>, path, input_spec=...)")
            target = owners[0][1]
        modes = [(m, m.training) for m in self.modules()]
        self.eval()
        try:
            yield target
        finally:
            for m, mode in modes:
                m.training = mode

    # -- printing ------------------------------------------------------------------------------
    def __repr__(self):
        name = type(self).__name__
        concrete = self._build_fn.concrete_program if self._build_fn is not None else None
        lines = [f"{name} (d2s.Graph, {'training' if self.training else 'eval'}, "
                 f"{'built' if concrete is not None else 'not built yet'})"]
        for i, ((opt, scheduler), (_, clip)) in enumerate(zip(self._optimizers, self._steps)):
            n = sum(len(g["params"]) for g in opt.param_groups)
            group = opt.param_groups[0]  # current values: an lr scheduler changes them
            hyper = ", ".join(f"{k}={group[k]}" for k in ("lr", "momentum", "betas", "weight_decay") if k in group)
            lines.append(f"  optimizer {i}: {type(opt).__name__}({hyper}) over {n} parameters"
                         + (f", lr_scheduler {type(scheduler).__name__}" if scheduler is not None else "")
                         + (f", gradients clipped to norm {clip[0]:g} (norm type {clip[1]:g})" if clip else ""))
        if concrete is None:
            modules = super().__repr__().splitlines()[1:-1]
            lines += modules or ["  (no modules)"]
            return "\n".join(lines)
        lines += [f"  input {v.to_string()}" for v in concrete.inputs]
        lines += [f"  output {v.to_string()}" for v in concrete.fetch_vars]
        lines.append("  program:")
        lines += ["    " + line for line in concrete.main_program.to_string().splitlines()]
        return "\n".join(lines)
