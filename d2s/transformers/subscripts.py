"""Subscripts by a computed index -> ``helpers.convert_getitem``.

Before::

    scale = scales[k]

After::

    scale = helpers.convert_getitem(scales, k)

A Python tuple or list indexed by an int that depends on a tensor is read
by index when the program runs (``operators/subscripts.py``); any other
subscript is the subscript itself. Literal indices and slices (``x[0]``,
``x[1:]``, ``x[:, 0]``) stay as they are: they are never run-time ints.
"""

import gast

from .base import Transformer


class Subscripts(Transformer):
    def visit_Subscript(self, node):
        self.generic_visit(node)
        index = node.slice
        if not isinstance(node.ctx, gast.Load) or isinstance(index, (gast.Slice, gast.Tuple, gast.Constant)) or (
                isinstance(index, gast.UnaryOp) and isinstance(index.operand, gast.Constant)):
            return node
        return self.expression("helpers.convert_getitem(value, index)", node, value=node.value, index=index)
