"""Run a generated program eagerly and statically and classify the outcome.

For one `fuzz_programs.Program`:

1. Inputs. A fixed pool of candidate inputs (signs, zeros, trip counts 0..3,
   rows of both signs) runs eagerly under a line tracer; inputs are chosen
   greedily until every line transition and every loop trip class (0, 1,
   several) that any candidate reaches is reached: both branches, zero and
   several trips and early exits are exercised whenever some input can.
   An input on which the program's own checks raise (a `raise`/`assert`
   whose message starts with ``fuzz:``) expects the same exception type and
   message from the declarative call and from the Executor.
2. The program is built ONCE, by `@declarative` from the first input; every
   input then runs through the declarative call and through the `Executor` on
   that same program, and must give the eager result exactly (values, dtype,
   shape; gradients of ``x`` when it requires grad; inputs mutated in place).
   The cache must hold one program, and each tensor-dependent ``if``/``while``
   the eager runs reached must have produced a ``cond``/``while`` op.
   Then inputs whose ``m`` has more rows (when the program runs on them
   eagerly) are called too: the first traces the rows as a run-time size
   (d2s/varying_sizes.py), and every one must give eager's result, through
   the declarative call and through the Executor.
3. The outcome is one of ``pass``, ``wrong`` (a silent difference), ``crash``
   (an exception that is not a documented ConversionError, or one whose
   message names internals or is false), ``refused`` (a ConversionError the
   docs list) or ``invalid`` (the program fails eagerly: a generator bug).

`Outcome.signature` groups outcomes into distinct failures (the stage plus
the message with names and numbers blanked).
"""

import contextlib
import importlib.util
import os
import re
import signal
import sys
import tempfile
import threading
import traceback
import warnings

import torch

import d2s
from runtime.errors import DecisionFailed
from runtime.output_tree import rebuild

import fuzz_programs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DOCS = os.path.join(ROOT, "docs", "syntax_and_limitations.md")
SECONDS_PER_PROGRAM = 60  # of CPU time
WALL_SECONDS_PER_PROGRAM = 900
MAX_INPUTS = 8
_DIR = None
_COUNT = [0]


class Outcome:
    def __init__(self, kind, stage="", detail="", message=""):
        self.kind, self.stage, self.detail, self.message = kind, stage, detail, message

    @property
    def signature(self):
        """What identifies a distinct failure (for wrong results: after minimisation)."""
        return (self.kind, self.stage, self.detail)

    @property
    def klass(self):
        """What a minimisation step must keep: a wrong result stays wrong at the same stage."""
        return (self.kind, self.stage) if self.kind == "wrong" else self.signature

    def __repr__(self):
        return f"Outcome({self.kind}, {self.stage}, {self.detail!r})"


# -- inputs ------------------------------------------------------------------------------------

_X = [[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0], [-2.0, 0.5, 1.5], [0.0, 0.0, 0.0], [0.5, 0.0, -0.5],
      [3.0, 2.5, 3.0], [-3.0, 1.0, -0.5], [1.5, -1.0, 0.5]]
_ROWS = [[1.0, -0.5, 2.0], [-1.5, -2.0, 0.5], [0.5, 0.5, 0.5], [-0.5, 1.0, -3.0], [2.0, 2.0, -1.0]]


def candidates(rows, grad):
    """The candidate inputs: (x, m, n) tuples; the first is the building input."""
    out = []
    for i in range(24):
        x = torch.tensor(_X[i % len(_X)])
        m = torch.tensor([_ROWS[(i * 2 + r * (1 + i % 3)) % len(_ROWS)] for r in range(rows)])
        if i % 5 == 4:
            m = -m
        n = torch.tensor((i // 2) % 4)
        out.append((x.requires_grad_(grad), m, n))
    return out


def other_sizes(fn, program, filename):
    """Inputs like the candidates whose `m` has 1 and 3 rows more, with
    their eager results, where the program runs on them eagerly."""
    out = []
    for extra in (1, 3):
        args = candidates(program.rows + extra, program.grad)[extra]
        try:
            result, grad, mutated, _ = eager_run(fn, args, filename)
        except Exception:  # noqa: BLE001 - the program needs its number of rows
            continue
        out.append((args, result, grad, mutated))
    return out


def clone(args):
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)


class _Coverage:
    """Line transitions and loop trip classes of one eager call of `f`."""

    def __init__(self, filename):
        self.filename, self.features = filename, set()

    def __call__(self, frame, event, arg):
        if frame.f_code.co_filename != self.filename:
            return None
        prev, hits = [None], {}

        def local(frame, event, arg):
            if event == "line":
                line = frame.f_lineno
                self.features.add((frame.f_code.co_name, prev[0], line))
                hits[line] = hits.get(line, 0) + 1
                prev[0] = line
            elif event == "return":
                for line, count in hits.items():
                    self.features.add((frame.f_code.co_name, line, "hits", min(count, 3)))
            return local
        return local


class Raised:
    """An expected exception: a generated `raise`/`assert` (message starting
    with ``fuzz:``) that the eager call took. The static call must raise the
    same type with a message starting with the same text."""

    def __init__(self, exc):
        self.type, self.text = type(exc), str(exc)

    def __repr__(self):
        return f"raises {self.type.__name__}({self.text!r})"


def eager_run(fn, args, filename=None):
    """(result, grad, mutated inputs, features) of one eager call; the result
    is a `Raised` when the program's own checks raise."""
    args = clone(args)
    cov = _Coverage(filename) if filename else None
    if cov:
        sys.settrace(cov)
    try:
        result = fn(*args)
    except (ValueError, AssertionError, IndexError, UnboundLocalError) as exc:
        # The generated checks, loop bodies that raise, and a name first assigned
        # in a loop read after zero trips.
        if not (str(exc).startswith("fuzz:") or isinstance(exc, (IndexError, UnboundLocalError))):
            raise
        result = Raised(exc)
    finally:
        if cov:
            sys.settrace(None)
    grad = None if isinstance(result, Raised) else _grad(result, args)
    return result, grad, args, cov.features if cov else set()


def _grad(result, args):
    """The gradient of x for a weighted sum of the (first) result."""
    x = args[0]
    if isinstance(result, tuple) and result:
        result = result[0]
    if not x.requires_grad or not isinstance(result, torch.Tensor) or not result.requires_grad:
        return None
    weights = torch.arange(1.0, 1.0 + result.numel()).reshape(result.shape)
    (gx,) = torch.autograd.grad((result * weights).sum(), [x], allow_unused=True)
    return gx


def choose_inputs(fn, program, filename):
    """Eager results of the inputs that together reach every feature some candidate reaches."""
    runs = []
    for args in candidates(program.rows, program.grad):
        try:
            runs.append((args,) + eager_run(fn, args, filename))
        except Exception:
            if not runs:  # the building input must run eagerly
                raise
    chosen, seen = [runs[0]], set(runs[0][4])
    rest = runs[1:]
    while rest and len(chosen) < MAX_INPUTS:
        best = max(range(len(rest)), key=lambda j: len(rest[j][4] - seen))
        if not rest[best][4] - seen:
            break
        seen |= rest[best][4]
        chosen.append(rest.pop(best))
    return [(args, result, grad, mutated) for args, result, grad, mutated, _ in chosen], seen


# -- comparison --------------------------------------------------------------------------------

# The level declarative calls compile at (tools/fuzz_translator.py --optimize).
# The fast level promises eager's results up to floating-point rounding
# (docs/performance.md): its floating-point values are compared with that
# tolerance, everything else (and the default level) exactly.
LEVEL = os.environ.get("D2S_FUZZ_OPTIMIZE", "default")
# The device programs run on (tools/fuzz_translator.py --device): each
# program runs under `with torch.device(DEVICE)`, so its inputs and every
# tensor it makes are there, eagerly and in the program; the Executor runs
# at that place.
DEVICE = os.environ.get("D2S_FUZZ_DEVICE", "cpu")
_FAST_RTOL, _FAST_ATOL = 1e-5, 1e-6


def same(eager, static, rounding=False, python_types=True):
    """Whether a static result is the eager one: exactly, or up to float
    rounding with `rounding`. A Python number or string must come back as
    one of eager's type (a declarative call gives them back as Python
    values: `7` is not `7.0`); without `python_types` (the Executor, which
    fetches tensors) a number may come back as a 0-d tensor."""
    if isinstance(eager, (tuple, list)):
        kind = type(static) is type(eager) if python_types else isinstance(static, (tuple, list))
        return kind and len(eager) == len(static) and all(
            same(a, b, rounding, python_types) for a, b in zip(eager, static))
    if isinstance(eager, torch.Tensor):
        if not (isinstance(static, torch.Tensor) and static.dtype == eager.dtype and static.shape == eager.shape):
            return False
        if rounding and eager.is_floating_point():
            return torch.allclose(static.detach(), eager.detach(), _FAST_RTOL, _FAST_ATOL, equal_nan=True)
        return torch.equal(static.detach(), eager.detach())
    if eager is None or isinstance(eager, str):
        return type(static) is type(eager) and static == eager
    if python_types and type(static) is not type(eager):
        return False
    value = static.item() if isinstance(static, torch.Tensor) and static.numel() == 1 else static
    if rounding and type(value) is float and type(eager) is float:
        return abs(value - eager) <= _FAST_ATOL + _FAST_RTOL * abs(eager) or value == eager
    return type(value) in (int, float, bool) and value == eager


def _show(value):
    return repr(value.detach() if isinstance(value, torch.Tensor) else value)


# -- errors ------------------------------------------------------------------------------------

def documented_messages(path=DOCS):
    """Regexes of the ConversionError messages the docs list (fenced blocks; a blank line separates
    two messages in one block), with names and numbers open."""
    text = open(path).read()
    patterns = []
    messages = [m for block in re.findall(r"```\n(.*?)```", text, re.S) for m in re.split(r"\n\s*\n", block)]
    for message in messages:
        message = " ".join(message.split())
        if not message:
            continue
        pattern = re.escape(message)
        pattern = re.sub(r"'[^']*'", "'[^']+'", pattern)
        pattern = re.sub(r"`[^`]*`", "`[^`]+`", pattern)
        pattern = re.sub(r"\b(int64|float32|int32|float64|bool)\b", r"\\w+", pattern)  # (before the digits)
        pattern = re.sub(r"\d+", r"\\d+", pattern)
        pattern = re.sub(r"\b([Tt]rue|[Ff]alse)\b", "([Tt]rue|[Ff]alse)", pattern)
        pattern = re.sub(r"\bNone\b", r"\\w+", pattern)
        patterns.append(re.compile(pattern))
    return patterns


_DOCUMENTED = None


def _is_documented(message):
    global _DOCUMENTED
    if _DOCUMENTED is None:
        _DOCUMENTED = documented_messages()
    text = " ".join(message.split())
    return any(p.search(text) for p in _DOCUMENTED)


def blank(message):
    """The message with quoted names, numbers and file locations blanked, for grouping."""
    message = re.sub(r'File "[^"]*", line \d+: ', "", message).split("\n")[0]
    message = re.sub(r"'[^']*'", "'_'", message)
    message = re.sub(r"\d+", "N", message)
    return " ".join(message.split())[:160]


def classify_error(exc, program, source, path=None):
    """An exception from the static side -> Outcome (refused, or crash with the reason)."""
    message = exc.message if isinstance(exc, d2s.ConversionError) else f"{type(exc).__name__}: {exc}"
    named = set(re.findall(r"'([A-Za-z_]\w*)'", message))
    quoted = set(re.findall(r"[`']([A-Za-z_]\w*)[`']", message))
    internal = [w for w in quoted if re.search(r"_\d+$|^__", w) and not re.search(rf"\b{w}\b", source)]
    foreign = [w for w in named if not re.search(rf"\b{re.escape(w)}\b", source)]
    if isinstance(exc, d2s.ConversionError):
        defined = set(program.state)
        false = [w for w in named & defined if re.search(r"defined before|not defined|first assigned", message)]
        if foreign or internal:
            return Outcome("crash", "conversion_error", "names internals: " + blank(message), message)
        if false:
            return Outcome("crash", "conversion_error", "false message: " + blank(message), message)
        if not _is_documented(message):
            return Outcome("crash", "conversion_error", "undocumented: " + blank(message), message)
        if path is not None and (exc.filename != path or not exc.lineno):
            return Outcome("crash", "conversion_error", "not at the user's line: " + blank(message),
                           f"{message}\n(raised for {exc.filename}, line {exc.lineno})")
        return Outcome("refused", "conversion_error", blank(message), message)
    if isinstance(exc, RuntimeError) and "d2s cannot convert again and rerun this call" in message:
        # A decision broken after an in-place write to an input (docs/syntax_and_limitations.md,
        # "Programs converted again"): documented, loud, and named at the op that wrote.
        return Outcome("refused", "rerun", blank(message), message)
    tb = traceback.extract_tb(exc.__traceback__)
    where = next((f"{os.path.basename(fr.filename)}:{fr.name}" for fr in reversed(tb)
                  if ROOT in os.path.abspath(fr.filename) and "/tests/" not in fr.filename), "")
    return Outcome("crash", "exception", f"{type(exc).__name__} at {where}: {blank(str(exc))}", message)


# -- running one program -----------------------------------------------------------------------

def load(program):
    """Write the program to a file (conversion needs source) and import it; -> (f, path, source)."""
    global _DIR
    if _DIR is None:
        _DIR = tempfile.mkdtemp(prefix="d2s_fuzz_")
    source = program.source()
    _COUNT[0] += 1
    path = os.path.join(_DIR, f"prog_{os.getpid()}_{_COUNT[0]}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"d2s_fuzz_{os.getpid()}_{_COUNT[0]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.f, path, source


class _Timeout(BaseException):
    """Not an Exception: d2s turns an Exception raised while it traces one side
    of a tensor `if` into a check of that side, and other `except Exception`
    fallbacks would take another path; a timeout must end the program instead."""


def _alarm(signum, frame):
    if signum == signal.SIGALRM:
        raise _Timeout(f"no result within {WALL_SECONDS_PER_PROGRAM} s of wall time")
    raise _Timeout(f"no result within {SECONDS_PER_PROGRAM} s of CPU time")


def run(program):
    """The Outcome of one program (see the module docstring)."""
    use_alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGVTALRM")
    if use_alarm:
        # A hang spins: the limit is on the CPU time this process spends
        # (a machine shared by other jobs stretches wall time, not that),
        # with a generous wall-time limit for one that blocks.
        old = signal.signal(signal.SIGVTALRM, _alarm), signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_VIRTUAL, SECONDS_PER_PROGRAM)
        signal.alarm(WALL_SECONDS_PER_PROGRAM)
    try:
        # Not for the CPU: a device context is a torch function mode, which
        # sends native segments to their Python fallback.
        with contextlib.nullcontext() if DEVICE == "cpu" else torch.device(DEVICE):
            return _run(program)
    except _Timeout as exc:
        return Outcome("crash", "hang", str(exc))
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            signal.alarm(0)
            signal.signal(signal.SIGVTALRM, old[0])
            signal.signal(signal.SIGALRM, old[1])


def _run(program):
    warnings.filterwarnings("ignore", category=UserWarning)  # float(x) on a tensor requiring grad, eagerly
    try:
        fn, path, source = load(program)
        inputs, _ = choose_inputs(fn, program, path)
    except Exception as exc:
        return Outcome("invalid", "eager", f"{type(exc).__name__}: {blank(str(exc))}")
    static = d2s.declarative(fn, optimize=LEVEL)
    rounding = LEVEL == "fast"
    same_sizes = len(inputs)
    inputs = inputs + other_sizes(fn, program, path)
    programs, built = None, None
    for i, (args, result, grad, mutated) in enumerate(inputs):
        if i == same_sizes:  # what the inputs of the building input's sizes left
            programs, built = _programs(static), static.concrete_program
        stage = "build" if i == 0 else "call"
        try:
            call_args = clone(args)
            got = static(*call_args)
            got_grad = _grad(got, call_args)
        except _Timeout:
            raise
        except Exception as exc:
            if isinstance(result, Raised) and _same_raise(result, exc):
                if not static.program_cache:  # a check Python decides raised while building, as eagerly
                    continue
                executed = _expect_raise(static, args, result, i, program)
                if executed is not None:
                    return executed
                continue
            outcome = classify_error(exc, program, source, path)
            outcome.stage = stage if outcome.kind == "crash" and outcome.stage == "exception" else outcome.stage
            return outcome
        if isinstance(result, Raised):
            return Outcome("wrong", "declarative", _wrong_detail(program),
                           f"input {i}: eager {result}, declarative returned {_show(got)}")
        if not same(result, got, rounding):
            return Outcome("wrong", "declarative", _wrong_detail(program),
                           f"input {i}: eager {_show(result)}, declarative {_show(got)}")
        if not _same_grad(grad, got_grad, rounding):
            return Outcome("wrong", "gradient", _wrong_detail(program),
                           f"input {i}: eager grad {_show(grad)}, declarative grad {_show(got_grad)}")
        if not all(torch.equal(a.detach(), b.detach()) for a, b in zip(mutated, call_args)):
            return Outcome("wrong", "mutation", _wrong_detail(program),
                           f"input {i}: eager leaves inputs {[_show(a) for a in mutated]}, "
                           f"declarative {[_show(a) for a in call_args]}")
        try:
            executed = _executor_run(static, args)
        except _Timeout:
            raise
        except Exception as exc:
            outcome = classify_error(exc, program, source, path)
            if outcome.kind == "refused":
                outcome = Outcome("crash", "executor", outcome.detail, outcome.message)
            return outcome
        if not same(result, executed, python_types=False):
            return Outcome("wrong", "executor", _wrong_detail(program),
                           f"input {i}: eager {_show(result)}, executor {_show(executed)}")
    if programs is None:
        programs, built = _programs(static), static.concrete_program
    if programs > 1 or (not programs and not all(isinstance(r, Raised) for _, r, *_ in inputs[:same_sizes])):
        return Outcome("wrong", "retrace", _wrong_detail(program),
                       f"{programs} programs for inputs of the same shapes")
    if not programs:
        return Outcome("pass")
    missing = _missing_ops(program, built.main_program, fn, inputs[:same_sizes], path)
    if missing:
        return Outcome("wrong", "ops", _wrong_detail(program), f"no {missing} op for tensor control flow")
    return Outcome("pass")


def _programs(static):
    """How many programs the calls made, those of one decision group (a side
    of an `if` whose values differ in type, strides or requires_grad read of
    a value that depends on the path: d2s/decisions.py) counted as one."""
    return len({id(getattr(c, "decisions", None) or c) for c in static.program_cache})


def _same_raise(expected, exc):
    return type(exc) is expected.type and str(exc).startswith(expected.text)


def _expect_raise(static, args, expected, i, program):
    """None when the Executor run of the program raises as eager did, else the wrong Outcome."""
    try:
        executed = _executor_run(static, args)
    except _Timeout:
        raise
    except Exception as exc:  # noqa: BLE001 - compared with the eager exception
        if _same_raise(expected, exc):
            return None
        return Outcome("wrong", "executor", _wrong_detail(program),
                       f"input {i}: eager {expected}, executor raises {type(exc).__name__}: {exc}")
    return Outcome("wrong", "executor", _wrong_detail(program),
                   f"input {i}: eager {expected}, executor returned {_show(executed)}")


def _same_grad(eager, static, rounding=False):
    if eager is None or static is None:
        return (eager is None) == (static is None) or _all_zero(eager) or _all_zero(static)
    return same(eager, static, rounding)


def _all_zero(grad):
    return grad is not None and not grad.any()


def _executor_run(static, args):
    """The Executor's result for `args` from the program the declarative call
    ran for them: the most recent one, else, where that one raises
    DecisionFailed (these inputs take a side another program of its decision
    group holds: d2s/decisions.py), the others of the group, as the call tries them."""
    first = static.concrete_program
    group = getattr(first, "decisions", None)
    others = [c for c in static.program_cache if c is not first and group is not None
              and getattr(c, "decisions", None) is group]
    for k, concrete in enumerate([first] + others):
        try:
            return _run_program(concrete, args)
        except DecisionFailed:
            if k == len(others):
                raise


def _run_program(concrete, args):
    # (fresh leaves with the arguments' flags: what the program reads of `requires_grad` is eager's)
    feed = {v.name: a.detach().requires_grad_(a.requires_grad) for v, a in zip(concrete.inputs, args)}
    place = d2s.CUDAPlace(torch.device(DEVICE).index or 0) if torch.device(DEVICE).type == "cuda" else d2s.CPUPlace()
    results = d2s.Executor(place).run(concrete.main_program, feed=feed, fetch_list=concrete.fetch_vars,
                                 return_numpy=False)
    return rebuild(concrete.out_tree, results)


def _missing_ops(program, main_program, fn, inputs, path):
    """The op type missing for a tensor `if`/loop whose line some eager run reached."""
    reached = set()
    for args, *_ in inputs:
        reached |= {f[2] for f in eager_run(fn, args, path)[3] if f[0] == "f" and len(f) == 3}
    types = {op.type for block in main_program.blocks for op in block.ops}
    empty = {stmt.line for stmt in _statements(program) if _does_nothing(stmt)}
    for kind, line in program.tensor_control_flow():
        # A test that reads without writing, around blocks that do nothing
        # (`if t.sum() > 0: pass`, what the minimiser leaves), computes
        # nothing anyone sees: a program may drop it as dead code.
        if (line is None or line in reached) and kind not in types and line not in empty:
            return kind
    return None


def _statements(program):
    return list(fuzz_programs.walk(getattr(program, "body", [])))


def _does_nothing(stmt):
    """Whether `stmt` is `pass`, or an `if` on a test without side effects
    whose blocks hold only such statements."""
    if isinstance(stmt, fuzz_programs.Simple):
        return stmt.text == "pass"
    return isinstance(stmt, fuzz_programs.If) and not _writes(stmt.test) and \
        all(_does_nothing(s) for block in stmt.blocks() for s in block)


def _writes(text):
    """Whether an expression may write (an in-place op, a call of the state's methods)."""
    return "_(" in text or ":=" in text


def _wrong_detail(program):
    """Wrong results group by the statement kinds of the (minimised) program."""
    return " ".join(sorted({s.kind for s in fuzz_programs.walk(program.body)}))
