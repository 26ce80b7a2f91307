"""`python -m d2s inspect|run DIR`: the happy paths in a real subprocess,
the error cases through `main()` in-process (same code, no interpreter
start-up per case)."""

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch
import torch.nn as nn

import runtime
from d2s.__main__ import main, output_name
from ops.capture import CaptureMode
from runtime import Executor, save_inference_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A two-input model: float features [s0, 4] and int64 ids [s1]."""
    torch.manual_seed(0)
    fc, emb = nn.Linear(4, 2), nn.Embedding(5, 2)
    program = runtime.Program()
    with runtime.program_guard(program):
        x = runtime.data("x", [None, 4])
        ids = runtime.data("ids", [None], dtype="int64")
        with CaptureMode():
            y = fc(x) + emb(ids)
    tmp = tmp_path_factory.mktemp("cli")
    path = tmp / "model"
    save_inference_model(str(path), ["x", "ids"], [y], Executor(), program)
    rng = np.random.RandomState(0)
    inputs = {"x": rng.rand(3, 4).astype("float32"), "ids": np.array([0, 4, 2])}
    files = {}
    for name, value in inputs.items():
        files[name] = str(tmp / f"{name}.npy")
        np.save(files[name], value)
    expected = (fc(torch.from_numpy(inputs["x"])) + emb(torch.from_numpy(inputs["ids"]))).detach().numpy()
    n_params = sum(p.numel() for p in list(fc.parameters()) + list(emb.parameters()))
    return {"dir": str(path), "program": program, "files": files, "fetch": y.name, "expected": expected,
            "n_params": n_params, "tmp": tmp}


def _cli(*args, cwd):
    # Only the d2s checkout under test on the path: no test or model code.
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "d2s", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def _inputs(model, **overrides):
    files = dict(model["files"], **overrides)
    return [arg for name, path in files.items() if path is not None for arg in ("--input", f"{name}={path}")]


def test_inspect_prints_program_feeds_fetches_and_versions(model):
    result = _cli("inspect", model["dir"], cwd=model["tmp"])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "format version: 4" in out
    assert f"torch {torch.__version__.split('+')[0]}" in out
    # Run-time sizes are printed as the program text prints them.
    assert "feeds:\n  x: float32[s0, 4]\n  ids: int64[s1]\n" in out
    assert f"fetches:\n  {model['fetch']}: float32[s0, 2]\n" in out
    assert f"parameters: {model['n_params']:,} elements in 3 tensors" in out
    assert out.endswith(model["program"].to_string())


def test_run_writes_outputs_that_match_eager(model, tmp_path):
    result = _cli("run", model["dir"], *_inputs(model), "--output-dir", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert model["fetch"].startswith("tmp_")  # a generated name: the file is named by position
    written = np.load(tmp_path / "out" / "output_0.npy")
    np.testing.assert_allclose(written, model["expected"], rtol=1e-6, atol=1e-6)


def test_run_prints_a_summary_without_output_dir(model, capsys):
    assert main(["run", model["dir"], *_inputs(model)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("output_0: float32, shape [3, 2], min ")
    assert f"{model['expected'].max():.6g}" in out


def test_usage_error_exits_2_with_one_line_in_a_subprocess(model):
    result = _cli("run", model["dir"], *_inputs(model, y=model["files"]["x"]), cwd=model["tmp"])
    assert result.returncode == 2
    assert result.stderr == "error: the model has no input 'y'; its inputs are: x, ids\n"


def _garbage(tmp):
    path = tmp / "garbage.npy"
    path.write_bytes(b"this is not a numpy file")
    return str(path)


def _pickled(tmp):
    path = tmp / "objects.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return str(path)


def _array(tmp, name, value):
    path = tmp / f"{name}.npy"
    np.save(path, value)
    return str(path)


ERRORS = {
    "unknown input": (lambda m, t: dict(z=m["files"]["x"]), "the model has no input 'z'; its inputs are: x, ids"),
    "missing input": (lambda m, t: dict(ids=None), "missing input 'ids' (int64[s1]); pass --input ids=FILE.npy"),
    "wrong rank": (lambda m, t: dict(x=_array(t, "x3", np.zeros((2, 4, 1), "float32"))),
                   "input 'x' has shape [2, 4, 1] but the model expects float32[s0, 4] (s0: any size)"),
    "wrong size": (lambda m, t: dict(x=_array(t, "x5", np.zeros((2, 5), "float32"))),
                   "input 'x' has shape [2, 5] but the model expects float32[s0, 4]"),
    "wrong dtype": (lambda m, t: dict(ids=_array(t, "fids", np.array([0.5, 1.0]))),
                    "input 'ids' has dtype float64 but the model expects int64"),
    "unreadable npy": (lambda m, t: dict(x=_garbage(t)), "cannot read input 'x' from"),
    "pickled npy": (lambda m, t: dict(x=_pickled(t)), "cannot read input 'x' from"),
    "missing file": (lambda m, t: dict(x=str(t / "absent.npy")), "No such file"),
    "text file": (lambda m, t: dict(x=_text(t)), "cannot read input 'x' from '{}': not a .npy file "
                                                   "(write one with numpy.save)"),
}


def _text(tmp):
    path = tmp / "x.txt"
    path.write_text("1 2 3 4\n")
    return str(path)


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_run_errors_exit_2_with_one_clear_line(model, tmp_path, capsys, case):
    overrides, message = ERRORS[case]
    code = main(["run", model["dir"], *_inputs(model, **overrides(model, tmp_path))])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1
    assert message.format(str(tmp_path / "x.txt")) in err
    assert "allow_pickle" not in err


def test_pickled_input_says_why_it_is_refused(model, tmp_path, capsys):
    assert main(["run", model["dir"], *_inputs(model, x=_pickled(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "holds Python objects (pickled data), which are never loaded" in err and "allow_pickle" not in err


def test_output_dir_that_is_a_file_exits_2_with_one_line(model, tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    assert main(["run", model["dir"], *_inputs(model), "--output-dir", str(tmp_path / "taken")]) == 2
    assert capsys.readouterr().err == f"error: --output-dir {str(tmp_path / 'taken')!r} exists and is not a directory\n"


@pytest.mark.parametrize("index, fetch, expected", [(0, "tmp_5", "output_0"), (3, "tmp_12", "output_3"),
                                                    (1, "logits", "logits"), (0, "head.out", "head.out")])
def test_outputs_are_named_by_fetch_name_or_position(index, fetch, expected):
    assert output_name(index, fetch) == expected


def test_float64_features_are_accepted_for_a_float32_input(model, tmp_path, capsys):
    x64 = _array(tmp_path, "x64", np.load(model["files"]["x"]).astype("float64"))
    assert main(["run", model["dir"], *_inputs(model, x=x64), "--output-dir", str(tmp_path)]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "output_0.npy"), model["expected"], rtol=1e-6)


@pytest.mark.parametrize("command", ["inspect", "run"])
def test_invalid_model_directory_exits_2(tmp_path, capsys, command):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "program.json").write_text("{")
    (tmp_path / "m" / "params.safetensors").write_bytes(b"")
    assert main([command, str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid model: ") and "not valid JSON" in err and err.count("\n") == 1


def test_malformed_input_flag(model, capsys):
    assert main(["run", model["dir"], "--input", "x"]) == 2
    assert "--input expects NAME=FILE.npy" in capsys.readouterr().err


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The quickstart model (a while and a cond), saved with jit.save."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("quickstart", os.path.join(ROOT, "examples", "quickstart.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import d2s
    path = tmp_path_factory.mktemp("show") / "quickstart"
    d2s.jit.save(d2s.declarative(module.GatedRefiner()), str(path), input_spec=[d2s.InputSpec([None, 8])])
    return str(path)


def test_show_prints_dot_text_without_output(quickstart, capsys):
    assert main(["show", quickstart]) == 0
    out = capsys.readouterr().out
    assert out.startswith("digraph program {") and 'label="while"' in out and 'label="cond"' in out


def test_show_writes_dot_text(quickstart, tmp_path, capsys):
    assert main(["show", quickstart, "-o", str(tmp_path / "q.dot")]) == 0
    assert (tmp_path / "q.dot").read_text().startswith("digraph program {")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_show_renders_the_quickstart_model_as_svg(quickstart, tmp_path, capsys):
    assert main(["show", quickstart, "-o", str(tmp_path / "q.svg")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'q.svg'}\n"
    root = ET.parse(tmp_path / "q.svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = {t.text for t in root.iter("{http://www.w3.org/2000/svg}text")}
    assert {"while", "cond", "x"} <= texts


def test_show_without_graphviz_says_how_to_install_it(quickstart, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert main(["show", quickstart, "-o", str(tmp_path / "q.svg")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "apt-get install graphviz" in err and "-o FILE.dot" in err
    assert not (tmp_path / "q.svg").exists()
