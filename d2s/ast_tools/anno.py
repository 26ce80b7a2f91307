"""Facts one pass leaves on an AST node for a later one, under named keys.

The analyses and transformers hand a few facts forward on the nodes they
concern (which names a lowered `break` keeps live, whether an `if`'s
branches fall through). They live in one dict attribute per node, reached
only through these functions and keyed by the names below, so every such
fact is declared here with what it means; a misspelt key is an error, not a
silently missing fact.
"""

# On a `while` (break_continue.py, read by while_loops.py): (names live after
# the loop, names live at its head), taken before break/continue are lowered.
JUMP_LIVE = "jump_live"
# On the guard `if` a lowered break/continue leaves (break_continue.py, read
# by if_else.py): (kind, the user's line, names the jumping path still reads).
JUMP = "jump"
# On an `if` (definedness.py, read by if_else.py): (body, orelse), whether
# each never falls through (it returns or raises on every path).
EXITS = "exits"
# On a call of a nested function (activity.py): the enclosing names it rebinds.
REBINDS = "rebinds"
# On a function (undefined.py, read by kept_locals.py): the names the user's
# code binds in its own scope, before any pass drops unreachable statements.
LOCALS = "locals"

_KEYS = frozenset({JUMP_LIVE, JUMP, EXITS, REBINDS, LOCALS})
_ATTR = "_d2s_anno"


def _check(key):
    if key not in _KEYS:
        raise KeyError(f"unknown AST annotation {key!r} (declared in d2s/ast_tools/anno.py)")


def setanno(node, key, value):
    """Annotate `node`. The dict is replaced, not changed, so a shallow
    copy of a node never shares a later annotation with its original."""
    _check(key)
    setattr(node, _ATTR, {**getattr(node, _ATTR, {}), key: value})


def getanno(node, key, default=None):
    _check(key)
    return getattr(node, _ATTR, {}).get(key, default)


def hasanno(node, key):
    _check(key)
    return key in getattr(node, _ATTR, {})
