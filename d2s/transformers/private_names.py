"""Private names: ``self.__x`` -> ``self._Owner__x`` in a method of ``Owner``.

Before (a method of ``class CausalConv1d(nn.Conv1d)``)::

    if self.__padding != 0:
        return res[:, :, :-self.__padding]

After::

    if self._CausalConv1d__padding != 0:
        return res[:, :, :-self._CausalConv1d__padding]

Python rewrites such names when it compiles a class body; d2s compiles the
converted function outside any class, so it rewrites them itself, before any
other pass (whose names, and the strings they keep of them, are then the ones
the compiled code uses), by Python's rules: an identifier with two leading
underscores and at most one trailing underscore, read or bound as a name, an
attribute, a parameter, a nested ``def`` or ``class``, or in ``global`` /
``nonlocal``, gets the innermost enclosing class's name with its leading
underscores stripped (nothing when that name is only underscores); keyword
argument names stay as they are. The innermost class comes from the
function's qualified name (``Outer.Inner.forward``: ``Inner``;
``Model.forward.<locals>.helper``: ``Model``).
"""

import gast

from .base import Transformer


def mangling_class(qualname):
    """The innermost class enclosing a function of qualified name
    `qualname`, or None: a part followed by another part that is not
    ``<locals>`` names a class (a function's part is followed by it)."""
    parts = qualname.split(".")
    owner = None
    for name, following in zip(parts, parts[1:]):
        if name != "<locals>" and following != "<locals>":
            owner = name
    return owner


def mangled(name, owner):
    if not name.startswith("__") or name.endswith("__") or "." in name:
        return name
    stripped = owner.lstrip("_")
    return f"_{stripped}{name}" if stripped else name


class PrivateNames(Transformer):
    def transform(self, tree):
        if not self.ctx.owner_class:
            return tree
        for node in gast.walk(tree):
            self._mangle(node, tree)
        return tree

    def _mangle(self, node, tree):
        owner = self.ctx.owner_class
        if isinstance(node, gast.Name):
            node.id = mangled(node.id, owner)
        elif isinstance(node, gast.Attribute):
            node.attr = mangled(node.attr, owner)
        elif isinstance(node, (gast.FunctionDef, gast.AsyncFunctionDef, gast.ClassDef)) and node is not tree:
            node.name = mangled(node.name, owner)
        elif isinstance(node, (gast.Global, gast.Nonlocal)):
            node.names = [mangled(n, owner) for n in node.names]
