"""Reject Python features d2s cannot turn into a program, before anything else.

Nothing is rewritten; the pass raises a ConversionError that names the file,
the line and what to write instead::

    def f(x):
        for row in x:
            yield row * 2      # ConversionError: generators are not supported ...

    def g(x):
        global CACHE
        CACHE = x              # ConversionError: rebinding global 'CACHE' ...
"""

import gast

from ..ast_tools import activity
from .base import Transformer


class Unsupported(Transformer):
    def visit_Yield(self, node):
        raise self.ctx.error(node, "generators (`yield`) are not supported in converted functions; "
                                   "collect the values in a list and return it")

    visit_YieldFrom = visit_Yield

    def visit_Await(self, node):
        raise self.ctx.error(node, "`await` is not supported in converted functions; "
                                   "convert a synchronous function instead")

    def visit_AsyncFunctionDef(self, node):
        raise self.ctx.error(node, "async functions are not supported; convert a synchronous function instead")

    def visit_FunctionDef(self, node):
        act = activity.analyze(node.body)
        for name in sorted(act.globals & act.bound):
            decl = next(n for n in gast.walk(node) if isinstance(n, gast.Global) and name in n.names)
            raise self.ctx.error(decl, (
                f"rebinding global {name!r} inside a converted function is not supported (a tensor "
                "stored there would escape the program); return the value instead, or keep state on "
                "the module (self.x = value, carried across calls)"))
        return self.generic_visit(node)
