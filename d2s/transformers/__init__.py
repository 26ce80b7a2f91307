"""The conversion pipeline: one transformer per Python feature, in a fixed order.

Each pass takes the function's gast tree and returns it rewritten; the order
matters and is part of the design:

 1. Unsupported   reject yield/await/async/global rebinding (nothing rewritten)
 2. Annotations   ``x: T = v`` -> ``x = v`` for local names (never evaluated; lets
                  later passes make ``x`` nonlocal)
 3. UndefinedLoads reads of possibly unbound variables -> ``convert_load`` (on the
                  user's own code, before any pass moves it into functions)
 4. ForLoop       ``for`` -> ``while`` over ``convert_for_iter/test/next``
 5. Return        early ``return`` -> ``do_return``/``retval`` flags (needs only ``while``)
 6. BreakContinue ``break``/``continue`` -> flags; loop ``else`` -> guarded block
 6b. KeptLocals   a name only the statements 5-6 dropped as unreachable assigned stays
                  a local: bound to ``Undefined`` at the top (a read is eager's
                  ``UnboundLocalError``, never a global of that name)
 7. WhileLoop     ``while`` -> ``convert_while`` (loops are now jump-free)
 8. IfElse        ``if`` -> ``convert_ifelse`` (also the guards passes 5-6 produced)
 9. IfExp         ``a if c else b`` -> ``convert_ifexp``
10. Logical       ``and``/``or``/``not``/chained comparisons -> ``convert_logical_*``
                  (after 5-8, which generate ``not flag`` and ``not flag and test``)
11. Assert        ``assert`` -> ``convert_assert``
12. AugAssign     ``x += v`` -> ``x = convert_augassign('+=', x, v)`` (in place, but
                  out of place for graph tensors that stand for Python numbers)
13. ListAppend    ``x.append(v)`` -> ``convert_list_append`` (after 7-8, whose
                  analyses see ``x.append`` as modifying ``x``)
14. Shape         ``x.shape`` -> ``convert_shape(x)``
14b. ClassAttr    ``x.__class__`` -> ``convert_type(x)`` (a graph tensor's class is eager's)
14c. FStrings     ``f"a{x}"`` -> ``convert_fstring(("a", (x, -1, None)))`` (text a run-time
                  int spells can pick an ``nn.ModuleDict`` item)
15. Subscripts    ``seq[i]`` by a computed index -> ``convert_getitem(seq, i)`` (a tuple
                  indexed by a run-time int)
16. TryScope      a ``try`` body with handlers -> inside ``with try_scope():`` (a
                  raise a tensor condition decides cannot reach an ``except``)
17. Call          ``f(...)`` -> ``convert_call(f)(...)`` (last: it must not wrap the
                  helper calls earlier passes generate, and it must see every call)

Before them all, ``PrivateNames`` gives ``self.__x`` in a method of a class
``Owner`` Python's name ``self._Owner__x`` (Python does it when compiling a
class body; the converted code is compiled outside it).
``run(tree, ctx, stop_after=n)`` runs the first ``n`` passes (``set_code_level``).
"""

import gast

from ..ast_tools import activity
from .annotations import Annotations
from .asserts import Assert
from .augassign import AugAssign
from .base import Context, Transformer
from .break_continue import BreakContinue
from .calls import Call
from .class_attr import ClassAttr
from .for_loops import ForLoop
from .fstrings import FStrings
from .if_else import IfElse
from .kept_locals import KeptLocals
from .ifexp import IfExp
from .list_append import ListAppend
from .logical import Logical
from .private_names import PrivateNames
from .returns import Return
from .shape import Shape
from .subscripts import Subscripts
from .try_scope import TryScope
from .undefined import UndefinedLoads
from .unsupported import Unsupported
from .while_loops import WhileLoop

PIPELINE = [
    Unsupported,
    Annotations,
    UndefinedLoads,
    ForLoop,
    Return,
    BreakContinue,
    KeptLocals,
    WhileLoop,
    IfElse,
    IfExp,
    Logical,
    Assert,
    AugAssign,
    ListAppend,
    Shape,
    ClassAttr,
    FStrings,
    Subscripts,
    TryScope,
    Call,
]


def run(tree, ctx, stop_after=None):
    """Run the pipeline (or its first ``stop_after`` passes) on ``tree``."""
    passes = PIPELINE if stop_after is None else PIPELINE[:stop_after]
    tree = PrivateNames(ctx).transform(tree)  # first: every later pass sees Python's names
    if isinstance(tree, (gast.FunctionDef, gast.AsyncFunctionDef)):
        ctx.captured = frozenset(activity.captured_names(tree))
    for transformer in passes:
        tree = transformer(ctx).transform(tree)
    return tree


__all__ = ["PIPELINE", "run", "Context", "Transformer"]
