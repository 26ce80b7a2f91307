"""A saved program records the `training` mode it was traced in; a loaded
layer switched to a mode it has no program for refuses, naming the mode,
unless no op of its program differs between the modes (runtime/modes.py).
Never the other mode's program run silently."""

import copy
import json

import pytest
import torch
import torch.nn as nn

import d2s
from runtime import modes


class Dropping(nn.Module):
    """Dropout and a data-dependent branch: the modes differ."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = self.drop(self.fc(x))
        if h.sum() > 0:
            h = h + 1
        else:
            h = h - 1
        return h


class Plain(nn.Module):
    """No op that differs between the modes."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        i = 0
        while h.abs().sum() > 1 and i < 3:
            h = h * 0.5
            i += 1
        return h


POS, NEG = torch.ones(3, 4), -10 * torch.ones(3, 4)


def _save_latest_call(tmp_path, model, how):
    """Run `model` (in its current mode) once, then save that call's program `how`."""
    static = d2s.declarative(model)
    static(POS)
    path = str(tmp_path / how)
    if how == "translator":
        d2s.ProgramTranslator().save_inference_model(path)
    elif how == "jit.save":
        d2s.jit.save(static, path)
    elif how == "traced":
        _, traced = d2s.TracedLayer.trace(model, [POS])
        traced.save_inference_model(path)
    else:  # the static graph API
        main = d2s.Program()
        with d2s.program_guard(main):
            x = d2s.data("x", [None, 4])
            y = model(x)
        d2s.save_inference_model(path, ["x"], [y], d2s.Executor(), main_program=main)
    return path


def _mode_written(path):
    return json.loads(open(f"{path}/program.json").read()).get("mode")


@pytest.mark.parametrize("how", ["translator", "jit.save", "program_guard"])
@pytest.mark.parametrize("saved, other", [("eval", "train"), ("train", "eval")])
def test_a_mode_with_dropout_that_was_not_saved_is_refused(tmp_path, how, saved, other):
    torch.manual_seed(0)
    model = Dropping().train(saved == "train")
    path = _save_latest_call(tmp_path, model, how)
    assert _mode_written(path) == saved
    loaded = d2s.jit.load(path)
    assert loaded.training == (saved == "train")
    with pytest.raises(RuntimeError, match=rf"cannot switch this loaded model to {other} mode: its program was "
                                           rf"built in {saved} mode .*\(torch.nn.functional.dropout\)"):
        loaded.train(other == "train")
    assert loaded.training == (saved == "train")  # unchanged: still runs the saved mode's program
    if saved == "eval":
        model.eval()
        for x in (POS, NEG):
            torch.testing.assert_close(loaded(x), model(x))


def test_a_traced_layer_records_its_mode(tmp_path):
    path = _save_latest_call(tmp_path, Dropping().eval(), "traced")
    assert _mode_written(path) == "eval"
    with pytest.raises(RuntimeError, match="cannot switch this loaded model to train mode"):
        d2s.jit.load(path).train()


@pytest.mark.parametrize("how", ["translator", "jit.save", "program_guard"])
def test_a_program_without_mode_dependent_ops_serves_both_modes(tmp_path, how):
    torch.manual_seed(0)
    model = Plain().eval()
    path = _save_latest_call(tmp_path, model, how)
    assert _mode_written(path) in ("eval", None)
    loaded = d2s.jit.load(path)
    assert "while" in [op.type for op in loaded.program.global_block().ops]
    for mode in (True, False, True):
        loaded.train(mode)
        model.train(mode)
        assert loaded.training == mode
        for x in (POS, NEG, torch.zeros(3, 4)):  # several, several, zero trips
            torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_both_modes_saved_switch_between_programs(tmp_path):
    torch.manual_seed(0)
    model = Dropping().eval()
    d2s.jit.save(d2s.declarative(model), str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 4])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    torch.testing.assert_close(loaded(NEG), model(NEG))
    loaded.train()
    out = loaded(POS)
    dropped = ((out == 1) | (out == -1)).float().mean()  # a dropped unit is 0, then +1 or -1 in the branch
    assert 0.2 < dropped < 0.8


def test_the_mode_of_a_program_is_read_from_its_ops():
    for training, expected in ((True, "train"), (False, "eval")):
        model = Dropping().train(training)
        d2s.declarative(model)(POS)
        program = model.forward.concrete_program.main_program
        assert program.mode == expected
        assert modes.mode_from_ops(program) == expected
        assert [op.type for op, _ in modes.mode_ops(program)] == ["torch.nn.functional.dropout"]
    plain = d2s.declarative(Plain())
    plain(POS)
    assert modes.mode_ops(plain.forward.concrete_program.main_program) == []
    assert modes.mode_from_ops(plain.forward.concrete_program.main_program) is None


def test_a_file_saved_without_a_mode_takes_the_mode_its_ops_say(tmp_path):
    path = _save_latest_call(tmp_path, Dropping().eval(), "translator")
    doc = json.loads(open(f"{path}/program.json").read())
    del doc["mode"]  # as files written before modes were recorded
    open(f"{path}/program.json", "w").write(json.dumps(doc))
    loaded = d2s.jit.load(path)
    assert not loaded.training
    with pytest.raises(RuntimeError, match="cannot switch this loaded model to train mode"):
        loaded.train()


class StatsFree(nn.Module):
    """Instance norm without running statistics: an op with a mode argument
    (`use_input_stats`) whose value is the same in both modes."""

    def __init__(self):
        super().__init__()
        self.norm = nn.InstanceNorm1d(4)

    def forward(self, x):
        h = self.norm(x)
        if h.sum() > 0:
            h = h + 1
        return h


def test_a_program_traced_the_same_in_both_modes_serves_both(tmp_path):
    model = StatsFree().eval()
    d2s.jit.save(d2s.declarative(model), str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 4, 5])])
    doc = json.loads(open(tmp_path / "m" / "program.json").read())
    assert doc["mode"] == "eval" and doc["both_modes"] is True and "alternate" not in doc
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert modes.mode_ops(loaded.program) and not loaded.training  # the ops alone would not tell
    x = torch.randn(2, 4, 5)
    for mode in (True, False):
        loaded.train(mode)
        model.train(mode)
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    d2s.jit.save(loaded, str(tmp_path / "again"))  # a loaded layer saves what it knows
    assert json.loads(open(tmp_path / "again" / "program.json").read())["both_modes"] is True


class TrainingReadsValues(nn.Module):
    """Training-only Python that d2s cannot convert (wav2vec2's SpecAugment
    reads the lengths with `.tolist()` and draws with numpy)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if self.training:
            h = h * len(x.sum(-1).tolist())
        if h.sum() > 0:
            h = h + 1
        return h


def test_a_mode_that_cannot_be_converted_is_left_out_and_refused(tmp_path):
    model = TrainingReadsValues().eval()
    spec = [d2s.InputSpec([None, 4])]
    with pytest.warns(UserWarning, match="train-mode program could not be converted"):
        d2s.jit.save(model, str(tmp_path / "m"), input_spec=spec)
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert "cond" in [op.type for op in loaded.program.global_block().ops]
    for x in (torch.randn(3, 4).abs(), -torch.randn(5, 4).abs()):
        assert torch.equal(loaded(x), model(x))
    # no op of the program differs between the modes, yet train() is refused: the Python did
    with pytest.raises(RuntimeError, match="cannot switch this loaded model to train mode: its train-mode program"):
        loaded.train()
    d2s.jit.save(loaded, str(tmp_path / "again"))  # saved again from the loaded model: still one mode
    with pytest.raises(RuntimeError, match="could not be converted"):
        d2s.jit.load(str(tmp_path / "again")).train()
    with pytest.raises(d2s.ConversionError, match="tolist"):  # saved in train mode: that mode must convert
        d2s.jit.save(model.train(), str(tmp_path / "train"), input_spec=spec)


class ReadsGradMode(nn.Module):
    """The user's code picks a path by the caller's grad mode."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if torch.is_grad_enabled():
            return self.fc(x) * 2
        return self.fc(x) + 1


def _encoder_layer():
    torch.manual_seed(0)  # eval: without gradients torch runs a fused kernel
    return nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True).eval()


@pytest.mark.parametrize("saved_in", ["grad", "no_grad"])
@pytest.mark.parametrize("make", [ReadsGradMode, _encoder_layer], ids=["user_read", "fused_kernel"])
def test_a_program_reading_the_grad_mode_is_saved_for_both_modes(tmp_path, make, saved_in):
    """A program that read the caller's grad mode serves only that mode; the
    saved model holds the other mode's program as a path, so the loaded one
    serves calls with and without gradients as eager does (it refused the
    other mode with DecisionFailed)."""
    model = make()
    eager = copy.deepcopy(model)
    path = str(tmp_path / "m")
    with torch.set_grad_enabled(saved_in == "grad"):
        d2s.jit.save(model, path, input_spec=[d2s.InputSpec([None, 3, 4])])
    loaded = d2s.jit.load(path)
    x = torch.randn(2, 3, 4)
    for mode in ("grad", "no_grad", "grad"):
        with torch.set_grad_enabled(mode == "grad"):
            assert torch.equal(loaded(x), eager(x)), mode
