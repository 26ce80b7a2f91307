"""``and`` / ``or`` / ``not`` and chained comparisons -> ``helpers.convert_logical_*``.

Before::

    if x > 0 and not done or 0 < i < n:
        ...

After::

    if helpers.convert_logical_or(
            lambda: helpers.convert_logical_and(lambda: x > 0, lambda: helpers.convert_logical_not(done),
                                                test=True),
            lambda: helpers.convert_logical_and(lambda: 0 < i, lambda: i < n, test=True), test=True):
        ...

    y = a and b
  ->
    y = helpers.convert_logical_and(lambda: a, lambda: b)

An ``if``/``while``/ternary/``assert`` test, and ``not``'s operand, needs
only its truth (``test=True``: ``torch.logical_and`` of graph tensors);
elsewhere the helpers yield Python's value, ``b if a else a``.

Operands become lambdas so that Python values keep their short-circuit
evaluation. A chained comparison is split into pairs when its middle
operands are names, constants or attributes (evaluating them twice is then
harmless); other chains go to ``helpers.convert_compare_chain``, which
evaluates each operand once, as Python does::

    if -1.0 < x.sum() < 3.0:
  ->
    if helpers.convert_compare_chain(lambda: -1.0, ('<', lambda: x.sum()), ('<', lambda: 3.0)):

``is`` / ``is not`` between two expressions that are not literals asks
``helpers.convert_is``, since a name a tensor ``if`` rebinds on one path is
one object or another depending on the path (ops/control_flow/identity.py)::

    if y is x:
  ->
    if helpers.convert_is(y, x):

(``y is None`` stays Python's: no path makes a tensor output None.)

``==`` / ``!=`` with a side written as a list or tuple ask
``helpers.convert_equal``: Python compares the items pair by pair, and a
pair holding a graph tensor has a truth the program computes::

    assert list(scores.size()) == [batch, heads, n_global, length]
  ->
    assert helpers.convert_equal(list(scores.size()), [batch, heads, n_global, length])

``in`` / ``not in`` ask ``helpers.convert_in``: ``3.0 in x`` of a graph
tensor is eager's ``Tensor.__contains__``, ``(x == 3.0).any()``, a bool the
program computes (Python's ``in`` would iterate it and test each row)::

    if 3.0 in x:
  ->
    if helpers.convert_in(3.0, x):
"""

import copy

import gast

from ..ast_tools import origin
from .base import Transformer

_SYMBOLS = {gast.Lt: "<", gast.LtE: "<=", gast.Gt: ">", gast.GtE: ">=", gast.Eq: "==", gast.NotEq: "!=",
            gast.Is: "is", gast.IsNot: "is not", gast.In: "in", gast.NotIn: "not in"}


def _written_as_sequence(node):
    """A list or tuple display, or a `list(...)`/`tuple(...)` call: an
    operand whose `==` compares items (d2s/operators/logical.py convert_equal)."""
    return isinstance(node, (gast.List, gast.Tuple, gast.ListComp)) or (
        isinstance(node, gast.Call) and isinstance(node.func, gast.Name) and node.func.id in ("list", "tuple"))


class Logical(Transformer):
    # Where only the truth of an expression matters (an if/while/ternary test
    # passes 7-9 recorded, an assert's test, the operand of `not`, a
    # comprehension's `if`, and so the operands of such an `and`/`or`), the
    # helpers get `test=True`: `torch.logical_and/or` of any two operands is
    # then exact. Elsewhere they must yield Python's value (`a and b` is
    # `b if a else a`).

    def _truth(self, node):
        self.ctx.truth_tests.add(id(node))

    def visit_Assert(self, node):
        self._truth(node.test)
        return self.generic_visit(node)

    def visit_comprehension(self, node):
        for test in node.ifs:
            self._truth(test)
        return self.generic_visit(node)

    def visit_BoolOp(self, node):
        truth = id(node) in self.ctx.truth_tests
        if truth:
            for value in node.values:
                self._truth(value)
        self.generic_visit(node)
        return self._chain(node, type(node.op), node.values, truth)

    def _identity(self, node):
        op, (right,) = node.ops[0], node.comparators
        if isinstance(op, (gast.Eq, gast.NotEq)) and any(map(_written_as_sequence, (node.left, right))):
            helper = "helpers.convert_equal(a, b)" if isinstance(op, gast.Eq) else "helpers.convert_not_equal(a, b)"
            return self.expression(helper, node, a=node.left, b=right)
        if isinstance(op, (gast.In, gast.NotIn)) and not isinstance(right, gast.Constant):
            helper = "helpers.convert_in(a, b)" if isinstance(op, gast.In) else "helpers.convert_not_in(a, b)"
            return self.expression(helper, node, a=node.left, b=right)
        if not isinstance(op, (gast.Is, gast.IsNot)) or any(
                isinstance(side, gast.Constant) for side in (node.left, right)):
            return node
        helper = "helpers.convert_is(a, b)" if isinstance(op, gast.Is) else "helpers.convert_is_not(a, b)"
        return self.expression(helper, node, a=node.left, b=right)

    def _chain(self, node, op, values, truth):
        if len(values) == 1:
            return values[0]
        template = {gast.And: "helpers.convert_logical_and(lambda: a, lambda: b",
                    gast.Or: "helpers.convert_logical_or(lambda: a, lambda: b"}[op]
        template += ", test=True)" if truth else ")"
        return self.expression(template, node, a=values[0], b=self._chain(node, op, values[1:], truth))

    def visit_UnaryOp(self, node):
        if isinstance(node.op, gast.Not):
            self._truth(node.operand)
        self.generic_visit(node)
        if isinstance(node.op, gast.Not):
            return self.expression("helpers.convert_logical_not(a)", node, a=node.operand)
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        middle = node.comparators[:-1]
        if len(node.ops) == 1:
            return self._identity(node)
        if not all(isinstance(m, (gast.Name, gast.Constant, gast.Attribute)) for m in middle):
            steps = [self.expression("(op, lambda: b)", node, op=gast.Constant(value=_SYMBOLS[type(op)], kind=None),
                                     b=c) for op, c in zip(node.ops, node.comparators)]
            call = self.expression("helpers.convert_compare_chain(lambda: a)", node, a=node.left)
            call.args += steps
            return call
        lefts = [node.left] + [copy.deepcopy(m) for m in middle]
        pairs = [gast.Compare(left=l, ops=[op], comparators=[r])
                 for l, op, r in zip(lefts, node.ops, node.comparators)]
        for p in pairs:
            origin.copy_location(p, node)
        return self._chain(node, gast.And, pairs, id(node) in self.ctx.truth_tests)
