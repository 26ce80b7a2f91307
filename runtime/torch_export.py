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


# Checks torch.export keeps as run-time assertions (torch._check on a size
# test: the ExportedProgram's module raises when a call breaks it), and the
# checks of tensor values, which an ExportedProgram cannot raise in a
# torch.cond branch or a while_loop body: refused (docs/deployment.md).
def _check_sizes(cond, message):
    torch._check(cond, lambda: message)


def _check_dims(x, dims, name):
    for i, size in dims:
        torch._check(x.shape[i] == size, lambda: f"this program was converted for '{name}' of size {size} in "
                     f"dimension {i}")


def _int64_unchecked(*args):
    """`check_int64` in an ExportedProgram: its ints are int64, as torch's."""


_SIZE_CHECKS = {"check_sizes": _check_sizes, "check_dims": _check_dims, "check_int64": _int64_unchecked}
_VALUE_CHECKS = ("assert", "raise", "check_all_true", "check_bool", "decision_failed", "check_strides")


def _op_defs(op_type):
    import dataclasses
    opdef = get_op_def(op_type)
    kernel = _SIZE_CHECKS.get(op_type)
    return opdef if kernel is None else dataclasses.replace(opdef, kernel=kernel)


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
            if op.type in _VALUE_CHECKS:
                raise TorchExportError(f"op {op.type!r} is a run-time check of tensor values, which an "
                                       "ExportedProgram cannot raise: use d2s.onnx.export, whose model keeps "
                                       f"it{_where(op)}")
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
            fn = _copying_inputs(region_function(block, ops, reads, outputs, op_defs=_op_defs).fn,
                                 [i for i, n in enumerate(reads) if n in writes or n in through])
            if reads or any(get_op_def(op.type).random or op.type in _SIZE_CHECKS for op in ops):
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
        self._block(self.program.global_block(), env)
        outs = tuple(env[n] for n in self.fetch_names)
        return outs[0] if len(outs) == 1 else outs

    def _block(self, block, env):
        for step in self._plans[block.idx]:
            if step[0] == "region":
                _, reads, outputs, fn = step
                env.update(zip(outputs, fn(*[env[n] for n in reads])))
            elif step[0] == "constants":
                env.update({n: getattr(self, v) if isinstance(v, str) else v for n, v in step[1].items()})
            elif step[1].type == "cond":
                self._cond(block, step[1], env)
            else:
                self._while(block, step[1], env)

    def _select(self, block, op):
        """Whether `op`'s branches only yield constants or values from outside
        (a `break` / `continue` flag), each output of one shape on both
        sides: then `torch.where` picks the result exactly and cheaply. (It
        also keeps such a cond out of loop bodies, where torch.onnx cannot
        export a torch.cond today.)"""
        sides = [(op.attrs[f"{s}_block"], op.attrs[f"{s}_outs"]) for s in ("true", "false")]
        if self._written(block, op) or any(step[0] != "constants" for sub, _ in sides for step in self._plans[sub.idx]):
            return False
        (t_block, t_outs), (f_block, f_outs) = sides
        return all(t_block.find_var(a).dims == f_block.find_var(b).dims and t_block.find_var(a).kind == "tensor"
                   for a, b in zip(t_outs, f_outs))

    def _cond(self, block, op, env):
        if self._select(block, op):
            results = []
            for side in ("true", "false"):
                inner = dict(env)
                self._block(op.attrs[f"{side}_block"], inner)
                results.append([inner[n] for n in op.attrs[f"{side}_outs"]])
            pred = env[op.input("Cond")[0]]
            env.update(zip(op.output("Out"), [_choose(pred, t, f) for t, f in zip(*results)]))
            return
        # What the branches take from outside: the op's inputs, and names a
        # branch yields without defining them (a `break` flag left as it was).
        written = self._written(block, op)
        outer = [n for n in dict.fromkeys(op.input("X") + op.attrs["true_outs"] + op.attrs["false_outs"] + written)
                 if n in env]

        def branch(side):
            sub, names = op.attrs[f"{side}_block"], op.attrs[f"{side}_outs"] + written

            def run(*values):
                inner = dict(zip(outer, values))
                self._block(sub, inner)
                return self._fresh([inner[n] for n in names], values)
            return run

        results = torch.cond(env[op.input("Cond")[0]], branch("true"), branch("false"),
                             tuple(env[n] for n in outer))
        env.update(zip(op.output("Out") + written, results))

    def _while(self, block, op, env):
        from torch._higher_order_ops import while_loop
        written = self._written(block, op)  # carried too
        loop_vars, body_outs = op.attrs["loop_vars"] + written, op.attrs["body_outs"] + written
        body, cond_block, cond_out = op.attrs["body_block"], op.attrs["cond_block"], op.attrs["cond_out"]
        outer = {n: env[n] for n in op.input("X") + body_outs if n in env and n not in loop_vars}

        def state(values):
            inner = dict(outer)
            inner.update(zip(loop_vars, values))
            return inner

        def cond_fn(*values):
            inner = state(values)
            self._block(cond_block, inner)
            return inner[cond_out]

        def body_fn(*values):
            inner = state(values)
            self._block(body, inner)
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


def _choose(pred, t, f):
    if t.dtype == torch.bool:  # onnxruntime has no Where for bool values: the same choice in logic ops
        return (pred & t) | (~pred & f)
    return torch.where(pred, t, f)


def export_program(module):
    """`torch.export.export` of a ProgramModule, with each dimension that is
    symbolic in the program dynamic."""
    block = module.program.global_block()
    values, dynamic = example_inputs([block.vars[n] for n in module.feed_names])
    with torch.no_grad():
        return torch.export.export(module, tuple(values), dynamic_shapes=(tuple(dynamic),), strict=False)
