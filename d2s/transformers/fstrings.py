"""f-strings -> ``helpers.convert_fstring``.

Before::

    expert = self[f"expert_{idx[0]}"]

After::

    expert = self[helpers.convert_fstring(("expert_", (idx[0], -1, None)))]

Each replacement field is (value, conversion, format spec): the conversion
is the f-string's (-1 none, ``ord("r")`` for ``!r``, ...), the spec its own
f-string (converted too) or None. With Python values the helper makes the
text Python makes; an integer known only when the program runs in a plain
field makes text whose digits the run decides (operators/fstrings.py), which
can pick an item of an ``nn.ModuleDict`` (switch_transformers' experts).
"""

import gast

from .base import Transformer


class FStrings(Transformer):
    def visit_JoinedStr(self, node):
        self.generic_visit(node)
        if not any(isinstance(v, gast.FormattedValue) for v in node.values):
            return node
        parts = []
        for value in node.values:
            if isinstance(value, gast.FormattedValue):
                spec = value.format_spec if value.format_spec is not None else gast.Constant(value=None, kind=None)
                parts.append(gast.Tuple(elts=[value.value, gast.Constant(value=value.conversion, kind=None), spec],
                                        ctx=gast.Load()))
            else:
                parts.append(value)
        return self.expression("helpers.convert_fstring(parts)", node, parts=gast.Tuple(elts=parts, ctx=gast.Load()))
