"""Calls -> ``helpers.convert_call(f)(...)``, so callees are converted too.

Before::

    y = self.block(x)
    n = len(x)
    s = x.size(1)
    super().forward(x)

After::

    y = helpers.convert_call(self.block)(x)
    n = helpers.convert_call(len)(x)
    s = helpers.convert_method(x, 'size')(1)
    helpers.convert_call(super(__class__, self).forward)(x)

``convert_call`` decides at run time: user functions, lambdas, methods and
user modules' ``forward`` are converted; torch, numpy, the standard library
and builtins run as they are, except the builtins with tensor meaning
(``len``, ``print``, ``int``/``float``/``bool``, ``range``, ``enumerate``,
``zip``, ``isinstance``) which map to their ``convert_*`` versions.
Tensor methods that would read a value at conversion time (``size``,
``item``, ``tolist``, ``numpy``) go through ``convert_method``. Zero-argument
``super()`` needs the class cell of a function compiled inside its class, so
it is spelled out with ``__class__`` and the first parameter. Calls to
``helpers`` (generated code) are left alone.
"""

import gast

from .base import Transformer

TENSOR_VALUE_METHODS = ("size", "item", "tolist", "numpy")


class Call(Transformer):
    def transform(self, tree):
        self.first_params = []
        return self.visit(tree)

    def visit_FunctionDef(self, node):
        args = node.args.posonlyargs + node.args.args
        # A function without parameters (a generated branch or loop body) sees
        # the enclosing method's `self`: zero-argument super() there means it.
        enclosing = self.first_params[-1] if self.first_params else None
        self.first_params.append(args[0].id if args else enclosing)
        self.generic_visit(node)
        self.first_params.pop()
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        if self.is_helper_call(node):
            return node
        func = node.func
        if isinstance(func, gast.Name) and func.id == "super":
            return self._super(node)
        if isinstance(func, gast.Attribute) and func.attr in TENSOR_VALUE_METHODS:
            node.func = self.expression("helpers.convert_method(obj, method)", func,
                                        obj=func.value, method=gast.Constant(value=func.attr, kind=None))
        else:
            node.func = self.expression("helpers.convert_call(f)", func, f=func)
        return node

    def _super(self, node):
        if node.args or not self.first_params or self.first_params[-1] is None:
            return node
        return self.expression("super(cls, first)", node, super="super", cls="__class__",
                               first=self.first_params[-1])
