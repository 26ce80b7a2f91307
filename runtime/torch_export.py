"""A Program as a `torch.export.ExportedProgram`: `cond` -> `torch.cond`,
`while` -> `torch._higher_order_ops.while_loop`, every run of other ops
between them replayed with the ops' kernels (`runtime/replay.py`).

    module = ProgramModule(program, feed_names, fetch_names, params)
    exported = export_program(module)       # dynamic dims as in the program
    exported.module()(x)                    # == the program's results

torch's control-flow operators need what d2s does not: loop state of one
shape for every trip, and tensors only. So a loop variable whose shape
changes between trips (a growing tensor) and tensor arrays (lists appended
in a loop) are refused with the reason, naming the user's line.
"""

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .ir import GENERATOR, TENSOR_ARRAY
from .optable import get_op_def
from .onnx_regions import example_inputs
from .replay import (AliasingError, check_aliasing, op_reads, outer_writes, reads_and_writes, region_function,
                     state_write, untraceable, written_roots)


class TorchExportError(ValueError):
    """The program has something torch.export's control flow cannot hold."""


def _where(op):
    if not op.origin:
        return ""
    filename, lineno, line = op.origin
    return f' (File "{filename}", line {lineno}' + (f": {line.strip()})" if line else ")")


# Checks torch.export keeps as run-time assertions: a size test as
# torch._check (the ExportedProgram's module raises when a call breaks it, or
# its range constraints refuse the call), a test of tensor values as
# `d2s::check` (below: a node of the graph, in torch.cond branches and
# while_loop bodies too: the module raises RuntimeError with the check's
# message where the program raises; see docs/deployment.md).
def _check_sizes(cond, message):
    torch._check(cond, lambda: message)


def _check_dims(x, dims, name):
    for i, size in dims:
        torch._check(x.shape[i] == size, lambda: f"this program was converted for '{name}' of size {size} in "
                     f"dimension {i}")


def _int64_unchecked(*args):
    """`check_int64` in an ExportedProgram: its ints are int64, as torch's."""


def _python_values_unchecked(values):
    """`check_python_values` in an ExportedProgram: the Python state of the
    exporting call, as a saved program keeps it (and the check's kernel
    keeps a note in its op, a write a torch.cond trace refuses)."""


# A check of tensor values in the graph: an op of d2s's own, not
# `torch._assert_async`, which torch.onnx.export drops (its ONNX model would
# then compute on where the program raises, from the placeholder values of
# a side never converted: a silent wrong result). Consumers that do not know
# `d2s::check` refuse the graph (torch.onnx names it as an op it cannot
# translate: d2s.onnx.export keeps the checks); loading a saved
# ExportedProgram needs `import d2s`, which registers it.
@torch.library.custom_op("d2s::check", mutates_args=())
def check(ok: torch.Tensor, message: str) -> torch.Tensor:
    """Raise RuntimeError(message) unless the 0-d bool `ok` is true."""
    if not bool(ok):
        raise RuntimeError(message)
    return ok.clone()


@check.register_fake
def _check_shape(ok, message):
    return torch.empty_like(ok)


torch.fx.node.has_side_effect(torch.ops.d2s.check.default)  # kept though nothing reads its result


def _holds(value, message):
    """The check that every element of `value` is true (an empty tensor
    passes, as in `_assert_kernel`), raised when the module runs."""
    if isinstance(value, torch.SymBool) and not statically_known_true(value):
        # A test of sizes: torch._check, a guard (or an assertion in a
        # branch); no message: dynamo cannot take its lambda in a branch.
        # Not a bool tensor: that needs torch.sym_ite, which dynamo folds in
        # a branch (`_check_sizes_inside`).
        torch._check(value)
        return
    if not isinstance(value, torch.Tensor):  # known from sizes, or a Python bool
        if bool(value):
            return
        value = torch.zeros((), dtype=torch.bool)
    check(value.bool().all(), message)


def _bool_tensor(value):
    """A Python or symbolic bool as a 0-d bool tensor: outside torch.cond
    branches and while_loop bodies only, unless the trace knows its value
    (`_refuse_unknown_inside`)."""
    if isinstance(value, torch.SymBool):
        value = torch.sym_ite(value, 1, 0)
    return torch.scalar_tensor(int(value) if isinstance(value, bool) else value, dtype=torch.int64) == 1


def _static_text(message, numbers):
    """A message whose run-time values (`ops/framework.run_time_text`) the
    graph cannot format: each field shown as `{...}`."""
    return message if numbers is None else message.format(*["{...}"] * len(numbers))


def _assert(cond, message, numbers=None, *values):
    _holds(cond, "AssertionError: " + _static_text(message, numbers))


def _raise_text(kind, message, numbers=None, *values):
    """The message of a `raise` op's error (eager's exception type leads it)."""
    return f"{kind}: {_static_text(message, numbers)}"


def _raise(*args):
    _holds(torch.zeros((), dtype=torch.bool), _raise_text(*args))


def _decision_failed(message):
    _holds(torch.zeros((), dtype=torch.bool), message)


def _check_all_true(valid, message):
    _holds(valid, message)


def _check_bool(x, expected, what):
    held = (x.bool().all() if expected else ~x.bool().all()) if isinstance(x, torch.Tensor) else bool(x) == expected
    _holds(held, f"this program was converted for inputs where {what} is {expected}; these inputs make it "
           f"{not expected}: convert again for such inputs")


_SIZE_CHECKS = {"check_sizes": _check_sizes, "check_dims": _check_dims, "check_int64": _int64_unchecked,
                "check_python_values": _python_values_unchecked}
_VALUE_CHECKS = {"assert": _assert, "raise": _raise, "decision_failed": _decision_failed,
                 "check_all_true": _check_all_true, "check_bool": _check_bool}
_KERNELS = {**_SIZE_CHECKS, **_VALUE_CHECKS}


def _check_sizes_inside(cond, message):
    """`check_sizes` in a torch.cond branch or a while_loop body: a check
    when the module runs (torch._check would fail the trace of a side the
    example's sizes do not take)."""
    if isinstance(cond, torch.Tensor):
        _holds(cond, message)
    elif not statically_known_true(cond):  # (what the trace knows of sizes needs no node)
        # torch._check with no message: a run-time assertion of the branch
        # (dynamo cannot take the message's lambda there). Not a tensor made
        # by torch.sym_ite: inside a torch.cond branch dynamo folds
        # sym_ite(test of sizes, 1, 0) to 0 (torch 2.13).
        torch._check(cond)


def _check_dims_inside(x, dims, name):
    for i, size in dims:
        _check_sizes_inside(x.shape[i] == size, f"this program was converted for '{name}' of size {size} in "
                            f"dimension {i}")


_INSIDE = {"check_sizes": _check_sizes_inside, "check_dims": _check_dims_inside}


def _op_table(inside):
    """The op table of a region: in the global block, or inside a branch
    or body (`_INSIDE`)."""
    import dataclasses

    def op_def(op_type):
        opdef = get_op_def(op_type)
        kernel = (_INSIDE if inside else {}).get(op_type) or _KERNELS.get(op_type)
        return opdef if kernel is None else dataclasses.replace(opdef, kernel=kernel)
    return op_def


def _check(program):
    """Refuse what torch.cond / while_loop cannot express, before tracing."""
    for var in program.global_block().vars.values():
        if var.kind == GENERATOR:
            raise TorchExportError(f"the program takes the torch.Generator {var.name!r}, which an ExportedProgram "
                                   "cannot take as an input")
    found = state_write(program)
    if found is not None:
        raise TorchExportError(f"op {found[0].type!r} writes the model's state {found[1]!r} (a parameter or "
                               "buffer) in place; the ExportedProgram keeps no state between runs, so its later "
                               f"runs would differ from the model's later calls{_where(found[0])}")
    for block in program.blocks:
        for op in block.ops:
            if op.type in ("check_strides", "check_layout"):
                raise TorchExportError(f"the program reads strides and was converted for one layout of "
                                       f"{op.attrs['args'][2]}, which an ExportedProgram can neither promise nor "
                                       f"check (its graph keeps no strides): use d2s.onnx.export, whose inputs "
                                       f"are dense, or d2s.jit.save{_where(op)}")
            names = op.input_names + op.output_names
            if any(block.find_var(n).kind == TENSOR_ARRAY for n in names):
                raise TorchExportError(f"op {op.type!r} works on a tensor array (a list appended in a loop), "
                                       f"which torch.export cannot hold: use d2s.onnx.export{_where(op)}")
            if op.type != "while":
                continue
            body = op.attrs["body_block"]
            for name, init in zip(op.attrs["loop_vars"], op.input("Init")):
                before, inside = block.find_var(init).dims, body.vars[name].dims
                if before != inside:
                    raise TorchExportError(
                        f"loop variable {name!r} changes shape between trips ({list(before)} before the loop, "
                        f"{list(inside)} in it); torch's while_loop keeps loop state of one shape{_where(op)}")


class ProgramModule(torch.nn.Module):
    """`forward(*feeds)` computes the program's fetches with `torch.cond`
    and `while_loop` for its control flow; parameters are buffers."""

    def __init__(self, program, feed_names, fetch_names, params):
        super().__init__()
        _check(program)
        self.program, self.feed_names, self.fetch_names = program, list(feed_names), list(fetch_names)
        self._param_slots = {}
        for i, name in enumerate(sorted(params)):
            slot = f"p{i}_" + "".join(c if c.isalnum() else "_" for c in name)
            self.register_buffer(slot, params[name].detach())
            self._param_slots[name] = slot
        # Every region compiled now: the control-flow operators trace their
        # branches and bodies with dynamo, which must only call the results.
        self._plans, self._constants, self._outer = {}, [], {}
        self._plan(program.global_block(), set(self.fetch_names))

    def _plan(self, block, keep):
        """The steps of `block`: ("region", reads, outputs, fn) for runs of
        straight-line ops, ("op", op) for cond / while (planned in turn)."""
        reads_after = [set(keep)]
        for op in reversed(block.ops):
            reads_after.append(reads_after[-1] | op_reads(op))
        reads_after.reverse()
        steps, run = [], []

        def flush(live):
            ops = list(run)
            run.clear()
            if not ops:
                return
            refused = untraceable(ops)
            if refused:
                raise TorchExportError(f"op {refused[0].type!r}: {refused[1]}{_where(refused[0])}")
            reads, writes = reads_and_writes(ops)
            through = [n for n in written_roots(ops) if n not in writes]  # written through a view made here
            try:
                check_aliasing(self.program, ops, set(reads) & (set(writes) | set(through)))
            except AliasingError as e:
                raise TorchExportError(f"op {e.op.type!r}: {e}{_where(e.op)}") from None
            outputs = [n for n in writes + through if n in live]
            kernels = _op_table(inside=block is not self.program.global_block())
            fn = _copying_inputs(region_function(block, ops, reads, outputs, op_defs=kernels).fn,
                                 [i for i, n in enumerate(reads) if n in writes or n in through])
            if reads or any(get_op_def(op.type).random or op.type in _KERNELS for op in ops):
                steps.append(("region", reads, outputs, fn))
                return
            # Constants (fill_constant, torch.zeros(3)) become buffers: a tensor
            # made inside a torch.cond branch is a constant torch.onnx cannot lift.
            values = {}
            for name, value in zip(outputs, fn()):
                if isinstance(value, torch.Tensor):
                    slot = f"k{len(self._constants)}"
                    self.register_buffer(slot, value)
                    self._constants.append(slot)
                    value = slot
                values[name] = value
            steps.append(("constants", values))

        for i, op in enumerate(block.ops):
            if op.type == "cond":
                flush(reads_after[i])
                steps.append(("op", op))
                written = set(self._written(block, op))
                self._plan(op.attrs["true_block"], set(op.attrs["true_outs"]) | written)
                self._plan(op.attrs["false_block"], set(op.attrs["false_outs"]) | written)
            elif op.type == "while":
                flush(reads_after[i])
                steps.append(("op", op))
                self._plan(op.attrs["cond_block"], {op.attrs["cond_out"]})
                self._plan(op.attrs["body_block"], set(op.attrs["body_outs"]) | set(self._written(block, op)))
            else:
                run.append(op)
        flush(reads_after[-1])
        self._plans[block.idx] = steps

    def _written(self, block, op):
        """The names of the enclosing scope `op` writes in place: its branches
        or body yield their new values (`runtime/replay.outer_writes`)."""
        names = self._outer.get(id(op))
        if names is None:
            loop_vars = op.attrs.get("loop_vars", ())
            names = self._outer[id(op)] = [n for n in outer_writes(block, op) if n not in loop_vars]
        return names

    def forward(self, *feeds):
        env = {name: getattr(self, slot) for name, slot in self._param_slots.items()}
        env.update(zip(self.feed_names, feeds))
        self._block(self.program.global_block(), env, 0)
        outs = tuple(env[n] for n in self.fetch_names)
        return outs[0] if len(outs) == 1 else outs

    def _block(self, block, env, depth):
        """Run `block`'s steps on `env`; `depth`: how many torch.cond /
        while_loop traces enclose the block."""
        for step in self._plans[block.idx]:
            if step[0] == "region":
                _, reads, outputs, fn = step
                env.update(zip(outputs, fn(*[env[n] for n in reads])))
            elif step[0] == "constants":
                env.update({n: getattr(self, v) if isinstance(v, str) else v for n, v in step[1].items()})
            elif step[1].type == "cond":
                self._cond(block, step[1], env, depth)
            else:
                self._while(block, step[1], env, depth)

    @staticmethod
    def _same_shapes(op):
        """Whether `op`'s sides give values of the same dims, output by output."""
        t_block, f_block = op.attrs["true_block"], op.attrs["false_block"]
        return all(t_block.find_var(a).dims == f_block.find_var(b).dims
                   for a, b in zip(op.attrs["true_outs"], op.attrs["false_outs"]))

    def _select(self, block, op):
        """Whether `op`'s branches only yield constants or values from outside
        (a `break` / `continue` flag), each output of one shape on both
        sides: then `torch.where` picks the result exactly and cheaply. (It
        also keeps such a cond out of loop bodies, where torch.onnx cannot
        export a torch.cond today.)"""
        sides = [(op.attrs[f"{s}_block"], op.attrs[f"{s}_outs"]) for s in ("true", "false")]
        if self._written(block, op) or any(step[0] != "constants" for sub, _ in sides for step in self._plans[sub.idx]):
            return False
        t_block, t_outs = sides[0]
        return self._same_shapes(op) and all(t_block.find_var(a).kind == "tensor" for a in t_outs)

    def _inline(self, block, op, env, depth, live):
        """`op`'s `live` side ("true" / "false") run in place of the cond."""
        inner = dict(env)
        self._block(op.attrs[f"{live}_block"], inner, depth)
        written = self._written(block, op)
        env.update(zip(op.output("Out") + written, [inner[n] for n in op.attrs[f"{live}_outs"] + written]))

    def _cond(self, block, op, env, depth):
        pred = env[op.input("Cond")[0]]
        if isinstance(pred, (bool, torch.SymBool)) and not self._same_shapes(op):
            # A test of sizes, not of values, whose sides give tensors of
            # other sizes (a mask padded to a length): torch.cond would give
            # them sizes it knows nothing of, which later ops cannot trace.
            # The trace takes the side of the example's sizes (those the
            # program was converted at) and keeps the test as a guard
            # (torch.export's own way with a Python `if` on sizes): the
            # ExportedProgram refuses sizes that take the other side.
            _refuse_unknown_inside(pred, depth, op)
            self._inline(block, op, env, depth, "true" if pred else "false")
            return
        failing = [side for side in ("true", "false") if _failure(op.attrs[f"{side}_block"]) is not None]
        if len(failing) == 1:
            # One side always raises (converted only as "not taken", or the
            # user's `raise`): a check that the run takes the other, which
            # then runs inline. No torch.cond, whose sides' outputs must agree.
            pred, live = env[op.input("Cond")[0]], "false" if failing == ["true"] else "true"
            if isinstance(pred, torch.Tensor):
                pred = pred.bool().all()
            if live == "false":
                pred = ~pred if isinstance(pred, torch.Tensor) else torch.sym_not(pred)
            _holds(pred, _failure(op.attrs[f"{failing[0]}_block"]))
            self._inline(block, op, env, depth, live)
            return
        if self._select(block, op):
            results = []
            for side in ("true", "false"):
                inner = dict(env)
                self._block(op.attrs[f"{side}_block"], inner, depth)
                results.append([inner[n] for n in op.attrs[f"{side}_outs"]])
            pred = env[op.input("Cond")[0]]
            env.update(zip(op.output("Out"), [_choose(pred, t, f, depth, op) for t, f in zip(*results)]))
            return
        # What the branches take from outside: the op's inputs, and names a
        # branch, or a cond nested in it, yields without defining them (a
        # `break` flag left as it was).
        written = self._written(block, op)
        # Tensors are the operands; numbers (sizes the trace holds as
        # symbols) reach the branches as closed-over values, which torch.cond
        # lifts itself (its operands must be tensors). A lifted size is a
        # symbol of unknown range inside, and a tensor sized by it then has
        # strides (Max(1, s)) torch.cond cannot match with the other side's:
        # so a size that is a dimension of an operand is read from it there.
        names = [n for n in dict.fromkeys(op.input("X") + sorted(op_reads(op)) + written) if n in env]
        outer = [n for n in names if isinstance(env[n], torch.Tensor)]
        closed = {n: env[n] for n in names if not isinstance(env[n], torch.Tensor)}
        # A test of sizes (a SymBool) comes in as a 0-d bool tensor made out
        # here: closed over, dynamo would fold it to one side inside.
        truths = [n for n in closed if isinstance(env[n], torch.SymBool)]
        for n in truths:
            _refuse_unknown_inside(env[n], depth, op)
        dims = {n: where for n in closed if (where := _dimension_of(env[n], [env[m] for m in outer]))}
        # Other sizes travel as the width of an empty tensor, which keeps
        # what the trace knows of them.
        carried = [n for n in closed if isinstance(closed[n], torch.SymInt) and n not in dims
                   and statically_known_true(closed[n] >= 0)]
        operands = [env[n] for n in outer] + [torch.empty((0, closed[n])) for n in carried]
        dims.update({n: (len(outer) + j, 1) for j, n in enumerate(carried)})
        flags = {n: len(operands) + j for j, n in enumerate(truths)}
        operands += [_bool_tensor(env[n]) for n in truths]

        def branch(side):
            sub, yields = op.attrs[f"{side}_block"], op.attrs[f"{side}_outs"] + written

            def run(*values):
                inner = dict(closed)
                inner.update({n: values[k] for n, k in flags.items()})
                inner.update({n: values[k].shape[i] for n, (k, i) in dims.items()})
                inner.update(zip(outer, values))
                self._block(sub, inner, depth + 1)
                values = values[:len(outer)]
                return self._fresh([_dense(v) for v in (inner[n] for n in yields)], values)
            return run

        results = torch.cond(env[op.input("Cond")[0]], branch("true"), branch("false"), tuple(operands))
        env.update(zip(op.output("Out") + written, results))

    def _while(self, block, op, env, depth):
        from torch._higher_order_ops import while_loop
        written = self._written(block, op)  # carried too
        loop_vars, body_outs = op.attrs["loop_vars"] + written, op.attrs["body_outs"] + written
        body, cond_block, cond_out = op.attrs["body_block"], op.attrs["cond_block"], op.attrs["cond_out"]
        outer = {n: env[n] for n in op.input("X") + sorted(op_reads(op)) + body_outs if n in env and n not in loop_vars}

        def state(values):
            inner = dict(outer)
            inner.update(zip(loop_vars, values))
            return inner

        def cond_fn(*values):
            inner = state(values)
            self._block(cond_block, inner, depth + 1)
            return inner[cond_out]

        def body_fn(*values):
            inner = state(values)
            self._block(body, inner, depth + 1)
            return self._fresh([inner[n] for n in body_outs], list(values) + list(outer.values()))

        results = while_loop(cond_fn, body_fn, tuple(env[n] for n in op.input("Init") + written))
        env.update(zip(op.output("Out") + written, results))


    def _fresh(self, results, given):
        """`results` with each tensor that is one of `given` or a buffer
        copied: torch.cond and while_loop refuse outputs aliasing inputs
        (a branch yielding a loop variable or a constant unchanged)."""
        # `is`, not a set of id()s: torch 2.11's dynamo cannot take id() of a tensor it traces.
        seen = list(given) + list(self.buffers())
        return tuple(r.clone() if isinstance(r, torch.Tensor) and any(r is v for v in seen) else r
                     for r in results)


def _dense(value):
    """`value`, or for a tensor whose strides are not the plain products of
    its sizes a copy with those: torch.cond refuses other outputs (a
    transposed view; a size the trace cannot prove positive, whose strides
    it writes as Max(1, s)). Values are the same; only strides differ."""
    if not isinstance(value, torch.Tensor):
        return value
    strides, step = [], 1
    for size in reversed(value.shape):
        strides.append(step)
        step = step * size
    strides.reverse()
    if all(_written_alike(a, b) for a, b in zip(value.stride(), strides)):
        return value
    if all(statically_known_true(a == b) for a, b in zip(value.stride(), strides)):
        # The same layout, its strides written otherwise (16*(a*b + a + b + 1)
        # for 16*(a + 1)*(b + 1)), which torch.cond compares as written.
        return value.as_strided(value.shape, strides)
    return torch.empty_strided(value.shape, strides, dtype=value.dtype, device=value.device).copy_(value)


def _written_alike(a, b):
    """Whether the ints or symbolic ints `a` and `b` are the same expression."""
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt) and a.node.expr == b.node.expr
    return a == b


def _dimension_of(size, tensors):
    """(k, i) where `tensors[k].shape[i]` is the symbolic int `size`, or None."""
    if not isinstance(size, torch.SymInt):
        return None
    for k, t in enumerate(tensors):
        for i, d in enumerate(t.shape):
            if isinstance(d, torch.SymInt) and d.node.expr == size.node.expr:
                return k, i
    return None


def _failure(block):
    """The message of the error every run of `block` raises (a `raise` or
    `decision_failed` among its own ops), or None."""
    for op in block.ops:
        if op.type == "decision_failed":
            return op.attrs["args"][0]
        if op.type == "raise":
            return _raise_text(*op.attrs["args"])
    return None


def _copying_inputs(fn, written):
    """`fn` working on copies of the arguments at `written` (which it writes
    in place): the ExportedProgram then mutates none of its inputs."""
    if not written:
        return fn

    def run(*args):
        args = list(args)
        for i in written:
            args[i] = args[i].clone()
        return fn(*args)
    return run


def _refuse_unknown_inside(value, depth, op):
    """Refuse a test of sizes the trace cannot decide (a SymBool) inside a
    torch.cond branch or a while_loop body: there dynamo folds
    torch.sym_ite(test, 1, 0) to 0 (torch 2.13), a silent wrong side."""
    if depth == 0 or not isinstance(value, torch.SymBool) or statically_known_true(value) \
            or statically_known_true(torch.sym_not(value)):
        return
    raise TorchExportError("a test of sizes inside a torch.cond branch or a while_loop body, which torch's "
                           "tracer cannot hold there (it folds such a test to one side): use d2s.onnx.export or "
                           f"d2s.jit.save{_where(op)}")


def _choose(pred, t, f, depth, op):
    if not isinstance(pred, torch.Tensor):  # a test of sizes (a SymBool)
        _refuse_unknown_inside(pred, depth, op)
        pred = _bool_tensor(pred)
    if t.dtype == torch.bool:  # onnxruntime has no Where for bool values: the same choice in logic ops
        return (pred & t) | (~pred & f)
    return torch.where(pred, t, f)


def export_program(module, sizes=None):
    """`torch.export.export` of a ProgramModule, with each dimension that is
    symbolic in the program dynamic. `sizes`: {feed name: shape} the
    program was converted at, the example's shapes where given: the trace
    then takes the sides of size tests the conversion took (torch.export
    keeps them as guards; its own example sizes are small and distinct, at
    which a deep network's maps shrink to one pixel, which torch fixes)."""
    block = module.program.global_block()
    values, dynamic = example_inputs([block.vars[n] for n in module.feed_names])
    for i, name in enumerate(module.feed_names):
        shape = (sizes or {}).get(name)
        if shape is not None and isinstance(values[i], torch.Tensor) and len(shape) == values[i].dim():
            # (Sizes 0 and 1 torch.export would fix: those keep their example size.)
            shape = [d if d >= 2 else e for d, e in zip(shape, values[i].shape)]
            values[i] = torch.zeros(shape, dtype=values[i].dtype)
    with torch.no_grad():
        return torch.export.export(module, tuple(values), dynamic_shapes=(tuple(dynamic),), strict=False)
