"""``for`` loops -> ``while`` loops over an index.

Before::

    for x in items:
        body
    else:
        orelse

After::

    itr, ctr = helpers.convert_for_iter(items)
    while helpers.convert_for_test(itr, ctr):
        x, ctr = helpers.convert_for_next(itr, ctr)
        body
    else:
        orelse

``convert_for_iter`` decides at run time what the loop is: over a Python
sequence (``ctr`` is a Python int, the ``while`` stays Python and unrolls) or
over a tensor, a tensor ``range``, ``enumerate`` or ``zip`` (``ctr`` is a 0-d
tensor, the ``while`` becomes a graph loop). Lowering to ``while`` first means
``break``, ``continue`` and ``return`` only have one kind of loop to handle.
"""

import gast

from .base import Transformer, visit_block


class ForLoop(Transformer):
    def visit_For(self, node):
        node.body = visit_block(self, node.body)
        node.orelse = visit_block(self, node.orelse)
        itr = self.ctx.namer.new("itr")
        ctr = self.ctx.namer.new("ctr")
        self.ctx.for_counters[ctr] = itr
        return self.template(
            """
            itr, ctr = helpers.convert_for_iter(items)
            while helpers.convert_for_test(itr, ctr):
                target, ctr = helpers.convert_for_next(itr, ctr)
                body
            else:
                orelse
            """,
            node, itr=itr, ctr=ctr, items=node.iter, target=node.target,
            body=node.body or [gast.Pass()], orelse=node.orelse)

    def visit_AsyncFor(self, node):
        raise self.ctx.error(node, "`async for` is not supported; use a plain `for` loop")
