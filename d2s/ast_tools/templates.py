"""Build code from readable templates.

A template is ordinary Python source whose placeholder *names* are replaced
by AST nodes::

    replace('''
        def body_fn():
            nonlocal state
            body
        ''', body_fn='loop_body', state=['x', 'i'], body=stmts)

Replacement rules for a placeholder ``k`` (keys of ``subs``):

- a ``Name`` ``k``: a ``str`` gives a Name with that id; an expression node is
  copied in (its context set to the placeholder's Load/Store); a list of
  names/expressions gives a Tuple; a list of statements replaces a statement
  that is just ``k``.
- a function name ``def k():`` takes the ``str``.
- ``nonlocal k`` / ``global k`` expand to the listed names (and disappear when
  the list is empty).

User names only ever enter generated code as AST nodes or identifiers, never
through string formatting of code.
"""

import copy
import textwrap

import gast

from . import origin


def replace(template, **subs):
    """Return the list of statements ``template`` describes."""
    module = gast.parse(textwrap.dedent(template))
    origin.strip(module)
    _Replacer(subs).visit(module)
    return module.body


def replace_as_expression(template, **subs):
    """Return the single expression ``template`` describes."""
    (stmt,) = replace(template, **subs)
    if not isinstance(stmt, gast.Expr):
        raise ValueError(f"template is not an expression: {template!r}")
    return stmt.value


def constant(value):
    """A gast node for a Python constant (tuples of constants included)."""
    if isinstance(value, (tuple, list)):
        return gast.Tuple(elts=[constant(v) for v in value], ctx=gast.Load())
    return gast.Constant(value=value, kind=None)


def name(identifier, ctx=None):
    return gast.Name(id=identifier, ctx=ctx or gast.Load(), annotation=None, type_comment=None)


def with_context(node, ctx):
    """Set the Load/Store/Del context of an assignable expression, in place."""
    if isinstance(node, (gast.Name, gast.Attribute, gast.Subscript, gast.Starred, gast.Tuple, gast.List)):
        node.ctx = ctx
    if isinstance(node, (gast.Tuple, gast.List)):
        for elt in node.elts:
            with_context(elt, type(ctx)())
    elif isinstance(node, gast.Starred):
        with_context(node.value, type(ctx)())
    return node


class _Replacer(gast.NodeTransformer):
    def __init__(self, subs):
        self.subs = subs
        self.used = set()

    def _fresh(self, key, node):
        # The first use takes the node itself; later uses take copies, so no
        # node is shared between two places in the tree.
        if key in self.used:
            return copy.deepcopy(node)
        self.used.add(key)
        return node

    def _expression(self, key, ctx):
        value = self.subs[key]
        if isinstance(value, str):
            return name(value, ctx)
        if isinstance(value, (list, tuple)):
            elts = [name(v) if isinstance(v, str) else copy.deepcopy(v) for v in value]
            return with_context(gast.Tuple(elts=elts, ctx=gast.Load()), ctx)
        return with_context(self._fresh(key, value), ctx)

    def visit_Name(self, node):
        if node.id in self.subs:
            return self._expression(node.id, type(node.ctx)())
        return node

    def visit_Expr(self, node):
        if isinstance(node.value, gast.Name) and node.value.id in self.subs:
            value = self.subs[node.value.id]
            if isinstance(value, (list, tuple)) and all(isinstance(v, gast.stmt) for v in value):
                return list(value)
            if isinstance(value, gast.stmt):
                return value
        return self.generic_visit(node)

    def visit_FunctionDef(self, node):
        if node.name in self.subs:
            node.name = self.subs[node.name]
        return self.generic_visit(node)

    def _declaration(self, node):
        names = []
        for n in node.names:
            value = self.subs.get(n, n)
            names.extend([value] if isinstance(value, str) else value)
        if not names:
            return None
        node.names = names
        return node

    visit_Nonlocal = visit_Global = _declaration
