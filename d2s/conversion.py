"""Function objects -> converted function objects.

``convert_function(fn)`` parses ``fn``'s source, runs the transformer
pipeline and compiles the result so that:

- the new function has ``fn``'s globals (global mutation stays visible), its
  defaults, and its very closure cells (nonlocal state stays shared);
- generated code reaches the helpers (``d2s.operators``) through one
  extra closure cell under a fresh name, never through the user's globals;
- the code is compiled with the user's file name and the user's line numbers
  (every generated node carries the location of the node it replaces), so
  tracebacks, op-origin capture and ConversionErrors name the user's lines.

To give the function exactly the free variables it needs, the converted
``def`` is compiled inside a factory whose parameters are the helpers name and
``fn``'s free variables; the inner code object is then instantiated with
``types.FunctionType`` and a closure of the matching cells. Results are cached
per code object (compilation) and per function object (instantiation).
"""

import __future__
import sys
import types
import weakref

import gast

from ops import tracer
from runtime import _debug

from . import operators, transformers
from .ast_tools import codegen, origin, parsing
from .ast_tools.naming import Namer
from .transformers.base import Context
from .transformers.private_names import mangling_class
from .unwrap import unwrap

_code_level = None
_compiled = {}                                 # _code_key(original code) -> _Compiled (None: leave as is)
_converted = weakref.WeakKeyDictionary()       # original function -> converted function
_converted_codes = weakref.WeakSet()           # every code object we compiled


class _Compiled:
    def __init__(self, code, source, helpers):
        self.code = code          # the converted function's code object
        self.source = source      # the converted source, for get_code and debugging
        self.helpers = helpers    # the free variable holding d2s.operators


def set_code_level(level=100):
    """Print each function's converted code, after the first ``level`` passes of
    the pipeline, when it is converted (``None`` turns this off)."""
    global _code_level
    _code_level = level


def is_converted(fn):
    return getattr(fn, "__code__", None) in _converted_codes


def convert_function(fn):
    """The converted version of ``fn`` (a function, lambda or bound method).

    A lambda whose source line cannot be isolated is returned unconverted.
    """
    if isinstance(fn, types.MethodType):
        return types.MethodType(convert_function(fn.__func__), fn.__self__)
    fn = unwrap(fn)  # our own decorator: convert what it wraps
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"d2s converts Python functions, not {type(fn).__name__}")
    if is_converted(fn):
        return fn
    traced = tracer.active()
    if traced is not None:  # the globals and cells it reads are checked when the program runs
        traced.functions[id(fn)] = fn
        if traced.attribute_reads is not None:
            traced.attribute_reads.add_function(fn)
        if traced.watch is not None:  # what it writes is carried or refused (d2s/python_writes.py)
            traced.watch.add_function(fn)
    converted = _converted.get(fn)
    if converted is None:
        compiled = _compile(fn)
        converted = fn if compiled is None else _instantiate(fn, compiled)
        _converted[fn] = converted
    return converted


def get_code(fn, level=None):
    """The converted source of ``fn`` after the first ``level`` passes (all by default)."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    fn = unwrap(fn)
    if level is None:
        compiled = _compile(fn)
        return compiled.source if compiled is not None else None
    tree, _ = _convert_tree(fn, level)
    return codegen.to_source(tree)


def _convert_tree(fn, level=None):
    parsed = parsing.parse_function(fn)
    if parsed is None:
        return None, None
    code = fn.__code__
    namer = Namer.for_tree(parsed.node, extra=code.co_names + code.co_varnames + code.co_freevars)
    ctx = Context(filename=parsed.filename, line_offset=parsed.line_offset, namer=namer,
                  helpers=namer.new("_d2s"), owner_class=mangling_class(getattr(fn, "__qualname__", "")))
    tree = transformers.run(parsed.node, ctx, stop_after=level)
    return tree, ctx


def _code_key(code):
    """What identifies the conversion of ``code``. Code objects compare equal
    without their file and qualified name (the same text at the same lines of
    two files is one code object to ``==``), but the converted code is compiled
    with the user's file name, which every message and origin shows: a key of
    the code alone gave a function of ``b.py`` the conversion of ``a.py``."""
    return code.co_filename, getattr(code, "co_qualname", code.co_name), code


def _compile(fn):
    code = fn.__code__
    key = _code_key(code)
    if key in _compiled:
        return _compiled[key]
    tree, ctx = _convert_tree(fn)
    if tree is None:
        _compiled[key] = None
        return None
    source = codegen.to_source(tree)
    if _debug.level() >= 1 or _code_level is not None:
        shown = source if _code_level is None else get_code(fn, _code_level)
        print(f"[d2s] converted {fn.__qualname__} ({ctx.filename}):\n{shown}", file=sys.stderr)
    module = _factory(tree, ctx, code)
    origin.fill_missing(module)
    origin.shift(module, ctx.line_offset)
    # The original's `from __future__ import annotations`: else a nested
    # `def f(x: torch.Tensor)` evaluates its annotations, and a name imported
    # only for type checking is a NameError (SegFormer).
    flags = code.co_flags & __future__.annotations.compiler_flag
    factory_code = compile(gast.gast_to_ast(module), ctx.filename, "exec", flags=flags, dont_inherit=True)
    inner = _find_code(factory_code, getattr(tree, "name", code.co_name))
    names = {"co_name": code.co_name}
    if hasattr(code, "co_qualname"):  # Python 3.11+: tracebacks show the qualified name
        names["co_qualname"] = code.co_qualname
    inner = inner.replace(**names)
    _remember(inner)
    _compiled[key] = compiled = _Compiled(inner, source, ctx.helpers)
    return compiled


def _factory(tree, ctx, code):
    """``def factory(helpers, *freevars): <converted def>; return <it>``.

    Defaults and annotations are dropped from the converted ``def``: they are
    the original function's values, passed to ``FunctionType`` as they are.
    """
    args = tree.args
    args.defaults = []
    args.kw_defaults = [None] * len(args.kwonlyargs)
    for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if a is not None:
            a.annotation = None
    if isinstance(tree, gast.Lambda):
        body = [gast.Return(value=tree)]
    else:
        tree.returns = None
        # A fresh name: the function's own name inside its body means what it
        # means in the original (the global or closure cell, which may carry
        # attributes: `make_positions.range_buf`), not the converted copy.
        tree.name = ctx.namer.new(tree.name)
        body = [tree, gast.Return(value=gast.Name(id=tree.name, ctx=gast.Load(), annotation=None,
                                                   type_comment=None))]
    params = [gast.Name(id=n, ctx=gast.Param(), annotation=None, type_comment=None)
              for n in (ctx.helpers,) + code.co_freevars]
    factory = gast.FunctionDef(
        name=ctx.namer.new("factory"),
        args=gast.arguments(args=params, posonlyargs=[], vararg=None, kwonlyargs=[], kw_defaults=[],
                            kwarg=None, defaults=[]),
        body=body, decorator_list=[], returns=None, type_comment=None, type_params=[])
    origin.set_origin([factory] + body, tree)
    return gast.Module(body=[factory], type_ignores=[])


def _find_code(code, name):
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name:
                return const
            found = _find_code(const, name)
            if found is not None:
                return found
    return None


def _remember(code):
    _converted_codes.add(code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _remember(const)


def _instantiate(fn, compiled):
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    cells[compiled.helpers] = types.CellType(operators)
    closure = tuple(cells[name] for name in compiled.code.co_freevars)
    new = types.FunctionType(compiled.code, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__dict__.update(fn.__dict__)
    return new
