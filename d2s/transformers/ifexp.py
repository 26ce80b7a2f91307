"""Conditional expressions -> ``helpers.convert_ifexp``.

Before::

    y = a if x.sum() > 0 else b

After::

    y = helpers.convert_ifexp(x.sum() > 0, lambda: a, lambda: b)

Each side is wrapped in a lambda so that, for a Python condition, only the
chosen side is evaluated, as in the original.
"""

from .base import Transformer


class IfExp(Transformer):
    def visit_IfExp(self, node):
        self.generic_visit(node)
        self.ctx.truth_tests.add(id(node.test))
        return self.expression("helpers.convert_ifexp(test, lambda: body, lambda: orelse)", node,
                               test=node.test, body=node.body, orelse=node.orelse)
