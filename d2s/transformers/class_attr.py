"""``x.__class__`` -> ``helpers.convert_type(x)``.

Before::

    if x.__class__ is torch.Tensor:

After::

    if helpers.convert_type(x) is torch.Tensor:

A graph tensor is an object of d2s's own class: its ``__class__`` answered
``Variable`` where eager's tensor answers ``torch.Tensor`` (a check of the
class name or identity took the other branch, silently). ``type(x)`` is
already converted so (``convert_type``); ``x.__class__`` means the same for
every object that does not fake its class.
"""

import gast

from .base import Transformer


class ClassAttr(Transformer):
    def visit_Attribute(self, node):
        self.generic_visit(node)
        if node.attr == "__class__" and isinstance(node.ctx, gast.Load):
            return self.expression("helpers.convert_type(value)", node, value=node.value)
        return node
