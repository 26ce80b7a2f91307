"""The short call path of a module whose `forward` is declarative: its class
becomes a same-named subclass whose `__call__` skips nn.Module's machinery
when there is nothing around `forward` (no hooks, no compile, no trace),
and still pickles and copies as its own class. Also the refusal of
data-parallel wrappers, which d2s cannot stage."""

import copyreg
import inspect
import weakref

import torch


DATA_PARALLEL = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)


def data_parallel_message(wrapper):
    name = type(wrapper).__name__
    return (f"the {name} wrapper prepares each step's gradient synchronisation in Python around `forward`, "
            f"which a program cannot repeat; wrap the other way round, {name}(d2s.declarative(model)), and "
            "call it outside declarative code (see docs/distributed.md)")


_CALLING_FORWARD = weakref.WeakKeyDictionary()
_module_hooks = torch.nn.modules.module
# torch mutates these dicts in place (register_module_forward_hook & co.) and
# never rebinds them, so holding them is as good as reading the module's globals.
_GLOBAL_HOOKS = (_module_hooks._global_forward_pre_hooks, _module_hooks._global_forward_hooks,
                 _module_hooks._global_backward_pre_hooks, _module_hooks._global_backward_hooks)
_tracing_state = torch._C._get_tracing_state


def _declarative_module_call(self, *args, **kwargs):
    """`module(x)` for a module whose `forward` is declarative: what
    `nn.Module.__call__` does when there is nothing around `forward` to run
    (no hook of the module's or global, no `module.compile()`, no
    `torch.jit.trace` in progress), in one frame instead of three; anything
    else goes through `nn.Module.__call__` itself. This is most of what a
    cache hit costs on top of the program (~0.6 us saved per call)."""
    d = self.__dict__
    try:
        forward = d["forward"]
        if (d["_forward_pre_hooks"] or d["_forward_hooks"] or d["_backward_pre_hooks"] or d["_backward_hooks"]
                or "_compiled_call_impl" in d):
            forward = None
    except KeyError:  # a module whose __init__ did not run nn.Module's
        forward = None
    g0, g1, g2, g3 = _GLOBAL_HOOKS
    if forward is None or g0 or g1 or g2 or g3 or _tracing_state():
        return torch.nn.Module.__call__(self, *args, **kwargs)
    return forward(*args, **kwargs)


def call_class_forward(self, *args, **kwargs):
    """`_declarative_module_call` for a module class of ours whose `forward`
    is the class's (a loaded model, `TranslatedLayer`)."""
    d = self.__dict__
    g0, g1, g2, g3 = _GLOBAL_HOOKS
    if (d["_forward_pre_hooks"] or d["_forward_hooks"] or d["_backward_pre_hooks"] or d["_backward_hooks"]
            or "_compiled_call_impl" in d or g0 or g1 or g2 or g3 or _tracing_state()):
        return torch.nn.Module.__call__(self, *args, **kwargs)
    return self.forward(*args, **kwargs)


def calling_forward(cls):
    """A subclass of `cls` (same name and module) whose __call__ is
    nn.Module's (hooks, then `forward`), taking the short way when nothing
    surrounds `forward` (`_declarative_module_call`)."""
    sub = _CALLING_FORWARD.get(cls)
    if sub is None:
        sub = type(cls.__name__, (cls,), {"__call__": _declarative_module_call, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                                          "__reduce_ex__": _reduce_declarative_instance})
        _CALLING_FORWARD[cls] = sub
    return sub


def _reduce_declarative_instance(module, protocol):
    """Pickle / deepcopy a module of a `calling_forward` class by its own
    class, which pickle can find by name (the subclass has the same name, so
    pickle refused it: "not the same object as M"); the copy gets the
    subclass back when it is made."""
    reduced = object.__reduce_ex__(module, protocol)
    if isinstance(reduced, tuple) and reduced[0] is copyreg.__newobj__ and reduced[1][0] is type(module):
        base = next(c for c in type(module).__mro__[1:] if _CALLING_FORWARD.get(c) is type(module))
        return (_new_calling_forward, (base,) + tuple(reduced[1][1:])) + tuple(reduced[2:])
    return reduced  # the class reduces itself its own way


def _new_calling_forward(cls, *args):
    return cls.__new__(calling_forward(cls), *args)


def call_forward_directly(module):
    """Give `module` (whose `forward` was just made declarative) the short
    call path, when its class calls `forward` the way nn.Module does.

    The instance's class becomes a same-named subclass: `isinstance`,
    `repr`, `state_dict` and hooks are unchanged, but `type(module) is Cls`
    is False (docs/user_guide.md). torch's own classes (`nn.Linear`, ...)
    keep theirs: torch looks some of them up by exact type (quantization
    mappings, fx), and one leaf module's hit is not worth that."""
    cls = type(module)
    if inspect.getattr_static(cls, "__call__", None) is not torch.nn.Module.__call__:
        return  # already done, or a class with a __call__ of its own: that is what module(x) runs
    if cls.__module__.partition(".")[0] == "torch":
        return
    try:
        module.__class__ = calling_forward(cls)
    except TypeError:  # a layout __class__ assignment refuses: keep the ordinary call
        pass
