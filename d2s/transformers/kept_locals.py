"""Names bound only in unreachable code stay locals.

Python decides at compile time that a name a function assigns anywhere is
one of its locals, so reading it where no assignment ran raises
``UnboundLocalError``, never a global's value. Return and BreakContinue drop
the statements after a ``return``/``break``/``continue`` (nothing runs
them); when those held a function's only assignment of a name, the
converted function would read a global of that name (or raise
``NameError``). Each such name is bound to ``Undefined`` at the top instead,
which every read turns into eager's ``UnboundLocalError`` (``convert_load``,
and the branch and loop helpers).

Before (after Return dropped ``y = 1``)::

    def f(x):
        if x.sum() > 0:
            do_return = True
            retval = x
        ...
        return helpers.convert_load(y)   # a global `y`, or NameError

After::

    def f(x):
        y = helpers.Undefined('y')
        ...
"""

import gast

from ..ast_tools import activity, anno, templates
from .base import Transformer


class KeptLocals(Transformer):
    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        lost = anno.getanno(node, anno.LOCALS, frozenset()) - activity.own_locals(node)
        bindings = [stmt for name in sorted(lost)
                    for stmt in self.template("name = helpers.Undefined(label)", node,
                                              name=name, label=templates.constant(name))]
        docstring = node.body[:1] if node.body and _is_docstring(node.body[0]) else []
        node.body = docstring + bindings + node.body[len(docstring):]
        return node


def _is_docstring(stmt):
    return (isinstance(stmt, gast.Expr) and isinstance(stmt.value, gast.Constant)
            and isinstance(stmt.value.value, str))
