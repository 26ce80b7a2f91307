"""A loaded `TranslatedLayer` behaves like the module it came from: train()
and eval() switch between the saved programs (dropout, batch norm), its
state-dict keys are the original's so state dicts move both ways, and it
prints its feeds, fetches and parameter count. Also: StaticFunction's repr,
the ProgramTranslator entry points on `declarative(module)`, and the index
and device errors of the deployment API."""

import copy
import json

import pytest
import torch
import torch.nn as nn

import d2s

SPEC = [d2s.InputSpec([None, 6])]


class DropNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(8, 3))
        self.unused = nn.Linear(2, 2)  # in the state dict, never read by forward

    def forward(self, x):
        h = self.drop(self.norm(self.fc(x)))
        if h.sum() > 0:
            h = h * 2
        return self.head(h)


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))


def _saved(tmp_path, module, mode, name="m"):
    module.train(mode == "train")
    d2s.jit.save(d2s.declarative(copy.deepcopy(module)), str(tmp_path / name), input_spec=SPEC)
    return d2s.jit.load(str(tmp_path / name))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_both_modes_are_saved_and_the_layer_loads_in_the_saved_one(tmp_path, mode):
    loaded = _saved(tmp_path, DropNorm(), mode)
    assert loaded.training == (mode == "train")
    doc = json.loads((tmp_path / "m" / "program.json").read_text())
    assert doc["mode"] == mode and doc["alternate"]["mode"] != mode


def test_eval_after_a_train_mode_save_disables_dropout(tmp_path):
    torch.manual_seed(0)
    eager = DropNorm()
    loaded = _saved(tmp_path, eager, "train")
    assert loaded.training
    x = torch.randn(5, 6)
    loaded.eval()
    eager.eval()
    torch.testing.assert_close(loaded(x), eager(x))
    torch.testing.assert_close(loaded(x), loaded(x))
    loaded.train()
    torch.manual_seed(1)
    noisy = [loaded(x) for _ in range(2)]
    assert not torch.equal(noisy[0], noisy[1])  # dropout draws differ


def test_fine_tuning_in_train_mode_updates_batch_norm_statistics_like_the_original(tmp_path):
    torch.manual_seed(0)
    eager = DropNorm()
    eager.drop.p = 0.0  # same numbers without matching dropout draws
    loaded = _saved(tmp_path, eager, "eval")
    assert not loaded.training
    loaded.train()
    eager.train()
    for seed in range(3):
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(seed)) * 3
        torch.testing.assert_close(loaded(x), eager(x))
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, msg=lambda m: f"{key}: {m}")
    assert int(loaded.state_dict()["norm.num_batches_tracked"]) == 3


def test_state_dicts_move_both_ways(tmp_path):
    torch.manual_seed(0)
    eager = DropNorm().eval()
    loaded = _saved(tmp_path, eager, "eval")
    assert list(loaded.state_dict()) == list(eager.state_dict())
    assert [n for n, _ in loaded.named_parameters()] == [n for n, _ in eager.named_parameters()]

    other = DropNorm().eval()
    loaded.load_state_dict(other.state_dict())
    x = torch.randn(4, 6)
    torch.testing.assert_close(loaded(x), other(x))

    with torch.no_grad():
        for p in loaded.parameters():
            p.mul_(0.5)
    eager.load_state_dict(loaded.state_dict())
    torch.testing.assert_close(eager(x), loaded(x))


def test_a_model_without_mode_dependent_layers_saves_one_program_for_both(tmp_path):
    loaded = _saved(tmp_path, Plain(), "train")
    doc = json.loads((tmp_path / "m" / "program.json").read_text())
    assert doc["mode"] == "train" and doc["both_modes"] is True and "alternate" not in doc  # one program
    x = torch.randn(3, 6)
    out = loaded(x)
    torch.testing.assert_close(loaded.eval()(x), out)


def test_a_mode_that_was_not_saved_is_refused(tmp_path):
    static = d2s.declarative(DropNorm().eval())
    static(torch.randn(4, 6))
    d2s.jit.save(static, str(tmp_path / "m"))  # no input_spec: the latest call's mode only
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert not loaded.training
    with pytest.raises(RuntimeError, match=r"cannot switch this loaded model to train mode: its program was built "
                                           r"in eval mode and holds ops that differ between the modes "
                                           r"\(torch.nn.functional.batch_norm, torch.nn.functional.dropout\)"):
        loaded.train()
    assert not loaded.training


def test_resaving_a_translated_layer_keeps_both_modes_and_the_state_keys(tmp_path):
    torch.manual_seed(0)
    eager = DropNorm()
    loaded = _saved(tmp_path, eager, "eval")
    d2s.jit.save(loaded, str(tmp_path / "again"))
    again = d2s.jit.load(str(tmp_path / "again"))
    assert list(again.state_dict()) == list(eager.state_dict())
    x = torch.randn(4, 6)
    torch.testing.assert_close(again(x), loaded(x))
    again.train()
    assert again.training


def test_repr_shows_feeds_fetches_and_parameter_count(tmp_path):
    loaded = _saved(tmp_path, Plain(), "eval")
    text = repr(loaded)
    assert "feeds: x: float32[any, 6]" in text
    assert "fetches: " in text and "float32[any, 3]" in text
    assert "parameters: 21 elements" in text


def test_static_function_repr():
    static = d2s.declarative(Plain())
    assert repr(static.forward) == "<d2s.StaticFunction Plain.forward of Plain, 0 programs cached>"
    static(torch.randn(2, 6))
    assert repr(static.forward) == "<d2s.StaticFunction Plain.forward of Plain, 1 program cached>"


@pytest.mark.parametrize("wrap", ["declarative", "plain"])
def test_program_translator_accepts_a_module(wrap):
    module = Plain()
    target = d2s.declarative(module) if wrap == "declarative" else module
    translator = d2s.ProgramTranslator()
    x = torch.randn(2, 6)
    assert "def forward" in translator.get_code(target)
    main, _, inputs, _ = translator.get_program(target, x)
    assert [v.name for v in inputs] == ["x"] and main.global_block().ops
    torch.testing.assert_close(translator.get_output(target, x), torch.relu(module.fc(x)))
    if wrap == "plain":
        assert not isinstance(module.forward, d2s.StaticFunction)  # inspecting does not convert it


def test_fetch_index_out_of_range_is_a_clear_error(tmp_path):
    static = d2s.declarative(Plain())
    static(torch.randn(2, 6))
    translator = d2s.ProgramTranslator()
    with pytest.raises(ValueError, match=r"fetch index 1 is out of range: the latest call has 1 output\(s\) "
                                         r"\(valid positions: 0..0\)"):
        translator.save_inference_model(str(tmp_path / "m"), fetch=[0, 1])


def test_traced_layer_feed_index_out_of_range_is_a_clear_error(tmp_path):
    _, traced = d2s.TracedLayer.trace(Plain(), [torch.randn(2, 6)])
    with pytest.raises(ValueError, match=r"feed index 3 is out of range: the traced layer has 1 input\(s\)"):
        traced.save_inference_model(str(tmp_path / "m"), feed=[3])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a CPU-only PyTorch")
def test_cuda_place_on_a_cpu_only_torch_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"CUDAPlace\(0\): (this PyTorch build has no CUDA support|"
                                           r"no CUDA device is visible).*use d2s.CPUPlace\(\)"):
        d2s.CUDAPlace(0)


@pytest.mark.parametrize("hook", ["forward_pre", "forward", "global forward"])
def test_hooks_of_a_loaded_layer_run_around_its_short_call(tmp_path, hook):
    # A loaded layer's call skips nn.Module's machinery only when nothing surrounds forward.
    torch.manual_seed(0)
    model = Plain()
    loaded = _saved(tmp_path, model, "eval")
    x = torch.randn(2, 6)
    if hook == "forward_pre":
        want = model(x * 2)
        handle = loaded.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    else:
        want = model(x) + 1
        register = loaded.register_forward_hook if hook == "forward" else nn.modules.module.register_module_forward_hook
        handle = register(lambda m, args, out: out + 1)
    try:
        assert torch.equal(loaded(x), want)
    finally:
        handle.remove()
    assert torch.equal(loaded(x), model(x))
