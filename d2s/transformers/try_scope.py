"""``try`` with ``except`` handlers -> its body inside ``helpers.try_scope()``.

Before::

    try:
        if x.sum() > 0:
            raise ValueError("positive")
        y = x + 1
    except ValueError:
        y = x - 1

After::

    try:
        with helpers.try_scope():
            if x.sum() > 0:
                raise ValueError("positive")
            y = x + 1
    except ValueError:
        y = x - 1

A `raise` or `assert` that a tensor condition decides becomes an op that
raises when the program runs; a program has no ``except``, so the handler
would never run for the inputs that raise (the call would fail where eager
returns ``x - 1``). While a trace runs the scope's body, making such an op
is refused at its line (d2s/operators/raising.py). A Python error raised
while tracing is caught by the handler as usual: the scope only counts.
Runs after the passes that lower ``return``/``break`` (a ``with`` around
the body changes nothing for them) and before ``Call``, which must not
wrap the helper.
"""

from .base import Transformer


class TryScope(Transformer):
    def visit_Try(self, node):
        self.generic_visit(node)
        if node.handlers:
            node.body = self.template("""
                with helpers.try_scope():
                    body
                """, node.body[0], body=node.body)
        return node
