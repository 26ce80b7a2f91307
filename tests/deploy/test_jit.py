"""`d2s.jit.save` / `d2s.jit.load` end to end with the tutorial's digits classifier.

Saved here, loaded in a fresh interpreter that cannot import any model code:
outputs equal eager for every batch size one `InputSpec([None, 1, 28, 28])`
covers, and for inputs taking either branch of a data-dependent model. In
this process: a loaded `TranslatedLayer` fine-tunes with the original's
gradients; `ProgramTranslator().save_inference_model(fetch=[0, 1])` keeps
both outputs; broken model directories raise `d2s.ModelFormatError`; a save
that fails midway leaves the previous model loadable; `python -m d2s run`
on a jit-saved model gives the eager outputs.
"""

import copy
import json
import functools
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn

import d2s
import runtime.atomic_dir
import runtime.io
from runtime.errors import OpRuntimeError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from mnist import MNIST, loss_fn, synthetic_digits  # noqa: E402
import exported_writes  # noqa: E402

SPEC = [d2s.InputSpec([None, 1, 28, 28], "float32")]


@functools.lru_cache(maxsize=None)
def _packages_only():
    """A directory holding links to this checkout's three packages and
    nothing else (the installed d2s may be another checkout)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = tempfile.mkdtemp(prefix="d2s-packages-")
    for package in ("d2s", "ops", "runtime"):
        os.symlink(os.path.join(root, package), os.path.join(path, package))
    return path


def _clean_env():
    """Only the d2s packages on the path: no test or model code."""
    return dict(os.environ, PYTHONPATH=_packages_only())


LOADER = textwrap.dedent("""
    import importlib, sys
    import numpy as np
    import torch
    for name in ("mnist", "test_jit", "examples"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
        else:
            sys.exit(f"model code {name!r} must not be importable here")
    import d2s
    model_dir, n_cases = sys.argv[1], int(sys.argv[2])
    model = d2s.jit.load(model_dir)
    assert isinstance(model, torch.nn.Module)
    with torch.no_grad():
        for i in range(n_cases):
            out = model(torch.from_numpy(np.load(f"in_{i}.npy")))
            np.save(f"out_{i}.npy", out.numpy())
    print("ok", model.feed_names)
""")


def _run_in_fresh_process(tmp_path, model_dir, inputs):
    """Outputs of `d2s.jit.load(model_dir)` on each input, computed by another interpreter."""
    work = tmp_path / "fresh"
    work.mkdir()
    (work / "load_model.py").write_text(LOADER)
    for i, x in enumerate(inputs):
        np.save(work / f"in_{i}.npy", x.numpy())
    result = subprocess.run([sys.executable, "load_model.py", str(model_dir), str(len(inputs))], cwd=work,
                            env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
    return [torch.from_numpy(np.load(work / f"out_{i}.npy")) for i in range(len(inputs))]


@pytest.fixture(scope="module")
def trained():
    """A briefly trained eager classifier (with batch norm, so running
    statistics matter) and a declarative copy in eval mode."""
    torch.manual_seed(0)
    eager = MNIST(batch_norm=True)
    images, labels = synthetic_digits(64, seed=5)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for start in range(0, 64, 16):
        probs, _ = eager(images[start:start + 16], labels[start:start + 16])
        opt.zero_grad()
        loss_fn(probs, labels[start:start + 16]).backward()
        opt.step()
    eager.eval()
    static = d2s.declarative(copy.deepcopy(eager)).eval()
    return eager, static


def _images(n, seed):
    return torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


def test_saved_classifier_runs_in_a_fresh_process_for_every_batch_size(tmp_path, trained):
    eager, static = trained
    model_dir = tmp_path / "mnist"
    d2s.jit.save(static, str(model_dir), input_spec=SPEC)
    inputs = [_images(n, seed=n) for n in (1, 7, 64)]
    with torch.no_grad():
        expected = [eager(x) for x in inputs]
    outputs = _run_in_fresh_process(tmp_path, model_dir, inputs)
    for x, out, want in zip(inputs, outputs, expected):
        assert out.shape == (len(x), 10)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    # one dynamic feed dimension: the same file serves all three sizes
    doc = json.loads((model_dir / "program.json").read_text())
    feed = doc["feed"]
    assert feed == ["inputs"]


class TwoWays(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 3)
        self.b = nn.Sequential(nn.Linear(8, 5), nn.Tanh(), nn.Linear(5, 3))

    def forward(self, x):
        if x.sum() > 0:
            return self.a(x)
        else:
            return self.b(x)


def test_data_dependent_model_takes_each_branch_in_a_fresh_process(tmp_path):
    torch.manual_seed(1)
    eager = TwoWays()
    model_dir = tmp_path / "two_ways"
    # traced with zeros (the else branch); both branches are in the program
    d2s.jit.save(d2s.declarative(copy.deepcopy(eager)), str(model_dir), input_spec=[d2s.InputSpec([None, 8])])
    loaded = d2s.jit.load(str(model_dir))
    assert "cond" in [op.type for op in loaded.program.global_block().ops]

    base = torch.rand(5, 8, generator=torch.Generator().manual_seed(2)) + 0.1
    inputs = [base, -base, base[:1], -base[:3]]
    with torch.no_grad():
        expected = [eager(x) for x in inputs]
    assert not torch.allclose(eager.a(base), eager.b(base))  # the branches really differ
    for x, want in zip(inputs, expected):
        torch.testing.assert_close(loaded(x).detach(), want, rtol=1e-5, atol=1e-6)
    for out, want in zip(_run_in_fresh_process(tmp_path, model_dir, inputs), expected):
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_kind", ["mnist", "two_ways"])
def test_translated_layer_fine_tunes_with_the_original_gradients(tmp_path, model_kind):
    torch.manual_seed(3)
    if model_kind == "mnist":
        eager = MNIST(batch_norm=True).eval()  # eval: batch norm uses (and keeps) running statistics
        x, y = synthetic_digits(8, seed=9)
        spec = SPEC

        def loss_of(model):
            return loss_fn(model(x), y)
    else:
        eager = TwoWays()
        x = torch.randn(4, 8)
        spec = [d2s.InputSpec([None, 8])]

        def loss_of(model):
            return model(x).pow(2).mean() + model(-x.abs()).sum()  # through both branches

    d2s.jit.save(d2s.declarative(copy.deepcopy(eager)), str(tmp_path / "m"), input_spec=spec)
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert loaded.training == eager.training  # loads in the mode it was saved in

    eager_params = list(eager.named_parameters())
    loaded_params = list(loaded.named_parameters())
    assert [n for n, _ in eager_params] == [n for n, _ in loaded_params]
    assert all(p.requires_grad for _, p in loaded_params)

    opt_eager = torch.optim.SGD([p for _, p in eager_params], lr=0.05)
    opt_loaded = torch.optim.SGD([p for _, p in loaded_params], lr=0.05)
    for _ in range(2):
        opt_eager.zero_grad()
        opt_loaded.zero_grad()
        loss_eager, loss_loaded = loss_of(eager), loss_of(loaded)
        torch.testing.assert_close(loss_loaded, loss_eager, rtol=1e-5, atol=1e-6)
        loss_eager.backward()
        loss_loaded.backward()
        for (name, p), (_, q) in zip(eager_params, loaded_params):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
        opt_eager.step()
        opt_loaded.step()
    # the program reads the updated parameters
    with torch.no_grad():
        torch.testing.assert_close(loss_of(loaded), loss_of(eager), rtol=1e-5, atol=1e-6)


def test_program_translator_save_keeps_both_outputs(tmp_path, trained):
    eager, static = trained
    images, labels = synthetic_digits(32, seed=11)
    probs, acc = static(images[:16], labels[:16])
    d2s.ProgramTranslator().save_inference_model(str(tmp_path / "both"), fetch=[0, 1])

    loaded = d2s.jit.load(str(tmp_path / "both"))
    assert loaded.feed_names == ["inputs", "label"]
    assert len(loaded.fetch_vars) == 2
    for batch in (slice(0, 16), slice(16, 32)):
        got_probs, got_acc = loaded(images[batch], labels[batch])
        want_probs, want_acc = eager(images[batch], labels[batch])
        torch.testing.assert_close(got_probs.detach(), want_probs.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_acc, want_acc)
        assert got_acc.dim() == 0

    # fetch=[0] keeps the probabilities only
    static(images[:16], labels[:16])
    d2s.ProgramTranslator().save_inference_model(str(tmp_path / "probs"), fetch=[0])
    only = d2s.jit.load(str(tmp_path / "probs"))
    assert len(only.fetch_vars) == 1
    torch.testing.assert_close(only(images[:16], labels[:16]).detach(), probs.detach())


# -- broken model directories ------------------------------------------------------------------

def _edit_json(key, value):
    def edit(path):
        doc = json.loads((path / "program.json").read_text())
        doc[key] = value
        (path / "program.json").write_text(json.dumps(doc))
    return edit


def _tamper_op_type(forbidden):
    def edit(path):
        text = (path / "program.json").read_text()
        assert '"type": "torch.conv2d"' in text
        (path / "program.json").write_text(text.replace('"type": "torch.conv2d"', f'"type": "{forbidden}"', 1))
    return edit


def _truncate(name, keep=0.5):
    def edit(path):
        data = (path / name).read_bytes()
        (path / name).write_bytes(data[:int(len(data) * keep)])
    return edit


def _flip_param_shape(path):
    from safetensors.torch import load_file, save_file
    params = load_file(str(path / "params.safetensors"))
    name = sorted(params)[0]
    params[name] = torch.zeros(params[name].numel() + 1)
    save_file(params, str(path / "params.safetensors"))


BROKEN = {
    "missing-dir": lambda path: __import__("shutil").rmtree(path),
    "missing-params": lambda path: (path / "params.safetensors").unlink(),
    "missing-program": lambda path: (path / "program.json").unlink(),
    "truncated-params": _truncate("params.safetensors"),
    "truncated-params-header": _truncate("params.safetensors", keep=0.001),
    "truncated-program": _truncate("program.json"),
    "empty-program": _truncate("program.json", keep=0),
    "foreign-version": _edit_json("format_version", 99),
    "version-as-string": _edit_json("format_version", "1"),
    "foreign-format": _edit_json("format", "paddle.inference_model"),
    "fetch-unknown-var": _edit_json("fetch", ["no_such_var"]),
    "forbidden-op-os-system": _tamper_op_type("os.system"),
    "forbidden-op-eval": _tamper_op_type("builtins.eval"),
    "forbidden-op-torch-load": _tamper_op_type("torch.load"),
    "param-shape": _flip_param_shape,
}


@pytest.fixture(scope="module")
def saved_mnist(tmp_path_factory, trained):
    path = tmp_path_factory.mktemp("pristine") / "mnist"
    d2s.jit.save(trained[1], str(path), input_spec=SPEC)
    return path


@pytest.mark.parametrize("damage", list(BROKEN), ids=list(BROKEN))
def test_broken_model_directory_is_a_model_format_error(tmp_path, saved_mnist, damage):
    import shutil
    path = tmp_path / "model"
    shutil.copytree(saved_mnist, path)
    d2s.jit.load(str(path))  # the copy itself is fine
    BROKEN[damage](path)
    with pytest.raises(d2s.ModelFormatError):
        d2s.jit.load(str(path))


# -- a save that fails midway ------------------------------------------------------------------

def _fail_swap(monkeypatch):
    """The second rename of the swap (staging -> target) fails; the old model is renamed back."""
    real_rename = os.rename
    calls = []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        return real_rename(src, dst)
    monkeypatch.setattr(runtime.atomic_dir.os, "rename", rename)


def _fail_params_write(monkeypatch):
    import safetensors.torch

    def save_file(*args, **kwargs):
        raise OSError("disk full (simulated)")
    monkeypatch.setattr(safetensors.torch, "save_file", save_file)


def _fail_fsync(monkeypatch):
    def fsync(path):
        raise OSError("I/O error (simulated)")
    monkeypatch.setattr(runtime.atomic_dir, "_fsync_path", fsync)


def _fail_document(monkeypatch):
    def dump(doc):
        raise RuntimeError("serialiser bug (simulated)")
    monkeypatch.setattr(runtime.io, "_dump_document", dump)


@pytest.mark.parametrize("failure", [_fail_swap, _fail_params_write, _fail_fsync, _fail_document],
                         ids=["swap", "params-write", "fsync", "document"])
def test_failed_save_leaves_the_previous_model_loadable(tmp_path, monkeypatch, trained, failure):
    eager, static = trained
    path = tmp_path / "model"
    d2s.jit.save(static, str(path), input_spec=SPEC)
    x = _images(3, seed=4)
    before = d2s.jit.load(str(path))(x).detach()
    torch.testing.assert_close(before, eager(x).detach(), rtol=1e-5, atol=1e-6)

    torch.manual_seed(42)
    other = d2s.declarative(MNIST(batch_norm=True)).eval()
    assert not torch.allclose(other(x), before)
    with monkeypatch.context() as patch:
        failure(patch)
        with pytest.raises((OSError, RuntimeError)):
            d2s.jit.save(other, str(path), input_spec=SPEC)

    assert sorted(os.listdir(tmp_path)) == ["model"]  # no staging or set-aside directories left
    assert torch.equal(d2s.jit.load(str(path))(x).detach(), before)
    # and the next save, with nothing failing, replaces it
    d2s.jit.save(other, str(path), input_spec=SPEC)
    torch.testing.assert_close(d2s.jit.load(str(path))(x).detach(), other(x), rtol=1e-5, atol=1e-6)


# -- the command line on a jit-saved model ------------------------------------------------------

def test_cli_runs_a_jit_saved_model_like_eager(tmp_path, saved_mnist, trained):
    eager, _ = trained
    x = _images(5, seed=6)
    np.save(tmp_path / "x.npy", x.numpy())
    out_dir = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "d2s", "run", str(saved_mnist), "--input", f"inputs={tmp_path / 'x.npy'}",
         "--output-dir", str(out_dir)],
        cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (written,) = os.listdir(out_dir)
    assert written.endswith(".npy") and written in result.stdout
    got = np.load(out_dir / written, allow_pickle=False)
    with torch.no_grad():
        np.testing.assert_allclose(got, eager(x).numpy(), rtol=1e-5, atol=1e-6)

    # without --output-dir it prints a summary of each output
    result = subprocess.run(
        [sys.executable, "-m", "d2s", "run", str(saved_mnist), "--input", f"inputs={tmp_path / 'x.npy'}"],
        cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "shape [5, 10]" in result.stdout


# -- known bugs ---------------------------------------------------------------------------------

class FlattenBySize(nn.Module):
    """The common PyTorch idiom `x.view(x.size(0), -1)` before the classifier."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 5)
        self.fc = nn.Linear(4 * 12 * 12, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        x = x.view(x.size(0), -1)
        return self.fc(x)


def test_view_by_dynamic_batch_size_saves_with_input_spec(tmp_path):
    torch.manual_seed(0)
    eager = FlattenBySize()
    d2s.jit.save(d2s.declarative(copy.deepcopy(eager)), str(tmp_path / "m"), input_spec=SPEC)
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for n in (1, 7, 64):
        x = _images(n, seed=n)
        torch.testing.assert_close(loaded(x).detach(), eager(x).detach(), rtol=1e-5, atol=1e-6)


def test_fine_tuned_translated_layer_saves_again_with_jit_save(tmp_path, saved_mnist):
    loaded = d2s.jit.load(str(saved_mnist))
    x = _images(4, seed=1)
    with torch.no_grad():
        for p in loaded.parameters():
            p.add_(0.01)
        want = loaded(x)
    # the lower-level route works
    d2s.save_inference_model(str(tmp_path / "low"), loaded.feed_names, loaded.fetch_vars, d2s.Executor(),
                             loaded.program)
    assert torch.equal(d2s.jit.load(str(tmp_path / "low"))(x), want)
    d2s.jit.save(loaded, str(tmp_path / "again"), input_spec=SPEC)
    assert torch.equal(d2s.jit.load(str(tmp_path / "again"))(x), want)


class WritesThroughViews(nn.Module):
    """DeepSeek-V3's attention: `k = x.new_empty(...)`, then
    `k[..., :d].copy_(a)` and `k[..., d:].copy_(b)`, writes that reach `k`
    only through views; and a buffer written through a view, state the next
    call reads."""

    def __init__(self, into_state):
        super().__init__()
        self.into_state = into_state
        self.register_buffer("seen", torch.zeros(2, 8))

    def forward(self, a, b):
        q = a.new_empty(a.shape[0], 8)
        q[..., :4].copy_(a)
        q[..., 4:].copy_(b * 2)
        if self.into_state:
            self.seen[:, 4:].add_(b.sum(0))
            return q + self.seen.sum()
        return q + 1


@pytest.mark.parametrize("into_state", [False, True])
def test_writes_through_views_are_kept_in_a_saved_program(tmp_path, into_state):
    # Pruning for the save dropped the in-place copies into the views (they
    # write names no fetch reads): the loaded model returned new_empty's
    # uninitialised memory, silently.
    model = WritesThroughViews(into_state)
    d2s.jit.save(model, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 4]), d2s.InputSpec([None, 4])])
    loaded, eager = d2s.jit.load(str(tmp_path / "m")), WritesThroughViews(into_state)
    for batch in (2, 3, 2):
        a, b = torch.randn(batch, 4), torch.randn(batch, 4)
        assert torch.equal(loaded(a, b), eager(a, b))
    assert torch.equal(loaded.state_dict()["seen"], eager.seen)


class _NormThenCount(nn.Module):
    # A number read after a norm in training mode: saving finds its example
    # value by replaying ops on the example's tensors, never the norm, whose
    # running statistics would move.
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        y = self.bn(x)
        return torch.zeros(int((y > 0).sum())) + y.sum()


@pytest.mark.parametrize("spec", [[4, 4], [None, 4]], ids=["static", "dynamic"])
def test_saving_a_module_in_training_mode_leaves_its_state(tmp_path, spec):
    torch.manual_seed(0)
    model = _NormThenCount().train()
    before = copy.deepcopy(model.state_dict())
    d2s.jit.save(model, str(tmp_path / "m"), input_spec=[d2s.InputSpec(spec)])
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_save_inference_model_refuses_state_carried_between_calls(tmp_path):
    # An inference model keeps no state between runs: saved so, every run
    # started from the state at save time (jit.save carries it).
    static = d2s.declarative(exported_writes.CarriesState())
    static(torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"carries module state from one call to the next \(`CarriesState.h`"):
        d2s.ProgramTranslator().save_inference_model(str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()
    assert "cond" in {op.type for op in static.forward.concrete_program.main_program.global_block().ops}
