"""``x += v`` on a name -> ``x = helpers.convert_augassign('+=', x, v)``.

Before::

    i += 1

After::

    i = helpers.convert_augassign('+=', i, 1)

Python rebinds ``x`` to ``operator.iadd(x, v)``, which mutates ``x`` when it
is a mutable object (a list, a tensor) and makes a new value when it is a
number. A 0-d graph tensor often *stands for* a number (a loop counter that a
tensor loop carries), so for those the helper computes the new value out of
place: an in-place op would also change every other name bound to the same
tensor (``last = i; i += 1``). Attribute and subscript targets
(``self.n += 1``, ``x[0] += 1``) stay as written.
"""

import gast

from ..ast_tools import templates
from .base import Transformer

SYMBOLS = {
    gast.Add: "+=", gast.Sub: "-=", gast.Mult: "*=", gast.Div: "/=", gast.FloorDiv: "//=",
    gast.Mod: "%=", gast.Pow: "**=", gast.MatMult: "@=", gast.BitAnd: "&=", gast.BitOr: "|=",
    gast.BitXor: "^=", gast.LShift: "<<=", gast.RShift: ">>=",
}


class AugAssign(Transformer):
    def visit_AugAssign(self, node):
        self.generic_visit(node)
        if not isinstance(node.target, gast.Name):
            return node
        return self.template("target = helpers.convert_augassign(op, value, operand)", node,
                             target=node.target.id, value=node.target.id,
                             op=templates.constant(SYMBOLS[type(node.op)]), operand=node.value)
