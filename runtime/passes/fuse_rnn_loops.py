"""Fast level: a loop stepping an RNN cell over a sequence becomes one fused
`torch.lstm` / `torch.gru` / `torch.rnn_tanh` / `torch.rnn_relu` call.

Recognised: a `while` whose only loop variables are a counter, the cell's
state (h, or h and c) and nothing else, whose test is `ctr < n` (`n` defined
outside the loop, a tensor or a Python int), and whose body is exactly

    ctr' = ctr + 1
    x_t  = seq[:, ctr]            (batch first)  or  seq[ctr]  (time first)
    h', c' = torch.lstm_cell(x_t, (h, c), w_ih, w_hh, b_ih, b_hh)
           | torch.gru_cell / rnn_tanh_cell / rnn_relu_cell(x_t, h, ...)

with the weights and `seq` defined outside the loop: what
`for t in range(n): h, c = self.cell(x[:, t], (h, c))` traces to. The body
may also append each step's new `h` to a list the loop carries
(`hs.append(h)` after the cell: `hs = array_append(hs, h')`); the fused op
then appends the rows of the fused output, `output.select(time, t)`, which
hold those same states (each a view of its own, so writing one in place
later works as it does on the loop's tensors).

Before:                                            After:
    Out=[c_1, ctr_1, h_1] = while(Init=[c0, 0, h0],    (ctr_1, h_1, c_1) = fused_rnn_loop(
        X=[n, x, w_ih, w_hh, b_ih, b_hh])                  'lstm', 1, x, n, 0, h0, c0,
  block 1:                                                 w_ih, w_hh, b_ih, b_hh)
    ctr' = torch.Tensor.__add__(ctr, 1)
    x_t = torch.Tensor.__getitem__(x, (:, ctr))
    (h', c') = torch.lstm_cell(x_t, (h, c), w_ih, ...)

At run time the op reads the trip count, `n - ctr`: no trip leaves the
state as it was; when the steps would index past the sequence (eager raises
IndexError there) or start at a negative index, it runs the cell step by
step, exactly as the loop did. One program serves every length.

Tolerance: the fused kernels compute the same gates in a different order
(one matmul over all time steps for the input projection), so results match
the loop within floating-point rounding: relative 1e-5 in float32 for
outputs and gradients over ~50 steps (see docs/performance.md). Where the
fused call would run cuDNN (`_cudnn_rounding`), whose rounding is outside
that, the loop runs step by step.
"""

import torch

from ..attrs import InputRef, OutputRef
from ..ir import Operator
from ..optable import OpDef, is_internal, register
from ._util import find_var

_CELLS = {  # cell op type -> (fused kind, number of state tensors)
    "torch.lstm_cell": ("lstm", 2),
    "torch.gru_cell": ("gru", 1),
    "torch.rnn_tanh_cell": ("rnn_tanh", 1),
    "torch.rnn_relu_cell": ("rnn_relu", 1),
}
_FUSED = {"lstm": torch.lstm, "gru": torch.gru, "rnn_tanh": torch.rnn_tanh, "rnn_relu": torch.rnn_relu}
_STEP = {"lstm": torch.lstm_cell, "gru": torch.gru_cell, "rnn_tanh": torch.rnn_tanh_cell,
         "rnn_relu": torch.rnn_relu_cell}


def fused_rnn_loop(kind, time_dim, seq, n, ctr, h, c, w_ih, w_hh, b_ih, b_hh, *carried, collect=None):
    """(ctr, h, c, *carried) after `while ctr < n: step`, computed by one
    fused call; `carried` are loop variables the loop never changes (but
    `collect`, one of them, gets each step's h appended)."""
    return _fused(kind, time_dim, seq, n, ctr, h, c, w_ih, w_hh, b_ih, b_hh, collect) + carried


def _fused(kind, time_dim, seq, n, ctr, h, c, w_ih, w_hh, b_ih, b_hh, collect):
    start, stop = int(ctr), int(n)
    if stop <= start:
        return (ctr if isinstance(ctr, torch.Tensor) else torch.tensor(ctr)), h, c
    steps = seq.shape[time_dim]
    if start < 0 or stop > steps or _cudnn_rounding(seq):
        # Exactly the loop (and its IndexError past the end).
        for t in range(start, stop):
            x_t = seq.select(time_dim, t)
            if kind == "lstm":
                h, c = _STEP[kind](x_t, (h, c), w_ih, w_hh, b_ih, b_hh)
            else:
                h = _STEP[kind](x_t, h, w_ih, w_hh, b_ih, b_hh)
            if collect is not None:
                collect.append(h)
        return torch.tensor(stop), h, c
    window = seq.narrow(time_dim, start, stop - start)
    has_biases = b_ih is not None
    params = [w_ih, w_hh, b_ih, b_hh] if has_biases else [w_ih, w_hh]
    batch_first = time_dim == 1
    if kind == "lstm":
        out, hn, cn = torch.lstm(window, (h.unsqueeze(0), c.unsqueeze(0)), params, has_biases, 1, 0.0,
                                 False, False, batch_first)
    else:
        out, hn = _FUSED[kind](window, h.unsqueeze(0), params, has_biases, 1, 0.0, False, False, batch_first)
        cn = None
    if collect is not None:
        # `select`, not `unbind`: unbind's views may not be written in place.
        collect.extend([out.select(time_dim, t) for t in range(stop - start)])
    return torch.tensor(stop), hn[0], (cn[0] if cn is not None else c)


def _cudnn_rounding(seq):
    """Whether the fused call would run cuDNN's RNN, whose rounding is
    outside the fast level's promise: in TF32 while
    `torch.backends.cudnn.allow_tf32` is on (its default), 1e-3 off; in
    float32, still 1e-4 relative on small elements after 48 steps (measured
    on an H200 against the cell loop). The loop then runs step by step, as
    eager's cells do; with cuDNN off, torch's own fused kernels run, as on
    the CPU."""
    return seq.is_cuda and torch.backends.cudnn.enabled and torch.backends.cudnn.is_acceptable(seq)


if not is_internal("fused_rnn_loop"):
    # The counter and the length may be Python ints (see scalars.py).
    register(OpDef("fused_rnn_loop", kernel=fused_rnn_loop, internal=True, takes_python_ints=True))


def _single(block, op_type):
    ops = [op for op in block.ops if op.type == op_type]
    return ops[0] if len(ops) == 1 else None


def _input_of(op, arg):
    return op.input("X")[arg.index] if isinstance(arg, InputRef) else None


def _defined_in(block):
    return {n for op in block.ops for n in op.output_names} | set(block.vars)


def _match(op, program):
    """The fused op's (kind, time_dim, inputs, outputs) for `op`, or None."""
    body, test = op.attrs["body_block"], op.attrs["cond_block"]
    if len(test.ops) != 1 or len(body.ops) not in (3, 4):
        return None
    append = _single(body, "array_append")
    if len(body.ops) == 4 and (append is None or body.ops[-1] is not append):
        return None  # the fourth op may only be `hs.append(h')`, after the cell
    bound = _match_bound(op, test)
    step_slice = bound and _match_step_and_slice(body, bound[0])
    cell = step_slice and _match_cell(body, step_slice[1])
    if not cell:
        return None
    ctr, n, n_arg = bound
    step, _, seq, time_dim = step_slice
    kind, n_state, state, weights, biases, new_state = cell
    loop = _match_loop_vars(op, ctr, step, state, new_state, append)
    if loop is None:
        return None
    carried, collect = loop
    inside = _defined_in(body) | _defined_in(test) | set(op.attrs["loop_vars"])
    if any(name in inside for name in [seq, n, *weights, *biases] if name is not None):
        return None
    var = find_var(program, seq)
    if var is None or len(var.shape) != 3:
        return None
    init = dict(zip(op.attrs["loop_vars"], op.input("Init")))
    out_of = dict(zip(op.attrs["loop_vars"], op.output("Out")))
    inputs = [seq, n, init[ctr], init[state[0]], init[state[1]] if n_state == 2 else None,
              *weights, *biases, *[init[v] for v in carried]]
    outputs = [out_of[ctr], out_of[state[0]], out_of[state[1]] if n_state == 2 else None,
               *[out_of[v] for v in carried]]
    collect_at = None if collect is None else len(inputs) - len(carried) + carried.index(collect)
    return kind, time_dim, inputs, outputs, n_arg, collect_at


def _match_bound(op, test):
    """The test `ctr < n`: (ctr, n, n's argument), n a variable or an int."""
    (lt,) = test.ops
    if lt.type != "torch.Tensor.__lt__" or lt.output("Out") != [op.attrs["cond_out"]] or lt.attrs.get("kwargs"):
        return None
    ctr_arg, n_arg = lt.attrs["args"]
    ctr = _input_of(lt, ctr_arg)
    if ctr not in op.attrs["loop_vars"]:
        return None
    n = _input_of(lt, n_arg)
    if n is None and type(n_arg) is not int:
        return None
    return ctr, n, n_arg


def _match_step_and_slice(body, ctr):
    """`ctr' = ctr + 1` and `x_t = seq[:, ctr]` (or `seq[ctr]`): (step, get, seq, time_dim)."""
    step = _single(body, "torch.Tensor.__add__")
    get = _single(body, "torch.Tensor.__getitem__")
    if step is None or get is None:
        return None
    if step.attrs["args"] != (InputRef(0), 1) or step.input("X") != [ctr]:
        return None
    seq_arg, index = get.attrs["args"]
    seq = _input_of(get, seq_arg)
    if index == InputRef(1) or index == (InputRef(1),):
        time_dim = 0
    elif (isinstance(index, tuple) and len(index) == 2 and index[0] == slice(None)
          and index[1] == InputRef(1)):
        time_dim = 1
    else:
        return None
    if seq is None or get.input("X")[1:] != [ctr] or get.input("X")[0] != seq:
        return None
    return step, get, seq, time_dim


def _match_cell(body, get):
    """The cell `(x_t, state, w_ih, w_hh, b_ih, b_hh)` on the slice `get` gives:
    (kind, number of state tensors, state, weights, biases, new state)."""
    cell = next((o for o in body.ops if o.type in _CELLS), None)
    if cell is None or cell.attrs.get("kwargs"):
        return None
    kind, n_state = _CELLS[cell.type]
    args = cell.attrs["args"]
    if len(args) != 6 or _input_of(cell, args[0]) != get.output("Out")[0]:
        return None
    state_arg = args[1]
    if n_state == 2 and not (isinstance(state_arg, tuple) and len(state_arg) == 2):
        return None
    state = [_input_of(cell, a) for a in (state_arg if n_state == 2 else (state_arg,))]
    weights = [_input_of(cell, a) for a in args[2:4]]
    biases = [_input_of(cell, a) if a is not None else None for a in args[4:6]]
    if None in weights or (None in biases and biases != [None, None]):
        return None
    if cell.attrs.get("out") != (tuple(OutputRef(i) for i in range(n_state)) if n_state == 2 else OutputRef(0)):
        return None
    return kind, n_state, state, weights, biases, cell.output("Out")


def _match_loop_vars(op, ctr, step, state, new_state, append):
    """Loop variables: ctr and the state, each updated by its own step, the
    list `append` collects into (if any), and any the loop carries unchanged:
    (carried, collect)."""
    body, test = op.attrs["body_block"], op.attrs["cond_block"]
    loop_vars = op.attrs["loop_vars"]
    updates = dict(zip(loop_vars, op.attrs["body_outs"]))
    collect = None
    if append is not None:
        # hs = array_append(hs, h'): a list the loop carries, read by nothing else in the loop.
        collect = append.input("X")[0]
        if (append.attrs.get("args") != (InputRef(0), InputRef(1)) or append.input("X")[1:] != new_state[:1]
                or append.output("Out") != [collect] or collect not in loop_vars or updates[collect] != collect
                or any(collect in o.input_names for o in body.ops if o is not append)
                or any(collect in o.input_names for o in test.ops)):
            return None
    carried = [v for v in loop_vars if updates[v] == v and v not in (ctr, *state)]
    if set(loop_vars) - set(carried) != {ctr, *state} or len(loop_vars) != len(state) + 1 + len(carried):
        return None
    if updates[ctr] != step.output("Out")[0] or [updates[s] for s in state] != new_state:
        return None
    return carried, collect


def run(ctx):
    program = ctx.program
    for block in program.blocks:
        for i, op in enumerate(block.ops):
            if op.type != "while":
                continue
            found = _match(op, program)
            if found is None:
                continue
            kind, time_dim, inputs, outputs, n_arg, collect_at = found
            names = [n for n in inputs if n is not None]
            refs = iter(range(len(names)))
            args = (kind, time_dim) + tuple(InputRef(next(refs)) if n is not None else
                                            (n_arg if k == 1 else None) for k, n in enumerate(inputs))
            # The list to append to: one of the carried inputs (they come last, all present).
            kwargs = {} if collect_at is None else {"collect": InputRef(len(names) - len(inputs) + collect_at)}
            outs = [o for o in outputs if o is not None]
            out_refs = iter(range(len(outs)))
            out_tree = tuple(OutputRef(next(out_refs)) if o is not None else None for o in outputs)
            block.ops[i] = Operator(block, "fused_rnn_loop", {"X": names}, {"Out": outs},
                                    {"args": args, "kwargs": kwargs, "out": out_tree}, op.origin)
