"""Definite assignment: which reads of a local variable may find it unbound.

``maybe_undefined(fn)`` walks function ``fn`` (not the functions nested in
it) forwards over its structured statements and returns the ``gast.Name``
load nodes of ``fn``'s own variables that some path reaches before any
assignment to the name. The rules, for the set ``D`` of names certainly
assigned:

- parameters start in ``D``; an assignment adds its targets after its value
  is evaluated (``x = x + 1`` reads ``x`` first);
- after an ``if``, ``D`` is the intersection over the branches that fall
  through: a branch that ends in ``return``, ``raise``, ``break`` or
  ``continue`` reaches nothing after the ``if`` and does not count (a name
  must be defined on every path that *reaches* its use);
- a loop body may run zero times: after a loop ``D`` is what it was before
  (plus what the ``else`` certainly assigns); ``try``, ``with`` and ``match``
  bodies count as possibly interrupted anywhere.

Names that are not variables of ``fn`` (globals, builtins, free names) are
never reported. Each ``if`` gets ``anno.EXITS``: (body, orelse) never fall
through (also in code no path reaches, which the lowering converts all the
same).
"""

import gast

from . import activity, anno

_NESTED = (gast.FunctionDef, gast.AsyncFunctionDef, gast.Lambda, gast.ClassDef,
           gast.ListComp, gast.SetComp, gast.DictComp, gast.GeneratorExp)


class _Top(frozenset):
    """The set of defined names on a path that never gets here: every name.

    It is an (empty) frozenset only so the set operators dispatch to it: it
    contains every name, meets another set as that set (`TOP & TOP` is TOP:
    both branches of an inner ``if`` return) and absorbs any union."""

    def __contains__(self, name):
        return True

    def __and__(self, other):
        return self if isinstance(other, _Top) else frozenset(other)

    __rand__ = __and__

    def __or__(self, other):
        return self

    __ror__ = __or__


TOP = _Top()


def maybe_undefined(fn):
    """The Name load nodes in ``fn``'s own scope that may read an unbound local."""
    visitor = _Definedness(activity.variables(fn) - activity.analyze(fn.body).nonlocals)
    visitor.block(fn.body, frozenset(activity.parameter_names(fn.args)))
    return visitor.found


class _Definedness:
    def __init__(self, local):
        self.local = local
        self.found = []

    def block(self, stmts, defined):
        for s in stmts:
            defined = self.stmt(s, defined)
        return defined

    def reads(self, node, defined):
        """Record the loads in expression ``node`` of names not in ``defined``."""
        if node is None:
            return
        stack = [node]
        while stack:
            n = stack.pop()
            if isinstance(n, gast.Name) and isinstance(n.ctx, gast.Load):
                if n.id in self.local and n.id not in defined:
                    self.found.append(n)
            elif isinstance(n, _NESTED):
                continue  # runs later, or in its own scope
            stack.extend(gast.iter_child_nodes(n))

    def stmt(self, s, defined):
        if isinstance(s, (gast.Return, gast.Raise)):
            for child in gast.iter_child_nodes(s):
                self.reads(child, defined)
            return TOP
        if isinstance(s, (gast.Break, gast.Continue)):
            return TOP
        if isinstance(s, gast.If):
            self.reads(s.test, defined)
            if isinstance(defined, _Top):
                # Code no path reaches (after `for ...: ... else: return`, whose
                # `else` always runs without a `break`) reports nothing, but the
                # lowering still converts it under a return flag that may be a
                # tensor, so its `if`s need their exits too: found by a probe
                # from a reachable start, whose reports are dropped.
                _Definedness(self.local).stmt(s, frozenset())
                return TOP
            body, orelse = self.block(s.body, defined), self.block(s.orelse, defined)
            # Which arms never fall through (every path returns, raises, breaks or
            # continues): the lowering turns those exits into flags that may be
            # tensors, after which only this says that such an arm defines nothing
            # the code after the `if` reads (see convert_ifelse's `exits`).
            anno.setanno(s, anno.EXITS, (isinstance(body, _Top), isinstance(orelse, _Top)))
            return body & orelse
        if isinstance(s, (gast.While, gast.For, gast.AsyncFor)):
            if isinstance(s, gast.While):
                self.reads(s.test, defined)
                inside = defined
            else:
                self.reads(s.iter, defined)
                inside = defined | _bound(s.target)
            self.block(s.body, inside)
            if not s.orelse:
                return defined
            after_else = self.block(s.orelse, defined)
            # A `break` skips the `else` (which may return): what the loop
            # guarantees there is what was defined before it.
            return after_else & defined if _breaks(s.body) else after_else
        if isinstance(s, (gast.With, gast.AsyncWith)):
            for item in s.items:
                self.reads(item.context_expr, defined)
                defined = defined | _bound(item.optional_vars)
            self.block(s.body, defined)
            return defined
        if isinstance(s, gast.Try) or type(s).__name__ in ("TryStar", "Match"):
            for child in gast.iter_child_nodes(s):
                if isinstance(child, gast.stmt):
                    self.block([child], defined)
                elif isinstance(child, gast.ExceptHandler):
                    self.block(child.body, defined | _bound(child.name))
                else:
                    self.reads(child, defined)
            return defined
        if isinstance(s, _NESTED):
            for child in getattr(s, "decorator_list", []) + getattr(s, "bases", []):
                self.reads(child, defined)
            args = getattr(s, "args", None)
            if args is not None:
                for d in args.defaults + [d for d in args.kw_defaults if d is not None]:
                    self.reads(d, defined)
            return defined | {s.name}
        for child in gast.iter_child_nodes(s):
            if not _is_target(child):
                self.reads(child, defined)
        return defined | activity.analyze(s).bound


def _breaks(stmts):
    """Whether `stmts` hold a `break` of their own loop (not of a nested one)."""
    stack = list(stmts)
    while stack:
        n = stack.pop()
        if isinstance(n, gast.Break):
            return True
        if not isinstance(n, (gast.While, gast.For, gast.AsyncFor) + _NESTED):
            stack.extend(gast.iter_child_nodes(n))
    return False


def _bound(node):
    return activity.analyze(node).bound if node is not None else frozenset()


def _is_target(node):
    ctx = getattr(node, "ctx", None)
    return isinstance(ctx, (gast.Store, gast.Del))
