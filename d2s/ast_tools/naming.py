"""Fresh names for generated code.

A ``Namer`` is created once per converted function with every identifier the
function's source mentions (plus the names its code object uses). A name it
hands out is then guaranteed not to shadow or be shadowed by a user name, and
two requests never get the same name.
"""

import gast


class Namer:
    def __init__(self, used=()):
        self._used = set(used)

    @classmethod
    def for_tree(cls, tree, extra=()):
        """A namer that avoids every identifier appearing in ``tree``."""
        return cls(set(identifiers(tree)) | set(extra))

    def new(self, base):
        """Return ``base`` if unused, else ``base_1``, ``base_2``, ...; reserve it."""
        name, i = base, 0
        while name in self._used:
            i += 1
            name = f"{base}_{i}"
        self._used.add(name)
        return name

    def reserve(self, name):
        self._used.add(name)

    def __contains__(self, name):
        return name in self._used


def identifiers(tree):
    """Every identifier bound or read anywhere in ``tree``."""
    for node in gast.walk(tree):
        if isinstance(node, gast.Name):
            yield node.id
        elif isinstance(node, (gast.FunctionDef, gast.AsyncFunctionDef, gast.ClassDef)):
            yield node.name
        elif isinstance(node, (gast.Global, gast.Nonlocal)):
            yield from node.names
        elif isinstance(node, gast.alias):
            yield (node.asname or node.name).split(".")[0]
        elif isinstance(node, gast.Attribute):
            yield node.attr
