"""A generic AST toolkit for source-to-source conversion.

Nothing here knows about tensors or about d2s's runtime helpers; the
transformers in ``d2s.transformers`` are built from these pieces:

- ``parsing``   function/lambda object -> gast tree plus where it came from
- ``templates`` build code from readable template strings; placeholders are
                replaced by AST nodes, never by formatting user names into text
- ``naming``    fresh names that cannot collide with names the function uses
- ``origin``    every generated node carries the user location it stands for
- ``activity``  names a piece of code reads and modifies
- ``liveness``  names live before/after each statement
- ``codegen``   gast tree -> Python source text
"""
