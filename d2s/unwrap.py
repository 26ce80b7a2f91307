"""Seeing through d2s's own wrappers without importing them.

Conversion and call dispatch meet `StaticFunction`s (a declarative function
called from converted code, a module whose forward is declarative); they
need the plain function inside, and importing static_function from there
would close an import circle (static_function converts through them). A
wrapper declares `__d2s_unwrap__` (returning the unbound Python function it
wraps); `unwrap` reads it.
"""


def unwrap(fn):
    """The Python function `fn` wraps when it is a d2s wrapper, else `fn`."""
    inner = getattr(type(fn), "__d2s_unwrap__", None)
    return fn if inner is None else inner(fn)


def is_wrapper(fn):
    return getattr(type(fn), "__d2s_unwrap__", None) is not None
