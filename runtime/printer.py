"""`Program.to_string()`: one deterministic text form, one line per op.

    block 0 (parent -1)
      var x: float32[-1, 784] (data)
      var fc.weight: float32[10, 784] (persistable)
      tmp_0 = torch.nn.functional.linear(x, fc.weight, fc.bias)
      Out=[y] = cond(Cond=[c], Input=[x]) {false_block: block[2], true_block: block[1]}

Call-style ops (those with an `args` attribute: every captured torch call)
print as the call they run; other ops print their slots and attributes.
"""

from .attrs import render


def _call_text(op):
    ins = op.input("X")
    outs = op.output("Out")
    parts = [render(a, ins) for a in op.attrs.get("args", ())]
    parts += [f"{k}={render(v, ins)}" for k, v in op.attrs.get("kwargs", {}).items()]
    lhs = render(op.attrs["out"], ins, outs) if "out" in op.attrs else ", ".join(outs)
    call = f"{op.type}({', '.join(parts)})"
    if op.attrs.get("no_grad"):
        call += "  {no_grad}"
    for device, dtype, enabled in op.attrs.get("autocast", ()):  # runtime/run_modes.py
        call += f"  {{autocast {device} {dtype if enabled else 'off'}}}"
    if op.attrs.get("for_rows"):  # d2s/operators/for_loops.py: a `for` loop's row
        call += "  {for_rows}"
    if op.attrs.get("once"):  # runtime/passes/hoist_invariants.py
        call += "  {once}"
    return f"{lhs} = {call}" if lhs and lhs != "None" else call


def _slots(slots):
    return ", ".join(f"{k}=[{', '.join(v)}]" for k, v in sorted(slots.items()))


def op_to_string(op, with_origin=False):
    if "args" in op.attrs:
        text = _call_text(op)
    else:
        lhs = _slots(op.outputs)
        text = f"{op.type}({_slots(op.inputs)})"
        attrs = {k: v for k, v in op.attrs.items()}
        if attrs:
            text += " {" + ", ".join(f"{k}: {render(attrs[k])}" for k in sorted(attrs)) + "}"
        if lhs:
            text = f"{lhs} = {text}"
    if with_origin and op.origin:
        text += f"  # {op.origin[0]}:{op.origin[1]}"
    return text


def block_to_string(block, with_origin=False):
    lines = [f"block {block.idx} (parent {block.parent_idx})"]
    lines += [f"  var {v.to_string()}" for v in block.vars.values()]
    lines += [f"  {op_to_string(op, with_origin)}" for op in block.ops]
    return "\n".join(lines)


def program_to_string(program, with_origin=False):
    return "\n".join(block_to_string(b, with_origin) for b in program.blocks) + "\n"
