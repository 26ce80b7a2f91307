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
  - InputRef / OutputRef positions in call-style attributes are in range;
  - `cond` and `while` are well formed (see `_check_cond` / `_check_while`):
    each sub-block is a child of the op's block, every name the op's
    attributes list resolves in the block it belongs to, and the lists that
    pair up (outputs, branch results, loop variables, initial values, body
    results) have the same length.

A breach raises ProgramError showing the bad op among its neighbours.
"""

from .attrs import InputRef, OutputRef, refs
from .errors import ProgramError
from .ir import Block
from .optable import is_internal, is_registered


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

    # What each block has defined once all its ops ran (for the names a
    # control-flow op takes from its sub-blocks after they ran).
    defined = {}
    control_flow = []
    for block in program.blocks:
        available = {n for n, v in block.vars.items() if v.is_data or v.persistable}
        available |= provided.get(block.idx, set())
        parent = block.parent
        while parent is not None:
            available |= set(parent.vars)  # parents' values exist before a sub-block runs
            parent = parent.parent
        for index, op in enumerate(block.ops):
            if not (is_registered(op.type) or is_internal(op.type)):
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
            if op.type in _CONTROL_FLOW:
                control_flow.append((block, index, op))
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
        defined[block.idx] = available
    for block, index, op in control_flow:
        _CONTROL_FLOW[op.type](block, index, op, defined)
    return program


def _sub_block(block, index, op, key, parent):
    value = op.attrs.get(key)
    if not isinstance(value, Block):
        _fail(block, index, f"attribute {key!r} must be a sub-block, got {type(value).__name__}")
    if value.parent is not parent:
        _fail(block, index, f"attribute {key!r} is block {value.idx}, whose parent is block {value.parent_idx}, "
                            f"not block {parent.idx}")
    return value


def _names(block, index, op, key, count=None, what=None):
    value = op.attrs.get(key)
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _fail(block, index, f"attribute {key!r} must be a list of variable names")
    if count is not None and len(value) != count:
        _fail(block, index, f"attribute {key!r} has {len(value)} name(s) but the op has {count} {what}")
    return value


def _resolves(block, index, op, key, names, sub, defined):
    """Each of `names` is visible from `sub` and, if `sub` declares it,
    defined there once `sub` has run."""
    for name in names:
        try:
            sub.find_var(name)
        except KeyError:
            _fail(block, index, f"attribute {key!r} names {name!r}, which block {sub.idx} cannot see")
        if name in sub.vars and name not in defined.get(sub.idx, ()):
            _fail(block, index, f"attribute {key!r} names {name!r}, which no op of block {sub.idx} writes")


def _check_cond(block, index, op, defined):
    if len(op.input("Cond")) != 1:
        _fail(block, index, f"a cond takes exactly one Cond input, got {len(op.input('Cond'))}")
    n_out = len(op.output("Out"))
    for side in ("true", "false"):
        sub = _sub_block(block, index, op, f"{side}_block", block)
        names = _names(block, index, op, f"{side}_outs", n_out, "Out outputs")
        _resolves(block, index, op, f"{side}_outs", names, sub, defined)


def _check_while(block, index, op, defined):
    body = _sub_block(block, index, op, "body_block", block)
    cond = _sub_block(block, index, op, "cond_block", body)
    n_out = len(op.output("Out"))
    loop_vars = _names(block, index, op, "loop_vars", n_out, "Out outputs")
    _names(block, index, op, "loop_vars", len(op.input("Init")), "Init inputs")
    for name in loop_vars:
        if name not in body.vars:
            _fail(block, index, f"loop variable {name!r} is not declared in the body, block {body.idx}")
    if len(set(loop_vars)) != len(loop_vars):
        _fail(block, index, f"attribute 'loop_vars' lists a name twice: {loop_vars}")
    body_outs = _names(block, index, op, "body_outs", n_out, "Out outputs")
    _resolves(block, index, op, "body_outs", body_outs, body, defined)
    cond_out = op.attrs.get("cond_out")
    if not isinstance(cond_out, str):
        _fail(block, index, "attribute 'cond_out' must be a variable name")
    _resolves(block, index, op, "cond_out", [cond_out], cond, defined)


_CONTROL_FLOW = {"cond": _check_cond, "while": _check_while}
