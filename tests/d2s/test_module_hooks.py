"""A submodule with forward hooks: torch's hook machinery runs around its
converted forward, and the hooks are converted too (d2s/operators/calls.py).
Run as they were, both saw graph tensors in unconverted code, where
`isinstance(x, torch.Tensor)` is False: a silently different path."""

import pytest
import torch

import d2s


def as_tensor(value):
    return value if isinstance(value, torch.Tensor) else torch.stack(list(value))


class Inner(torch.nn.Module):
    def forward(self, x):
        if not isinstance(x, torch.Tensor):
            return x * 3
        if x.sum() > 0:
            return x * 2
        return x - 1


def pre_hook(module, args):
    return (as_tensor(args[0]) + 1,)


def kwargs_pre_hook(module, args, kwargs):
    return (as_tensor(args[0]) * 5,), kwargs


def post_hook(module, args, out):
    return out + 10 if isinstance(out, torch.Tensor) else out


class Outer(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.inner = Inner()
        if kind == "pre":
            self.inner.register_forward_pre_hook(pre_hook)
        elif kind == "pre_kwargs":
            self.inner.register_forward_pre_hook(kwargs_pre_hook, with_kwargs=True)
        else:
            self.inner.register_forward_hook(post_hook)

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("kind", ["pre", "pre_kwargs", "post"])
def test_hooked_submodule_runs_converted(kind):
    eager, static = Outer(kind), d2s.declarative(Outer(kind))
    for x in (torch.ones(3), -torch.full((3,), 4.0)):  # both branches of Inner's tensor `if`
        assert torch.equal(static(x), eager(x))
    program = static.forward.concrete_program.main_program
    assert len(static.forward.program_cache) == 1
    assert "cond" in {op.type for block in program.blocks for op in block.ops}
    # The module is left as it was: its own forward, its hooks.
    inner = static.inner
    assert "forward" not in vars(inner)
    hooks = list(inner._forward_pre_hooks.values()) + list(inner._forward_hooks.values())
    assert hooks == [{"pre": pre_hook, "pre_kwargs": kwargs_pre_hook, "post": post_hook}[kind]]
