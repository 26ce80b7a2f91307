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

from ..ast_tools import anno, liveness
from .base import Transformer, map_bodies, own_nodes, own_nodes_in, visit_block


def record_jump_liveness(tree, ctx):
    """Note on each ``while`` of ``tree`` what a path taking a jump out of its
    body may still read: after ``break``, what is live after the loop; after
    ``continue``, what is live at its head. Return lowering calls this before
    it runs: with ``return`` still a statement, liveness knows that nothing
    after it is read (after lowering, only a flag says so)."""
    result = liveness.analyze(tree, ctx.cell_reads, ctx.captured)
    for node in gast.walk(tree):
        if isinstance(node, gast.While) and node in result.live_out:
            after = frozenset(result.live_out[node])
            anno.setanno(node, anno.JUMP_LIVE, (after, frozenset(result.live_in[node]) | after))


class BreakContinue(Transformer):
    def transform(self, tree):
        if any(isinstance(n, gast.While) and not anno.hasanno(n, anno.JUMP_LIVE) for n in gast.walk(tree)):
            record_jump_liveness(tree, self.ctx)  # run without the Return pass before it
        return super().transform(tree)

    def visit_While(self, node):
        live_after, live_head = anno.getanno(node, anno.JUMP_LIVE)
        node.body = visit_block(self, node.body)  # inner loops first: their jumps are theirs
        node.orelse = visit_block(self, node.orelse)
        breaks = own_nodes_in(node.body, (gast.Break,))
        continues = own_nodes_in(node.body, (gast.Continue,))
        self.broke = self.ctx.namer.new("broke") if breaks else None
        self.continued = self.ctx.namer.new("continued") if continues else None
        if breaks:
            self.ctx.jump_flags[self.broke] = live_after
        if continues:
            self.ctx.jump_flags[self.continued] = live_head
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
                flags = [f for f, may in ((self.broke, may_break), (self.continued, may_continue)) if may]
                live = frozenset().union(*(self.ctx.jump_flags[f] for f in flags))
                anno.setanno(guard[0], anno.JUMP, (kind, self.ctx.user_line(first), tuple(sorted(live))))
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
