"""CUDA-graph replay of declarative calls: `d2s.cuda_graph(static)`, for a
declarative function or module, or a model from `d2s.jit.load`.

On a GPU every op of a program is a kernel launch, and launching is what a
small model's call costs. A CUDA graph records the launches of one call and
replays them with one launch. A replay re-runs only the GPU work: whatever
the call decided or did on the host is frozen into the graph. So a call is
replayed only where nothing it decides or does on the host can differ from
the call that was captured:

  - its arguments: every tensor on a CUDA device (a CPU tensor's values
    would be read at the capture only), except 0-d CPU tensors, which are
    counts the call reads on the host and join the key by value; none an
    expanded view (the graph's input buffers take each argument's strides);
    the same shapes, strides and dtypes, and the same other values (numbers,
    strings, None: part of the key); grad mode off (a replay records no
    autograd);
  - its program: the one a plain call would run now (a retrace after a
    module changed captures again); no decision between programs by a
    value, no Python object or module attribute it reads or writes beside
    its tensors, no print or check (but the check of the Python values it
    read, globals, config attributes, parameters' `requires_grad`, which
    each replay runs on the host first: a change runs the call plainly); every tensor it reads (parameters,
    buffers, constants) on a CUDA device, at the address it had at the
    capture (an optimizer step updates in place and is replayed; `.to()`, a
    swapped `.data` or a new Parameter capture again);
  - what it did: the first call of a key runs plainly, and is watched: one
    that wrote a module tensor or an argument in place or drew random
    numbers is never replayed (a replay would write its own buffers, or
    draw other numbers than eager);
  - GPU values read on the host (a tensor `if` or `while`, `.item()`, a
    decision checked when the program runs) synchronize with the device,
    which a capture refuses: such a program is not captured. (CUDA's
    conditional nodes could hold a tensor `if`; the torch we could run on a
    GPU, 2.11, has no API for them, and an untested path is not shipped.)

A call that is not replayed runs as a plain declarative call, with the same
results; a key whose calls cannot be replayed says why once, as a warning.
Every result of a replay is a tensor of its own: the graph's output buffers
are copied, so a later call never changes an earlier call's results.
"""

import warnings

import torch
import torch.utils._pytree as pytree

from ops.torch_ops import WRITES_UNDECLARED
from runtime import foreign_tracers
from runtime.errors import DecisionFailed
from runtime.optable import get_op_def

from . import module_watch
from .jit import TranslatedLayer
from .static_function import StaticFunction
from .translator_state import STATE


# Kinds of arguments (keys) one callable captures or refuses; each graph
# holds its buffers and a memory pool.
MAX_KEYS = 32


def cuda_graph(target):
    """Replay `target`'s calls as CUDA graphs where that is exact (module
    docstring). `target`: a declarative function, a module whose `forward`
    is declarative, or a model from `d2s.jit.load`. Returns a callable with `captures`,
    `replays` and `not_captured` (key -> reason) for inspection."""
    return GraphedCalls(target)


class _Declared:
    """A declarative function's calls: the program is the one its cache
    holds for the arguments (built on a miss, as a plain call would)."""

    def __init__(self, static):
        self.static = static
        self.name = static.__qualname__

    def program(self, args, kwargs):
        """(what identifies the program a plain call runs now, that program)."""
        concrete = self.static._lookup(args, kwargs)[0]
        return concrete, concrete.main_program

    def refusal(self, concrete):
        if concrete.decisions is not None:
            return "it chooses between programs by a value when it runs"
        if not concrete._plain:
            return ("it reads or writes Python state, module attributes or tensor layouts beside its tensors, "
                    "which a replay would not do")
        return None

    def bound(self, concrete):
        return list(concrete.main_program.bound.values())


class _Loaded:
    """A model from `d2s.jit.load`: its program for the current mode; it
    reads its tensors through the module (its parameters and buffers)."""

    def __init__(self, layer):
        self.layer = layer
        self.name = f"a loaded model ({type(layer).__name__})"

    def program(self, args, kwargs):
        part = self.layer._part
        return part, part[0]

    def refusal(self, part):
        if self.layer._paths:
            return "it chooses between its saved programs by a value when it runs"
        if part[4]:
            return "it carries module state from one call to the next, which a replay would not write"
        return None

    def bound(self, part):
        return []


class GraphedCalls:
    def __init__(self, target):
        if isinstance(target, TranslatedLayer):
            source = _Loaded(target)
        else:
            static = target.forward if isinstance(target, torch.nn.Module) else target
            if not isinstance(static, StaticFunction):
                raise TypeError("d2s.cuda_graph takes a declarative function, a module whose forward is "
                                "declarative (d2s.declarative(...)) or a model from d2s.jit.load, got "
                                f"{type(target).__name__}")
            source = _Declared(static)
        self._target = target
        self._source = source
        self._graphs = {}        # key -> _Graph
        self.not_captured = {}   # key -> why its calls run without a graph
        self.captures = 0
        self.replays = 0
        self._full = False       # MAX_KEYS kinds of arguments seen
        self._reads_cache = (None, [])  # (stamp, the tensors calls read): `_reads`

    def __call__(self, *args, **kwargs):
        key, tensors = self._key(args, kwargs)
        if key is None or key in self.not_captured:
            return self._target(*args, **kwargs)
        if key not in self._graphs and len(self._graphs) + len(self.not_captured) >= MAX_KEYS:
            # Keys that keep changing (a count of every value): plain calls, not a graph each.
            if not self._full:
                self._full = True
                warnings.warn(f"d2s.cuda_graph: {self._source.name} was called with {MAX_KEYS} kinds of "
                              "arguments already; calls with others run without a CUDA graph", stacklevel=2)
            return self._target(*args, **kwargs)
        # The program a plain call would run now (a retrace after a module
        # changed, another mode of a loaded model: another program): the
        # graph replays that one only.
        token, program = self._source.program(args, kwargs)
        graph = self._graphs.get(key)
        if graph is None or graph.token is not token or graph.state != self._state(token, program):
            return self._call_and_capture(key, token, program, args, kwargs, tensors)
        if not graph.checks_hold():  # a Python value the program read changed: a plain call converts again
            return self._target(*args, **kwargs)
        self.replays += 1
        return graph.replay(tensors)

    # -- when a call may be replayed ------------------------------------------------------------
    def _key(self, args, kwargs):
        """(key, tensor leaves) of a call a graph may replay, else (None, None)."""
        if torch.is_grad_enabled() or not STATE.enable_to_static or foreign_tracers.active():
            return None, None
        if not kwargs and all(type(a) is torch.Tensor for a in args):
            leaves, spec = args, len(args)  # the common call, without a tree to flatten
        else:
            leaves, spec = pytree.tree_flatten((args, kwargs))
        parts, tensors = [], []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                if leaf.is_cuda and leaf.layout == torch.strided and not leaf.is_nested and _no_overlap(leaf):
                    tensors.append(leaf)
                    parts.append((leaf.shape, leaf.stride(), leaf.dtype, leaf.device))
                elif _host_number(leaf):  # a loop count: read on the host, so its value is in the key
                    parts.append((leaf.dtype, leaf.item()))
                else:  # a CPU tensor's values would be read at the capture only
                    return None, None
            elif leaf is None or type(leaf) in (bool, int, float, str):
                parts.append((type(leaf), leaf))
            else:  # an object whose state the key cannot see
                return None, None
        if not tensors or torch.cuda.is_current_stream_capturing():  # (CUDA tensors: a CUDA build)
            return None, None
        current = torch.cuda.current_device()
        if any(t.device.index != current for t in tensors):  # a graph is captured on the current device
            return None, None
        modes = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"),
                 torch.are_deterministic_algorithms_enabled(), torch.is_inference_mode_enabled(),
                 torch.get_default_dtype(),
                 getattr(self._target, "training", None))
        return (spec, tuple(parts), modes), tensors

    def _reads(self, token, program):
        """The tensors a call may read beside its arguments: the program's
        bound tensors and a module's parameters and buffers (a new Parameter
        is another tensor). Walking a module tree costs ~2 us a tensor, so
        the list is kept until a module's tensors are assigned anew
        (d2s/module_watch.py) or the program changes."""
        stamp = (module_watch.generation(), id(token), program._version)
        if self._reads_cache[0] != stamp:
            reads = [t for t in self._source.bound(token) if isinstance(t, torch.Tensor)]
            if isinstance(self._target, torch.nn.Module):
                reads += [*self._target.parameters(), *self._target.buffers()]
            reads = list({id(t): t for t in reads}.values())  # a module's tensors are its program's too
            self._reads_cache = (stamp, reads)
        return self._reads_cache[1]

    def _state(self, token, program):
        """What a graph's replay depends on beside its arguments: the
        program's version and each tensor it reads, by identity and address
        (`.to()` or a swapped `.data` moves an address, not the module)."""
        return program._version, [(id(t), t.data_ptr()) for t in self._reads(token, program)]

    # -- capturing ------------------------------------------------------------------------------
    def _call_and_capture(self, key, token, program, args, kwargs, tensors):
        """The caller's call, run plainly; then, when it showed that a
        replay can stand for it, the capture of its key's graph. What the
        call wrote is seen by watching it: a module tensor or an argument
        written in place (running statistics, `embedding(max_norm=...)`,
        `x.mul_(2)`: a replay would write its own buffers, or write twice
        what the capture's warm-up wrote) or a generator moved (a replay
        would not draw eager's numbers)."""
        watched = list(self._reads(token, program))
        reason = self._source.refusal(token) or _program_refusal(program, watched)
        if reason is not None:
            self._refuse(key, reason)
            return self._target(*args, **kwargs)
        watched += [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        versions = [t._version for t in watched]
        devices = sorted({t.device.index or 0 for t in tensors})
        generators = _generator_states(devices)
        result = self._target(*args, **kwargs)
        if [t._version for t in watched] != versions:
            self._refuse(key, "it writes a module tensor or an argument in place (running statistics, "
                              "`embedding(max_norm=...)`, `x.mul_(2)`)")
        elif not _same_states(_generator_states(devices), generators):
            self._refuse(key, "it draws random numbers (a replay would not draw eager's)")
        else:
            reason, graph = self._capture(token, program, args, kwargs, tensors)
            if reason is not None:
                self._refuse(key, reason)
            else:
                self.captures += 1
                self._graphs[key] = graph
        return result

    def _refuse(self, key, reason):
        self.not_captured[key] = reason
        warnings.warn(f"d2s.cuda_graph: calls of {self._source.name} with these arguments run "
                      f"without a CUDA graph: {reason}", stacklevel=4)

    def _capture(self, token, program, args, kwargs, tensors):
        """(None, a _Graph), or (why not, None). The caller's call showed
        that the program writes nothing outside its results and draws
        nothing, so the warm-up call changes nothing the caller sees."""
        # The graph reads its inputs from buffers of its own, which each replay fills.
        buffers = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device) for t in tensors]
        for b, t in zip(buffers, tensors):
            b.copy_(t)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        it = iter(buffers)
        call_args, call_kwargs = pytree.tree_unflatten(
            [(next(it) if leaf.is_cuda else leaf.clone()) if isinstance(leaf, torch.Tensor) else leaf
             for leaf in leaves], spec)
        # A warm-up call on a side stream, as torch.cuda.graphs asks (lazy
        # cuBLAS/cuDNN handles, allocator state): the caller's call ran on
        # the caller's stream.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._target(*call_args, **call_kwargs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            # A pool of its own: graphs of other keys replay in any order.
            with torch.cuda.graph(graph):
                out = self._target(*call_args, **call_kwargs)
        except Exception as exc:  # noqa: BLE001 - the calls before ran: a synchronizing call failed
            torch.cuda.synchronize()
            return ("it reads a GPU value on the host while it runs (a tensor `if` or `while`, a value checked "
                    f"when the program runs, `.item()`): {str(exc).splitlines()[0]}"), None
        return None, _Graph(graph, buffers, out, token, self._state(token, program), host_checks(program))


def _no_overlap(t):
    """Whether a buffer of `t`'s strides can take `t`'s values: an expanded
    view (stride 0) cannot be written element by element, so its calls run
    plainly (as do views torch cannot tell quickly)."""
    return t.is_contiguous() or torch._debug_has_internal_overlap(t) == 0


def _host_number(t):
    """A 0-d CPU tensor outside autograd: a count the call reads on the host
    (`for t in range(length)`), a key by its value."""
    return t.device.type == "cpu" and t.dim() == 0 and not t.requires_grad and t.layout == torch.strided


# The check of the Python values a program read (ops/python_values.py: globals,
# config attributes, parameters' `requires_grad`): it reads nothing on the
# device and takes no inputs, so a replay runs it on the host first.
HOST_CHECKS = frozenset(("check_python_values",))


def host_checks(program):
    """(kernel, args, kwargs) of each of `program`'s host checks."""
    return [(get_op_def(op.type).kernel, op.attrs["args"], op.attrs["kwargs"])
            for op in program.global_block().ops if op.type in HOST_CHECKS]


def _program_refusal(program, reads):
    """Why calls of `program` cannot be replayed, known before a call, or
    None. `reads`: the tensors a call reads beside its arguments."""
    for block in program.blocks:
        for op in block.ops:
            # Undeclared writes (running statistics) are watched on the
            # caller's call; a print or a check acts outside the graph.
            if get_op_def(op.type).side_effect and op.type.rsplit(".", 1)[-1] not in WRITES_UNDECLARED \
                    and op.type not in HOST_CHECKS:
                return f"it acts outside its results ({op.type}: a print or a check)"
    on_cpu = sorted({tuple(t.shape) for t in reads if not t.is_cuda})
    if on_cpu:
        return f"it reads tensors on the CPU (of shapes {', '.join(map(str, on_cpu[:3]))})"
    return None


def _generator_states(devices):
    """The default generators' states: the CPU's and those of `devices`."""
    return (torch.default_generator.get_state(), [torch.cuda.get_rng_state(i) for i in devices])


def _same_states(a, b):
    return torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


class _Graph:
    """One captured call: its graph, input buffers, outputs, and the
    program and state (`GraphedCalls._state`) it was captured with."""

    def __init__(self, graph, buffers, out, token, state, checks=()):
        self.graph = graph
        self.checks = checks  # host_checks of the program: run before each replay
        self.buffers = buffers
        self.out_leaves, self.out_spec = pytree.tree_flatten(out)
        self.token = token  # what identifies the program captured
        self.state = state

    def checks_hold(self):
        try:
            for kernel, args, kwargs in self.checks:
                kernel(*args, **kwargs)
        except DecisionFailed:
            return False
        return True

    def replay(self, tensors):
        for b, t in zip(self.buffers, tensors):
            b.copy_(t)
        self.graph.replay()
        return pytree.tree_unflatten(
            [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in self.out_leaves], self.out_spec)
