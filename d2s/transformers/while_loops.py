"""``while`` loops -> ``helpers.convert_while`` over a test and a body function.

Before::

    while i < n:
        x = x * 2
        i += 1

After::

    def loop_test():
        return i < n
    def loop_body():
        nonlocal i, x
        x = x * 2
        i += 1
    i, x = helpers.convert_while(loop_test, loop_body, ('i', 'x'), ())

The loop variables are the names the body modifies that are live around the
loop (read by the test or body before being written, or read after the
loop, as liveness found before ``return``/``break``/``continue`` became
flags); the body function declares them ``nonlocal`` and the runtime reads and
writes them through its closure cells. Names the body only uses as
temporaries stay local to it. The last argument lists the compiler-generated
names that may start undefined (the lowered return value). Runs after
``break``/``continue`` lowering, so loops have no ``else``.
"""

from ..ast_tools import activity, anno, liveness, templates
from .base import ScopedTransformer, assign, visit_block


class WhileLoop(ScopedTransformer):
    def transform(self, tree):
        self.liveness = liveness.analyze(tree, captured=self.ctx.captured)
        return super().transform(tree)

    def visit_While(self, node):
        live = self.liveness.live_in[node] | self.liveness.live_out[node]
        # Liveness taken before returns, breaks and continues became flags
        # knows that nothing after a jump reads a name its path left unset
        # (here, a flag says so only at run time): of the user's names, only
        # those live then are carried; the lowering's own flags and values
        # as they are live now.
        precise = anno.getanno(node, anno.JUMP_LIVE)
        if precise is not None:
            generated = self.ctx.return_names | self.ctx.return_flags | set(self.ctx.jump_flags)
            live = (live & (precise[1] | generated))
        loop_vars = sorted(activity.analyze(node.body).carried(self.variables) & live)
        node.body = visit_block(self, node.body)
        self.ctx.truth_tests.add(id(node.test))
        test_fn = self.ctx.namer.new("loop_test")
        body_fn = self.ctx.namer.new("loop_body")
        stmts = self.template(
            """
            def test_fn():
                return test
            def body_fn():
                nonlocal loop_vars
                body
            """,
            node, test_fn=test_fn, body_fn=body_fn, test=node.test, loop_vars=loop_vars,
            body=node.body + node.orelse)
        # A lowered `for` names its counter (advanced on every path when the
        # runtime unrolls a loop over a Python sequence under a tensor test).
        counter = [n for n in loop_vars if n in self.ctx.for_counters]
        call = self.expression(
            "helpers.convert_while(test_fn, body_fn, names, return_names"
            + (", counter=(ctr, itr))" if counter else ")"),
            node, test_fn=test_fn, body_fn=body_fn, names=templates.constant(tuple(loop_vars)),
            return_names=templates.constant(tuple(n for n in loop_vars if n in self.ctx.return_names)),
            **({"ctr": templates.constant(counter[0]), "itr": self.ctx.for_counters[counter[0]]} if counter else {}))
        result = assign(loop_vars, call, node)
        # The helper reads the loop variables' values from before the loop.
        self.ctx.cell_reads[id(result[0])] = set(loop_vars) & self.liveness.live_in[node]
        return stmts + result

