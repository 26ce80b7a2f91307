"""``if`` statements -> ``helpers.convert_ifelse`` over two branch functions.

Before::

    if x.sum() > 0:
        y = x + 1
    else:
        y = x - 1
    return y

After::

    def if_true():
        nonlocal y
        y = x + 1
    def if_false():
        nonlocal y
        y = x - 1
    (y,) = helpers.convert_ifelse(x.sum() > 0, if_true, if_false, ('y',), ('y',), (), (), ((2, 4),))

The state is the names either branch modifies that are live around the
``if``; each branch function declares the ones it assigns ``nonlocal``, and
the ``if`` assigns them all (so that this function binds every name it
declares ``nonlocal``). The runtime restores the state before each branch it
traces; the outputs (the state names live after the ``if``) are merged. Names
a branch only uses as temporaries stay local to it. Two more arguments
list compiler-generated names: the lowered return value, which may be
undefined on one side, and the lowered return's flag (a side where it is
True reaches no later use); then come the lines where each branch first
assigns each output, from which the runtime's messages name the user's
lines. A Python condition runs only the taken branch, exactly like the
``if`` it replaces.
"""

import gast

from ..ast_tools import activity, anno, liveness, templates
from .base import ScopedTransformer, assign, visit_block


class IfElse(ScopedTransformer):
    def transform(self, tree):
        self.liveness = liveness.analyze(tree, self.ctx.cell_reads, self.ctx.captured)
        return super().transform(tree)

    def visit_If(self, node):
        live_in, live_out = self.liveness.live_in[node], self.liveness.live_out[node]
        true_mod = activity.analyze(node.body).carried(self.variables)
        false_mod = activity.analyze(node.orelse).carried(self.variables)
        state = sorted((true_mod | false_mod) & (live_in | live_out))
        outputs = [n for n in state if n in live_out]
        lines = [(self._first_store(node.body, n), self._first_store(node.orelse, n)) for n in outputs]
        node.body = visit_block(self, node.body)
        node.orelse = visit_block(self, node.orelse)
        true_fn = self.ctx.namer.new("if_true")
        false_fn = self.ctx.namer.new("if_false")
        stmts = self.template(
            """
            def true_fn():
                nonlocal true_vars
                body
            def false_fn():
                nonlocal false_vars
                orelse
            """,
            node, true_fn=true_fn, false_fn=false_fn,
            true_vars=[n for n in state if n in true_mod], false_vars=[n for n in state if n in false_mod],
            body=node.body or [gast.Pass()], orelse=node.orelse or [gast.Pass()])
        # A guard that break/continue lowering generated names its jump (for
        # messages, and what the jumped side may still read); the jump flags an
        # arm may set say what a path that jumped may still read.
        jump = anno.getanno(node, anno.JUMP)
        jump_flags = tuple((n, tuple(sorted(self.ctx.jump_flags[n]))) for n in outputs if n in self.ctx.jump_flags)
        extra = ", jump, jump_flags" if jump_flags else ", jump" if jump else ""
        # Arms that never fall through (definedness marked them on the user's code).
        exits = anno.getanno(node, anno.EXITS, (False, False))
        extra += ", exits=exit_sides)" if any(exits) else ")"
        self.ctx.truth_tests.add(id(node.test))
        call = self.expression(
            "helpers.convert_ifelse(test, true_fn, false_fn, state, outputs, return_names, return_flags, lines"
            + extra, node, lines=templates.constant(tuple(lines)), exit_sides=templates.constant(exits),
            **({"jump": templates.constant(jump)} if jump or jump_flags else {}),
            **({"jump_flags": templates.constant(jump_flags)} if jump_flags else {}),
            test=node.test, true_fn=true_fn, false_fn=false_fn,
            state=templates.constant(tuple(state)), outputs=templates.constant(tuple(outputs)),
            return_names=templates.constant(tuple(n for n in outputs if n in self.ctx.return_names)),
            return_flags=templates.constant(tuple(n for n in outputs if n in self.ctx.return_flags)))
        # Every state name is assigned, not only the outputs: the branch
        # functions declare them `nonlocal`, so this function must bind them.
        return stmts + assign(state, call, node)

    def _first_store(self, stmts, name):
        """The user's line where ``stmts`` first assign ``name`` (for messages), or None."""
        lines = [n.lineno for s in stmts for n in gast.walk(s)
                 if isinstance(n, gast.Name) and n.id == name and isinstance(n.ctx, gast.Store)
                 and getattr(n, "lineno", None) is not None]
        return min(lines) + self.ctx.line_offset if lines else None
