"""``x.append(v)`` statements -> ``helpers.convert_list_append``.

Before::

    outs.append(y)

After::

    helpers.convert_list_append(outs, y)

A list carried by a graph loop is a tensor array inside the loop; the helper
appends to a tensor array with an op and to anything else by calling its own
``append``. Runs after the loop and branch passes, whose activity analysis
recognises ``x.append(...)`` as modifying ``x``.
"""

import gast

from .base import Transformer


class ListAppend(Transformer):
    def visit_Expr(self, node):
        self.generic_visit(node)
        call = node.value
        if (isinstance(call, gast.Call) and isinstance(call.func, gast.Attribute)
                and call.func.attr == "append" and len(call.args) == 1 and not call.keywords
                and not isinstance(call.args[0], gast.Starred)):
            return self.template("helpers.convert_list_append(target, value)", node,
                                 target=call.func.value, value=call.args[0])
        return node
