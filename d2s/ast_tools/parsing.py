"""Function and lambda objects -> gast trees.

The source is found from the function's *code object*, the lines from its
first line (``inspect.getsource`` on the function would follow
``__wrapped__`` and return some other function's source). It is dedented; source that cannot be dedented (a
multi-line string less indented than the code) is parsed inside an ``if
True:`` block instead. Decorators are dropped: the converted function object
is built directly, and whoever decorated the original keeps decorating it.
"""

import inspect
import textwrap
from dataclasses import dataclass

import gast

from runtime.errors import ConversionError


@dataclass
class Parsed:
    node: gast.AST      # the FunctionDef or Lambda, lines relative to the snippet
    filename: str
    line_offset: int    # snippet line + line_offset = line in ``filename``
    source: str         # the snippet as parsed


def parse_function(fn):
    """Parse ``fn`` (a plain Python function or lambda) into a ``Parsed``.

    Raises ConversionError when the source is unavailable; returns ``None`` for
    a lambda whose defining line cannot be parsed on its own or holds several
    lambdas with the same parameters (the caller then leaves it unconverted).
    """
    code = fn.__code__
    try:
        lines, first = _source_lines(fn)
    except (OSError, TypeError) as e:
        raise ConversionError(
            f"cannot read the source of {fn.__qualname__!r} ({e}); d2s converts "
            "functions defined in source files", code.co_filename, code.co_firstlineno) from None
    module, offset = _parse_snippet("".join(lines), first - 1, lambda_only=code.co_name == "<lambda>")
    if module is None:
        return None
    if code.co_name == "<lambda>":
        node = _find_lambda(module, code, code.co_firstlineno - offset)
        if node is None:
            return None
    else:
        node = next(n for n in module.body if isinstance(n, (gast.FunctionDef, gast.AsyncFunctionDef)))
        node.decorator_list = []
    return Parsed(node, code.co_filename, offset, "".join(lines))


def _source_lines(fn):
    """`inspect.getsourcelines(fn.__code__)`, without its search of every
    loaded module: given a code object, `inspect.getmodule` finds the module
    by computing the real path of every module's file (a tenth of a second
    in a process that has imported torch and sympy, on every first
    conversion). `findsource` given the function itself takes the module
    from `fn.__module__` and reads the same lines from `fn.__code__`
    (it does not follow `__wrapped__`, unlike `getsourcelines(fn)`)."""
    lines, start = inspect.findsource(fn)
    return inspect.getblock(lines[start:]), start + 1


def parse_source(source):
    """Parse a source string (dedented first) into a gast Module."""
    return gast.parse(textwrap.dedent(source))


def _parse_snippet(source, offset, lambda_only):
    try:
        return gast.parse(textwrap.dedent(source)), offset
    except SyntaxError:
        pass
    try:  # not dedentable: keep the indentation under an `if True:`
        module = gast.parse("if True:\n" + source)
        return gast.Module(body=module.body[0].body, type_ignores=[]), offset - 1
    except SyntaxError:
        if lambda_only:  # a lambda in the middle of a multi-line expression
            return None, offset
        raise


def _find_lambda(module, code, relative_line):
    params = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    found = [
        n for n in gast.walk(module)
        if isinstance(n, gast.Lambda) and n.lineno == relative_line
        and tuple(a.id for a in n.args.args + n.args.kwonlyargs) == tuple(params)
    ]
    return found[0] if len(found) == 1 else None
