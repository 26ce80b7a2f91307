"""Early ``return`` -> a flag, a value variable and one final ``return``.

Before::

    def f(x):
        while cond:
            if c:
                return a
            x = g(x)
        return x

After::

    def f(x):
        do_return = False
        while not do_return and cond:
            if c:
                do_return = True
                retval = a
            if not do_return:
                x = g(x)
            else:
                do_return = True
        if not do_return:
            do_return = True
            retval = x
        else:
            do_return = True
        return retval

Statements after one that may return are guarded by ``if not do_return``
(whose ``else`` states that the flag is set: see ``_block``);
statements after one that always returns are dropped. A function that can
fall off its end gets an explicit ``return None`` first, so every path sets
``retval``. ``retval`` is registered in ``ctx.return_names``: a branch or loop
may leave it undefined on one side. When every ``return`` returns a literal
k-tuple, there are k value variables (``retval_0, retval_1 = a, b``), so
that branches and loops carry tensors rather than tuples. Functions whose only ``return`` is their
last statement are left alone.
"""

import gast

from ..ast_tools.origin import copy_location
from . import break_continue
from .base import Transformer, map_bodies, own_nodes, own_nodes_in


class Return(Transformer):
    def transform(self, tree):
        break_continue.record_jump_liveness(tree, self.ctx)
        return super().transform(tree)

    def visit_FunctionDef(self, node):
        self.generic_visit(node)  # nested functions first; they are their own scopes
        returns = own_nodes_in(node.body, (gast.Return,))
        if not returns or (len(returns) == 1 and node.body[-1] is returns[0]):
            return node
        body = list(node.body)
        if not _always_returns(body):
            body.append(_located(gast.Return(value=None), body[-1]))
        self.flag = self.ctx.namer.new("do_return")
        self.ctx.return_flags.add(self.flag)
        arity = _tuple_arity(returns) if _always_returns(node.body) else None
        if arity is None:
            self.value = self.ctx.namer.new("retval")
            self.ctx.return_names.add(self.value)
        else:  # one variable per element: branches and loops carry tensors, not tuples
            self.value = [self.ctx.namer.new(f"retval_{i}") for i in range(arity)]
            self.ctx.return_names.update(self.value)
        node.body = (self.template("flag = False", node.body[0], flag=self.flag)
                     + self._block(body)
                     + self.template("return retval", returns[-1], retval=self.value))
        return node

    def visit_Lambda(self, node):
        return node

    def _block(self, stmts):
        out = []
        for i, s in enumerate(stmts):
            always, may = _always_returns([s]), bool(own_nodes(s, (gast.Return,)))
            out.extend(self._stmt(s))
            rest = stmts[i + 1:]
            if always or not rest:
                break
            if may:
                # `else: flag = True` restates what that side knows: it has
                # returned, so nothing it leaves unset is read later (the
                # runtime sees a Python True there even when the flag is a
                # tensor, as after an `if` on a tensor whose arms both return).
                out += self.template("if not flag:\n    rest\nelse:\n    flag = True", rest[0],
                                     flag=self.flag, rest=self._block(rest))
                break
        return out

    def _stmt(self, s):
        if isinstance(s, gast.Return):
            value = s.value if s.value is not None else gast.Constant(value=None, kind=None)
            return self.template("flag = True\nretval = value", s,
                                 flag=self.flag, retval=self.value, value=value)
        if not own_nodes(s, (gast.Return,)):
            return [s]
        if isinstance(s, gast.While):
            s.body = self._block(s.body)
            # The flag first: once the body returned, the test must not run again.
            s.test = self.expression("not flag and test", s.test, test=s.test, flag=self.flag)
            if s.orelse:  # `else` runs only when the loop ended normally, never after a return
                # (`else: flag = True` as in `_block`: the side that returned reads nothing it leaves unset.)
                s.orelse = self.template("if not flag:\n    orelse\nelse:\n    flag = True", s.orelse[0],
                                         flag=self.flag,
                                         orelse=self._block(s.orelse))
        elif not map_bodies(s, self._block):
            raise self.ctx.error(s, f"`return` inside `{type(s).__name__}` is not supported")
        return [s]


def _tuple_arity(returns):
    """k when every ``return`` returns a literal k-tuple (k >= 2, no ``*``), else None."""
    sizes = {len(r.value.elts) if isinstance(r.value, gast.Tuple)
             and not any(isinstance(e, gast.Starred) for e in r.value.elts) else None
             for r in returns}
    (size,) = sizes if len(sizes) == 1 else (None,)
    return size if size is not None and size >= 2 else None


def _always_returns(stmts):
    """True when running ``stmts`` certainly ends in ``return`` or ``raise`` (or never ends)."""
    for s in stmts:
        if isinstance(s, (gast.Return, gast.Raise)):
            return True
        if isinstance(s, gast.If) and _always_returns(s.body) and _always_returns(s.orelse):
            return True
        if isinstance(s, (gast.With, gast.AsyncWith)) and _always_returns(s.body):
            return True
        if isinstance(s, gast.Try) and (_always_returns(s.finalbody) or (
                _always_returns(s.body) and all(_always_returns(h.body) for h in s.handlers))):
            return True
        if isinstance(s, gast.Match) and s.cases and _irrefutable(s.cases[-1]) and all(
                _always_returns(case.body) for case in s.cases):
            return True
        if (isinstance(s, gast.While) and isinstance(s.test, gast.Constant) and s.test.value is True
                and not own_nodes_in(s.body, (gast.Break,))):
            return True  # `while True:` without break only leaves by return or raise
    return False


def _irrefutable(case):
    """`case _:` or `case name:` without a guard: it matches every subject."""
    pattern = case.pattern
    while isinstance(pattern, gast.MatchAs) and pattern.pattern is not None:
        pattern = pattern.pattern
    return case.guard is None and isinstance(pattern, gast.MatchAs)


def _located(node, origin):
    copy_location(node, origin)
    return node
