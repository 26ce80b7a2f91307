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


def _register(kind, module):
    """A hook of `kind` registered after the program was built; its handle."""
    if kind == "pre":
        return module.inner.register_forward_pre_hook(pre_hook)
    if kind == "pre_kwargs":
        return module.inner.register_forward_pre_hook(kwargs_pre_hook, with_kwargs=True)
    if kind == "post":
        return module.inner.register_forward_hook(post_hook)
    return torch.nn.modules.module.register_module_forward_hook(post_hook)  # "global": every module's


class Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("kind", ["pre", "pre_kwargs", "post", "global"])
@pytest.mark.parametrize("x", [torch.ones(3), -torch.full((3,), 4.0)], ids=["true-side", "false-side"])
def test_a_hook_registered_or_removed_between_calls_is_run_like_eager(kind, x):
    eager, static = Plain(), d2s.declarative(Plain())
    assert torch.equal(static(x), eager(x))
    handles = [_register(kind, eager)] + ([_register(kind, static)] if kind != "global" else [])
    try:
        assert torch.equal(static(x), eager(x))  # eager runs the new hook; so must the program
        assert torch.equal(static(x), eager(x))
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(static(x), eager(x))  # and no longer once it is removed
    assert len(static.forward.program_cache) == 2
    program = static.forward.concrete_program.main_program
    assert "cond" in {op.type for block in program.blocks for op in block.ops}


@pytest.mark.parametrize("x", [torch.ones(3), -torch.full((3,), 4.0)], ids=["true-side", "false-side"])
def test_a_hook_of_all_modules_runs_converted_inside_the_program(x):
    handle = torch.nn.modules.module.register_module_forward_hook(post_hook)
    try:
        eager, static = Plain(), d2s.declarative(Plain())
        assert torch.equal(static(x), eager(x))  # Inner's output gets +10 inside the program, Plain's outside
        program = static.forward.concrete_program.main_program
        assert "cond" in {op.type for block in program.blocks for op in block.ops}
    finally:
        handle.remove()
