"""``assert`` -> ``helpers.convert_assert``.

Before::

    assert x.min() >= 0, "negative input"

After::

    helpers.convert_assert(x.min() >= 0, lambda: "negative input")

A tensor condition becomes a run-time ``assert`` op; a Python condition is
checked right away. The message stays lazy, as in the original.
"""

from .base import Transformer


class Assert(Transformer):
    def visit_Assert(self, node):
        self.generic_visit(node)
        if node.msg is None:
            return self.template("helpers.convert_assert(test)", node, test=node.test)
        return self.template("helpers.convert_assert(test, lambda: msg)", node, test=node.test, msg=node.msg)
