"""Training ops: backward and optimizer updates as program ops.

Two families share the `backward` op (gradients of a loss with respect to
the parameters, by `torch.autograd.grad`; the forward ops ran under autograd
in the same program run):

  - the static API, `d2s.optimizer.*.minimize(loss)`: `backward` then one
    update op per parameter (`sgd`, `momentum`, `adam`), which apply exactly
    the arithmetic of the single-tensor paths of `torch.optim.SGD`,
    `SGD(momentum=...)` and `Adam`, in place on the bound parameter and on
    state tensors made by the startup program;
  - `loss.backward()` inside a declarative function or `d2s.Graph.build`
    (`record_backward`): `backward` then `accumulate_grad`, which adds the
    gradients into the leaves' `.grad` as eager `loss.backward()` does, and
    `opt.step()` / `opt.zero_grad()` of a `torch.optim` optimizer
    (`record_optimizer_call`): `optimizer_step` / `optimizer_zero_grad`, which
    run that optimizer's own update when the program runs, so its state stays
    in the optimizer (`opt.state_dict()` works) and an lr scheduler's changes
    apply. Before/after, in a declarative function:

        loss = F.mse_loss(model(x), y)        tmp_3 = mse_loss(...)
        opt.zero_grad()                       optimizer_zero_grad(<SGD#0>, w, b)
        loss.backward()                       w@GRAD_0, b@GRAD_0 = backward(tmp_3, w, b)
                                              accumulate_grad(w, b, w@GRAD_0, b@GRAD_0)
        opt.step()                            optimizer_step(<SGD#0>, w, b)

Ops holding a live optimizer cannot be saved; they are training-only, so
inference programs never contain them.
"""

import contextvars
import inspect
import itertools
import weakref

import torch
from torch.optim import optimizer as optim_base

from runtime import native
from runtime.attrs import InputRef, OutputRef

from . import tracer
from .recording import lift
from .user_frames import error_at_user_line, user_name, user_origin
from .registry import OpDef, register


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _backward_kernel(loss, *params, grad_output=None, retain_graph=None):
    # A parameter the loss does not reach on the path taken gets None, as in
    # eager: no `.grad`, and the update ops skip it like torch.optim does.
    engine = native.load()
    if engine is not None and type(loss) in _PLAIN and (grad_output is None or type(grad_output) in _PLAIN) and \
            all(type(p) in _PLAIN for p in params) and not torch._C._is_torch_function_mode_enabled():
        # The same engine call without torch.autograd.grad's Python layers
        # (which only matter for subclasses and function modes, excluded).
        return engine.autograd_grad(loss, params, grad_output, retain_graph)
    return torch.autograd.grad(loss, params, grad_outputs=grad_output, retain_graph=retain_graph,
                               allow_unused=True)


def _accumulate_grad_kernel(*tensors):
    """`leaf.grad` += grad for each (leaf, grad) pair; what eager
    `loss.backward()` leaves in `.grad`. Leaves come first, then grads."""
    half = len(tensors) // 2
    for leaf, grad in zip(tensors[:half], tensors[half:]):
        if grad is None:
            continue
        if leaf.grad is None:
            leaf.grad = grad
        else:
            with torch.no_grad():
                leaf.grad += grad


@torch.no_grad()
def _sgd_kernel(param, grad, lr):
    if grad is None:  # not reached on this run's path: torch.optim skips it
        return param
    param.add_(grad, alpha=-lr)
    return param


@torch.no_grad()
def _momentum_kernel(param, grad, velocity, lr, momentum):
    if grad is None:  # not reached on this run's path: torch.optim skips it
        return param
    velocity.mul_(momentum).add_(grad)
    param.add_(velocity, alpha=-lr)
    return param


@torch.no_grad()
def _adam_kernel(param, grad, moment1, moment2, step, lr, beta1, beta2, epsilon):
    if grad is None:  # not reached on this run's path: torch.optim skips it
        return param
    step.add_(1)
    t = step.item()
    moment1.lerp_(grad, 1 - beta1)
    moment2.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1 ** t)
    denom = (moment2.sqrt() / (1 - beta2 ** t) ** 0.5).add_(epsilon)
    param.addcdiv_(moment1, denom, value=-step_size)
    return param


def _optimizer_step_kernel(optimizer, *params):
    opt = optimizer.optimizer
    groups = _plain_sgd(opt)
    if groups is None:
        opt.step()
        return
    # What `SGD.step()` does in this case, without its Python layers: its
    # single-tensor path's calls for each parameter with a gradient, in the
    # same order, under no_grad (`differentiable=False`), and the momentum
    # buffers into its state afterwards, as `step` puts them there.
    grad_mode = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        for group in groups:
            _sgd_group(opt, group)
    finally:
        torch._C._set_grad_enabled(grad_mode)
    if "step" in vars(opt):  # an lr scheduler's wrapper, which notes the call
        opt._opt_called = True


def _sgd_group(opt, group):
    lr, momentum, dampening, weight_decay = group["lr"], group["momentum"], group["dampening"], group["weight_decay"]
    nesterov, maximize = group["nesterov"], group["maximize"]
    if momentum == 0 and weight_decay == 0 and not maximize:
        for p in group["params"]:
            grad = p.grad
            if grad is not None:
                p.add_(grad, alpha=-lr)
        return
    state = opt.state
    for p in group["params"]:
        grad = p.grad
        if grad is None:
            continue
        if maximize:
            grad = -grad
        if weight_decay != 0:
            grad = grad.add(p, alpha=weight_decay)
        if momentum != 0:
            buf = state[p].get("momentum_buffer")
            if buf is None:
                buf = grad.detach().clone()
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            state[p]["momentum_buffer"] = buf
            grad = grad.add(buf, alpha=momentum) if nesterov else buf
        p.add_(grad, alpha=-lr)


def _optimizer_zero_grad_kernel(optimizer, *params, set_to_none=True):
    opt = optimizer.optimizer
    if set_to_none and type(opt).zero_grad is torch.optim.Optimizer.zero_grad and "zero_grad" not in vars(opt) \
            and hasattr(opt, "_zero_grad_profile_name") and not torch._C._autograd._profiler_enabled():
        # Optimizer.zero_grad(set_to_none=True) without its profiling scope
        # (the class's own, not overridden on the instance or by a subclass).
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad = None
        return
    opt.zero_grad(set_to_none=set_to_none)


_SGD_STEP = inspect.unwrap(torch.optim.SGD.step)
_sgd_steps = {}  # a class's `step` (wrapped once by torch.optim's profiling hook) -> whether it is SGD's own
_NO_HOOKS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")
_NUMBERS = ("lr", "momentum", "dampening", "weight_decay")  # a tensor takes other calls (addcmul_, ...)
_FLAGS = ("nesterov", "maximize")
_NOT_PLAIN = ("differentiable", "foreach", "fused")  # SGD's flags that pick other paths


def _plain_sgd(opt):
    """The param groups when `opt.step()` is exactly SGD's single-tensor
    path (`_sgd_group` makes its calls): a `torch.optim.SGD` (not a
    subclass) without foreach, fused, differentiable or grad scaling, with
    numbers for lr, momentum, dampening and weight decay, its own step (an
    lr scheduler's wrapper aside), no step hooks, and the profiler off (the
    step's `record_function` scope is then unobservable). CPU parameters
    only: elsewhere SGD picks its foreach kernels by default. None otherwise."""
    step = type(opt).step
    own = _sgd_steps.get(step)
    if own is None:
        own = _sgd_steps[step] = inspect.unwrap(step) is _SGD_STEP
    if type(opt) is not torch.optim.SGD or not own or \
            torch._C._autograd._profiler_enabled() or optim_base._global_optimizer_pre_hooks or \
            optim_base._global_optimizer_post_hooks or any(getattr(opt, h, None) for h in _NO_HOOKS) or \
            getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None) is not None:
        return None
    own_step = vars(opt).get("step")
    if own_step is not None and not getattr(own_step, "_wrapped_by_lr_sched", False):
        return None
    for group in opt.param_groups:
        if any(type(group.get(key)) not in (float, int) for key in _NUMBERS) or \
                any(type(group.get(key)) is not bool for key in _FLAGS) or \
                any(group.get(key) for key in _NOT_PLAIN) or not all(p.is_cpu for p in group["params"]):
            return None
    return opt.param_groups


register(OpDef("backward", kernel=_backward_kernel, training_only=True))
# These three act on state outside their inputs (`.grad`, the optimizer's state).
register(OpDef("accumulate_grad", kernel=_accumulate_grad_kernel, mutates=True, training_only=True, side_effect=True))
register(OpDef("sgd", kernel=_sgd_kernel, mutates=True, training_only=True))
register(OpDef("momentum", kernel=_momentum_kernel, mutates=True, training_only=True))
register(OpDef("adam", kernel=_adam_kernel, mutates=True, training_only=True))
register(OpDef("optimizer_step", kernel=_optimizer_step_kernel, mutates=True, training_only=True, side_effect=True))
register(OpDef("optimizer_zero_grad", kernel=_optimizer_zero_grad_kernel, mutates=True, training_only=True,
               side_effect=True))


def append_call(block, op_type, inputs, outputs, extra_args=(), kwargs=None, out=None, leading=()):
    """Append a call-style op `op_type(*leading, *inputs, *extra_args, **kwargs)`."""
    args = tuple(leading) + tuple(InputRef(i) for i in range(len(inputs))) + tuple(extra_args)
    return block.append_op(op_type, inputs={"X": inputs}, outputs={"Out": outputs},
                           attrs={"args": args, "kwargs": dict(kwargs or {}), "out": out},
                           origin=user_origin())


# -- torch.optim optimizers inside programs ---------------------------------------------

_optimizer_ids = itertools.count()


class OptimizerRef:
    """A `torch.optim` optimizer as an op attribute: one short line in the
    program text (`<SGD#0 lr=0.1>`), the optimizer itself for the kernel."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.number = next(_optimizer_ids)

    def __repr__(self):
        lrs = sorted({g.get("lr") for g in self.optimizer.param_groups}, key=str)
        return f"<{type(self.optimizer).__name__}#{self.number} lr={'/'.join(map(str, lrs))}>"


# optimizer -> its OptimizerRef, kept beside the optimizer rather than as an
# attribute on it: tracing must not write into the user's objects (the
# Python-writes check walks a subclass defined in user code).
_refs = weakref.WeakKeyDictionary()


def _optimizer_ref(optimizer):
    ref = _refs.get(optimizer)
    if ref is None:
        ref = _refs[optimizer] = OptimizerRef(optimizer)
    return ref


def _param_vars(optimizer):
    """The Variables of `program` bound to the optimizer's parameters (lifted
    here when the program has not read them yet: the op still touches them)."""
    return [lift(p) for group in optimizer.param_groups for p in group["params"]]


def _append_optimizer_op(op_type, optimizer, kwargs=None):
    tr = tracer.current()
    block = tr.block
    if block.idx != 0:
        raise error_at_user_line(f"`{type(optimizer).__name__}.{op_type.split('_', 1)[1]}()` under a tensor "
                                 "condition or loop cannot become part of a program; call it at the top "
                                 "level of the function")
    params = _param_vars(optimizer)
    if not params:
        raise error_at_user_line(f"the {type(optimizer).__name__} optimizer has no parameters")
    append_call(block, op_type, params, params, kwargs=kwargs, leading=(_optimizer_ref(optimizer),))


def optimizer_step(optimizer):
    """`optimizer.step()` when the program runs."""
    _append_optimizer_op("optimizer_step", optimizer)


def optimizer_zero_grad(optimizer, set_to_none=True):
    """`optimizer.zero_grad()` when the program runs."""
    _append_optimizer_op("optimizer_zero_grad", optimizer, {"set_to_none": bool(set_to_none)})


def record_optimizer_call(method):
    """What a converted function calls in place of `opt.<method>` of a
    `torch.optim` optimizer or lr scheduler: run at build time, `step()`
    would update nothing (there are no gradients yet) and never run again."""
    owner, name = method.__self__, method.__name__
    if isinstance(owner, torch.optim.Optimizer):
        if name == "step":
            return lambda closure=None: _no_closure(closure) or optimizer_step(owner)
        if name == "zero_grad":
            return lambda set_to_none=True: optimizer_zero_grad(owner, set_to_none)
        raise error_at_user_line(f"`{type(owner).__name__}.{name}()` cannot run inside a program; only "
                                 "`step()` and `zero_grad()` of an optimizer can (call it outside)")
    raise error_at_user_line(f"`{type(owner).__name__}.{name}()` (an lr scheduler) cannot run inside a "
                             "program: call it outside the declarative function after each step, or pass the "
                             "scheduler to d2s.Graph.add_optimizer(opt, lr_scheduler=...)")


def _no_closure(closure):
    if closure is not None:
        raise error_at_user_line("optimizer.step(closure) cannot run inside a program: the closure would "
                                 "re-run the model in Python; call step() without a closure")


# -- loss.backward() ------------------------------------------------------------------

# Optimizers that `loss.backward()` also zeroes (before) and steps (after):
# set by d2s.Graph while it traces `build`, whose backward is the whole step.
_STEPPED_BY_BACKWARD = contextvars.ContextVar("d2s_stepped_by_backward", default=())


class backward_steps:
    """`with backward_steps(optimizers):` the `loss.backward()` traced inside
    also zeroes and steps `optimizers` (a class, not a generator: a Graph
    enters it on every call)."""

    __slots__ = ("_optimizers", "_token")

    def __init__(self, optimizers):
        self._optimizers = tuple(optimizers)

    def __enter__(self):
        self._token = _STEPPED_BY_BACKWARD.set(self._optimizers)

    def __exit__(self, *exc):
        _STEPPED_BY_BACKWARD.reset(self._token)


def _leaves(program):
    """The Variables whose tensors eager backward would give a `.grad`:
    trainable persistables (parameters) and data inputs that require grad."""
    leaves = []
    for var in program.global_block().vars.values():
        if var.stop_gradient or not (var.persistable or var.is_data) or not var.dtype.is_floating_point:
            continue
        tensor = program.bound.get(var.name)
        with torch._C.DisableTorchFunction():  # a question about the tensor, not an op
            non_leaf = tensor is not None and not tensor.is_leaf
        if non_leaf:
            raise error_at_user_line(
                f"`loss.backward()` would have to reach through `{var.name}`, a tensor computed outside the "
                "function with autograd history; pass it as an argument or detach it")
        leaves.append(var)
    return leaves


def record_backward(loss, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """`loss.backward()` on a Variable: append `backward` and
    `accumulate_grad` (and, inside a Graph, the optimizers' zero_grad/step)."""
    program = loss.block.program
    block = tracer.current().block
    if block.idx != 0:
        raise error_at_user_line("`loss.backward()` under a tensor condition or loop cannot become part of a "
                                 "program; compute the loss in the branch and call backward() after it")
    if create_graph or inputs is not None:
        raise error_at_user_line("`loss.backward(create_graph=..., inputs=...)` is not supported inside a "
                                 "program; call loss.backward() with the default arguments")
    if not isinstance(retain_graph, (bool, type(None))):
        raise error_at_user_line("`retain_graph` must be a Python bool")
    if loss.stop_gradient:
        raise error_at_user_line(f"`.backward()` of {user_name(loss)}: the loss does not require grad (it depends on no "
                                 "trainable parameter, or was computed under no_grad)")
    if gradient is None and loss.shape != ():
        raise error_at_user_line(f"`.backward()` of {user_name(loss)}: grad can be implicitly created only for a scalar "
                                 f"loss, and this one has shape {list(loss.shape)}; pass gradient=")
    if isinstance(gradient, torch.Tensor):
            gradient = lift(gradient)
    leaves = _leaves(program)
    stepped = _STEPPED_BY_BACKWARD.get()
    for optimizer in stepped:
        optimizer_zero_grad(optimizer)
    grads = [block.create_var(name=program.unique_name(v.name + "@GRAD"), shape=v.shape, dtype=v.dtype,
                              stop_gradient=True) for v in leaves]
    inputs = [loss] + leaves + ([gradient] if gradient is not None else [])
    kwargs = {"retain_graph": retain_graph}
    if gradient is not None:
        kwargs["grad_output"] = InputRef(len(inputs) - 1)
    args = tuple(InputRef(i) for i in range(1 + len(leaves)))
    block.append_op("backward", inputs={"X": inputs}, outputs={"Out": grads},
                    attrs={"args": args, "kwargs": kwargs, "out": tuple(OutputRef(i) for i in range(len(grads)))},
                    origin=user_origin())
    if leaves:
        append_call(block, "accumulate_grad", leaves + grads, leaves)
    for optimizer in stepped:
        optimizer_step(optimizer)
