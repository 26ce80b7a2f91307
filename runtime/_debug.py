"""The one debug ladder: D2S_DEBUG=1 converted source, =2 programs, =3 every
op as it runs. `set_verbosity(n)` overrides the environment."""

import contextlib
import os

_override = None


def level():
    if _override is not None:
        return _override
    try:
        return int(os.environ.get("D2S_DEBUG", "0"))
    except ValueError:
        return 0


def set_verbosity(n):
    global _override
    _override = None if n is None else int(n)


@contextlib.contextmanager
def verbosity(n):
    """`set_verbosity(n)` for the duration of a block (None: leave it as it is)."""
    global _override
    saved = _override
    if n is not None:
        _override = int(n)
    try:
        yield
    finally:
        _override = saved
