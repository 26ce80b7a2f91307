"""d2s.Graph: inference graphs, the debug ladder, eval/train programs, saving
an inference graph, and the mistakes it refuses."""

import copy

import pytest
import torch
import torch.nn as nn

import d2s


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = self.drop(self.fc(x))
        if h.sum() > 0:
            return h * 2
        return -h


class InferGraph(d2s.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x):
        return self.model(x)


def test_inference_graph_matches_eager_on_both_branches_and_saves(tmp_path):
    torch.manual_seed(0)
    model = Gate().eval()
    graph = InferGraph(model).eval()
    xs = [torch.ones(3, 4), -torch.ones(3, 4) * 5]
    for x in xs:
        assert torch.equal(graph(x), model(x))
    assert len(graph._build_fn.program_cache) == 1
    assert "cond" in [op.type for op in graph.program.global_block().ops]
    assert not graph.training_step

    d2s.jit.save(graph, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 4])])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for x in xs:
        torch.testing.assert_close(loaded(x), model(x))


def test_train_and_eval_are_separate_programs():
    model = Gate()
    graph = InferGraph(model)
    x = torch.ones(8, 4)
    graph(x)
    graph.eval()
    assert torch.equal(graph(x), model.eval()(x))  # eval: no dropout
    assert len(graph._build_fn.program_cache) == 2


def test_debug_level_applies_to_this_graph_only(capsys):
    graph = InferGraph(Gate().eval()).debug(2)
    graph(torch.ones(2, 4))
    err = capsys.readouterr().err
    assert "[d2s] graph InferGraph: built a program" in err
    assert "[d2s] program of InferGraph.build" in err
    InferGraph(Gate().eval())(torch.ones(2, 4))
    assert capsys.readouterr().err == ""


class NoBackward(d2s.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.add_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))

    def build(self, x):
        return self.model(x).sum()


def test_optimizer_without_backward_is_an_error():
    with pytest.raises(d2s.ConversionError, match="never calls loss.backward"):
        NoBackward(Gate())(torch.ones(2, 4))


def test_add_optimizer_checks_its_arguments():
    graph = InferGraph(Gate())
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        graph.add_optimizer(object())
    opt = torch.optim.SGD(Gate().parameters(), lr=0.1)
    other = torch.optim.SGD(Gate().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="another optimizer"):
        graph.add_optimizer(opt, lr_scheduler=torch.optim.lr_scheduler.StepLR(other, 1))


class TwoModels(d2s.Graph):
    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = nn.Linear(4, 4), nn.Linear(4, 4)
        self.add_optimizer(torch.optim.SGD(self.parameters(), lr=0.1))

    def build(self, x):
        loss = self.decoder(self.encoder(x)).pow(2).mean()
        loss.backward()
        return loss


def test_saving_a_training_graph_with_two_models_asks_which(tmp_path):
    graph = TwoModels()
    graph(torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"2 \(encoder, decoder\).*d2s.jit.save\(graph.<name>"):
        d2s.jit.save(graph, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 4])])


def test_static_function_repr():
    static = d2s.declarative(Gate())
    assert repr(static.forward) == "<d2s.StaticFunction Gate.forward of Gate, 0 programs cached>"
    static(torch.ones(2, 4))
    assert repr(static.forward).endswith("1 program cached>")


class StepGraph(d2s.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        self.add_optimizer(opt, lr_scheduler=torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5))

    def build(self, x):
        loss = self.model(x).pow(2).mean()
        loss.backward()
        return loss


def _eager_step(graph, x):
    """The graph's step in plain PyTorch (translation off for this call)."""
    translator = d2s.ProgramTranslator()
    translator.enable(False)
    try:
        return graph(x)
    finally:
        translator.enable(True)


def test_with_translation_disabled_the_graph_runs_the_same_step_eagerly():
    torch.manual_seed(0)
    model = Gate().eval()
    eager_model = copy.deepcopy(model)
    static, eager = StepGraph(model), StepGraph(eager_model)
    for x in (torch.ones(2, 4), -torch.ones(2, 4), torch.ones(2, 4) * 3):
        expected = _eager_step(eager, x)
        assert torch.equal(static(x), expected)
    for p, q in zip(eager_model.parameters(), model.parameters()):
        assert torch.equal(p, q)
    assert eager._build_fn is None or len(eager._build_fn.program_cache) == 0


@pytest.mark.parametrize("copied", [False, True])
def test_every_trace_of_build_steps_the_optimizer(copied):
    """The optimizer's steps are traced into every program of `build`
    (`__d2s_trace_context__`), not only the first: a call at new sizes
    converts again inside a call that found no program, and a deep copy's
    graph traces its own. Each call steps the lr scheduler once."""
    torch.manual_seed(0)
    model = Gate().eval()
    graph, eager = StepGraph(model), StepGraph(copy.deepcopy(model))
    if copied:
        graph = copy.deepcopy(graph)
    for x in (torch.ones(2, 4), -torch.ones(3, 4), torch.ones(5, 4) * 3, -torch.ones(2, 4)):
        expected = _eager_step(eager, x)
        assert torch.equal(graph(x), expected)
        assert graph._optimizers[0][0].param_groups[0]["lr"] == eager._optimizers[0][0].param_groups[0]["lr"]
    for p, q in zip(eager.model.parameters(), graph.model.parameters()):
        assert torch.equal(p, q)
    programs = list(graph._build_fn.program_cache)
    assert len(programs) >= 2
    for concrete in programs:
        types = [op.type for op in concrete.main_program.global_block().ops]
        assert "optimizer_step" in types and "cond" in types
