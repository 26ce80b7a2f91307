"""Python errors while a tensor-dependent branch is traced -> ``raise`` ops.

Under a tensor condition both sides are traced, but only one runs for a
given input. An exception the user's code raises while one side is traced
(``raise``, a failed Python ``assert``, ``[1, 2, 3][4]``) must therefore not
fail the build: it becomes a ``raise`` op in that side, which raises the
same exception type and message when the program runs and takes it.
``ConversionError``s (constructs d2s cannot stage) still fail the build.
"""

import contextlib

from ops import control_flow as cf
from ops import framework as fw
from ops import tracer
from runtime.errors import ConversionError


@contextlib.contextmanager
def try_scope():
    """The body of a user `try` that has `except` handlers
    (d2s/transformers/try_scope.py): while it is traced, a `raise` or
    `assert` that only a run can decide is refused (ops/framework.py)."""
    tr = tracer.active()
    if tr is None:  # converted code running without a trace
        yield
        return
    tr.try_depth += 1
    try:
        yield
    finally:
        tr.try_depth -= 1


def raising_as_op(fn):
    """``fn`` for a branch being traced: an exception it raises (not a
    ConversionError) becomes a ``raise`` op in place of what it recorded,
    and the branch yields ``Unreachable``."""
    def run():
        tr = tracer.current()
        mark = tr.mark()
        try:
            return fn()
        except ConversionError as exc:
            # A kernel refusing the sizes of a side these inputs skip:
            # converted when a run takes it (ops/control_flow.decide_failed_side).
            if getattr(exc, "kernel_failed", False):
                tr.rollback(mark)
                if cf.decide_failed_side(exc):
                    return cf.Unreachable("branch")
            raise
        except Exception as exc:  # noqa: BLE001 - the user's error, raised when the branch runs
            if cf.raised_by_torch(exc) or not _complete(tr, mark):
                tr.rollback(mark)
                if cf.decide_failed_side(exc):  # (torch failing on a side these inputs do not take)
                    return cf.Unreachable("branch")
            # What ran before the error stays: eager runs it before raising,
            # and it may raise first itself (an inner loop whose body raises)
            # or write what the caller sees. Pure ops are dead code after it.
            fw.raise_(exc)
            return cf.Unreachable("branch")
    return run


def _complete(tr, mark):
    """Whether what was recorded since `mark` is whole: recording is back in
    the branch's block, and every block made since is a sub-block of a
    recorded op (none left by a construct the error cut short)."""
    if tr.block is not mark.block:
        return False
    blocks = tr.program.blocks
    new = {b.idx for b in blocks[len(mark.blocks):]}
    if not new:
        return True
    used = {sub.idx for b in blocks for op in b.ops for sub in op.sub_blocks()}
    return new <= used


# Ops that raise the user's own error when a run reaches them (a tensor
# `assert`, torch's argument validation) before any error the build meets later.
_USER_CHECKS = ("raise", "assert", "check_all_true")


def raising_after_raise_ops(fn, program):
    """``fn`` for the whole function being traced. An error its top level
    raises (not a ConversionError, not torch refusing sizes) fails the
    conversion, as it fails every eager call, unless the program already
    holds one of `_USER_CHECKS` (a ``raise``, a tensor ``assert``), which a run may reach first (a loop
    body that raises on every path: eager raises there for inputs that take
    a trip, and here for the others; a tensor ``assert`` that fails before
    a name the function never binds). Then it becomes a ``raise`` op too, and the
    function yields ``Unreachable``."""
    def run():
        tr = tracer.current()
        mark = tr.mark()
        try:
            return fn()
        except ConversionError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's error, raised when a run gets here
            if (cf.raised_by_torch(exc) or tr.block is not program.global_block() or not _complete(tr, mark)
                    or not any(op.type in _USER_CHECKS for block in program.blocks for op in block.ops)):
                raise
            fw.raise_(exc)
            return cf.Unreachable("function")
    return run
