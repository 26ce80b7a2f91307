"""Liveness analysis: which names may still be read after each statement.

``analyze(fn)`` walks a function (and, as separate scopes, every function
nested in it) backwards over its structured statements and returns a
``Liveness`` with two maps keyed by statement node:

- ``live_out[s]``: names whose current value may be read after ``s`` runs;
- ``live_in[s]``:  names whose value before ``s`` may be read by ``s`` or later.

At the end of a function the live names are the ones it declares
``nonlocal``: their values escape to the enclosing function. Loops are
iterated to a fixed point; ``try`` is approximated conservatively (anything
live at a handler is live throughout the ``try`` body). Kills are definite
only: ``x = ...`` kills ``x``; ``x[i] = ...`` or ``x.append(v)`` read ``x``.
"""

from dataclasses import dataclass, field

import gast

from . import activity

_FUNCTIONS = (gast.FunctionDef, gast.AsyncFunctionDef)


@dataclass
class Liveness:
    live_in: dict = field(default_factory=dict)
    live_out: dict = field(default_factory=dict)


def analyze(fn, cell_reads=None, captured=frozenset()):
    """``cell_reads`` maps id(statement) -> names the statement reads without
    naming them: a generated ``x, i = helpers.convert_while(...)`` reads the
    loop variables' values before the loop through closure cells.
    ``captured``: names of ``fn`` that the user's nested functions read or
    rebind (``activity.captured_names``, taken before any pass added
    functions of its own): live everywhere in ``fn``, since such a
    function may run at any later point and read the name's last value."""
    result = Liveness()
    _Scope(result, cell_reads or {}).function(fn, frozenset(captured))
    return result


class _Scope:
    def __init__(self, result, cell_reads, captured=frozenset()):
        self.result = result
        self.cell_reads = cell_reads
        self.captured = captured
        self.loops = []  # (live after the loop, live at the loop head) for break/continue

    def function(self, fn, captured=frozenset()):
        body = fn.body if isinstance(fn.body, list) else []
        end = activity.analyze(body).nonlocals
        _Scope(self.result, self.cell_reads, captured).block(body, set(end))
        # Nested functions are analysed where they are defined (see `stmt`).

    def block(self, stmts, live):
        live = set(live) | self.captured
        for s in reversed(stmts):
            self.result.live_out[s] = set(live)
            live = self.stmt(s, live) | self.captured
            self.result.live_in[s] = set(live)
        return live

    def stmt(self, s, out):
        method = getattr(self, "stmt_" + type(s).__name__, None)
        if method is not None:
            return method(s, out)
        act = activity.analyze(s)
        return (out - _kills(s)) | act.read | self.cell_reads.get(id(s), set())

    def stmt_If(self, s, out):
        return _reads(s.test) | self.block(s.body, out) | self.block(s.orelse, out)

    def stmt_While(self, s, out):
        after = self.block(s.orelse, out)
        head = _reads(s.test) | after
        while True:
            self.loops.append((out, head))
            body_in = self.block(s.body, head)
            self.loops.pop()
            new = head | body_in
            if new == head:
                return head
            head = new

    def stmt_For(self, s, out):
        after = self.block(s.orelse, out)
        target = activity.analyze(s.target).modified
        head = set(after)
        while True:
            self.loops.append((out, head))
            body_in = self.block(s.body, head)
            self.loops.pop()
            new = head | (body_in - target) | _reads(s.target)
            if new == head:
                break
            head = new
        return head | _reads(s.iter)

    stmt_AsyncFor = stmt_For

    def stmt_Break(self, s, out):
        return set(self.loops[-1][0]) if self.loops else set(out)

    def stmt_Continue(self, s, out):
        return set(self.loops[-1][1]) if self.loops else set(out)

    def stmt_Return(self, s, out):
        return _reads(s.value) if s.value is not None else set()

    def stmt_Raise(self, s, out):
        return activity.analyze(s).read

    def stmt_Try(self, s, out):
        final = self.block(s.finalbody, out)
        handlers = set()
        for h in s.handlers:
            handler_in = self.block(h.body, final)
            if h.name is not None:
                handler_in -= {h.name.id}
            handlers |= handler_in | (_reads(h.type) if h.type is not None else set())
        orelse = self.block(s.orelse, final)
        body = self.block(s.body, orelse | handlers)
        return body | handlers

    stmt_TryStar = stmt_Try

    def stmt_With(self, s, out):
        body = self.block(s.body, out)
        targets = activity.analyze([i.optional_vars for i in s.items if i.optional_vars is not None])
        return (body - targets.modified) | _reads([i.context_expr for i in s.items]) | targets.read

    stmt_AsyncWith = stmt_With

    def stmt_Match(self, s, out):
        # No case may match: then the statement only reads its subject.
        live = set(out)
        for case in s.cases:
            captured = activity.analyze(case.pattern).bound
            tests = _reads(case.pattern) | _reads(case.guard)  # a guard runs after the capture
            live |= (self.block(case.body, out) | tests) - captured
        return live | _reads(s.subject)

    def stmt_FunctionDef(self, s, out):
        self.function(s)
        return (out - {s.name}) | activity.scope_activity(s).read

    stmt_AsyncFunctionDef = stmt_FunctionDef


def _reads(node):
    return activity.analyze(node).read if node is not None else set()


def _kills(s):
    """Names certainly rebound by the simple statement ``s``."""
    if isinstance(s, gast.Assign):
        targets = s.targets
    elif isinstance(s, gast.AnnAssign):
        targets = [s.target] if s.value is not None else []
    elif isinstance(s, gast.Delete):
        targets = s.targets
    elif isinstance(s, (gast.Import, gast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in s.names}
    elif isinstance(s, gast.ClassDef):
        return {s.name}
    else:
        return set()
    killed = set()
    for t in targets:
        stack = [t]
        while stack:
            n = stack.pop()
            if isinstance(n, gast.Name):
                killed.add(n.id)
            elif isinstance(n, (gast.Tuple, gast.List)):
                stack.extend(n.elts)
            elif isinstance(n, gast.Starred):
                stack.append(n.value)
    return killed
