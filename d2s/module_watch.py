"""A process-wide counter that changes whenever any module's `training` flag,
its submodules, parameters or buffers change.

A declarative call keys its program on the `training` flag of every module
involved and on the identity of those modules and of their parameters and
buffers (a program binds the tensors it was traced with: after
`net.fc = nn.Linear(...)` or `net.fc.weight = nn.Parameter(...)` it must not
run again). Walking the module tree on every call costs ~0.7 us per
submodule; instead each StaticFunction caches what it read and re-reads only
when this counter has moved since. It moves on:

  - `module.training = ...` (what `train()` / `eval()` do):
    `nn.Module.__setattr__` is wrapped once, when d2s is imported; the
    wrapper compares the attribute name and nothing else;
  - a submodule, parameter or buffer assigned, registered or set to None
    (`net.fc = ...`, `add_module`, `register_parameter`, `ModuleList.append`,
    ...): torch's own global registration hooks;
  - a submodule, parameter or buffer deleted as an attribute (`del net.fc`,
    `nn.Module.__delattr__`, wrapped), or from a ModuleDict (`del d[k]`,
    `pop`, `clear`); `ModuleList.insert` / `Sequential.insert` (wrapped);
  - a forward or backward hook registered on a module or on all modules
    (`register_forward_hook`, `register_module_forward_hook`, ..., wrapped),
    or a hook handle removed (`RemovableHandle.remove`, wrapped): a program
    traced the hooks there were (`hooks` keys it on them).

Code that edits a module's private `_modules` / `_parameters` / `_buffers`
or hook dicts directly bypasses all of these; call
`d2s.module_watch.touch()` after doing so.

Why wrap `__setattr__` globally rather than something narrower (measured,
docs/performance.md): a stale training flag is a silent wrong result, and the
flag is a plain attribute that `train()`, `eval()` and user code assign
directly, so only `__setattr__` sees every change. The wrapper adds ~0.09 us
to each module attribute assignment (about +2% on module construction);
reading the flags on every call instead would cost O(modules) per call and
still need a tree watch.
"""

import torch
import torch.nn as nn
from torch.nn.modules import module as _module
from torch.utils.hooks import RemovableHandle

from ops.user_frames import error_at_user_line
from runtime.ir import Variable

_generation = [0]


def generation():
    return _generation[0]


# Callbacks (module, name, value) told of every value assigned to a module
# attribute while they are registered: a trace under way records the writes
# it may replay (d2s/python_writes.py). Empty outside traces.
_attribute_writes = []


def touch():
    """Mark every cached set of training flags stale."""
    _generation[0] += 1


# torch's dtypes, devices, layouts and memory formats are as constant to a
# trace as numbers (`x.to(self.dtype)`); a torch.Size is a tuple of ints.
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format})
_TUPLES = (tuple, torch.Size)


def is_plain_value(value):
    """A Python number, string, None, torch dtype, device, layout or memory
    format, or a tuple of them: what a trace reads from a module attribute
    as a constant of the program."""
    kind = type(value)
    return kind in _SCALARS or (kind in _TUPLES and all(type(v) in _SCALARS for v in value))


# Module attribute values that are not keyed by identity (`by_identity`):
# tensors, submodules and containers (module_state.py reads and writes the
# tensors in them).
_NOT_BY_IDENTITY = (torch.Tensor, nn.Module, list, tuple, dict, set, frozenset)


def by_identity(modules, own=frozenset()):
    """The functions and objects `modules` hold in plain attributes
    (`self.act = torch.tanh`, a config object), which a program traced with
    them must not run for others; names in `own` (torch's bookkeeping, d2s's
    `forward`) are left."""
    return [v for m in modules for k, v in m.__dict__.items()
            if not isinstance(v, _NOT_BY_IDENTITY) and k not in own and not is_plain_value(v)]


def plain_values(modules):
    """(module index, name, value, its types) of every plain attribute of
    `modules` (`is_plain_value`), in order: a program traced with one set of
    them must not serve another. The type is part of it because 1 == 1.0 ==
    True, while `x * self.k` differs in dtype between them."""
    return tuple((i, k, v, _types(v)) for i, m in enumerate(modules) for k, v in m.__dict__.items()
                 if k != "training" and is_plain_value(v))


def same_plain_value(a, b):
    """Whether two plain values are equal and of the same types."""
    return a is b or (is_plain_value(a) and is_plain_value(b) and a == b and _types(a) == _types(b))


def _types(value):
    return (type(value),) + tuple(map(type, value)) if type(value) in _TUPLES else type(value)


_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks",
          "_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
_GLOBAL_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                 "_global_backward_hooks", "_global_forward_hooks_with_kwargs", "_global_forward_hooks_always_called")


def hooks(modules):
    """(module index or -1 for all modules', which dict, handle ids) of the
    forward and backward hooks of `modules` and of all modules: a program
    traced with one set of hooks must not serve another (a handle id is
    new for every registration)."""
    out = [(-1, name, tuple(getattr(_module, name))) for name in _GLOBAL_HOOKS if getattr(_module, name)]
    for i, m in enumerate(modules):
        d = m.__dict__
        for name in _HOOKS:
            registered = d.get(name)
            if registered:
                out.append((i, name, tuple(registered)))
    return tuple(out)


def _on_register(module, name, value):
    _generation[0] += 1


def _bumping(method):
    def wrapper(self, *args, **kwargs):
        _generation[0] += 1
        return method(self, *args, **kwargs)

    wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__ = method.__name__, method.__doc__, method
    return wrapper


def _install():
    if getattr(nn.Module, "_d2s_watched", False):
        return
    setattr_, delattr_ = nn.Module.__setattr__, nn.Module.__delattr__

    def __setattr__(self, name, value):
        # Submodules, parameters and buffers are seen by the registration
        # hooks below; the training flag, plain Python values (which a
        # program may have read as constants: `x * self.k`) and functions
        # and objects (which it called or read through: `self.act = torch.tanh`)
        # need this. Tensors and containers (state a program writes on every
        # run: module_state.py) do not.
        if name == "training" or is_plain_value(value) or not isinstance(value, _NOT_BY_IDENTITY):
            _generation[0] += 1
        if isinstance(value, Variable) and name in self.__dict__.get("_parameters", ()):
            # torch's own TypeError would name a d2s class; the user's line says more.
            raise error_at_user_line(
                f"`{name}` is a parameter of this {type(self).__name__}: the traced code replaces it with a value "
                "it computes (a new nn.Parameter on every call?), which a program cannot do to its inputs; "
                "create parameters in __init__, or write the value in place under torch.no_grad() "
                f"(`self.{name}.copy_(...)`)")
        if _attribute_writes:
            for record in _attribute_writes:
                record(self, name, value)
        setattr_(self, name, value)

    def __delattr__(self, name):
        d = self.__dict__
        if name in d.get("_modules", ()) or name in d.get("_parameters", ()) or name in d.get("_buffers", ()):
            _generation[0] += 1
        delattr_(self, name)

    for cls_fn, wrapper in ((setattr_, __setattr__), (delattr_, __delattr__)):
        wrapper.__doc__, wrapper.__wrapped__ = cls_fn.__doc__, cls_fn
    nn.Module.__setattr__, nn.Module.__delattr__ = __setattr__, __delattr__

    # These write `_modules` directly, past every hook.
    nn.ModuleDict.__delitem__ = _bumping(nn.ModuleDict.__delitem__)
    nn.ModuleDict.clear = _bumping(nn.ModuleDict.clear)
    nn.ModuleList.insert = _bumping(nn.ModuleList.insert)
    nn.Sequential.insert = _bumping(nn.Sequential.insert)
    for name in ("register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                 "register_full_backward_pre_hook", "register_backward_hook"):
        setattr(nn.Module, name, _bumping(getattr(nn.Module, name)))
    for name in ("register_module_forward_hook", "register_module_forward_pre_hook",
                 "register_module_full_backward_hook", "register_module_full_backward_pre_hook",
                 "register_module_backward_hook"):
        wrapped = _bumping(getattr(_module, name))
        for namespace in (_module, torch.nn.modules):  # (torch.nn.modules re-exports them)
            if getattr(namespace, name, None) is wrapped.__wrapped__:
                setattr(namespace, name, wrapped)
    RemovableHandle.remove = _bumping(RemovableHandle.remove)
    _module.register_module_module_registration_hook(_on_register)
    _module.register_module_parameter_registration_hook(_on_register)
    _module.register_module_buffer_registration_hook(_on_register)
    nn.Module._d2s_watched = True


_install()
