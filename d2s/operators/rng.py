"""The CPU generator's state in converted code: read and written by ops when
the program runs, in program order with its random draws.

    s = torch.get_rng_state()           ->  s = torch.get_rng_state()        (op)
    torch.set_rng_state(s)              ->  torch.set_rng_state(s)           (op)

    with torch.random.fork_rng():           state = torch.get_rng_state()    (op)
        a = torch.rand(3)               ->  a = torch.rand(3)
    b = torch.rand(3)                       torch.set_rng_state(state)       (op)
                                            b = torch.rand(3)

Called as they are, these would run once, while tracing: `fork_rng` would
restore the generator at build time only, so every run after the first would
draw `b` from a generator the block had advanced (a silent difference from
eager). The state of accelerator generators is not staged: forking one is
refused at the user's line.
"""

import contextlib
import inspect

import torch

from ops import tracer
from ops.recording import record
from ops.user_frames import error_at_user_line
from ops.torch_ops import python_level_op

_FORK_RNG = inspect.signature(torch.random.fork_rng)


def convert_fork_rng(*args, **kwargs):
    """``with torch.random.fork_rng(...):`` while tracing: the state ops
    around the block (the call itself still runs, so tracing leaves the
    generators as it found them)."""
    bound = _FORK_RNG.bind(*args, **kwargs)
    bound.apply_defaults()
    options = bound.arguments
    if options["enabled"]:
        # The accelerator fork_rng forks as well, as torch picks it.
        accelerator = torch.accelerator.current_accelerator()
        device_type = options["device_type"] or (accelerator.type if accelerator is not None else "cuda")
        devices = options["devices"]
        if devices is None:
            devices = range(torch.get_device_module(device_type).device_count())
        if list(devices):
            raise error_at_user_line(
                f"fork_rng over {device_type} devices {list(devices)}: only the CPU generator's state is "
                "part of a program; pass devices=[] to fork the CPU generator alone")
    return _forked(torch.random.fork_rng(*args, **kwargs), options["enabled"])


@contextlib.contextmanager
def _forked(build_time_fork, enabled):
    with build_time_fork:
        state = get_rng_state() if enabled else None
        try:
            yield
        finally:
            if state is not None:
                set_rng_state(state)


def _op_call(fn):
    opdef = python_level_op(fn)
    return lambda *args, **kwargs: record(opdef, fn, args, kwargs)


get_rng_state = _op_call(torch.get_rng_state)
set_rng_state = _op_call(torch.set_rng_state)
_CONVERTED = {
    torch.get_rng_state: get_rng_state,
    torch.set_rng_state: set_rng_state,
    torch.random.fork_rng: convert_fork_rng,
}


def convert_rng_call(fn):
    """What converted code calls in place of `fn` while tracing, or None."""
    if tracer.active() is None:
        return None
    try:
        return _CONVERTED.get(fn)
    except TypeError:  # unhashable callable
        return None
