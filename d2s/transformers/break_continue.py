"""``break`` / ``continue`` -> flags; ``while ... else`` -> a guarded block.

Before::

    while test:
        a()
        if c:
            break
        if d:
            continue
        b()
    else:
        e()

After::

    broke = False
    while not broke and test:
        continued = False
        a()
        if c:
            broke = True
        if not broke:
            if d:
                continued = True
            if not continued:
                b()
    if not broke:
        e()

Statements after one that may break or continue are guarded by the flags;
statements after a bare ``break``/``continue`` are dropped. The loop's ``else``
moves after the loop (guarded by ``not broke`` when the loop can break), so
later passes only see ``while`` loops without ``else``. Runs after ``for`` and
``return`` lowering, so every loop here is a ``while``.
"""

import gast

from .base import Transformer, map_bodies, own_nodes, own_nodes_in, visit_block


class BreakContinue(Transformer):
    def visit_While(self, node):
        node.body = visit_block(self, node.body)  # inner loops first: their jumps are theirs
        node.orelse = visit_block(self, node.orelse)
        breaks = own_nodes_in(node.body, (gast.Break,))
        continues = own_nodes_in(node.body, (gast.Continue,))
        self.broke = self.ctx.namer.new("broke") if breaks else None
        self.continued = self.ctx.namer.new("continued") if continues else None
        if not breaks and not continues:
            before, after = [], node.orelse
        else:
            node.body = self._block(node.body)
            before, after = [], node.orelse
            if continues:
                node.body = self.template("flag = False", node, flag=self.continued) + node.body
            if breaks:
                before = self.template("flag = False", node, flag=self.broke)
                node.test = self.expression("not flag and test", node.test, test=node.test, flag=self.broke)
                if after:
                    after = self.template("if not flag:\n    orelse", node.orelse[0], flag=self.broke, orelse=after)
        node.orelse = []
        return before + [node] + after

    def _block(self, stmts):
        out = []
        for i, s in enumerate(stmts):
            jumps = own_nodes(s, (gast.Break, gast.Continue))
            may_break = any(isinstance(j, gast.Break) for j in jumps)
            may_continue = any(isinstance(j, gast.Continue) for j in jumps)
            out.extend(self._stmt(s))
            rest = stmts[i + 1:]
            if isinstance(s, (gast.Break, gast.Continue)) or not rest:
                break
            if may_break or may_continue:
                # The guard stands for the jump: it is located there, and tells
                # the runtime's messages which jump (a name the rest assigns is
                # unset on the path that takes it).
                first = min(jumps, key=lambda j: (j.lineno, j.col_offset))
                guard = self.template("if not jumped:\n    rest", first,
                                      jumped=self._jumped(first, may_break, may_continue),
                                      rest=self._block(rest))
                kind = "break` or `continue" if may_break and may_continue else \
                    "break" if may_break else "continue"
                guard[0].d2s_jump = (kind, self.ctx.user_line(first))
                out += guard
                break
        return out

    def _jumped(self, node, may_break, may_continue):
        if may_break and may_continue:
            return self.expression("broke or continued", node, broke=self.broke, continued=self.continued)
        return self.expression("flag", node, flag=self.broke if may_break else self.continued)

    def _stmt(self, s):
        if isinstance(s, gast.Break):
            return self.template("flag = True", s, flag=self.broke)
        if isinstance(s, gast.Continue):
            return self.template("flag = True", s, flag=self.continued)
        if not own_nodes(s, (gast.Break, gast.Continue)):
            return [s]
        if not map_bodies(s, self._block):
            raise self.ctx.error(s, f"`break`/`continue` inside `{type(s).__name__}` is not supported")
        return [s]
