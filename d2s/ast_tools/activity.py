"""Activity analysis: which names a piece of code reads and which it modifies.

``analyze(code)`` takes a statement, an expression or a list of them, all in
one function scope, and returns an ``Activity``. Rules:

- ``x = ...``, ``x += ...``, ``del x``, ``for x in``, ``with ... as x``,
  ``import x``, ``def x``, ``class x``, ``except E as x``, ``(x := ...)``,
  a ``match`` pattern's capture (``case (x, *y)``, ``case {**x}``,
  ``case P() as x``) modify ``x``.
- ``x[i] = ...`` and mutating method calls on a bare name or ``convert_load(x)`` (``x.append(v)``,
  ``x.extend``, ``x.pop``, ...) *mutate* ``x``: the object changes, the name
  does not. ``modified`` holds both kinds; ``bound`` only the rebound names,
  ``mutated`` only the others. Whether a mutation matters to a branch or loop
  depends on whether ``x`` is one of the function's variables at all: the
  same syntax is ``torch.add(a, b)`` or ``torch.sort(t)`` on a module, so the
  transformers carry ``mutated & variables(scope)`` (see ``variables``).
  Attribute assignment (``obj.a = v``) only reads ``obj``.
- A nested ``def``/``lambda``/comprehension is its own scope: it reads the
  names it uses but does not bind (its free names) and modifies the names it
  declares ``nonlocal`` and assigns. Its body runs later, but it is treated
  as running where it is defined: that is exactly how the generated branch
  and loop functions are used, and is conservative for user closures. A
  call of such a user closure (``mark_closure_calls``) also modifies the
  names it rebinds, where it is called.
"""

from dataclasses import dataclass, field

import gast

from . import anno

MUTATING_METHODS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "update", "add",
    "discard", "setdefault", "popitem", "sort", "reverse",
})

_SCOPES = (gast.FunctionDef, gast.AsyncFunctionDef, gast.Lambda, gast.ListComp,
           gast.SetComp, gast.DictComp, gast.GeneratorExp, gast.ClassDef)


@dataclass
class Activity:
    read: set = field(default_factory=set)
    bound: set = field(default_factory=set)       # rebound names
    mutated: set = field(default_factory=set)     # names whose object may change in place
    nonlocals: set = field(default_factory=set)   # declared nonlocal in this scope
    globals: set = field(default_factory=set)     # declared global in this scope

    @property
    def modified(self):
        return self.bound | self.mutated

    def carried(self, variables):
        """The names a branch or loop running this code changes: every
        rebound name, and mutated objects named by a variable of the scope."""
        return self.bound | (self.mutated & variables)


def analyze(code):
    """Activity of a node or list of nodes of one scope."""
    visitor = _Visitor()
    for node in code if isinstance(code, (list, tuple)) else [code]:
        visitor.visit(node)
    return visitor.activity


def scope_activity(fn):
    """Activity of a function or lambda *as seen from outside it*.

    ``read``: its free names (and names read by defaults/decorators);
    ``bound``: the nonlocal names it assigns; ``mutated``: the free names whose
    objects it may change in place. The function's own name is not
    included (binding it is the enclosing ``def`` statement's business).
    """
    inner = analyze(fn.body)
    params = parameter_names(fn.args)
    local = (inner.bound | params) - inner.nonlocals - inner.globals
    outside = analyze(fn.args.defaults + [d for d in fn.args.kw_defaults if d is not None])
    if not isinstance(fn, gast.Lambda):
        outside = _merge(outside, analyze(fn.decorator_list))
    return Activity(read=(inner.read - local) | outside.read,
                    bound=inner.bound & inner.nonlocals, mutated=inner.mutated - local)


def mark_closure_calls(fn):
    """Mark each call in ``fn``'s own scope of a function ``fn`` defines that
    rebinds ``fn``'s variables with ``nonlocal`` (``def add(v): nonlocal
    total; total = total + v``): the call's ``anno.REBINDS`` lists those names, so
    a branch or loop calling it carries them as if it assigned them."""
    own, stack = [], list(fn.body)
    while stack:  # the statements and expressions of fn's scope, not of nested scopes
        node = stack.pop()
        own.append(node)
        if not isinstance(node, _SCOPES):
            stack.extend(gast.iter_child_nodes(node))
    closures = {node.name: scope_activity(node).bound for node in own
                if isinstance(node, (gast.FunctionDef, gast.AsyncFunctionDef))}
    closures = {name: bound for name, bound in closures.items() if bound}
    for node in own:
        if isinstance(node, gast.Call) and isinstance(node.func, gast.Name) and node.func.id in closures:
            anno.setanno(node, anno.REBINDS, tuple(sorted(closures[node.func.id])))


def variables(fn, enclosing=frozenset()):
    """The names that are variables of function ``fn``'s scope: its parameters,
    the names it binds (not declared ``global``) and the variables of the
    enclosing functions it can see (``enclosing``). A name outside this set
    (a module such as ``torch``, a builtin, a global) is never a branch or
    loop variable."""
    inner = analyze(fn.body if isinstance(fn.body, list) else [fn.body])
    own = (inner.bound | parameter_names(fn.args)) - inner.globals
    return (set(enclosing) - inner.globals) | own


def captured_names(fn):
    """The variables of ``fn`` that a ``def`` or ``lambda`` nested in it
    (at any depth; not a comprehension, which runs where it stands) reads
    or rebinds: such a function may run later, after a branch or loop, and
    then sees the name's last value (Python's late binding)."""
    nested = [n for stmt in fn.body for n in gast.walk(stmt)
              if isinstance(n, (gast.FunctionDef, gast.AsyncFunctionDef, gast.Lambda))]
    free = set()
    for node in nested:
        inner = scope_activity(node)
        free |= inner.read | inner.bound
    return free & variables(fn)


def own_locals(fn):
    """The names function ``fn`` binds in its own scope (not its parameters,
    nor names it declares ``global`` or ``nonlocal``): Python's locals of it."""
    inner = analyze(fn.body if isinstance(fn.body, list) else [fn.body])
    return inner.bound - inner.nonlocals - inner.globals - parameter_names(fn.args)


def parameter_names(args):
    names = [a.id for a in args.posonlyargs + args.args + args.kwonlyargs]
    names += [a.id for a in (args.vararg, args.kwarg) if a is not None]
    return set(names)


def _merge(a, b):
    return Activity(a.read | b.read, a.bound | b.bound, a.mutated | b.mutated,
                    a.nonlocals | b.nonlocals, a.globals | b.globals)


def _loaded_name(node):
    """``x`` for ``x`` and for ``helpers.convert_load(x)`` (a read of a name
    that may be unbound, see transformers/undefined.py); None otherwise."""
    if (isinstance(node, gast.Call) and isinstance(node.func, gast.Attribute)
            and node.func.attr == "convert_load" and len(node.args) == 1):
        node = node.args[0]
    return node.id if isinstance(node, gast.Name) else None


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
            self.activity.bound.add(node.id)

    def visit_AugAssign(self, node):
        if isinstance(node.target, gast.Name):
            self.activity.read.add(node.target.id)
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if not isinstance(node.ctx, gast.Load) and isinstance(node.value, gast.Name):
            self.activity.mutated.add(node.value.id)
        self.generic_visit(node)

    def visit_Call(self, node):
        # A call of a nested function that rebinds enclosing variables (`nonlocal`): it
        # changes them where it is called (see `mark_closure_calls`).
        rebinds = anno.getanno(node, anno.REBINDS, ())
        self.activity.bound |= set(rebinds)
        self.activity.read |= set(rebinds)
        func = node.func
        if isinstance(func, gast.Attribute) and func.attr in MUTATING_METHODS:
            name = _loaded_name(func.value)
            if name is not None:
                self.activity.mutated.add(name)
        self.generic_visit(node)

    def _capture(self, node):
        # A pattern's capture names are identifiers, not Name nodes.
        name = getattr(node, "name", None) if not isinstance(node, gast.MatchMapping) else node.rest
        if name is not None:
            self.activity.bound.add(name)
        self.generic_visit(node)

    visit_MatchAs = visit_MatchStar = visit_MatchMapping = _capture

    def visit_Global(self, node):
        self.activity.globals.update(node.names)

    def visit_Nonlocal(self, node):
        self.activity.nonlocals.update(node.names)

    def visit_alias(self, node):
        self.activity.bound.add((node.asname or node.name).split(".")[0])

    def _function(self, node):
        inner = scope_activity(node)
        self.activity.read |= inner.read
        self.activity.bound |= inner.bound
        self.activity.mutated |= inner.mutated
        if not isinstance(node, gast.Lambda):
            self.activity.bound.add(node.name)
        if getattr(node, "returns", None) is not None:
            self.visit(node.returns)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node):
        self.activity.bound.add(node.name)
        for child in node.bases + node.keywords + node.decorator_list:
            self.visit(child)
        body = analyze(node.body)  # class bodies bind class attributes, not our names
        self.activity.read |= body.read - body.bound

    def _comprehension(self, node):
        # The first iterable is evaluated in the enclosing scope; targets are local.
        self.visit(node.generators[0].iter)
        inner = analyze([g.target for g in node.generators] + [g.iter for g in node.generators[1:]]
                        + [c for g in node.generators for c in g.ifs]
                        + ([node.key, node.value] if isinstance(node, gast.DictComp) else [node.elt]))
        targets = analyze([g.target for g in node.generators]).bound
        self.activity.read |= inner.read - targets
        self.activity.bound |= _walrus_targets(node)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension


def _walrus_targets(node):
    # `(y := v)` inside a comprehension binds y in the enclosing function.
    return {n.target.id for n in gast.walk(node) if isinstance(n, gast.NamedExpr)}
