"""What every transformer shares: the conversion context and a base class."""

from dataclasses import dataclass, field

import gast

from runtime.errors import ConversionError

from ..ast_tools import activity, origin, templates
from ..ast_tools.naming import Namer


@dataclass
class Context:
    """State of one function's conversion, shared by the pipeline's passes.

    ``helpers`` is the fresh name under which generated code reaches
    ``d2s.operators``. ``return_names`` holds compiler-generated names
    (the lowered return value) that control-flow ops may leave undefined on
    one side: the return transformer adds to it, the loop and branch
    transformers pass it on to the runtime. ``return_flags`` holds the
    lowered ``return``'s flags: on a path where one is True, nothing after
    the branch uses the names it leaves undefined. ``jump_flags`` maps the
    lowered ``break``/``continue`` flags to the names that the path taking
    the jump may still read (live after the loop, or at its head): on a path
    where the flag is True, the other names it leaves undefined are never
    read. ``cell_reads`` maps a
    generated statement (by id) to the names its helper reads through closure
    cells (see ``liveness.analyze``), for the analyses of later passes.
    ``truth_tests`` holds (by id) the tests of the ifs, loops and ternaries
    passes 7-9 turn into helper calls: only their truth matters, which lets
    ``Logical`` give their ``and``/``or`` the cheaper truth-only form.
    ``for_counters`` maps the counter of each ``for`` loop pass 4 lowered to
    a ``while`` loop to its iterable's name (the runtime advances the
    counter itself when it unrolls a loop over a Python sequence under a
    tensor condition).
    ``captured`` holds the function's names its user's own nested functions
    and lambdas read or rebind (found before any pass adds functions): the
    liveness analyses keep them live everywhere, so branches and loops that
    assign them share the function's cell (late binding, as eagerly).
    """

    filename: str
    line_offset: int
    namer: Namer
    helpers: str
    return_names: set = field(default_factory=set)
    return_flags: set = field(default_factory=set)
    jump_flags: dict = field(default_factory=dict)
    cell_reads: dict = field(default_factory=dict)
    truth_tests: set = field(default_factory=set)
    for_counters: dict = field(default_factory=dict)
    captured: frozenset = frozenset()
    owner_class: str = None  # the innermost class the function is defined in (private_names.py)

    def error(self, node, message):
        lineno = getattr(node, "lineno", None)
        return ConversionError(message, self.filename,
                               None if lineno is None else lineno + self.line_offset)

    def user_line(self, node):
        return node.lineno + self.line_offset


class Transformer(gast.NodeTransformer):
    """A pass over a function tree. ``transform`` runs it and returns the tree."""

    def __init__(self, ctx):
        self.ctx = ctx

    def transform(self, tree):
        return self.visit(tree)

    def template(self, source, node, **subs):
        """Statements from ``source``; the helpers placeholder is always ``helpers``.

        Every generated node takes ``node``'s location.
        """
        stmts = templates.replace(source, helpers=self.ctx.helpers, **subs)
        origin.set_origin(stmts, node)
        return stmts

    def expression(self, source, node, **subs):
        expr = templates.replace_as_expression(source, helpers=self.ctx.helpers, **subs)
        origin.set_origin(expr, node)
        return expr

    def is_helper_call(self, node):
        """True for a call to ``helpers.something`` (code we generated)."""
        func = node.func
        return (isinstance(func, gast.Attribute) and isinstance(func.value, gast.Name)
                and func.value.id == self.ctx.helpers)


class ScopedTransformer(Transformer):
    """A pass that knows, at each node, the variables of the function scope it
    is in (``self.variables``, see ``activity.variables``)."""

    def transform(self, tree):
        self._scopes = [frozenset()]
        return self.visit(tree)

    @property
    def variables(self):
        return self._scopes[-1]

    def _scope(self, node):
        self._scopes.append(frozenset(activity.variables(node, self._scopes[-1])))
        try:
            return self.generic_visit(node)
        finally:
            self._scopes.pop()

    visit_FunctionDef = visit_Lambda = _scope


def assign(names, value, node):
    """``[a, b = value]`` (``[value]`` as a statement when ``names`` is empty),
    located at ``node``."""
    if not names:
        stmt = gast.Expr(value=value)
    else:
        elts = [templates.name(n, gast.Store()) for n in names]
        stmt = gast.Assign(targets=[gast.Tuple(elts=elts, ctx=gast.Store())], value=value, type_comment=None)
    origin.set_origin(stmt, node)
    return [stmt]


def visit_block(transformer, stmts):
    """Visit a statement list, splicing statements that turned into lists."""
    out = []
    for s in stmts:
        result = transformer.visit(s)
        if result is None:
            continue
        out.extend(result if isinstance(result, list) else [result])
    return out


def own_nodes(node, kinds):
    """Nodes of ``kinds`` inside statement ``node`` that belong to its scope:
    not inside nested functions, lambdas or classes (nor, for Break/Continue,
    inside nested loops). A function or (for jumps) loop statement owns none:
    what it contains is its own business."""
    stop = (gast.FunctionDef, gast.AsyncFunctionDef, gast.Lambda, gast.ClassDef)
    if any(k in (gast.Break, gast.Continue) for k in kinds):
        stop += (gast.For, gast.While, gast.AsyncFor)
    found = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, stop):
            continue
        if isinstance(n, kinds):
            found.append(n)
        stack.extend(gast.iter_child_nodes(n))
    return found


def own_nodes_in(stmts, kinds):
    return [n for s in stmts for n in own_nodes(s, kinds)]


def map_bodies(stmt, rewrite):
    """Apply `rewrite` (a list of statements -> a list of statements) to every
    statement list of an `if`, `with`, `try` or `match` (its patterns and
    guards are Python's: a tensor subject meets them as eagerly); returns
    False for any other statement, whose bodies a jump transformer cannot
    rewrite in place."""
    if isinstance(stmt, gast.If):
        stmt.body, stmt.orelse = rewrite(stmt.body), rewrite(stmt.orelse)
    elif isinstance(stmt, (gast.With, gast.AsyncWith)):
        stmt.body = rewrite(stmt.body)
    elif isinstance(stmt, gast.Try):
        stmt.body, stmt.orelse, stmt.finalbody = rewrite(stmt.body), rewrite(stmt.orelse), rewrite(stmt.finalbody)
        for handler in stmt.handlers:
            handler.body = rewrite(handler.body)
    elif isinstance(stmt, gast.Match):
        for case in stmt.cases:
            case.body = rewrite(case.body)
    else:
        return False
    return True
