"""The conversion pipeline: one transformer per Python feature, in a fixed order.

Each pass takes the function's gast tree and returns it rewritten; the order
matters and is part of the design:

 1. Unsupported   reject yield/await/async/global rebinding (nothing rewritten)
 2. UndefinedLoads reads of possibly unbound variables -> ``convert_load`` (on the
                  user's own code, before any pass moves it into functions)
 3. ForLoop       ``for`` -> ``while`` over ``convert_for_iter/test/next``
 4. Return        early ``return`` -> ``do_return``/``retval`` flags (needs only ``while``)
 5. BreakContinue ``break``/``continue`` -> flags; loop ``else`` -> guarded block
 6. WhileLoop     ``while`` -> ``convert_while`` (loops are now jump-free)
 7. IfElse        ``if`` -> ``convert_ifelse`` (also the guards passes 4-5 produced)
 8. IfExp         ``a if c else b`` -> ``convert_ifexp``
 9. Logical       ``and``/``or``/``not``/chained comparisons -> ``convert_logical_*``
                  (after 4-7, which generate ``not flag`` and ``not flag and test``)
10. Assert        ``assert`` -> ``convert_assert``
11. AugAssign     ``x += v`` -> ``x = convert_augassign('+=', x, v)`` (in place, but
                  out of place for graph tensors that stand for Python numbers)
12. ListAppend    ``x.append(v)`` -> ``convert_list_append`` (after 6-7, whose
                  analyses see ``x.append`` as modifying ``x``)
13. Shape         ``x.shape`` -> ``convert_shape(x)``
14. Call          ``f(...)`` -> ``convert_call(f)(...)`` (last: it must not wrap the
                  helper calls earlier passes generate, and it must see every call)

``run(tree, ctx, stop_after=n)`` runs the first ``n`` passes (``set_code_level``).
"""

from .asserts import Assert
from .augassign import AugAssign
from .base import Context, Transformer
from .break_continue import BreakContinue
from .calls import Call
from .for_loops import ForLoop
from .if_else import IfElse
from .ifexp import IfExp
from .list_append import ListAppend
from .logical import Logical
from .returns import Return
from .shape import Shape
from .undefined import UndefinedLoads
from .unsupported import Unsupported
from .while_loops import WhileLoop

PIPELINE = [
    Unsupported,
    UndefinedLoads,
    ForLoop,
    Return,
    BreakContinue,
    WhileLoop,
    IfElse,
    IfExp,
    Logical,
    Assert,
    AugAssign,
    ListAppend,
    Shape,
    Call,
]


def run(tree, ctx, stop_after=None):
    """Run the pipeline (or its first ``stop_after`` passes) on ``tree``."""
    passes = PIPELINE if stop_after is None else PIPELINE[:stop_after]
    for transformer in passes:
        tree = transformer(ctx).transform(tree)
    return tree


__all__ = ["PIPELINE", "run", "Context", "Transformer"]
