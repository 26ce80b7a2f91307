"""A process-wide counter that changes whenever any module's `training` flag
or its set of submodules changes.

A declarative call keys its program on the `training` flag of every module
involved. Walking the module tree on every call costs ~0.7 us per submodule;
instead each StaticFunction caches the flags and re-reads them only when this
counter has moved since. It moves on:

  - `module.training = ...` (what `train()` / `eval()` do) and any submodule
    assigned or deleted as an attribute: `nn.Module.__setattr__` /
    `__delattr__` are wrapped once, when d2s is imported;
  - `add_module` / `register_module` (ModuleList.append, ...): torch's own
    global module-registration hook;
  - deleting from a ModuleDict (`del d[k]`, `pop`, `clear`).

Code that edits a module's private `_modules` dict directly bypasses all of
these; call `d2s.module_watch.touch()` after doing so.
"""

import torch.nn as nn
from torch.nn.modules import module as _module

_generation = [0]


def generation():
    return _generation[0]


def touch():
    """Mark every cached set of training flags stale."""
    _generation[0] += 1


def _on_register(module, name, submodule):
    _generation[0] += 1


def _install():
    if getattr(nn.Module, "_d2s_watched", False):
        return
    setattr_, delattr_ = nn.Module.__setattr__, nn.Module.__delattr__

    def __setattr__(self, name, value):
        if name == "training" or isinstance(value, nn.Module):
            _generation[0] += 1
        setattr_(self, name, value)

    def __delattr__(self, name):
        if name in self._modules:
            _generation[0] += 1
        delattr_(self, name)

    for cls_fn, wrapper in ((setattr_, __setattr__), (delattr_, __delattr__)):
        wrapper.__doc__, wrapper.__wrapped__ = cls_fn.__doc__, cls_fn
    nn.Module.__setattr__, nn.Module.__delattr__ = __setattr__, __delattr__

    dict_delitem, dict_clear = nn.ModuleDict.__delitem__, nn.ModuleDict.clear

    def __delitem__(self, key):
        _generation[0] += 1
        dict_delitem(self, key)

    def clear(self):
        _generation[0] += 1
        dict_clear(self)

    nn.ModuleDict.__delitem__, nn.ModuleDict.clear = __delitem__, clear
    _module.register_module_module_registration_hook(_on_register)
    nn.Module._d2s_watched = True


_install()
