"""Where the user is: the innermost frame of the user's code, the source
line shown in messages, the user's name for a value, and the
ConversionError that names the user's file and line. The bottom of ops:
it imports nothing of the project but runtime's error class, so every op
family can say where the user wrote what it refuses.
"""

import linecache
import os
import re
import sys
import sysconfig

import torch

from runtime.errors import ConversionError

TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
INTERNAL_DIRS = (TORCH_DIR,) + tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d) + os.sep
    for d in ("ops", "runtime", "d2s")
)


def called_from_torch():
    """Whether the nearest frame of the caller's outside d2s's own packages
    is torch's code (not the user's)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(INTERNAL_DIRS) \
            and not frame.f_code.co_filename.startswith(TORCH_DIR):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR)


# The standard library, recognised by where its files live (a user module
# may well be called `test` or `types`); site-packages lies inside it.
_STDLIB_DIRS = tuple({os.path.join(os.path.realpath(sysconfig.get_paths()[k]), "")
                      for k in ("stdlib", "platstdlib")})
_SITE_DIRS = tuple({os.path.join(os.path.realpath(sysconfig.get_paths()[k]), "") for k in ("purelib", "platlib")})


def is_stdlib_file(filename):
    """Whether `filename` is a file of Python's standard library."""
    path = os.path.realpath(filename)
    return path.startswith(_STDLIB_DIRS) and not path.startswith(_SITE_DIRS)


def _user_frame(skip_internal=True):
    """The innermost user frame: the first frame outside torch and d2s's own
    packages. Converted code is compiled with the user's file name and line
    numbers, so it counts as user code."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (skip_internal and filename.startswith(INTERNAL_DIRS)) and not filename.startswith("<frozen"):
            return frame
        frame = frame.f_back
    return None


def user_origin(skip_internal=True):
    """(filename, lineno, source line) of the innermost user frame."""
    frame = _user_frame(skip_internal)
    return None if frame is None else _origin(frame)


def _origin(frame, kind=tuple):
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return kind((frame.f_code.co_filename, frame.f_lineno, line))


class Origin(tuple):
    """(filename, lineno, source line) of a user line, and `site`: the
    (filename, lineno, instruction) of each user frame from that line out to the frame
    that entered the trace. One line can be reached through several calls
    in one trace (transformers' `sdpa_mask` builds a model's full mask and
    its sliding-window mask), each of which may take another side of its
    `if`: the site tells them apart where the line cannot."""

    site = None


_MAX_SITE = 64  # frames: past them the site is cut (a deep recursion)


def user_origin_at_site(entry):
    """`user_origin()` as an `Origin` whose site reaches out to `entry`
    (the frame that entered the trace; None: as far as the stack goes)."""
    frame = _user_frame()
    if frame is None:
        return None
    origin = _origin(frame, Origin)
    site = []
    while frame is not None and frame is not entry and len(site) < _MAX_SITE:
        filename = frame.f_code.co_filename
        if not filename.startswith(INTERNAL_DIRS) and not filename.startswith("<frozen"):
            # (the instruction too: two `if`s of one line, `max(t, 0.1), min(u, 0.1)`,
            # are two sites, each with its own side)
            site.append((filename, frame.f_lineno, frame.f_lasti))
        frame = frame.f_back
    origin.site = tuple(site)
    return origin


def user_name(value, what="tensor"):
    """How a message names ``value``: "tensor `s`" when a variable of the
    user's code holds it and appears on the user's line, else "this tensor"
    (the line is shown under the message). Never the program's own name for
    it (`tmp_3`, `ys_2`), which the user never wrote."""
    frame = _user_frame()
    if frame is not None:
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        words = set(re.findall(r"[A-Za-z_]\w*", line))
        names = sorted(n for n, v in frame.f_locals.items() if v is value and n in words)
        if names:
            return f"{what} `{names[0]}`"
    return f"this {what}"


def _user_names(values):
    """For each value, the variable of the user's code on the user's line that
    holds it, else "input i" (never the program's own name, `tmp_3`)."""
    frame = _user_frame()
    names = []
    words = set(re.findall(r"[A-Za-z_]\w*", linecache.getline(frame.f_code.co_filename, frame.f_lineno))) \
        if frame is not None else set()
    local = frame.f_locals if frame is not None else {}
    for i, value in enumerate(values):
        held = sorted(n for n, v in local.items() if v is value and n in words)
        names.append(held[0] if held else f"input {i + 1}")
    return names


def exception_origin(exc):
    """(filename, lineno, source line) of the innermost user frame that ``exc``
    passed through (where the user's code raised it), or None."""
    origin, tb = None, exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(INTERNAL_DIRS) and not filename.startswith("<frozen"):
            origin = (filename, tb.tb_lineno, linecache.getline(filename, tb.tb_lineno).strip())
        tb = tb.tb_next
    return origin


def error_at_user_line(message, frame=None):
    """A ConversionError naming the innermost user frame's line (or `frame`'s)."""
    origin = user_origin() if frame is None else _origin(frame)
    if origin is None:
        return ConversionError(message)
    filename, lineno, line = origin
    text = f"{message}\n    {line}" if line else message
    return ConversionError(text, filename, lineno)


# Sizes known only at run time while tracing (ops/symbolic.py).
SYMBOLIC_TYPES = (torch.SymInt, torch.SymBool, torch.SymFloat)
