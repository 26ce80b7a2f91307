"""Training ops appended by `d2s.optimizer.*.minimize(loss)`.

`backward` computes the gradients of a loss with respect to parameters with
`torch.autograd.grad` (the forward ops ran under autograd in the same
program run); the update ops apply exactly the arithmetic of the
single-tensor paths of `torch.optim.SGD`, `SGD(momentum=...)` and `Adam`, in
place on the bound parameter and state tensors, so a static training loop
matches an eager one step for step.
"""


import torch

from .registry import OpDef, register


def _backward_kernel(loss, *params):
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return tuple(torch.zeros_like(p) if g is None else g for p, g in zip(params, grads))


@torch.no_grad()
def _sgd_kernel(param, grad, lr):
    param.add_(grad, alpha=-lr)
    return param


@torch.no_grad()
def _momentum_kernel(param, grad, velocity, lr, momentum):
    velocity.mul_(momentum).add_(grad)
    param.add_(velocity, alpha=-lr)
    return param


@torch.no_grad()
def _adam_kernel(param, grad, moment1, moment2, step, lr, beta1, beta2, epsilon):
    step.add_(1)
    t = step.item()
    moment1.lerp_(grad, 1 - beta1)
    moment2.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1 ** t)
    denom = (moment2.sqrt() / (1 - beta2 ** t) ** 0.5).add_(epsilon)
    param.addcdiv_(moment1, denom, value=-step_size)
    return param


register(OpDef("backward", kernel=_backward_kernel, training_only=True))
register(OpDef("sgd", kernel=_sgd_kernel, mutates=True, training_only=True))
register(OpDef("momentum", kernel=_momentum_kernel, mutates=True, training_only=True))
register(OpDef("adam", kernel=_adam_kernel, mutates=True, training_only=True))
