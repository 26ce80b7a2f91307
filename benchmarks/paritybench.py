"""ParityBench under d2s: how much of real-world PyTorch `@declarative` captures.

    python benchmarks/paritybench.py PATH [--sample N] [--seed S] [--save] [--grad] [--jobs J]
                                          [--optimize {default,fast}]
                                          [--timeout T] [--files NAME ...] [--failures K]
                                          [--json OUT] [--report OUT]

PATH is a checkout of github.com/jansel/pytorch-jit-paritybench (fetched,
never copied into this repository). Each `generated/test_*.py` file is one
project; its `TESTCASES` list holds (module class, init args, forward args,
jit-compiles flag) tuples. For each case:

  1. eager: build the module, `eval()`, run the forward twice with the RNG
     reset before each; a case that fails eagerly or gives two different
     results is left out (as ParityBench does);
  2. d2s: `d2s.declarative` (at level --optimize) on a deep copy of the module taken before the
     eager calls, then call it twice (the second call runs the cached
     program) and compare call i with eager call i (atol = rtol = 1e-4): a
     forward that updates module state is compared from the same state;
  3. with --save: `d2s.jit.save` the program, `d2s.jit.load` it and compare
     the loaded model's outputs (the tensors of the result, in order) with a
     third eager call (both models then hold the state of two calls);
  4. with --grad: on two more copies taken before the eager calls, one
     forward and backward of a weighted sum of the floating outputs, eager
     and under d2s, and the parameters' gradients compared: "exact"
     (torch.equal, what the default level promises), "close" (within the
     tolerance) or "differ".

Each file runs in its own subprocess (`--worker`), with a per-case time
limit (--timeout for the eager calls; the d2s calls and the save get it again
plus eight times one eager call, so a model whose forward alone takes seconds
is not counted as a d2s timeout). Third-party modules the generated file imports but this machine
lacks are replaced by `unittest.mock.MagicMock`s for that file only (its
own `__import__`), so nothing else sees them.

Prints the project and test pass rates, the save/reload rate and the most
common failures, grouped by cause.
"""

import argparse
import builtins
import collections
import concurrent.futures
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
import unittest
from unittest import mock

SEED = 20261121
TOL = 1e-4
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the worker: one generated file in this process --------------------------------------------

class CaseTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CaseTimeout("timed out")


def _helpers_module():
    """Stand-in for ParityBench's `_paritybench_helpers`: the names generated
    files import, without its dynamo/inductor test machinery."""
    import torch
    helpers = types.ModuleType("_paritybench_helpers")

    class _mock_config(dict):
        __getattr__ = dict.__getitem__

    def patch_functional():
        # Some projects import `torch.functional` as F and call nn.functional
        # names on it (or the reverse): make each have the other's names.
        f1, f2 = torch.functional, torch.nn.functional
        names1 = {n for n in dir(f1) if re.match(r"^[a-z]", n)}
        names2 = {n for n in dir(f2) if re.match(r"^[a-z]", n)}
        for n in names1 - names2:
            setattr(f2, n, getattr(f1, n))
        for n in names2 - names1:
            setattr(f1, n, getattr(f2, n))

    def _mock_layer(in_features=None, out_features=None, *args, **kwargs):
        if in_features and out_features:
            return torch.nn.Linear(in_features, out_features, **kwargs)
        return torch.nn.ReLU()

    helpers._mock_config = _mock_config
    helpers.patch_functional = patch_functional
    helpers._mock_layer = _mock_layer
    helpers._paritybench_base = unittest.TestCase
    helpers._fails_compile = lambda: (lambda x: x)
    return helpers


def _mocking_import(real_import):
    """An `__import__` that answers a missing third-party module with a MagicMock."""
    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        try:
            return real_import(name, globals, locals, fromlist, level)
        except ImportError as exc:
            missing = (getattr(exc, "name", None) or name).split(".")[0]
            if level != 0 or missing in ("torch", "d2s", "ops", "runtime"):
                raise
            return mock.MagicMock(name=name)
    return _import


def load_generated(path):
    """Execute one generated file as a fresh module with its own mocking `__import__`."""
    _hide_broken_torchvision()
    sys.modules["_paritybench_helpers"] = _helpers_module()
    name = "pb_" + re.sub(r"\W", "_", os.path.basename(path)[:-3])
    module = types.ModuleType(name)
    module.__file__ = path
    own_builtins = dict(vars(builtins))
    own_builtins["__import__"] = _mocking_import(builtins.__import__)
    module.__dict__["__builtins__"] = own_builtins
    sys.modules[name] = module
    with open(path) as f:
        code = compile(f.read(), path, "exec")
    exec(code, module.__dict__)
    return module


def _hide_broken_torchvision():
    """A torchvision built for another torch fails on import ("operator
    torchvision::nms does not exist"), and so would every generated file
    that imports it: benchmarks/models.py's `hide_broken_torchvision` loads
    it without its fake kernels, or hides it (then it is mocked like any
    missing module). Loaded by file: a generated file's `import models`
    must not find ours."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_d2s_benchmark_models", os.path.join(os.path.dirname(os.path.abspath(__file__)), "models.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.hide_broken_torchvision()


def reset_rng():
    import numpy as np
    import torch
    torch.manual_seed(1337)
    random.seed(1337)
    np.random.seed(1337)


def tensor_leaves(value):
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensor_leaves(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensor_leaves(v)]
    return []


def same(a, b):
    """Whether two results match: same structure, tensors within TOL."""
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_complex() or a.is_floating_point():
            return torch.allclose(a.detach(), b.detach(), atol=TOL, rtol=TOL, equal_nan=True)
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= TOL + TOL * abs(b) or (a != a and b != b)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values do not match
        return False


def cause(exc):
    """A short, size-free description of a failure, to group failures by."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = re.sub(r'^File "[^"]*", line \d+: ', "", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", lambda m: m.group(0) if len(m.group(0)) < 40 else "'...'", text)
    text = re.sub(r"(?<![A-Za-z_])\d+", "N", text)
    return f"{type(exc).__name__}: {text}"[:160]


def _where(exc):
    """The innermost d2s frame of the traceback (file:line), to locate causes."""
    frames = traceback.extract_tb(exc.__traceback__)
    for fr in reversed(frames):
        if fr.filename.startswith(REPO):
            return f"{os.path.relpath(fr.filename, REPO)}:{fr.lineno}"
    return ""


def _mocked(value):
    import torch
    if isinstance(value, mock.Base):
        return True
    if isinstance(value, torch.nn.Module):
        return any(isinstance(m, mock.Base) or isinstance(getattr(type(m), "forward", None), mock.Base)
                   or isinstance(vars(m).get("forward"), mock.Base) for m in value.modules())
    if isinstance(value, (list, tuple)):
        return any(_mocked(v) for v in value)
    if isinstance(value, dict):
        return any(_mocked(v) for v in value.values())
    return False


def _copy_or_none(model):
    import copy
    try:
        return copy.deepcopy(model)
    except Exception:  # noqa: BLE001 - an uncopyable module runs as before, on the eager instance
        return None


def _loss(out):
    """A weighted sum of the floating outputs that carry gradient, or None."""
    leaves = [t for t in tensor_leaves(out) if t.is_floating_point() and t.requires_grad]
    if not leaves:
        return None
    return sum(t.sum() * (0.5 + i) for i, t in enumerate(leaves))


def _equal_nan_equal(a, b):
    """torch.equal, with NaN equal to NaN in the same places (a model whose
    eager gradients hold NaN, a square root of a negative "variance")."""
    import torch
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        nan = a.isnan()
        return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])
    return torch.equal(a, b)


def compare_gradients(eager_model, static_model, args, kwargs, optimize):
    """"exact", "close", "differ: NAME" or "no gradient": the parameters'
    gradients after one forward and backward, eager against d2s."""
    import copy
    import torch
    import d2s
    # Each side on its own copy of the inputs: a forward may write them (`x.float()[i] = ...`).
    (args_s, kwargs_s) = copy.deepcopy((args, kwargs))
    reset_rng()
    loss = _loss(eager_model(*args, **kwargs))
    if loss is None:
        return "no gradient"
    try:
        loss.backward()
    except RuntimeError:  # eager's own backward fails (an in-place write of a saved tensor): nothing to compare
        return "eager backward fails"
    static = d2s.declarative(static_model, optimize=optimize)
    reset_rng()
    loss = _loss(static(*args_s, **kwargs_s))
    if loss is None:
        return "differ: the d2s result carries no gradient"
    loss.backward()
    verdict = "exact"
    for (name, a), (_, b) in zip(eager_model.named_parameters(), static_model.named_parameters()):
        if (a.grad is None) != (b.grad is None):
            return f"differ: {name} has a gradient on one side only"
        ga, gb = (g.to_dense() if g is not None and g.is_sparse else g for g in (a.grad, b.grad))
        if ga is None or _equal_nan_equal(ga, gb):
            continue
        if not torch.allclose(ga, gb, atol=TOL, rtol=TOL, equal_nan=True):
            return f"differ: {name}"
        verdict = "close"
    return verdict


def run_case(entry, save, timeout=None, optimize="default", grad=False):
    import torch
    import d2s
    module_cls, init_args, forward_args = entry[0], entry[1], entry[2]
    result = {"case": getattr(module_cls, "__name__", str(module_cls))}
    # eager
    try:
        args, kwargs = init_args()
        model = module_cls(*args, **kwargs)
        model.eval()
        # A forward may update module state (a running center, a step count):
        # d2s runs on a copy taken before the eager calls, so its call i is
        # compared with eager call i, from the same state.
        fresh = _copy_or_none(model)
        for_grads = (_copy_or_none(model), _copy_or_none(model)) if grad else None
        args, kwargs = forward_args()
        reset_rng()
        start = time.perf_counter()
        expected = model(*args, **kwargs)
        eager_seconds = time.perf_counter() - start
        reset_rng()
        again = model(*args, **kwargs)
    except CaseTimeout:
        result.update(status="eager_fail", cause="eager run timed out")
        return result
    except Exception as exc:  # noqa: BLE001 - the case is left out, as ParityBench does
        result.update(status="eager_fail", cause=cause(exc))
        return result
    if _mocked(expected) or _mocked(model):
        # A third-party class this machine lacks stands in: nothing to compare.
        result.update(status="eager_fail", cause="uses a mocked third-party module")
        return result
    if not same(expected, again):
        result.update(status="nondeterministic")
        return result
    if timeout:
        signal.alarm(timeout + math.ceil(8 * eager_seconds))
    # d2s
    try:
        static = d2s.declarative(fresh if fresh is not None else model, optimize=optimize)
        for want in (expected, again) if fresh is not None else (expected, expected):
            reset_rng()
            got = static(*args, **kwargs)
            if not same(want, got):
                result.update(status="fail", cause="wrong result (differs from eager)")
                return result
    except CaseTimeout:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure is a result to report
        result.update(status="fail", cause=cause(exc), where=_where(exc))
        return result
    result["status"] = "pass"
    # (`is`, not `in`: a module's own `__eq__` may raise, as tormentor's Distribution does)
    if grad and all(m is not None for m in for_grads):
        try:
            result["grad"] = compare_gradients(*for_grads, args, kwargs, optimize)
        except CaseTimeout:
            raise
        except Exception as exc:  # noqa: BLE001
            result["grad"] = "failed: " + cause(exc)
    if save:
        try:
            if fresh is not None:
                # The saved state is the one after two calls: so is the eager model's.
                reset_rng()
                expected = model(*args, **kwargs)
            with tempfile.TemporaryDirectory() as tmp:
                d2s.jit.save(static, os.path.join(tmp, "model"))
                loaded = d2s.jit.load(os.path.join(tmp, "model"))
                reset_rng()
                out = loaded(*tensor_leaves((args, kwargs)))
            # The loaded model returns what forward returns: the same structure and constants.
            result["save"] = "pass" if same(expected, out) else "fail"
            if result["save"] == "fail":
                result["save_cause"] = "wrong result after reload"
        except CaseTimeout:
            raise
        except Exception as exc:  # noqa: BLE001
            result.update(save="fail", save_cause=cause(exc), save_where=_where(exc))
    return result


def worker(path, save, timeout, optimize="default", grad=False):
    import torch
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        module = load_generated(path)
        cases = list(getattr(module, "TESTCASES", []))
    except BaseException as exc:  # noqa: BLE001 - an import failure leaves the whole file out
        print(json.dumps({"status": "import_fail", "cause": cause(exc)}), flush=True)
        return
    finally:
        signal.alarm(0)
    if not cases:
        print(json.dumps({"status": "no_cases"}), flush=True)
    for i, entry in enumerate(cases):
        # A crash (not an exception) in this case leaves this line last.
        print(json.dumps({"status": "started", "index": i}), flush=True)
        signal.alarm(timeout)
        try:
            result = run_case(entry, save, timeout, optimize, grad)
        except CaseTimeout:
            result = {"case": str(i), "status": "timeout", "cause": "timeout"}
        except BaseException as exc:  # noqa: BLE001
            result = {"case": str(i), "status": "fail", "cause": cause(exc)}
        finally:
            signal.alarm(0)
        result["index"] = i
        print(json.dumps(result), flush=True)


# -- the driver -----------------------------------------------------------------------------------

def sample_files(path, n, seed):
    names = sorted(f for f in os.listdir(os.path.join(path, "generated"))
                   if f.startswith("test_") and f.endswith(".py"))
    if n is not None and n < len(names):
        names = random.Random(seed).sample(sorted(names), n)
    return names


def run_file(path, name, save, timeout, optimize="default", grad=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", os.path.join(path, "generated", name),
           "--timeout", str(timeout), "--optimize", optimize] + (["--save"] if save else []) + (
           ["--grad"] if grad else [])
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as cwd:  # files a model writes stay out of the way
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd,
                                  timeout=timeout * 40)
            out, err = proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            out, err = exc.stdout or "", "file timed out"
            out = out.decode() if isinstance(out, bytes) else out
    results = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                results.append(json.loads(line))
            except ValueError:
                pass
    tail = ((err or "").strip().splitlines()[-1:] or ["no output"])[0][:120]
    if not results:
        results.append({"status": "import_fail", "cause": "crashed while importing: " + tail})
    elif results[-1]["status"] == "started":
        results[-1] = {"status": "crash", "index": results[-1]["index"], "cause": "worker crashed: " + tail}
    results = [r for r in results if r["status"] != "started"]
    for r in results:
        r["file"] = name
    return results


def report(results, save, top):
    by_file = collections.defaultdict(list)
    for r in results:
        by_file[r["file"]].append(r)
    counted = [r for r in results if r["status"] in ("pass", "fail", "timeout", "crash")]
    passed = [r for r in counted if r["status"] == "pass"]
    projects = {f: rs for f, rs in by_file.items() if any(r["status"] in ("pass", "fail", "timeout", "crash")
                                                        for r in rs)}
    ok_projects = [f for f, rs in projects.items()
                   if all(r["status"] not in ("fail", "timeout", "crash") for r in rs)]
    left_out = collections.Counter(r["status"] for r in results if r not in counted)
    print(f"files: {len(by_file)}; left out: {dict(left_out)}")
    print(f"projects: {len(ok_projects)}/{len(projects)} = {100 * len(ok_projects) / max(1, len(projects)):.1f}%")
    print(f"tests:    {len(passed)}/{len(counted)} = {100 * len(passed) / max(1, len(counted)):.1f}%")
    if save:
        saved = [r for r in passed if r.get("save") == "pass"]
        print(f"save/reload: {len(saved)}/{len(passed)} = {100 * len(saved) / max(1, len(passed)):.1f}% "
              "of passing tests")
    causes = collections.Counter(r["cause"] for r in counted if r["status"] != "pass")
    if causes:
        print("\nmost common failures (tests):")
        for c, n in causes.most_common(top):
            files = sorted({r["file"] for r in counted if r.get("cause") == c})
            print(f"  {n:4d}  {c}\n        e.g. {', '.join(files[:3])}")
    grads = collections.Counter(r["grad"].split(":")[0] for r in passed if "grad" in r)
    if grads:
        print("gradients of passing tests: " + ", ".join(f"{k} {n}" for k, n in grads.most_common()))
        for r in passed:
            if r.get("grad", "exact").split(":")[0] in ("differ", "failed"):
                print(f"  {r['file']} {r['case']}: {r['grad']}")
    save_causes = collections.Counter(r.get("save_cause") for r in passed if r.get("save") == "fail")
    if save_causes:
        print("\nmost common save/reload failures:")
        for c, n in save_causes.most_common(top):
            files = sorted({r["file"] for r in passed if r.get("save_cause") == c})
            print(f"  {n:4d}  {c}\n        e.g. {', '.join(files[:3])}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", help="a checkout of pytorch-jit-paritybench")
    p.add_argument("--sample", type=int, default=None, help="run N files drawn at random (default: all)")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--save", action="store_true", help="also jit.save / jit.load and compare again")
    p.add_argument("--grad", action="store_true", help="also compare the parameters' gradients")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--timeout", type=int, default=60, help="seconds per case")
    p.add_argument("--files", nargs="*", help="only these file names (test_*.py)")
    p.add_argument("--failures", type=int, default=20, help="how many failure causes to list")
    p.add_argument("--json", help="write every case's result to this file")
    p.add_argument("--report", metavar="JSON", help="only print the report of a --json file (PATH is ignored)")
    p.add_argument("--optimize", choices=("default", "fast"), default="default",
                   help="the level of d2s.declarative (the fast level compares within the same tolerance)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.report:
        with open(a.report) as f:
            report(json.load(f), a.save, a.failures)
        return 0
    if a.worker:
        sys.path.insert(0, REPO)
        worker(a.path, a.save, a.timeout, a.optimize, a.grad)
        return 0
    names = a.files or sample_files(a.path, a.sample, a.seed)
    results = []
    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
        futures = {pool.submit(run_file, a.path, n, a.save, a.timeout, a.optimize, a.grad): n for n in names}
        for done, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            rs = fut.result()
            results.extend(rs)
            if a.json:  # after every file, so a run stopped early still leaves its results
                with open(a.json, "w") as f:
                    json.dump(results, f, indent=1)
            bad = [r for r in rs if r["status"] in ("fail", "timeout", "crash")]
            print(f"[{done}/{len(names)}] {futures[fut]}: "
                  f"{sum(r['status'] == 'pass' for r in rs)} pass, {len(bad)} fail"
                  + (f" ({bad[0]['cause']})" if bad else ""), file=sys.stderr, flush=True)
    print(f"\n{len(names)} files in {time.time() - start:.0f} s")
    report(results, a.save, a.failures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
