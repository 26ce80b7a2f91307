"""Python errors while a tensor-dependent branch is traced -> ``raise`` ops.

Under a tensor condition both sides are traced, but only one runs for a
given input. An exception the user's code raises while one side is traced
(``raise``, a failed Python ``assert``, ``[1, 2, 3][4]``) must therefore not
fail the build: it becomes a ``raise`` op in that side, which raises the
same exception type and message when the program runs and takes it.
``ConversionError``s (constructs d2s cannot stage) still fail the build.
"""

from ops import control_flow as cf
from ops import framework as fw
from ops import tracer
from runtime.errors import ConversionError


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
            tr.rollback(mark)
            if not cf.decide_failed_side(exc):  # (torch failing on a side these inputs do not take)
                fw.raise_(exc)
            return cf.Unreachable("branch")
    return run
