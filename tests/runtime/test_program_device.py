"""A program's device and the attributes that follow it (runtime/ir.py
`Program.device`).

A device the trace read off a value (`device=x.device`,
`device=self.weight.device`, `y.to(x.device)`) is the program's own device
object in its attributes: saved as `$program_device`, and renamed when the
program runs on another device (a saved model moved to a GPU), as a trace
there would record it. A device the user spelled out stays as written, as
eager keeps it.

Without a GPU, "another device" is `meta` (shapes only, no values): a model
traced and saved on the CPU, loaded and moved to `meta`, must put the
values eager puts there on `meta` and keep a spelled-out CPU tensor on the
CPU. tests/runtime/test_cuda_runtime.py runs the same on a GPU, with values
and control flow.
"""

import json

import pytest
import torch
import torch.nn as nn

import d2s
from runtime.ir import Program

META = torch.device("meta")


class Shifted(nn.Module):
    """Devices read off an input, off a parameter, and one spelled out."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        bias = torch.arange(4, device=self.lin.weight.device, dtype=x.dtype)
        zeros = torch.zeros(x.shape[0], 4, device=x.device)
        return self.lin(x) + zeros + bias.to(x.device), torch.ones(2, device="cpu")


def _follower_ops(program):
    return sorted(op.type for b in program.blocks for op in b.ops
                  for v in op.attrs.values() if _holds(v, program.device))


def _holds(value, device):
    if value is device:
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds(v, device) for v in value)
    if isinstance(value, dict):
        return any(_holds(v, device) for v in value.values())
    return False


def _saved(tmp_path):
    torch.manual_seed(0)
    model = Shifted()
    x = torch.randn(3, 4)
    d2s.jit.save(d2s.declarative(model), str(tmp_path / "m"), input_spec=[x])
    return model, x, tmp_path / "m"


def test_devices_read_off_values_follow_the_program_and_spelled_out_ones_do_not(tmp_path):
    model, x, path = _saved(tmp_path)
    static = d2s.declarative(model)
    static(x)
    program = static.forward.concrete_program.main_program
    assert _follower_ops(program) == ["torch.Tensor.to", "torch.arange", "torch.zeros"]
    attrs = [line for line in (path / "program.json").read_text().splitlines() if "device" in line]
    assert sum('"$program_device": "cpu"' in line for line in attrs) == 3
    assert any('"device": "cpu"' in line for line in attrs)  # torch.ones(2, device="cpu"), as written


@pytest.mark.parametrize("grad", [True, False])
def test_a_saved_model_moved_to_another_device_puts_its_values_there(tmp_path, grad):
    model, x, path = _saved(tmp_path)
    loaded = d2s.jit.load(str(path))
    with torch.set_grad_enabled(grad):
        want, got = model(x), loaded(x)
        assert all(torch.equal(a, b) for a, b in zip(want, got))
        loaded.to(META)
        model.to(META)
        want, got = model(x.to(META)), loaded(x.to(META))
    assert [(t.device, t.shape) for t in got] == [(t.device, t.shape) for t in want] \
        == [(META, torch.Size([3, 4])), (torch.device("cpu"), torch.Size([2]))]
    assert loaded.program.device == torch.device("cpu")  # the loaded program itself is unchanged


class Counted(nn.Module):
    """No parameters: moving a module to `meta` replaces its Parameter
    objects (CPU and meta tensors cannot swap storage), which a TracedLayer
    holds; moving to a GPU keeps them (test_cuda_runtime.py)."""

    def forward(self, x):
        return x * torch.arange(x.shape[-1], device=x.device), torch.ones(2, device="cpu")


def test_a_traced_layer_follows_its_inputs_device():
    x = torch.randn(3, 4)
    _, traced = d2s.TracedLayer.trace(Counted(), [x])
    assert torch.equal(traced(x)[0], Counted()(x)[0])
    got = traced(x.to(META))
    assert [(t.device, t.shape) for t in got] == [(META, torch.Size([3, 4])), (torch.device("cpu"), torch.Size([2]))]


def test_on_device_renames_only_the_followers_and_leaves_the_program_alone():
    static = d2s.declarative(Shifted())
    static(torch.randn(3, 4))
    program = static.forward.concrete_program.main_program
    before = program.to_string()
    moved = program.on_device(META)
    assert moved is not program and moved.device == META
    assert _follower_ops(moved) == _follower_ops(program)
    assert "device(type='cpu')" not in str([op.attrs for op in moved.global_block().ops
                                             if op.type in ("torch.zeros", "torch.arange")])
    assert program.to_string() == before and program.on_device(torch.device("cpu")) is program


def test_a_program_without_followers_moves_for_its_passes_alone():
    program = Program()
    assert not _follower_ops(program)
    moved = program.on_device(META)
    assert moved is not program and moved.device == META and program.device == torch.device("cpu")


def test_setting_the_device_renames_the_followers_in_place():
    static = d2s.declarative(Shifted())
    static(torch.randn(3, 4))
    program = static.forward.concrete_program.main_program.copy()
    version = program._version
    program.device = META
    assert _follower_ops(program) == ["torch.Tensor.to", "torch.arange", "torch.zeros"]
    assert program._version > version  # compiled functions of the old attributes are not reused


def test_a_version_2_file_reads_with_every_device_as_written(tmp_path):
    """Version 2 had no `$program_device`: its devices stay as saved."""
    _, x, path = _saved(tmp_path)
    doc = json.loads((path / "program.json").read_text())
    doc["format_version"] = 2
    text = json.dumps(doc).replace('"$program_device"', '"$device"')
    (path / "program.json").write_text(text)
    loaded = d2s.jit.load(str(path))
    assert not _follower_ops(loaded.program)
    assert loaded(x)[0].shape == (3, 4)


@pytest.mark.parametrize("body", ["os.system", "", 7, "cuda:x"])
def test_a_malformed_program_device_is_refused(tmp_path, body):
    _, _, path = _saved(tmp_path)
    text = (path / "program.json").read_text().replace('{"$program_device": "cpu"}',
                                                      json.dumps({"$program_device": body}), 1)
    (path / "program.json").write_text(text)
    with pytest.raises(d2s.ModelFormatError, match="not a device"):
        d2s.jit.load(str(path))


def _mixed(x, lengths):
    made_by_lengths = torch.zeros(3, device=lengths.device)
    made_by_x = torch.ones(3, device=x.device)
    return made_by_lengths, made_by_x, lengths.device.type, x.is_cuda


@pytest.mark.parametrize("first", ["meta", "cpu"])
def test_a_feed_on_another_device_than_the_first_has_its_own(first):
    """CPU lengths beside inputs on another device: each feed's `.device` is
    its own (the program's device is the first tensor argument's)."""
    x, lengths = torch.randn(3, device=first), torch.tensor([1, 2])
    static = d2s.declarative(_mixed)
    want, got = _mixed(x, lengths), static(x, lengths)
    assert [t.device for t in got[:2]] == [t.device for t in want[:2]] and got[2:] == want[2:]


def _ranged(x):
    return x + torch.arange(4, device=x.device) + torch.zeros(4, device=x.device)


def test_a_program_traced_on_another_device_runs_on_the_cpu_once_loaded(tmp_path):
    """Traced on `meta` (a GPU trace without a GPU), saved, loaded on the CPU:
    through the Executor at CPUPlace and through jit.load."""
    static = d2s.declarative(_ranged)
    static(torch.randn(3, 4, device=META))
    d2s.ProgramTranslator().save_inference_model(str(tmp_path / "m"))
    assert (tmp_path / "m" / "program.json").read_text().count('{"$program_device": "meta"}') == 2
    x = torch.randn(3, 4)
    exe = d2s.Executor(d2s.CPUPlace())
    program, feed_names, fetch_targets = d2s.load_inference_model(str(tmp_path / "m"), exe)
    (got,) = exe.run(program, feed={feed_names[0]: x}, fetch_list=fetch_targets, return_numpy=False)
    assert torch.equal(got, _ranged(x))
    assert torch.equal(d2s.jit.load(str(tmp_path / "m"))(x), _ranged(x))
