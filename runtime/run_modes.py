"""The modes a recorded call runs in besides the caller's: `no_grad`
(recorded inside `with torch.no_grad():`) and `autocast` (recorded inside
`with torch.autocast(...)`, where autocast differs from the state the
trace started in).

    with torch.autocast("cpu", dtype=torch.bfloat16):     y = torch.matmul(x, w)
        y = x @ w                                  ->         {autocast cpu bfloat16}

Codegen runs such a call inside the same `with`; a pass that merges,
moves or lowers calls leaves it alone (`has_mode`). The autocast state the
caller is in when the program runs is part of the declarative call's
cache key (`autocast_state`): a program traced under another one is not
reused. A program that cannot be retraced (loaded, `TracedLayer`,
`Executor.run`) holds the state it was traced in (`Program.autocast`, saved
with it) and refuses a call made in another (`check_caller_modes`):
its decisions on dtypes, and the dtypes its unmarked calls were inferred
in, are the traced state's. The same holds for the default dtype
(`Program.default_dtype`, part of the declarative key too).
"""

import torch

from .ir import dtype_name


def _autocast_devices():
    # Every device type torch's autocast knows (of this torch build); a
    # device that is absent here costs nothing but a None in each state.
    known = []
    for device in ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "ipu", "mtia", "maia"):
        try:
            torch.get_autocast_dtype(device)
        except (RuntimeError, ValueError):
            continue
        known.append(device)
    return tuple(known)


AUTOCAST_DEVICES = _autocast_devices()


def has_mode(op):
    """Whether `op` runs in a mode of its own (see the module docstring)."""
    return bool(op.attrs.get("no_grad") or op.attrs.get("autocast"))


def mode_key(op):
    """What tells two calls' modes apart (for merging equal calls)."""
    return bool(op.attrs.get("no_grad")), repr(op.attrs.get("autocast"))


OFF = (None,) * len(AUTOCAST_DEVICES)
_default_dtype = torch.get_default_dtype
_any_enabled = torch._C._is_any_autocast_enabled  # one C call: the declarative call's key reads it every call


def autocast_state():
    """Per device type of AUTOCAST_DEVICES: the autocast dtype, or None when
    off. For the per-call keys and checks: one C call while autocast is off,
    which torch answers for every device type but `mps` and `maia`
    (`full_autocast_state` asks those too)."""
    if not _any_enabled():
        return OFF
    return full_autocast_state()


_UNSEEN = tuple(d for d in ("mps", "maia") if d in AUTOCAST_DEVICES)  # what _any_enabled does not answer for


def full_autocast_state():
    """`autocast_state()` asking every device type: what tracing records."""
    if not _any_enabled() and not any(torch.is_autocast_enabled(d) for d in _UNSEEN):
        return OFF
    return tuple(torch.get_autocast_dtype(d) if torch.is_autocast_enabled(d) else None for d in AUTOCAST_DEVICES)


def autocast_changes(state, start):
    """`[[device type, dtype name, enabled], ...]` where autocast `state`
    differs from `start` (both `autocast_state()` values)."""
    changes = []
    for device, now, before in zip(AUTOCAST_DEVICES, state, start):
        if now != before:
            dtype = now if now is not None else torch.get_autocast_dtype(device)
            changes.append([device, dtype_name(dtype), now is not None])
    return changes


def traced_autocast(state):
    """`Program.autocast` for a program traced in autocast `state`: the
    device types on, as `autocast_changes` lists them, or None (all off)."""
    return autocast_changes(state, OFF) or None


def check_caller_modes(program):
    """Refuse to run `program` (one that is not retraced per call) in an
    autocast state or under a default dtype other than the ones it was
    traced in."""
    if program.default_dtype is not None and _default_dtype() is not program.default_dtype:
        raise RuntimeError(
            f"this program was traced under the default dtype {program.default_dtype} and is called under "
            f"{_default_dtype()} (torch.set_default_dtype): its factories, constants and the promotion of "
            "integer tensors with Python floats took the first (as they did in eager code there); call it under "
            "that default dtype, or trace and save it under the one it runs in")
    traced = program.autocast
    if traced is None and not _any_enabled():  # every call of a loaded model asks: one C call
        return
    now = traced_autocast(full_autocast_state())
    if now != traced:
        raise RuntimeError(
            f"this program was traced {_describe(traced)} and is called {_describe(now)}: its dtypes, and its "
            "decisions on them, are those of the first (as they were for eager code there); call it as it was "
            "traced, or trace and save it under the autocast it runs in")


def _describe(changes):
    if not changes:
        return "with autocast off"
    return "under " + ", ".join(f'torch.autocast("{device}", dtype=torch.{dtype})' for device, dtype, _ in changes)


def check_autocast_attr(value):
    """The error text for a malformed `autocast` attribute (from a file), or None."""
    if not isinstance(value, list):
        return "must be a list of [device type, dtype name, enabled]"
    for entry in value:
        if not (isinstance(entry, list) and len(entry) == 3 and entry[0] in AUTOCAST_DEVICES
                and isinstance(entry[1], str) and isinstance(entry[2], bool)):
            return f"entry {entry!r:.60} is not [device type ({', '.join(AUTOCAST_DEVICES)}), dtype name, enabled]"
        try:
            dtype_name(entry[1])
        except ValueError as exc:
            return str(exc)
    return None
