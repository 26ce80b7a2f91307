"""gast tree -> Python source text.

astor writes the most readable code; ``ast.unparse`` takes over for syntax
astor does not know (walrus, match, positional-only parameters, ...).
"""

import ast

import astor
import gast


def to_source(tree):
    node = gast.gast_to_ast(tree)
    ast.fix_missing_locations(node)
    try:
        return astor.to_source(node)
    except Exception:  # astor raises assorted errors on syntax it predates
        return ast.unparse(node) + "\n"
