"""Source locations of generated code.

Generated nodes take the location of the user node they replace, so that the
compiled code reports the user's own line in tracebacks, in op-origin capture
and in ConversionErrors. Line numbers inside the tree are relative to the
parsed snippet (line 1 = the first line of ``inspect.getsource``); ``shift``
moves them to file line numbers just before compilation.
"""

import gast

LOCATION = ("lineno", "col_offset", "end_lineno", "end_col_offset")


def has_location(node):
    return getattr(node, "lineno", None) is not None


def strip(tree):
    """Remove every location in ``tree`` (used on freshly parsed templates)."""
    for node in gast.walk(tree):
        for attr in LOCATION:
            if attr in node._attributes:
                setattr(node, attr, None)
    return tree


def copy_location(node, origin):
    """Give ``node`` the *first line* of ``origin``'s location.

    A generated node stands for the statement it replaces, whose first line
    is the one to report (``while cond:``, ``if cond:``); a multi-line span
    would make Python point tracebacks at its last line instead.
    """
    node.lineno = getattr(origin, "lineno", None)
    node.col_offset = getattr(origin, "col_offset", None)
    node.end_lineno = node.lineno
    end_col = getattr(origin, "end_col_offset", None)
    single_line = getattr(origin, "end_lineno", None) == node.lineno
    node.end_col_offset = end_col if single_line and end_col is not None else node.col_offset


def set_origin(nodes, origin):
    """Give ``origin``'s location to every node in ``nodes`` that has none.

    ``nodes`` is a node or a list of nodes; user nodes spliced into a template
    keep their own locations.
    """
    if not isinstance(nodes, (list, tuple)):
        nodes = [nodes]
    for root in nodes:
        for node in gast.walk(root):
            if "lineno" in node._attributes and not has_location(node):
                copy_location(node, origin)
    return nodes


def fill_missing(tree, default=None):
    """Give a node without a location its nearest located ancestor's location."""

    def visit(node, parent):
        if "lineno" in node._attributes:
            if not has_location(node) and parent is not None:
                copy_location(node, parent)
            if has_location(node):
                parent = node
        for child in gast.iter_child_nodes(node):
            visit(child, parent)

    visit(tree, default)
    return tree


def shift(tree, offset):
    """Add ``offset`` to every line number in ``tree``."""
    for node in gast.walk(tree):
        for attr in ("lineno", "end_lineno"):
            value = getattr(node, attr, None)
            if value is not None:
                setattr(node, attr, value + offset)
    return tree
