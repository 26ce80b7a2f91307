"""Reads of a variable that may be unbound -> ``helpers.convert_load``.

Before::

    def f(x, n):
        if n > 0:
            y = x * 2
        return y

After::

    def f(x, n):
        if n > 0:
            y = x * 2
        return helpers.convert_load(y)

Branches and loops become functions whose variables live in closure cells;
the helpers read a cell that has no value as ``Undefined(name)``, and the
generated code may bind it to a name. ``convert_load`` raises Python's own
``UnboundLocalError`` for it, so a name read on a path that never assigned
it fails exactly as in eager code (and, under a tensor condition, when the
program takes that path; see ``convert_ifelse``). Only the reads the
definite-assignment analysis (``ast_tools.definedness``) cannot prove bound
are wrapped. Runs first after Unsupported, on the user's own code (and
marks the calls of closures that rebind this function's variables:
``activity.mark_closure_calls``).
"""

import gast

from ..ast_tools import activity, anno, definedness
from .base import Transformer


class UndefinedLoads(Transformer):
    def transform(self, tree):
        self.maybe = set()
        return self.visit(tree)

    def visit_FunctionDef(self, node):
        self.maybe |= {id(n) for n in definedness.maybe_undefined(node)}
        # Also on the user's own code: which calls rebind this function's variables
        # through a closure's `nonlocal` (for the analyses of the later passes).
        activity.mark_closure_calls(node)
        # Which names are this function's locals is Python's compile-time fact;
        # kept_locals.py keeps it after unreachable code is dropped.
        anno.setanno(node, anno.LOCALS, frozenset(activity.own_locals(node)))
        return self.generic_visit(node)

    def visit_Name(self, node):
        if id(node) not in self.maybe:
            return node
        return self.expression("helpers.convert_load(name)", node, name=node)
