"""Programs as plain JSON-able dicts, and the checks a loaded one must pass.

    {"blocks": [{"idx": 0, "parent_idx": -1,
                 "vars": [{"name": "x", "shape": ["s0", 4], "dtype": "float32",
                           "persistable": false, "stop_gradient": true,
                           "kind": "tensor", "is_data": true}, ...],
                 "ops": [{"type": "torch.nn.functional.linear",
                          "inputs": {"X": ["x", "w", "b"]}, "outputs": {"Out": ["y"]},
                          "attrs": {"args": {"$tuple": [{"$in": 0}, ...]}, ...},
                          "origin": ["model.py", 12, "y = self.fc(x)"]}]},   # optional
                ...]}

Attribute values use the tagged encoding of `runtime.attrs`. Tensor arrays
also record `elem_known` (whether an element type has been seen).

`program_from_dict` treats its input as untrusted (it may come from a file
someone else wrote): it rebuilds the program only from the fields listed
above, and refuses anything that could make the executor do something other
than run registered kernels on declared variables -- see `_Validator`.
"""

import re

from .attrs import InputRef, OutputRef, decode, encode, leaves, refs
from .errors import ModelFormatError
from .format_rules import check_collisions, check_name, check_size, current_limits
from .ir import GENERATOR, SCALAR, TENSOR, TENSOR_ARRAY, Block, Program, dtype_name
from .optable import empty_table_hint, get_op_def, is_registered
from .run_modes import check_autocast_attr
from .signatures import CallError, check_call

# 2: symbolic dimensions ("s0", "2*s0") in shapes; scalar variables.
# Version 3 adds `$program_device` attributes (runtime/attrs.py); a version
# 2 file, which has none, reads the same under 3's rules. Version 4 adds
# the `for_rows` call attribute (a `for` loop's rows of a tensor, which eager
# slices with one `unbind`); a version 2 or 3 file has none.
FORMAT_VERSION = 4
READABLE_VERSIONS = (2, 3, 4)

_KINDS = (TENSOR, TENSOR_ARRAY, SCALAR, GENERATOR)
# The text of a symbolic dimension: symbols (s0, u1), integers, arithmetic
# and the size functions sympy prints; never evaluated, but only this, so a
# dimension cannot read "nan", "inf" or code.
_SYMBOLIC_DIM = re.compile(r"[A-Za-z0-9_ +\-*/%(),]{1,200}")
_DIM_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIM_SYMBOL = re.compile(r"[a-z]{1,4}[0-9]{1,6}")
_DIM_FUNCTIONS = frozenset("Max Min Abs floor ceiling Mod FloorDiv CeilDiv CleanDiv PythonMod IntTrueDiv "
                           "FloorToInt CeilToInt TruncToInt ModularIndexing Identity ceil trunc".split())
# ... which torch's printer writes `math.ceil(s1 / 4)` (a side rounded up to whole patches).
_MATH_PREFIX = "math."
# Sizes of real tensors stay far below this; 2**62 elements is no model's.
MAX_DIM = 2**40


def _valid_dim(d):
    if isinstance(d, str):
        d = d.replace(_MATH_PREFIX, "")
        return bool(_SYMBOLIC_DIM.fullmatch(d)) and all(
            _DIM_SYMBOL.fullmatch(w) or w in _DIM_FUNCTIONS for w in _DIM_WORD.findall(d))
    return isinstance(d, int) and not isinstance(d, bool) and -1 <= d <= MAX_DIM


# -- writing -------------------------------------------------------------------------

def program_to_dict(program, keep_origin=False):
    """The JSON-able form of `program`. Origins (user file, line, source
    line) are left out unless `keep_origin`: a saved model should not carry
    the author's file paths."""
    return {"blocks": [_block_to_dict(b, keep_origin) for b in program.blocks]}


def _block_to_dict(block, keep_origin):
    return {
        "idx": block.idx,
        "parent_idx": block.parent_idx,
        "vars": [_var_to_dict(v) for v in block.vars.values()],
        "ops": [_op_to_dict(op, keep_origin) for op in block.ops],
    }


def _var_to_dict(var):
    out = {
        "name": var.name,
        # A size expression the format does not take (over 200 characters:
        # nested roundings of an image side) is written as unknown, -1: the
        # sizes the program computes are the same, its shape says less.
        "shape": [d if _valid_dim(d) else -1 for d in var.dims],
        "dtype": var.dtype_name,
        "persistable": bool(var.persistable),
        "stop_gradient": bool(var.stop_gradient),
        "kind": var.kind,
        "is_data": bool(var.is_data),
    }
    # `elem_known` is set by the tensor-array builders; plain tensors lack it.
    if "elem_known" in var.__dict__:
        out["elem_known"] = bool(var.elem_known)
    return out


def _op_to_dict(op, keep_origin):
    out = {
        "type": op.type,
        "inputs": {k: list(v) for k, v in op.inputs.items()},
        "outputs": {k: list(v) for k, v in op.outputs.items()},
        "attrs": {k: encode(v, op.block.program.device) for k, v in op.attrs.items()},
    }
    if keep_origin and op.origin is not None:
        filename, lineno, line = op.origin
        out["origin"] = [str(filename), int(lineno), line or ""]
    return out


# -- reading ---------------------------------------------------------------------------

def program_from_dict(data, limits=None, trusted=False):
    """Rebuild a Program from `program_to_dict` output, validating every
    field first; raises ModelFormatError naming the first problem. `limits`
    (a `format_rules.LoadLimits`) bounds the counts of blocks, variables and
    ops and the length of names. `trusted` (a copy of an in-memory program:
    `clone`, pruning) skips the limits and the naming rules of the file
    format, which only files must follow."""
    try:
        return _Validator(data, None if trusted else current_limits(limits)).build()
    except RecursionError:
        raise ModelFormatError("program: attribute values are nested too deeply") from None


def _fail(where, message):
    raise ModelFormatError(f"{where}: {message}" if where else message)


def _expect(value, types, where, what):
    # bool is an int subclass; a shape of [true, 3] is not a shape.
    if isinstance(value, bool) and bool not in types:
        _fail(where, f"{what} must be {_type_names(types)}, got {value!r}")
    if not isinstance(value, types):
        _fail(where, f"{what} must be {_type_names(types)}, got {type(value).__name__} {value!r:.60}")
    return value


def _type_names(types):
    return " or ".join(t.__name__ for t in types)


def _str_list(value, where, what):
    _expect(value, (list,), where, what)
    for item in value:
        _expect(item, (str,), where, f"each entry of {what}")
    return value


class _Validator:
    """Builds a Program from untrusted data, one pass per concern:
    block structure, variables, ops (types, slots, names, attributes), then
    the references between ops and blocks."""

    def __init__(self, data, limits):
        self.data = data
        self.limits = limits
        self.program = Program()

    def build(self):
        blocks = self._check_blocks()
        if self.limits:
            self._check_counts(blocks)
        for i, raw in enumerate(blocks):
            self._add_vars(self.program.blocks[i], raw)
        if self.limits:
            check_collisions([v.name for v in self.program.all_vars()], "program")
        for i, raw in enumerate(blocks):
            self._add_ops(self.program.blocks[i], raw)
        for block in self.program.blocks:
            for j, op in enumerate(block.ops):
                self._check_op_refs(block, j, op)
        return self.program

    # -- blocks ------------------------------------------------------------------
    def _check_blocks(self):
        _expect(self.data, (dict,), "program", "the program")
        blocks = _expect(self.data.get("blocks"), (list,), "program", "'blocks'")
        if not blocks:
            _fail("program", "has no blocks")
        if self.limits:
            check_size("program: number of blocks", len(blocks), self.limits.max_blocks, "max_blocks")
        parents = []
        for i, raw in enumerate(blocks):
            where = f"block {i}"
            _expect(raw, (dict,), where, "a block")
            idx = _expect(raw.get("idx"), (int,), where, "'idx'")
            if idx != i:
                _fail(where, f"has idx {idx}; blocks must be listed in index order")
            parent = _expect(raw.get("parent_idx"), (int,), where, "'parent_idx'")
            if i == 0 and parent != -1:
                _fail(where, f"the global block must have parent_idx -1, got {parent}")
            if i > 0 and not 0 <= parent < len(blocks):
                _fail(where, f"parent_idx {parent} is not a block index (0..{len(blocks) - 1})")
            parents.append(parent)
        for i in range(1, len(blocks)):
            seen, j = set(), i
            while j != -1:
                if j in seen:
                    _fail(f"block {i}", "its chain of parent blocks contains a cycle")
                seen.add(j)
                j = parents[j]
        for i in range(1, len(blocks)):
            self.program.blocks.append(Block(self.program, i, parents[i]))
        return blocks

    def _check_counts(self, blocks):
        """Sizes first, before any object is built: a huge program is
        refused in the time it takes to count its lists."""
        count = lambda key: sum(len(raw.get(key, ())) for raw in blocks if isinstance(raw.get(key, ()), list))
        check_size("program: number of variables", count("vars"), self.limits.max_vars, "max_vars")
        check_size("program: number of ops", count("ops"), self.limits.max_ops, "max_ops")

    # -- variables ---------------------------------------------------------------------
    def _add_vars(self, block, raw):
        for k, var in enumerate(_expect(raw.get("vars", []), (list,), f"block {block.idx}", "'vars'")):
            where = f"block {block.idx}, var {k}"
            _expect(var, (dict,), where, "a variable")
            name = _expect(var.get("name"), (str,), where, "'name'")
            if self.limits:
                check_name(name, where, self.limits)
            elif not name:
                _fail(where, "empty variable name")
            where = f"block {block.idx}, var {name!r}"
            if name in block.vars:
                _fail(where, "is declared twice")
            shape = _expect(var.get("shape"), (list,), where, "'shape'")
            for d in shape:
                if not _valid_dim(d):
                    _fail(where, f"bad dimension {d!r:.40} in shape {shape!r:.80} (ints 0..2**40, -1 for unknown, "
                          "or a size expression such as \"2*s0\")")
            dtype = _expect(var.get("dtype"), (str,), where, "'dtype'")
            try:
                dtype_name(dtype)
            except ValueError as exc:
                _fail(where, str(exc))
            kind = var.get("kind", TENSOR)
            if kind not in _KINDS:
                _fail(where, f"unknown kind {kind!r} (known: {', '.join(_KINDS)})")
            flags = {f: _expect(var.get(f, False), (bool,), where, f"'{f}'")
                     for f in ("persistable", "stop_gradient", "is_data")}
            if flags["persistable"] and block.idx != 0:
                # The executor passes parameters to the global block only.
                _fail(where, "is persistable but not in the global block")
            created = block.create_var(name=name, shape=shape, dtype=dtype, kind=kind, **flags)
            if "elem_known" in var:
                created.elem_known = _expect(var["elem_known"], (bool,), where, "'elem_known'")

    # -- ops -----------------------------------------------------------------------------
    def _add_ops(self, block, raw):
        for j, op in enumerate(_expect(raw.get("ops", []), (list,), f"block {block.idx}", "'ops'")):
            where = f"block {block.idx}, op {j}"
            _expect(op, (dict,), where, "an op")
            op_type = _expect(op.get("type"), (str,), where, "'type'")
            if not is_registered(op_type):
                _fail(where, f"op type {op_type!r} is not a registered d2s op{empty_table_hint()}; "
                      "a saved program may only use the op allowlist (see ops/torch_ops.py)")
            where = f"block {block.idx}, op {j} ({op_type})"
            opdef = get_op_def(op_type)
            if opdef.live_object:
                _fail(where, f"this op type runs {opdef.live_object}, a live Python object that a "
                      "saved program cannot hold; it is never written, so this file was not made by d2s")
            inputs = self._slots(block, op.get("inputs", {}), opdef.inputs, where, "inputs")
            outputs = self._slots(block, op.get("outputs", {}), opdef.outputs, where, "outputs")
            raw_attrs = _expect(op.get("attrs", {}), (dict,), where, "'attrs'")
            attrs = {}
            for key, value in raw_attrs.items():
                self._check_tags(value, len(self.program.blocks), f"{where}, attr {key!r}")
                try:
                    attrs[key] = decode(value, self.program)
                except ModelFormatError as exc:
                    _fail(f"{where}, attr {key!r}", str(exc))
            missing = [a for a in opdef.attrs if a not in attrs]
            if missing:
                _fail(where, f"missing attribute(s) {missing}")
            _check_attr_schema(opdef, attrs, where)
            if self.limits and opdef.kernel is not None and "args" in attrs:
                try:  # a file's call must be one torch's signature takes (runtime/signatures.py)
                    check_call(opdef.kernel, attrs["args"], attrs.get("kwargs", {}))
                except CallError as exc:
                    _fail(where, f"a call its torch signature does not take: {exc}")
            if opdef.check_args is not None:
                problem = opdef.check_args(attrs.get("args", ()), attrs.get("kwargs", {}))
                if problem:
                    _fail(where, problem)
            block.append_op(op_type, inputs, outputs, attrs, self._origin(op.get("origin"), where))

    def _slots(self, block, slots, allowed, where, what):
        _expect(slots, (dict,), where, f"'{what}'")
        for slot, names in slots.items():
            if slot not in allowed:
                _fail(where, f"unknown {what[:-1]} slot {slot!r} (this op has {list(allowed)})")
            for name in _str_list(names, where, f"{what}[{slot!r}]"):
                if not _visible(block, name):
                    _fail(where, f"{what[:-1]} {name!r} is not a variable visible from block {block.idx}")
        return slots

    def _check_tags(self, value, num_blocks, where):
        """Reject malformed index tags before `decode` sees them: it would
        accept `{"$block": -1}` (Python's negative indexing) or `"2"`."""
        if isinstance(value, list):
            for item in value:
                self._check_tags(item, num_blocks, where)
            return
        if not isinstance(value, dict):
            return
        tags = [k for k in value if k.startswith("$")]
        if not tags:
            for item in value.values():
                self._check_tags(item, num_blocks, where)
            return
        tag, body = tags[0], value[tags[0]]
        if len(value) != (2 if tag == "$return_type" else 1):
            _fail(where, f"malformed tagged value {value!r:.80}")
        if tag in ("$block", "$in", "$out"):
            if not isinstance(body, int) or isinstance(body, bool) or body < 0:
                _fail(where, f"{tag} needs a non-negative int index, got {body!r}")
            if tag == "$block" and not 0 < body < num_blocks:
                _fail(where, f"block reference {body} is out of range (sub-blocks are 1..{num_blocks - 1})")
        elif tag in ("$tuple", "$slice", "$size"):
            self._check_tags(_expect(body, (list,), where, tag), num_blocks, where)
        elif tag == "$dict":
            for item in _expect(body, (dict,), where, tag).values():
                self._check_tags(item, num_blocks, where)
        elif tag == "$return_type":
            self._check_tags(_expect(value.get("items"), (list,), where, "$return_type items"),
                             num_blocks, where)

    @staticmethod
    def _origin(origin, where):
        if origin is None:
            return None
        if (not isinstance(origin, list) or len(origin) != 3 or not isinstance(origin[0], str)
                or not isinstance(origin[1], int) or not isinstance(origin[2], str)):
            _fail(where, f"'origin' must be [filename, lineno, line], got {origin!r:.80}")
        return tuple(origin)

    # -- references between ops, variables and blocks ---------------------------------------
    def _check_op_refs(self, block, j, op):
        where = f"block {block.idx}, op {j} ({op.type})"
        n_in, n_out = len(op.input("X")), len(op.output("Out"))
        kwargs = op.attrs.get("kwargs", {})
        if not isinstance(kwargs, dict) or not all(k.isidentifier() for k in kwargs):
            # They become keyword arguments of the kernel call.
            _fail(where, f"'kwargs' must map argument names to values, got {kwargs!r:.80}")
        for key, value in op.attrs.items():
            for ref in refs(value):
                if isinstance(ref, InputRef) and ref.index >= n_in:
                    _fail(where, f"attr {key!r} refers to input {ref.index} but the op has {n_in} X input(s)")
                if isinstance(ref, OutputRef) and ref.index >= n_out:
                    _fail(where, f"attr {key!r} refers to output {ref.index} but the op has {n_out} Out output(s)")
        subs = op.sub_blocks()
        for sub in subs:
            # A sub-block strictly below the op's block: the executor inlines
            # it, so a reference upwards or to itself would never terminate.
            if sub.parent is None or not sub.parent.is_under(block):
                _fail(where, f"sub-block {sub.idx} is not nested inside block {block.idx}")
        if subs:
            # Control-flow ops name values of their sub-blocks in the
            # attributes their type declares (true_outs, loop_vars, cond_out, ...).
            for key in get_op_def(op.type).var_attrs:
                value = op.attrs.get(key)
                names = [value] if isinstance(value, str) else value
                if not isinstance(names, (list, tuple)) or not all(isinstance(v, str) for v in names):
                    _fail(where, f"attr {key!r} must name variables, got {value!r:.80}")
                for name in names:
                    if not any(_visible(sub, name) for sub in subs):
                        _fail(where, f"attr {key!r} names {name!r}, which no sub-block of this op can see")


# Attributes of a call-style op (every op but the control-flow ones): the
# kernel's positional and keyword arguments, where its result goes, and
# whether it ran under no_grad (and under autocast), and whether it takes a
# `for` loop's rows of a tensor (d2s/operators/for_loops.py `_mark_for_rows`).
_CALL_ATTRS = {"args": tuple, "kwargs": dict, "out": object, "no_grad": bool, "autocast": list, "for_rows": bool}


def _check_attr_schema(opdef, attrs, where):
    """Every attribute is one the op's schema has, of the type it allows:
    a file cannot hand a kernel a sub-block, or a control-flow op a call."""
    allowed = set(opdef.attrs) | (set() if opdef.emit is not None and opdef.attrs else set(_CALL_ATTRS))
    for key, value in attrs.items():
        if key not in allowed:
            _fail(where, f"unknown attribute {key!r} (this op has {sorted(allowed)})")
        if key in opdef.attrs:
            continue  # typed by Program.verify (control flow) or by the op itself
        kind = _CALL_ATTRS[key]
        if not isinstance(value, kind):
            _fail(where, f"attribute {key!r} must be a {kind.__name__}, got {type(value).__name__}")
        if any(isinstance(leaf, Block) for leaf in leaves(value)):
            _fail(where, f"attribute {key!r} holds a block reference; only control-flow ops have sub-blocks")
    if "autocast" in attrs and "autocast" not in opdef.attrs:
        problem = check_autocast_attr(attrs["autocast"])
        if problem:
            _fail(where, f"attribute 'autocast' {problem}")
    out = attrs.get("out")
    # None: a position where the kernel returns None (multi_head_attention_forward's
    # weights with need_weights=False), which the program never reads.
    if out is not None and not all(leaf is None or isinstance(leaf, OutputRef) for leaf in leaves(out)):
        _fail(where, "attribute 'out' may only hold output positions ($out) and None")


def _visible(block, name):
    while block is not None:
        if name in block.vars:
            return True
        block = block.parent
    return False
