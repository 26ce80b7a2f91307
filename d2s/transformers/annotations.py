"""Annotated assignments of local names -> plain assignments.

Before::

    if use_bias:
        bias_term: Union[Tensor, float] = self.bias(x)
    else:
        bias_term = 0.0

After::

    if use_bias:
        bias_term = self.bias(x)
    else:
        bias_term = 0.0

Python never evaluates the annotation of a local variable (PEP 526), so
dropping it changes nothing, and the branch and loop passes can then make
the name `nonlocal` in the functions they generate (Python forbids
`nonlocal` for an annotated name: a SyntaxError at compile time). A bare
annotation (`x: int`, no value) is left as it is, and so is everything in a
class body, where annotations are evaluated and stored.
"""

import gast

from ..ast_tools import origin
from .base import Transformer


class Annotations(Transformer):
    def visit_ClassDef(self, node):
        return node  # annotations in a class body are evaluated: keep them

    def visit_AnnAssign(self, node):
        if node.value is None or not isinstance(node.target, gast.Name):
            return node
        assign = gast.Assign(targets=[node.target], value=node.value, type_comment=None)
        origin.set_origin([assign], node)
        return assign
