"""``x.shape`` -> ``helpers.convert_shape(x)``.

Before::

    n = x.shape[0]

After::

    n = helpers.convert_shape(x)[0]

For a graph tensor the helper returns a tuple with Python ints for known
dimensions and 0-d tensors (computed at run time) for unknown ones; any
other object's ``shape`` is returned as it is.
"""

import gast

from .base import Transformer


class Shape(Transformer):
    def visit_Attribute(self, node):
        self.generic_visit(node)
        if node.attr == "shape" and isinstance(node.ctx, gast.Load):
            return self.expression("helpers.convert_shape(value)", node, value=node.value)
        return node
