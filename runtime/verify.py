"""`Program.verify()`: check every IR invariant, and say how to fix a breach.

Invariants:
  - blocks are numbered by position; block 0 has parent -1, every other
    block's parent is an earlier block;
  - variable names are unique across the whole program (the executor turns
    them into locals of one function);
  - every op type is registered (the allowlist);
  - every name an op reads is visible from its block (own vars, then the
    parents') and, in a block, produced before it is read (data,
    persistable and sub-block-argument variables are available from the start);
  - block attributes point at existing blocks nested under the op's block;
  - InputRef / OutputRef positions in call-style attributes are in range.

A breach raises ProgramError showing the bad op among its neighbours.
"""

from .attrs import InputRef, OutputRef, refs
from .errors import ProgramError
from .ir import Block
from .optable import is_registered


def _context(block, index):
    lo, hi = max(0, index - 2), min(len(block.ops), index + 3)
    lines = []
    for i in range(lo, hi):
        mark = ">>" if i == index else "  "
        lines.append(f"  {mark} [{i}] {block.ops[i].to_string()}")
    return "\n".join(lines)


def _fail(block, index, message):
    raise ProgramError(f"block {block.idx}, op {index}: {message}\n{_context(block, index)}")


def verify_program(program):
    seen = {}
    for i, block in enumerate(program.blocks):
        if block.idx != i:
            raise ProgramError(f"block at position {i} says it is block {block.idx}")
        if (i == 0) != (block.parent_idx == -1) or block.parent_idx >= i:
            raise ProgramError(f"block {i} has parent {block.parent_idx}; block 0 must have parent -1 "
                               "and every other block an earlier parent")
        for name in block.vars:
            if name in seen:
                raise ProgramError(f"variable {name!r} is declared in blocks {seen[name]} and {i}; "
                                   "names must be unique in a program (use Program.unique_name)")
            seen[name] = i

    # Names each sub-block gets from the op that owns it (loop variables).
    provided = {}
    for block in program.blocks:
        for op in block.ops:
            for name in op.attrs.get("loop_vars", []) if isinstance(op.attrs.get("loop_vars"), list) else []:
                provided.setdefault(op.attrs["body_block"].idx, set()).add(name)

    for block in program.blocks:
        available = {n for n, v in block.vars.items() if v.is_data or v.persistable}
        available |= provided.get(block.idx, set())
        parent = block.parent
        while parent is not None:
            available |= set(parent.vars)  # parents' values exist before a sub-block runs
            parent = parent.parent
        for index, op in enumerate(block.ops):
            if not is_registered(op.type):
                _fail(block, index, f"op type {op.type!r} is not registered; only ops in the op table "
                                    "(ops/) may appear in a program")
            for name in op.input_names:
                try:
                    block.find_var(name)
                except KeyError:
                    _fail(block, index, f"input {name!r} is not a variable visible from block {block.idx}")
                if name in block.vars and name not in available:
                    _fail(block, index, f"input {name!r} is read before any op of block {block.idx} writes it")
            for name in op.output_names:
                try:
                    block.find_var(name)
                except KeyError:
                    _fail(block, index, f"output {name!r} is not a variable visible from block {block.idx}")
                available.add(name)
            for key, value in op.attrs.items():
                if isinstance(value, Block):
                    if value.program is not program or value.idx >= len(program.blocks) \
                            or program.blocks[value.idx] is not value:
                        _fail(block, index, f"attribute {key!r} refers to a block outside this program")
                    if value.parent is None or not value.parent.is_under(block):
                        _fail(block, index, f"attribute {key!r} refers to block {value.idx}, which is not "
                                            f"nested under block {block.idx}")
            if "args" in op.attrs:
                n_in, n_out = len(op.input("X")), len(op.output("Out"))
                refs_in = [r.index for r in refs((op.attrs.get("args"), op.attrs.get("kwargs")))
                           if isinstance(r, InputRef)]
                if any(r >= n_in for r in refs_in):
                    _fail(block, index, f"an argument refers to input {max(refs_in)} but the op has {n_in} inputs")
                refs_out = [r.index for r in refs(op.attrs.get("out")) if isinstance(r, OutputRef)]
                if any(r >= n_out for r in refs_out):
                    _fail(block, index, f"the result refers to output {max(refs_out)} but the op has {n_out} outputs")
    return program
