"""Activity analysis: which names a piece of code reads and which it modifies.

``analyze(code)`` takes a statement, an expression or a list of them, all in
one function scope, and returns an ``Activity``. Rules:

- ``x = ...``, ``x += ...``, ``del x``, ``for x in``, ``with ... as x``,
  ``import x``, ``def x``, ``class x``, ``except E as x``, ``(x := ...)``
  modify ``x``.
- ``x[i] = ...`` and mutating method calls on a bare name (``x.append(v)``,
  ``x.extend``, ``x.pop``, ...) modify ``x``: the object a loop or branch
  carries changes. Attribute assignment (``obj.a = v``) only reads ``obj``.
- A nested ``def``/``lambda``/comprehension is its own scope: it reads the
  names it uses but does not bind (its free names) and modifies the names it
  declares ``nonlocal`` and assigns. Its body runs later, but it is treated
  as running where it is defined: that is exactly how the generated branch
  and loop functions are used, and is conservative for user closures.
"""

from dataclasses import dataclass, field

import gast

MUTATING_METHODS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "update", "add",
    "discard", "setdefault", "popitem", "sort", "reverse",
})

_SCOPES = (gast.FunctionDef, gast.AsyncFunctionDef, gast.Lambda, gast.ListComp,
           gast.SetComp, gast.DictComp, gast.GeneratorExp, gast.ClassDef)


@dataclass
class Activity:
    read: set = field(default_factory=set)
    modified: set = field(default_factory=set)
    nonlocals: set = field(default_factory=set)   # declared nonlocal in this scope
    globals: set = field(default_factory=set)     # declared global in this scope


def analyze(code):
    """Activity of a node or list of nodes of one scope."""
    visitor = _Visitor()
    for node in code if isinstance(code, (list, tuple)) else [code]:
        visitor.visit(node)
    return visitor.activity


def scope_activity(fn):
    """Activity of a function or lambda *as seen from outside it*.

    ``read``: its free names (and names read by defaults/decorators);
    ``modified``: the nonlocal names it assigns. The function's own name is not
    included (binding it is the enclosing ``def`` statement's business).
    """
    inner = analyze(fn.body)
    params = parameter_names(fn.args)
    local = (inner.modified | params) - inner.nonlocals - inner.globals
    outside = analyze(fn.args.defaults + [d for d in fn.args.kw_defaults if d is not None])
    if not isinstance(fn, gast.Lambda):
        outside = _merge(outside, analyze(fn.decorator_list))
    return Activity(read=(inner.read - local) | outside.read,
                    modified=inner.modified & inner.nonlocals)


def parameter_names(args):
    names = [a.id for a in args.posonlyargs + args.args + args.kwonlyargs]
    names += [a.id for a in (args.vararg, args.kwarg) if a is not None]
    return set(names)


def _merge(a, b):
    return Activity(a.read | b.read, a.modified | b.modified, a.nonlocals | b.nonlocals, a.globals | b.globals)


def root_name(node):
    """``x`` for ``x``, ``x.a``, ``x[i].b``; None for anything else."""
    while isinstance(node, (gast.Attribute, gast.Subscript)):
        node = node.value
    return node.id if isinstance(node, gast.Name) else None


class _Visitor(gast.NodeVisitor):
    def __init__(self):
        self.activity = Activity()

    def visit_Name(self, node):
        if isinstance(node.ctx, gast.Load):
            self.activity.read.add(node.id)
        elif isinstance(node.ctx, (gast.Store, gast.Del, gast.Param)):
            self.activity.modified.add(node.id)

    def visit_AugAssign(self, node):
        if isinstance(node.target, gast.Name):
            self.activity.read.add(node.target.id)
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if not isinstance(node.ctx, gast.Load) and isinstance(node.value, gast.Name):
            self.activity.modified.add(node.value.id)
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if (isinstance(func, gast.Attribute) and func.attr in MUTATING_METHODS
                and isinstance(func.value, gast.Name)):
            self.activity.modified.add(func.value.id)
        self.generic_visit(node)

    def visit_Global(self, node):
        self.activity.globals.update(node.names)

    def visit_Nonlocal(self, node):
        self.activity.nonlocals.update(node.names)

    def visit_alias(self, node):
        self.activity.modified.add((node.asname or node.name).split(".")[0])

    def _function(self, node):
        inner = scope_activity(node)
        self.activity.read |= inner.read
        self.activity.modified |= inner.modified
        if not isinstance(node, gast.Lambda):
            self.activity.modified.add(node.name)
        if getattr(node, "returns", None) is not None:
            self.visit(node.returns)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node):
        self.activity.modified.add(node.name)
        for child in node.bases + node.keywords + node.decorator_list:
            self.visit(child)
        body = analyze(node.body)  # class bodies bind class attributes, not our names
        self.activity.read |= body.read - body.modified

    def _comprehension(self, node):
        # The first iterable is evaluated in the enclosing scope; targets are local.
        self.visit(node.generators[0].iter)
        inner = analyze([g.target for g in node.generators] + [g.iter for g in node.generators[1:]]
                        + [c for g in node.generators for c in g.ifs]
                        + ([node.key, node.value] if isinstance(node, gast.DictComp) else [node.elt]))
        targets = analyze([g.target for g in node.generators]).modified
        self.activity.read |= inner.read - targets
        self.activity.modified |= _walrus_targets(node)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension


def _walrus_targets(node):
    # `(y := v)` inside a comprehension binds y in the enclosing function.
    return {n.target.id for n in gast.walk(node) if isinstance(n, gast.NamedExpr)}
