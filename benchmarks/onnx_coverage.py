"""ONNX coverage: d2s.onnx.export and torch.onnx.export(dynamo=True) side by side.

    python benchmarks/onnx_coverage.py PATH [--sample N] [--seed S] [--jobs J] [--timeout T]
                                       [--files NAME ...] [--no-zoo | --zoo PART] [--no-paritybench] [--json OUT]
                                       [--log OUT.jsonl]
    python benchmarks/onnx_coverage.py --from-log OUT.jsonl

PATH is a checkout of github.com/jansel/pytorch-jit-paritybench (fetched,
never copied here); its files are sampled as by benchmarks/paritybench.py
(same seed, same sample). Besides, a zoo of transformers and timm
architectures with tiny random configurations: benchmarks/models.py's zoo
(its first input case: a padded batch for text, with its attention mask)
and a few more timm architectures (offline; both packages are optional, a
missing one leaves its part out). A transformers model is asked for its
first output (last hidden state or logits), without a KV cache.

For each model whose forward is deterministic eagerly and whose d2s
program matches eager (a "passing" test of paritybench.py; the zoo asks the
same), both exporters write ONNX from the same example inputs, onnxruntime
runs each, and the outputs (tensor leaves, in order) are compared with
eager at rtol 1e-4, atol 1e-5:

    pass       exported, and onnxruntime matches eager
    mismatch   exported, but the values differ (the worst outcome)
    rounding   the values differ, but eager float32 itself misses eager
               float64 by more than the tolerance and the ONNX outputs by no
               more than eight times as much (an ill-conditioned model:
               activations of 1e8 and more); counted apart, not as a pass
    error      the exporter refused or failed, or onnxruntime could not run it

Prints the counts per exporter, the models only one of them exports, the
tests whose d2s program holds data-dependent control flow (cond / while:
what torch.onnx alone cannot export) and how each exporter fares on them, and
the errors ranked by cause (torch.onnx's missing ATen functions among them).
Each file or architecture runs in its own subprocess with a time limit.
"""

import argparse
import collections
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paritybench as pb  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5


# -- one model ------------------------------------------------------------------------------------

def _compare(session, args, expected):
    """('pass' or 'mismatch', outputs) of an onnxruntime session fed the
    tensor leaves of `args`."""
    import numpy as np
    feeds = [t.detach().numpy() for t in pb.tensor_leaves(args)]
    inputs = session.get_inputs()
    if len(inputs) != len(feeds):
        raise RuntimeError(f"the ONNX model takes {len(inputs)} inputs for {len(feeds)} tensor arguments")
    got = session.run(None, {i.name: f for i, f in zip(inputs, feeds)})
    want = [t.detach().numpy() for t in pb.tensor_leaves(expected)]
    if len(got) != len(want):
        raise RuntimeError(f"the ONNX model gives {len(got)} outputs for {len(want)} tensors")
    for g, w in zip(got, want):
        if g.shape != w.shape or not np.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True):
            return "mismatch", got
    return "pass", got


def _rounding_only(model, args, kwargs, expected, got):
    """Whether a mismatch is float32 rounding of an ill-conditioned model:
    eager float32 itself misses the float64 result by more than the
    tolerance, and the ONNX outputs miss it by no more than eight times as
    much (two float32 summation orders; plus 1e-6 of the output's scale). (The model is converted to float64 in place: call this last.)"""
    import numpy as np
    import torch
    to64 = lambda v: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v  # noqa: E731
    with torch.no_grad():
        pb.reset_rng()
        reference = model.double()(*[to64(a) for a in args], **{k: to64(v) for k, v in kwargs.items()})
    for g, w, r in zip(got, pb.tensor_leaves(expected), pb.tensor_leaves(reference)):
        w, r = w.detach().numpy(), r.detach().numpy()
        if g.shape != w.shape or not np.issubdtype(g.dtype, np.floating):
            return False
        eager_error, onnx_error = np.abs(w - r).max(initial=0), np.abs(g - r).max(initial=0)
        if np.allclose(g, w, rtol=RTOL, atol=ATOL):
            continue
        if np.allclose(w, r, rtol=RTOL, atol=ATOL) or onnx_error > 8 * eager_error + 1e-6 * np.abs(r).max(initial=0):
            return False
    return True


def _session(path):
    import onnxruntime as ort
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def _d2s_onnx(static, path):
    import d2s
    d2s.onnx.export(static, path)  # the program of the call just made
    return _session(path)


def _torch_onnx(model, args, kwargs, path):
    import torch
    torch.onnx.export(model, tuple(args), path, kwargs=kwargs or None, dynamo=True, verbose=False)
    return _session(path)


def run_model(model, args, kwargs):
    """{'eager': ..., 'd2s': ..., 'torch.onnx': ...} for an eval-mode model."""
    import torch
    import d2s
    # Copies taken before any call (a forward may update state); a model that
    # cannot be copied (weight norm's non-leaf tensors) is shared.
    fresh = [pb._copy_or_none(model) or model, pb._copy_or_none(model) or model]
    with torch.no_grad():
        pb.reset_rng()
        expected = model(*args, **kwargs)
        pb.reset_rng()
        if not pb.same(expected, model(*args, **kwargs)):
            return {"eager": "nondeterministic"}
        result = {"eager": "pass"}
        try:
            static = d2s.declarative(fresh[0])
            pb.reset_rng()
            if not pb.same(expected, static(*args, **kwargs)):
                return dict(result, d2s_run="wrong result")
        except Exception as exc:  # noqa: BLE001 - the test does not pass under d2s: left out
            return dict(result, d2s_run=pb.cause(exc))
        result["d2s_run"] = "pass"
        result["control_flow"] = _control_flow(static)
        outputs = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name, export in (("d2s", lambda p: _d2s_onnx(static, p)),
                                 ("torch.onnx", lambda p: _torch_onnx(fresh[1], args, kwargs, p))):
                try:
                    session = export(os.path.join(tmp, name + ".onnx"))
                    result[name], outputs[name] = _compare(session, (args, kwargs), expected)
                except Exception as exc:  # noqa: BLE001 - a failure is a result to report
                    result[name] = "error"
                    result[name + "_cause"] = _onnx_cause(exc)
        for name, got in outputs.items():
            if result[name] == "mismatch":
                try:
                    if _rounding_only(model, args, kwargs, expected, got):
                        result[name] = "rounding"
                except Exception:  # noqa: BLE001 - no float64 reference: it stays a mismatch
                    pass
    return result


def _control_flow(static):
    """The control-flow ops (cond, while) of the program d2s converted for
    the call just made: the tests whose If/Loop only d2s can export."""
    from d2s.translator import ProgramTranslator
    try:
        program = ProgramTranslator._static(static).concrete_program.main_program
    except Exception:  # noqa: BLE001 - unknown: the report leaves the test out of this count
        return None
    return sorted({op.type for block in program.blocks for op in block.ops if op.type in ("cond", "while")})


def _onnx_cause(exc):
    """The cause to rank: the ATen op torch.onnx lacks when it says so."""
    import re
    text = str(exc)
    missing = re.search(r"No ONNX function found for <OpOverload\(op='([\w.]+)'", text)
    if missing:
        return f"no ONNX function for {missing.group(1)}"
    return pb.cause(exc)


# -- the model sets -------------------------------------------------------------------------------

def _zoo_entries():
    """{"transformers:NAME" / "timm:NAME": Entry}: benchmarks/models.py's zoo
    (tiny random configurations, built offline) and a few more timm
    architectures."""
    import models
    entries = list(models.ZOO) + [models._timm(n) for n in EXTRA_TIMM] + [
        models._timm(n, image=224, resize=False) for n in EXTRA_TIMM_224]
    return {f"{e.family}:{e.name}": e for e in entries}


# timm architectures besides models.py's (other layer kinds: dense blocks,
# an MLP mixer, squeeze-excite variants).
EXTRA_TIMM = ["resnet50d", "densenet121", "rexnet_100", "tinynet_e", "dpn68", "hrnet_w18_small"]
EXTRA_TIMM_224 = ["mixer_s16_224"]


def _first_output(model, names):
    """A transformers model called with keywords `names`, giving its first
    output (last hidden state or logits) without a KV cache: both exporters
    are asked for the same tensor."""
    import inspect
    import torch
    options = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}

    class FirstOutput(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, a, b=None, c=None):
            return self.model(**dict(zip(names, (a, b, c))), **options)[0]

    return FirstOutput().eval()


def zoo_model(target):
    """(model, positional args) of a zoo target, its first input case
    (a padded batch for text and audio)."""
    import models
    entry = _zoo_entries()[target]
    model = models.build(entry)
    inputs = models.cases(entry)[0][1]
    if entry.family == "transformers":
        model = _first_output(model, list(inputs))
    return model, list(inputs.values())


def zoo():
    import models
    broken = models.hide_broken_torchvision()
    names = []
    for target, entry in _zoo_entries().items():
        try:
            __import__(entry.family)
        except Exception:  # noqa: BLE001 - an optional benchmark dependency
            continue
        if entry.family == "timm" and broken:
            continue
        names.append(target)
    return names


# -- workers and the driver -----------------------------------------------------------------------

def _alarm(signum, frame):
    raise TimeoutError("timed out")


def worker(target, timeout):
    import torch
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _alarm)
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import models
    models.hide_broken_torchvision()  # generated files import it too
    if ":" in target and not target.endswith(".py"):
        name = target.split(":", 1)[1]
        signal.alarm(timeout)
        try:
            model, args = zoo_model(target)
            result = run_model(model, args, {})
        except Exception as exc:  # noqa: BLE001
            result = {"eager": pb.cause(exc)}
        print(json.dumps(dict(result, case=name)), flush=True)
        return
    try:
        cases = list(getattr(pb.load_generated(target), "TESTCASES", []))
    except BaseException as exc:  # noqa: BLE001
        print(json.dumps({"eager": "import failed: " + pb.cause(exc)}), flush=True)
        return
    if not cases:
        print(json.dumps({"eager": "no test cases"}), flush=True)
    for entry in cases:
        signal.alarm(timeout)
        name = getattr(entry[0], "__name__", str(entry[0]))
        try:
            init_args, init_kwargs = entry[1]()
            model = entry[0](*init_args, **init_kwargs).eval()
            args, kwargs = entry[2]()
            if pb._mocked(model):
                result = {"eager": "uses a mocked third-party module"}
            else:
                result = run_model(model, list(args), kwargs)
        except BaseException as exc:  # noqa: BLE001
            result = {"eager": pb.cause(exc)}
        finally:
            signal.alarm(0)
        print(json.dumps(dict(result, case=name)), flush=True)


def run_target(target, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", target, "--timeout", str(timeout)]
    env = dict(os.environ, PYTHONPATH=pb.REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as cwd:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout * 10).stdout
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [dict(r, target=os.path.basename(target)) for r in results] or [
        {"target": os.path.basename(target), "eager": "worker crashed or timed out"}]


def report(title, results):
    tested = [r for r in results if r.get("d2s_run") == "pass"]
    print(f"\n== {title}: {len(results)} tests, {len(tested)} pass eagerly and under d2s")
    for exporter in ("d2s", "torch.onnx"):
        counts = collections.Counter(r.get(exporter, "error") for r in tested)
        print(f"  {exporter:11s} pass {counts['pass']:4d}   mismatch {counts['mismatch']:4d}   "
              f"rounding {counts['rounding']:4d}   error {counts['error']:4d}")
    only = collections.Counter()
    for r in tested:
        if (r.get("d2s") == "pass") != (r.get("torch.onnx") == "pass"):
            only["d2s" if r.get("d2s") == "pass" else "torch.onnx"] += 1
    print(f"  exported by d2s only: {only['d2s']}, by torch.onnx only: {only['torch.onnx']}")
    flow = [r for r in tested if r.get("control_flow")]
    if flow:
        passing = {e: sum(r.get(e) == "pass" for r in flow) for e in ("d2s", "torch.onnx")}
        print(f"  with data-dependent control flow (cond/while in d2s's program): {len(flow)}; "
              f"d2s pass {passing['d2s']}, torch.onnx pass {passing['torch.onnx']}")
        failing = [f"{r['target']}:{r['case']} ({r.get('d2s')})" for r in flow if r.get("d2s") != "pass"]
        if failing:
            print(f"    not exported by d2s: {', '.join(failing)}")
    for exporter in ("d2s", "torch.onnx"):
        causes = collections.Counter(r.get(exporter + "_cause", "?") for r in tested if r.get(exporter) == "error")
        if causes:
            print(f"  {exporter} errors, ranked:")
            for text, n in causes.most_common(12):
                print(f"    {n:4d}  {text}")
        for status in ("mismatch", "rounding"):
            cases = [f"{r['target']}:{r['case']}" for r in tested if r.get(exporter) == status]
            if cases:
                print(f"  {exporter} {status.upper()}: {', '.join(cases)}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", nargs="?", help="a pytorch-jit-paritybench checkout")
    p.add_argument("--sample", type=int, default=200)
    p.add_argument("--seed", type=int, default=pb.SEED)
    p.add_argument("--files", nargs="*", help="these generated files instead of a sample")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=int, default=120, help="seconds per test case")
    p.add_argument("--no-zoo", action="store_true")
    p.add_argument("--zoo", choices=["transformers", "timm"], help="only this part of the zoo")
    p.add_argument("--no-paritybench", action="store_true")
    p.add_argument("--json", help="write every result to this file")
    p.add_argument("--log", help="append each target's results to this JSON-lines file as it finishes")
    p.add_argument("--from-log", help="print the report of a --log file (of a run stopped early) and exit")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a.worker, a.timeout)
    if a.from_log:
        with open(a.from_log) as f:
            logged = [json.loads(line) for line in f if line.strip()]
        for title in dict.fromkeys(r["group"] for r in logged):
            report(title, [r for r in logged if r["group"] == title])
        return 0
    groups = {}
    if a.path and not a.no_paritybench:
        names = a.files or pb.sample_files(a.path, a.sample, a.seed)
        groups["ParityBench"] = [os.path.join(a.path, "generated", n) for n in names]
    if not a.no_zoo:
        zoo_names = zoo()
        for part in ("transformers", "timm"):
            if a.zoo in (None, part):
                groups[part] = [n for n in zoo_names if n.startswith(part + ":")]
    everything = {}

    def run(title, target):
        results = [dict(r, group=title) for r in run_target(target, a.timeout)]
        if a.log:
            with open(a.log, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in results)
        return results

    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for title, targets in groups.items():
            everything[title] = [r for rs in pool.map(lambda t: run(title, t), targets) for r in rs]
            report(title, everything[title])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
