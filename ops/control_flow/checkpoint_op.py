"""The `checkpoint` op: `torch.utils.checkpoint.checkpoint(block, *args)` in
converted code, with the block's ops in a sub-block that torch's own
checkpoint runs when the program runs, so that the block's activations are
freed after the forward and computed again in backward, as eagerly.

Before (the user's code):

    h = torch.utils.checkpoint.checkpoint(self.layer, x, mask, use_reentrant=False)

After (the program, and the statements the executor makes of it):

    h = checkpoint(X=[x, mask, layer_w]) {block: <the layer's ops>, outs: [out_3],
                                          args: [X[0], X[1]], reentrant: False}

    def ck_1(v_layer_w, v_x, v_mask):   # the values the block reads from outside,
        <the block's statements>        # the explicit arguments last
        return (v_out_3,)
    (v_h,) = checkpoint(partial(ck_1, v_layer_w), v_x, v_mask, use_reentrant=False, ...)

Only the call's own positional tensor arguments are the checkpoint's
inputs; every other value the block reads (parameters, values of the
enclosing code, what its other arguments hold) is bound to the function, as
a closure is eagerly: the reentrant variant gives
no gradient to those when no input requires grad, exactly as torch does.
Values, gradients and the RNG draws are eager's: the same kernel, torch's
checkpoint, runs the same statements twice.

Where a sub-block cannot stand for the call, its ops are spliced into the
enclosing block instead (`splice`: the values are eager's, only the memory
saving is lost): inside `torch.no_grad()`, with a `context_fn` or `debug`,
when the block returns something other than tensors, numbers and
constants (or none it makes), keeps a value it makes on a module, or when
a value it makes is read outside it other than through its result (a cache
object: `settle`, once the trace is over). An op of the block that writes
in place a value of the enclosing code (batch norm's running statistics)
runs again when torch's checkpoint computes the block again, as it does
eagerly; spliced, it would run once, so such a block is refused there
(but inside `torch.no_grad()`, where eager computes nothing again either).
"""

import ast
import functools

import torch
from torch.utils import _pytree as pytree

from runtime.attrs import InputRef
from runtime.effects import var_attr_names, written_in_place
from runtime.errors import ConversionError
from runtime.ir import SCALAR, TENSOR, Variable
from runtime.passes._util import rename_uses

from .. import tracer
from ..recording import _grad_enabled, lift
from ..registry import OpDef, register
from ..user_frames import error_at_user_line, user_origin
from .values import defined_in, outer_reads


def _emit_checkpoint(op, gen):
    body = op.attrs["block"]
    outs = op.attrs["outs"]
    # The function's parameters: the call's graph values (inputs), None elsewhere.
    params = [op.input("X")[a.index] if isinstance(a, InputRef) else None for a in op.attrs["args"]]
    explicit = [p for p in params if p is not None]
    bound = [n for n in outer_reads([body]) if n not in explicit]
    name = gen.fresh_local("ck")
    arg_names = [gen.local(n) for n in bound] + [
        gen.local(p) if p is not None and p not in params[:i] else f"_unused_{i}" for i, p in enumerate(params)]
    stmts = gen.emit_block(body, keep=outs)
    stmts.append(ast.Return(value=ast.Tuple(elts=[gen.load(o) for o in outs], ctx=ast.Load())))
    fn_def = ast.FunctionDef(name=name, args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=a) for a in arg_names],
                                                            kwonlyargs=[], kw_defaults=[], defaults=[]),
                             body=stmts, decorator_list=[], returns=None, type_params=[])
    function = ast.Name(id=name, ctx=ast.Load())
    if bound:
        function = gen.call(gen.global_ref(functools.partial, "partial"), [function] + [gen.load(n) for n in bound])
    args = [gen.arg_expr(a, op.input("X")) for a in op.attrs["args"]]
    kwargs = {"use_reentrant": ast.Constant(op.attrs["reentrant"] is True)}
    kwargs.update((k, ast.Constant(v)) for k, v in sorted(op.attrs["settings"].items())
                  if k in _SETTINGS and type(v) in (bool, str))
    call = gen.call(gen.global_ref(torch.utils.checkpoint.checkpoint, "checkpoint"), [function] + args, kwargs)
    target = ast.Tuple(elts=[gen.store(o) for o in op.output("Out")], ctx=ast.Store())
    return [fn_def, gen.assign(target, call)]


# torch's checkpoint's keywords a program passes on, with bool or str values
# (a loaded program's others are not passed).
_SETTINGS = ("preserve_rng_state", "determinism_check", "early_stop")


register(OpDef("checkpoint", emit=_emit_checkpoint, inputs=("X",), outputs=("Out",),
               attrs=("block", "outs", "args", "reentrant", "settings"), var_attrs=("outs",)))


def checkpointed(function, args, kwargs, reentrant, settings, inline_why=None):
    """`function(*args, **kwargs)` (converted) as a `checkpoint` op, or its
    ops spliced into the current block: inside the user's `torch.no_grad()`
    (where nothing is computed again either), for `inline_why` (the caller's
    reason: torch machinery the op does not carry), or where the op could not
    stand for the call (see the module's docstring)."""
    splice_now = True if not _grad_enabled() else inline_why
    tr = tracer.current()
    parent = tr.block
    # A tensor argument (a parameter passed as one) is an input of the
    # checkpoint as eagerly: a value of the program the block is given.
    args = tuple(lift(a) if isinstance(a, torch.Tensor) and not isinstance(a, Variable) else a for a in args)
    body = tr.new_block()
    writes = len(tr.python_writes)
    with tr.block_guard(body):
        out = function(*args, **kwargs)
    leaves, spec = pytree.tree_flatten(out)
    variables = [v for v in leaves if isinstance(v, Variable)]
    why = splice_now or _why_not_an_op(body, args, leaves, variables, tr.python_writes[writes:])
    if why:
        if why is not True:  # (True: the call's values are eager's inline, recomputing included)
            _refuse_writes_outside(body, why, error_at_user_line)
        splice(tr.program, parent, body, len(parent.ops))
        return out
    # The call's positional graph values are the checkpoint's inputs. What
    # the block read of its other arguments (sizes, tensors in a tuple,
    # keywords, which only the non-reentrant variant takes) is a value it
    # reads from outside, bound to its function as eagerly a closure holds
    # it: the function is given None in their place. (Neither variant makes
    # a tensor inside a container an input: the reentrant one gives it no
    # gradient through the checkpoint, as eagerly.)
    inputs = list(dict.fromkeys(v.name for v in args if isinstance(v, Variable)))
    tree = [InputRef(inputs.index(a.name)) if isinstance(a, Variable) else None for a in args]
    reads = [n for n in outer_reads([body]) if n not in inputs]
    # A value of the enclosing code the block returns as it is (T5's
    # position bias, handed from layer to layer) is a result too: the
    # function hands back that tensor, and torch's checkpoint what eager's
    # gives for it (the same tensor, or the reentrant variant's output).
    variables = list({v.name: v for v in variables}.values())
    outs = []
    for v in variables:
        o = parent.create_var(name=tr.program.unique_name(v.name), shape=v.dims, dtype=v.dtype, kind=v.kind,
                              stop_gradient=v.stop_gradient)
        for key, value in v.__dict__.items():  # what tracing learned of it: strides, a Python number, hints
            if key not in o.__dict__ and key != "grad_leaf":
                o.__dict__[key] = value
        outs.append(o)
    parent.append_op("checkpoint", inputs={"X": inputs + reads}, outputs={"Out": [o.name for o in outs]},
                     attrs={"block": body, "outs": [v.name for v in variables], "args": tree,
                            "reentrant": reentrant, "settings": dict(settings)},
                     origin=user_origin())
    by_name = {v.name: o for v, o in zip(variables, outs)}
    return pytree.tree_unflatten([by_name[v.name] if isinstance(v, Variable) else v for v in leaves], spec)


_CONSTANTS = (type(None), bool, int, float, str)


def _why_not_an_op(body, args, leaves, variables, logged):
    """Why a sub-block run by torch's checkpoint would not give what the
    call gives, or None: the graph values it is given must be tensors or
    numbers, and so its result, beside constants, at least one of them made
    by the block, none kept on a module. (An op writing a value of the
    enclosing code in place, batch norm's running statistics, runs again in
    backward, as eagerly: eager's statistics are updated twice per step
    under checkpointing, and so are the program's.)"""
    if not all(a.kind in (TENSOR, SCALAR) for a in args if isinstance(a, Variable)):
        return "it is given a list a loop fills or a generator"
    if not all(isinstance(v, Variable) or type(v) in _CONSTANTS for v in leaves) \
            or not all(v.kind in (TENSOR, SCALAR) for v in variables):
        return "it returns something other than tensors, numbers and constants"
    if not any(v.name in body.vars for v in variables):
        return "it returns none of the values it makes"
    if _kept_on_modules(logged, defined_in([body])):
        return "it keeps a value it makes on a module"
    return None


def _refuse_writes_outside(body, why, error):
    """A block run inline writes what it writes in place once; eager's
    checkpoint computes it again in backward and writes it again (batch
    norm's statistics updated twice): refused rather than different."""
    name = _written_outside(body)
    if name is not None:
        raise error(f"the block torch.utils.checkpoint runs writes {name!r} in place, which eager PyTorch writes "
                    f"again when it computes the block again in backward; d2s runs this block inline ({why}), "
                    "where it would be written once")


def _written_outside(body):
    """The first value of the enclosing code an op of `body` writes in place, or None."""
    inside = defined_in([body])
    stack = [body]
    while stack:
        block = stack.pop()
        for op in block.ops:
            written = written_in_place(op)
            if written is not None and written not in inside:
                return written
            stack += op.sub_blocks()
    return None


def _kept_on_modules(logged, inside):
    """Whether a module attribute the block assigned (logged writes since
    it began) holds a value the block made (`self.attn = probs`): read
    after the call, it must exist outside the block."""
    for namespace, key, _ in logged:
        if "_parameters" in namespace and "_modules" in namespace and _holds(namespace.get(key), inside):
            return True
    return False


def _holds(value, names, depth=0):
    if isinstance(value, Variable):
        return value.name in names
    if depth < 3 and isinstance(value, (list, tuple)):
        return any(_holds(v, names, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict):
        return any(_holds(v, names, depth + 1) for v in value.values())
    return False


def splice(program, parent, body, at):
    """Put the ops and variables of `body` (a sub-block of `parent`) into
    `parent` at position `at`, and drop `body` from the program (blocks
    after it renumbered): the ops run inline, as before there was an op."""
    for name, var in body.vars.items():
        var.block = parent
        parent.vars[name] = var
    parent.ops[at:at] = body.ops
    body.ops, body.vars = [], {}
    old = {b.idx: b for b in program.blocks}
    program.blocks.remove(body)
    for b in program.blocks:
        if b.parent_idx == body.idx:
            b.parent_idx = parent.idx
    position = {b: i for i, b in enumerate(program.blocks)}
    for b in program.blocks:
        b.parent_idx = position[old[b.parent_idx]] if b.parent_idx >= 0 else -1
        b.idx = position[b]
    program._changed()


def settle(program, read_names=()):
    """Run inline every `checkpoint` op of which a value the block makes is
    read outside it other than through its result: by an op (a module
    attribute written in the block and read later) or in `read_names` (the
    program's results and the state it writes back)."""
    while True:
        found = _escaping(program, set(read_names))
        if found is None:
            return
        parent, at, op = found
        _refuse_writes_outside(op.attrs["block"], "a value it makes is read outside it",
                               lambda message: ConversionError(message, *(op.origin or (None, None))[:2]))
        for name, inner in _inline(program, parent, at, op).items():
            # Whoever holds the op's result (the program's results) names the block's value now.
            parent.vars.pop(name).name = inner


def without_checkpoints(program, fetch_names):
    """(program, fetch names): `program` as it is, or a copy with every
    `checkpoint` op's block run inline, readers of a result reading the
    block's value: what an exporter translates, as a graph without a
    backward pass has nothing to compute again."""
    if not any(op.type == "checkpoint" for block in program.blocks for op in block.ops):
        return program, list(fetch_names)
    program = program.copy()
    renames = {}
    while True:
        found = next(((block, at, op) for block in program.blocks for at, op in enumerate(block.ops)
                      if op.type == "checkpoint"), None)
        if found is None:
            break
        inlined = _inline(program, *found)
        for name in inlined:
            del found[0].vars[name]
        renames.update(inlined)

    def resolved(name):
        while name in renames:
            name = renames[name]
        return name
    return program, [resolved(n) for n in fetch_names]


def _inline(program, parent, at, op):
    """Replace `op` (at `parent.ops[at]`) by its block's ops; every reader
    of a result reads the block's value instead. Returns {result: value}."""
    renames = dict(zip(op.output("Out"), op.attrs["outs"]))
    del parent.ops[at]
    rename_uses(program.global_block(), renames)
    splice(program, parent, op.attrs["block"], at)
    return renames


def _escaping(program, read_names):
    for block in program.blocks:
        for at, op in enumerate(block.ops):
            if op.type != "checkpoint":
                continue
            inside = defined_in([op.attrs["block"]])
            if inside & read_names or any(inside & _reads(b, op) for b in program.blocks):
                return block, at, op
    return None


def _reads(block, skip):
    """Names the ops of `block` read (sub-blocks aside: they are blocks of
    the program too), except the op `skip` and its own sub-blocks' ops."""
    if any(block.is_under(sub) for sub in skip.sub_blocks()):
        return set()
    return {n for op in block.ops if op is not skip for n in op.input_names + var_attr_names(op)}
