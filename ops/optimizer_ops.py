"""Training ops: backward and optimizer updates as program ops.

Two families of ops (the forward ops ran under autograd in the same
program run):

  - the static API, `d2s.optimizer.*.minimize(loss)`: `backward` (the
    gradients of the loss with respect to the parameters, by
    `torch.autograd.grad`, as program values) then one
    update op per parameter (`sgd`, `momentum`, `adam`), which apply exactly
    the arithmetic of the single-tensor paths of `torch.optim.SGD`,
    `SGD(momentum=...)` and `Adam`, in place on the bound parameter and on
    state tensors made by the startup program;
  - `loss.backward()` inside a declarative function or `d2s.Graph.build`
    (`record_backward`): `tensor_backward`, eager's engine backward into the
    leaves' `.grad` (`p.grad` read after it is `tensor_grad`), and
    `opt.step()` / `opt.zero_grad()` of a `torch.optim` optimizer
    (`record_optimizer_call`): `optimizer_step` / `optimizer_zero_grad`, which
    run that optimizer's own update when the program runs, so its state stays
    in the optimizer (`opt.state_dict()` works) and an lr scheduler's changes
    apply. Before/after, in a declarative function:

        loss = F.mse_loss(model(x), y)        tmp_3 = mse_loss(...)
        opt.zero_grad()                       optimizer_zero_grad(<SGD#0>, w, b)
        loss.backward()                       tensor_backward(tmp_3, retain_graph=None)
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
from runtime.ir import Variable

from . import tracer
from .recording import lift
from .user_frames import error_at_user_line, user_name, user_origin
from .registry import OpDef, register


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _backward_kernel(loss, *params, grad_output=None, retain_graph=None):
    # A parameter the loss does not reach on the path taken gets None, as in
    # eager: no `.grad`, and the update ops skip it like torch.optim does.
    engine = native.loaded()
    if engine is not None and type(loss) in _PLAIN and (grad_output is None or type(grad_output) in _PLAIN) and \
            all(type(p) in _PLAIN for p in params) and not torch._C._is_torch_function_mode_enabled():
        # The same engine call without torch.autograd.grad's Python layers
        # (which only matter for subclasses and function modes, excluded).
        return engine.autograd_grad(loss, params, grad_output, retain_graph)
    return torch.autograd.grad(loss, params, grad_outputs=grad_output, retain_graph=retain_graph,
                               allow_unused=True)


def _tensor_backward_kernel(loss, gradient=None, retain_graph=None):
    """`loss.backward()`: the engine's backward into the leaves' `.grad`,
    as eager's (its AccumulateGrad nodes, their layout rule and hooks)."""
    engine = native.loaded()
    if engine is not None and gradient is None and type(loss) in _PLAIN and loss.is_floating_point() and \
            not torch._C._is_torch_function_mode_enabled():
        # The engine call torch.autograd.backward ends in, without its Python
        # layers (which only matter for subclasses and function modes, excluded).
        engine.autograd_backward(loss, retain_graph)
        return
    torch.autograd.backward(loss, gradient, retain_graph=retain_graph)


def _tensor_grad_kernel(tensor):
    """`tensor.grad` after the program's `loss.backward()`."""
    grad = tensor.grad
    if grad is None:
        raise RuntimeError("`.grad` is None on this run: the loss did not reach this tensor on the path the run "
                           "took, or its gradient was set to None. The program was converted on a path where it "
                           "was a tensor, and reads it as one; use the tensor on every path, or read `.grad` "
                           "outside the function")
    return grad


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
    if _plain_sgd_optimizer(opt):
        # What `SGD.step()` does here, without its Python layers: its
        # single-tensor path's calls for each parameter with a gradient, in
        # the same order, under no_grad (`differentiable=False`), and the
        # momentum buffers into its state afterwards, as `step` puts them
        # there. The native `sgd_step` tests the groups itself and does
        # nothing when they are not plain (`_plain_sgd_groups`).
        engine = native.loaded()
        done = engine.sgd_step(opt.param_groups, opt.state) if engine is not None else \
            _plain_sgd_groups(opt.param_groups) and _python_sgd(opt)
        if done:
            if "step" in vars(opt):  # an lr scheduler's wrapper, which notes the call
                opt._opt_called = True
            return
    opt.step()


@torch.no_grad()
def _python_sgd(opt):
    """`_single_tensor_sgd`'s calls for each group (segment.cpp's
    `sgd_step` is the same in C++)."""
    state = opt.state
    for group in opt.param_groups:
        lr, momentum, dampening, weight_decay = group["lr"], group["momentum"], group["dampening"], \
            group["weight_decay"]
        nesterov, maximize = group["nesterov"], group["maximize"]
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
    return True


def _optimizer_zero_grad_kernel(optimizer, *params, set_to_none=True):
    opt = optimizer.optimizer
    if set_to_none and type(opt).zero_grad is torch.optim.Optimizer.zero_grad and "zero_grad" not in vars(opt) \
            and hasattr(opt, "_zero_grad_profile_name") and not torch._C._autograd._profiler_enabled() \
            and not torch._C._is_torch_function_mode_enabled():
        # Optimizer.zero_grad(set_to_none=True) without its profiling scope
        # (the class's own, not overridden on the instance or by a subclass;
        # a torch function mode would see the scope's calls): `p.grad = None`
        # for each parameter, in C++ for plain tensors.
        engine = native.loaded()
        if engine is not None and engine.zero_grads(opt.param_groups):
            return
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad = None
        return
    opt.zero_grad(set_to_none=set_to_none)


_SGD_STEP = inspect.unwrap(torch.optim.SGD.step)
_sgd_steps = {}  # a class's `step` (wrapped once by torch.optim's profiling hook) -> whether it is SGD's own
_NO_HOOKS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")
# lr, momentum, dampening and weight_decay must be numbers: a tensor takes
# other calls (addcmul_, ...); nesterov and maximize bools; differentiable,
# foreach and fused (flags that pick other paths) off.
_NUMBER_TYPES = (float, int)


def _plain_sgd_optimizer(opt):
    """Whether `opt` itself allows `step()` to be SGD's single-tensor path
    made directly: a `torch.optim.SGD` (not a subclass) with its own step
    (an lr scheduler's wrapper aside), no grad scaling, no step hooks, and
    the profiler off (the step's `record_function` scope is then
    unobservable). Its groups are `_plain_sgd_groups`' test."""
    step = type(opt).step
    own = _sgd_steps.get(step)
    if own is None:
        own = _sgd_steps[step] = inspect.unwrap(step) is _SGD_STEP
    own_attrs = vars(opt)
    # (Written out rather than with any()/all() over generators: this runs on every step.)
    if type(opt) is not torch.optim.SGD or not own or \
            torch._C._autograd._profiler_enabled() or optim_base._global_optimizer_pre_hooks or \
            optim_base._global_optimizer_post_hooks or own_attrs.get(_NO_HOOKS[0]) or own_attrs.get(_NO_HOOKS[1]) or \
            own_attrs.get("grad_scale") is not None or own_attrs.get("found_inf") is not None:
        return False
    own_step = own_attrs.get("step")
    return own_step is None or getattr(own_step, "_wrapped_by_lr_sched", False)


def _plain_sgd_groups(groups):
    """Whether every group takes SGD's single-tensor path as `_python_sgd`
    makes its calls: numbers for lr, momentum, dampening and weight decay,
    bools for nesterov and maximize, differentiable, foreach and fused off,
    plain CPU tensors for the parameters (elsewhere SGD picks its foreach
    kernels by default; a subclass may override __torch_function__). The
    native `sgd_step` makes the same test (`read_sgd_group`), and also
    takes no momentum buffer of a subclass from the state, which the
    Python calls here reach as eager's do."""
    if torch._C._is_torch_function_mode_enabled() or type(groups) is not list:
        return False
    for group in groups:
        if type(group) is not dict:
            return False
        get = group.get
        if type(get("lr")) not in _NUMBER_TYPES or type(get("momentum")) not in _NUMBER_TYPES or \
                type(get("dampening")) not in _NUMBER_TYPES or type(get("weight_decay")) not in _NUMBER_TYPES or \
                type(get("nesterov")) is not bool or type(get("maximize")) is not bool or \
                get("differentiable") or get("foreach") or get("fused") or type(get("params")) is not list:
            return False
        for p in group["params"]:
            if type(p) not in _PLAIN or not p.is_cpu:
                return False
    return True


def _plain_sgd(opt):
    """Whether `opt.step()` is exactly SGD's single-tensor path made
    directly (`_plain_sgd_optimizer` and `_plain_sgd_groups`)."""
    return _plain_sgd_optimizer(opt) and _plain_sgd_groups(opt.param_groups)


register(OpDef("backward", kernel=_backward_kernel, training_only=True))
# These act on state outside their inputs: `.grad` (written by `loss.backward()`,
# read by `.grad`), the optimizer's state.
register(OpDef("tensor_backward", kernel=_tensor_backward_kernel, training_only=True, side_effect=True))
register(OpDef("tensor_grad", kernel=_tensor_grad_kernel, training_only=True, side_effect=True))
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
    return [lift(p) for p in optimizer_params(optimizer)]


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
    if set_to_none:  # the `.grad` of its parameters is None after it, whatever the backward set
        tracer.current().backward_leaves.difference_update(v.name for v in _param_vars(optimizer))


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

# Optimizers that `loss.backward()` also zeroes (before), clips and steps
# (after): set by d2s.Graph while it traces `build`, whose backward is the
# whole step. Each entry: (optimizer, None or (max_norm, norm_type)).
_STEPPED_BY_BACKWARD = contextvars.ContextVar("d2s_stepped_by_backward", default=())


class backward_steps:
    """`with backward_steps(steps):` the `loss.backward()` traced inside
    also zeroes, clips and steps the optimizers of `steps`, (optimizer,
    clip) pairs (a class, not a generator: a Graph enters it on every call)."""

    __slots__ = ("_steps", "_token")

    def __init__(self, steps):
        self._steps = tuple(steps)

    def __enter__(self):
        self._token = _STEPPED_BY_BACKWARD.set(self._steps)

    def __exit__(self, *exc):
        _STEPPED_BY_BACKWARD.reset(self._token)


def optimizer_params(optimizer):
    """Every parameter of `optimizer`, group by group."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def read_grad(tensor):
    """`t.grad` while tracing, `t` a leaf the program reads (a parameter,
    an input that requires grad): after this program's `loss.backward()`
    reached it, the `tensor_grad` op, which reads `.grad` when the program
    runs (so `clip_grad_norm_` and other in-place edits act on the real
    `.grad`). Before that, `.grad` is state left by code outside the
    program, None or a tensor from an earlier step: refused, since either
    would be frozen. A tensor that does not require grad never gets one
    from backward; its `.grad` is None when it is None now."""
    tr = tracer.current()
    if isinstance(tensor, Variable):
        var, name = tensor, user_name(tensor)
    else:
        with torch._C.DisableTorchFunction():  # questions about the tensor, not ops
            requires_grad, grad = tensor.requires_grad, tensor._grad
        if not requires_grad and grad is None:
            return None
        var = lift(tensor)
        # A module's parameter is named by its path in the module (`fc.weight`).
        name = f"`{var.name}`" if tr.name_hints.get(id(tensor)) == var.name else user_name(tensor)
    if var.name in tr.backward_leaves:
        block = tr.block
        out = block.create_var(name=tr.program.unique_name(var.name + "@GRAD"), shape=var.shape, dtype=var.dtype,
                               stop_gradient=True)
        append_call(block, "tensor_grad", [var], [out], out=OutputRef(0))
        return out
    if tr.backward_stepped:
        raise error_at_user_line(
            f"`.grad` of {name} cannot be read in a d2s.Graph's `build`: its `loss.backward()` also "
            "steps the optimizers, so code after it sees gradients the step has already used; to clip or "
            "scale gradients, write the step as a declarative function (zero_grad, backward, clip, step)")
    raise error_at_user_line(
        f"`.grad` of {name} is read before this program's `loss.backward()` reaches it: it is state "
        "left by code outside the program (None, or a tensor of an earlier step), which would be frozen here; "
        "pass the gradient in as an argument, or call loss.backward() in the function before reading it")


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
    """`loss.backward()` on a Variable: append `tensor_backward` (and, inside
    a Graph, the optimizers' zero_grad before it, their clips and steps after)."""
    program = loss.block.program
    tr = tracer.current()
    block = tr.block
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
    for optimizer, _ in stepped:
        optimizer_zero_grad(optimizer)
    inputs = [loss] + ([gradient] if gradient is not None else [])
    kwargs = {"retain_graph": retain_graph}
    if gradient is not None:
        kwargs["gradient"] = InputRef(1)
    block.append_op("tensor_backward", inputs={"X": inputs}, outputs={"Out": []},
                    attrs={"args": (InputRef(0),), "kwargs": kwargs, "out": None}, origin=user_origin())
    tr.backward_leaves.update(v.name for v in leaves)  # `.grad` of these is the program's from here
    if not stepped:
        return
    for optimizer, clip in stepped:
        if clip is not None:  # the eager loop's clip_grad_norm_(params, max_norm, norm_type), traced
            torch.nn.utils.clip_grad_norm_(optimizer_params(optimizer), *clip)
    # The steps read `.grad` right after the backward: code after it in
    # `build` cannot take part (clip, scale), so there `.grad` stays unread.
    tr.backward_leaves.difference_update(v.name for v in leaves)
    tr.backward_stepped = True
    for optimizer, _ in stepped:
        optimizer_step(optimizer)
