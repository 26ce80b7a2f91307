"""Function and lambda objects -> gast trees.

The source is found from the function's *code object*, the lines from its
first line (``inspect.getsource`` on the function would follow
``__wrapped__`` and return some other function's source). It is dedented; source that cannot be dedented (a
multi-line string less indented than the code) is parsed inside an ``if
True:`` block instead. Decorators are dropped: the converted function object
is built directly, and whoever decorated the original keeps decorating it.
"""

import inspect
import linecache
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

    Raises ConversionError when the source is unavailable. A lambda whose
    defining lines cannot be parsed on their own (it sits in a multi-line
    expression) or hold several lambdas with its parameters is found in its
    whole file, by the columns its code object records; ``None`` only when
    even that fails (the caller then leaves it unconverted).
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
        return _lambda_in_file(code)
    if code.co_name == "<lambda>":
        node = _find_lambda(module, code, code.co_firstlineno - offset)
        if node is None:
            return _lambda_in_file(code)
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


def _find_lambda(module, code, relative_line, columns=False):
    """The one Lambda of `module` at `relative_line` with `code`'s
    parameters; with `columns` (the module is the whole file, so columns are
    the code object's own) one whose body spans the code's positions."""
    params = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    found = [
        n for n in gast.walk(module)
        if isinstance(n, gast.Lambda) and n.lineno == relative_line
        and tuple(a.id for a in n.args.args + n.args.kwonlyargs) == tuple(params)
    ]
    if len(found) > 1 and columns and hasattr(code, "co_positions"):  # Python 3.11+
        spans = [(l0, c0, l1, c1) for l0, l1, c0, c1 in code.co_positions()
                 if None not in (l0, l1, c0, c1) and (c0, c1) != (0, 0)]
        if spans:
            start, end = min(s[:2] for s in spans), max(s[2:] for s in spans)
            found = [n for n in found
                     if (n.body.lineno, n.body.col_offset) <= start
                     and end <= (n.body.end_lineno, n.body.end_col_offset)]
    return found[0] if len(found) == 1 else None


def _lambda_in_file(code):
    """The lambda of `code` parsed from its whole source file, or None."""
    source = "".join(linecache.getlines(code.co_filename))
    try:
        module = gast.parse(source)
    except SyntaxError:
        return None
    node = _find_lambda(module, code, code.co_firstlineno, columns=True)
    return None if node is None else Parsed(node, code.co_filename, 0, source)
