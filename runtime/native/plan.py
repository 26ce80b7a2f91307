"""Segment layouts: which ops of a block form one native segment, and the
registers and instructions of each (what segment.cpp's `Segment` reads).

`runs` cuts a block's ops into runs a segment may hold (lower.py decides
which ops lower); `plan_segment` numbers a run's registers and frees each
after its last read. Codegen uses both for the straight-line code of every
block, lower_flow.py for the blocks of a `while`/`cond` run in C++.
"""

from .lower import INPLACE, fresh_names, out_names, writes


def runs(ops, lowered):
    """(start, end) per piece of `ops`: end > start for a run of lowered ops
    a segment may hold, end None for one op that stays Python. A run ends
    before an in-place op that writes a tensor from outside it (or a view of
    one): a segment that falls back must have written nothing Python reads."""
    i = 0
    while i < len(ops):
        end = i
        fresh = set()  # tensors the run made that nothing outside it can see
        while end < len(ops) and lowered[end] is not None:
            written = writes(ops[end], lowered[end])
            if written is not None and written not in fresh:
                break
            fresh |= fresh_names(ops[end], lowered[end])
            end += 1
        if end > i:
            yield i, end
            i = end
        else:
            yield i, None
            i += 1


class Plan:
    """A segment's layout: registers 0..len(inputs)-1 hold the inputs, every
    op result gets the next one; `instructions` as segment.cpp reads them."""

    def __init__(self, inputs, outputs, output_regs, n_regs, instructions):
        self.inputs = inputs
        self.outputs = outputs
        self.output_regs = output_regs
        self.n_regs = n_regs
        self.instructions = instructions


def plan_segment(module, ops, lowered, live_after):
    """The Plan for running `ops` (each lowered to (opcode, operands)) as one
    segment; `live_after(name)`: whether the code after the segment reads
    `name`. None when nothing the segment computes is read afterwards."""
    opcodes, kinds = _numbering(module)
    # The inputs: names read before any op of the segment defines them. They
    # take the low registers; results get the next ones, in order.
    inputs, defined = [], set()
    for op, (opcode, operands) in zip(ops, lowered):
        for kind, value in operands:
            for name in [value.name] if kind == "reg" else value.names if kind == "regs" else []:
                if name not in defined and name not in inputs:
                    inputs.append(name)
        defined.update(out_names(op))
    steps = []    # (opcode number, [(kind number, value or register)], [out registers])
    n_regs = len(inputs)
    current = {name: i for i, name in enumerate(inputs)}
    last_read = {}
    for k, (op, (opcode, operands)) in enumerate(zip(ops, lowered)):
        args = []
        for kind, value in operands:
            if kind == "reg":
                args.append((kinds[kind], current[value.name]))
                last_read[current[value.name]] = k
            elif kind == "regs":
                regs = [current[n] for n in value.names]
                args.append((kinds[kind], regs))
                for r in regs:
                    last_read[r] = k
            else:
                args.append((kinds[kind], value))
        outs = []
        if opcode in INPLACE:
            # The result is the written tensor itself: every name the op
            # gives it (the user's `b = a.mul_(2)`) reads that register.
            written = current[operands[0][1].name]
            outs.append(written)
            for name in out_names(op):
                current[name] = written
        else:
            for name in out_names(op):
                current[name] = n_regs
                outs.append(n_regs)
                n_regs += 1
        steps.append((opcodes[opcode], args, outs))
    outputs = [name for name, r in current.items() if r >= len(inputs) and live_after(name)]
    if not outputs:
        return None
    output_regs = [current[n] for n in outputs]
    keep = set(output_regs)
    instructions = []
    for k, (opcode, args, outs) in enumerate(steps):
        # A register is freed after its last read (results nobody reads, at once),
        # so intermediates die as early as in the Python code.
        frees = sorted(r for r, last in last_read.items() if last == k and r not in keep)
        frees += [r for r in outs if r not in last_read and r not in keep]
        instructions.append((opcode, args, outs, frees))
    return Plan(inputs, outputs, output_regs, n_regs, instructions)


_numbers = {}


def _numbering(module):
    if module not in _numbers:
        _numbers[module] = (module.opcodes(), module.operand_kinds())
    return _numbers[module]
