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
reused.
"""

import torch

from .ir import dtype_name

AUTOCAST_DEVICES = ("cpu", "cuda")


def has_mode(op):
    """Whether `op` runs in a mode of its own (see the module docstring)."""
    return bool(op.attrs.get("no_grad") or op.attrs.get("autocast"))


def mode_key(op):
    """What tells two calls' modes apart (for merging equal calls)."""
    return bool(op.attrs.get("no_grad")), repr(op.attrs.get("autocast"))


_OFF = (None,) * len(AUTOCAST_DEVICES)
_any_enabled = torch._C._is_any_autocast_enabled  # one C call: the declarative call's key reads it every call


def autocast_state():
    """Per device type of AUTOCAST_DEVICES: the autocast dtype, or None when off."""
    if not _any_enabled():
        return _OFF
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
