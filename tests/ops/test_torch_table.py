"""The op table comes from torch's own declarations; what is denied is refused
before it runs (capture) and never loaded; nothing a module holds is frozen."""

import json
import os

import pytest
import torch
import torch.nn as nn

import d2s
import runtime
from ops import torch_ops
from opcheck import check, line_of, randn
from runtime.optable import get_op_def, is_registered

HERE = __file__


def _line_of(marker):
    return line_of(HERE, marker)


# -- the table -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "torch.logdet", "torch.equal", "torch.tanh_", "torch.conv_tbc", "torch.fft.rfftn",
    "torch.sparse_coo_tensor", "torch.nn.functional.max_pool2d", "torch.Tensor.softmax",
    "torch.Tensor.log_softmax", "torch.Tensor.new", "torch.Tensor.new_zeros", "torch.linalg.det",
    "torch.special.erfcx", "torch.Tensor.data", "torch.zeros", "torch.randn"])
def test_torch_declares_it_so_it_is_an_op(name):
    assert is_registered(name)


@pytest.mark.parametrize("name, random", [
    ("torch.randn", True), ("torch.Tensor.normal_", True), ("torch.nn.functional.dropout", True),
    ("torch.nn.functional.rrelu", True), ("torch.multinomial", True), ("torch.add", False),
    ("torch.Tensor.add_", False), ("torch.zeros", False), ("torch.nn.functional.linear", False)])
def test_random_ops_are_known_from_torchs_schemas(name, random):
    # Computed on first use (schema lookups for the whole table cost ~0.2 s at import).
    assert bool(get_op_def(name).random) is random


def _denied_names():
    return sorted(name for name, _why in set(torch_ops.DENIED.values()))


@pytest.mark.parametrize("name", _denied_names())
def test_denylisted_names_are_not_ops(name):
    assert not is_registered(name)


@pytest.mark.parametrize("name", ["size", "dim", "numel", "stride", "is_complex", "get_device"])
def test_metadata_is_not_an_op(name):
    assert not is_registered(f"torch.Tensor.{name}")


def test_every_listed_name_exists_in_the_torch_ci_pins():
    # Another release may lack a name (nothing to deny there); on this one a missing name is a typo.
    assert torch_ops.missing_names() == []


def test_a_name_torch_lacks_is_reported_and_denies_nothing(monkeypatch):
    monkeypatch.setattr(torch_ops, "DENYLIST", (("torch", "no_such_function save", "I/O"),))
    assert torch_ops.missing_names() == ["torch.no_such_function"]
    assert sorted(name for name, _why in torch_ops._denied().values()) == ["torch.save"]


# -- denied calls: refused at capture, before they run ---------------------------------------------

class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))


def _call(fn, holder, x):
    return fn(holder.w, x)  # DENIED CALL


def _resolve(name):
    prefix, _, attr = name.rpartition(".")
    owner = torch.Tensor if prefix == "torch.Tensor" else {"torch": torch}[prefix]
    return owner.__dict__.get(attr, getattr(owner, attr, None)) if owner is torch.Tensor else getattr(owner, attr)


@pytest.mark.parametrize("name", _denied_names())
def test_denied_call_is_refused_at_the_users_line_before_it_runs(name):
    fn = _resolve(name)
    holder = Holder()

    @d2s.declarative
    def f(x):
        return _call(fn, holder, x)

    with pytest.raises(d2s.ConversionError) as info:
        f(torch.randn(3))
    assert info.value.lineno == _line_of("# DENIED CALL") and info.value.filename == HERE
    assert name in str(info.value)


def test_torch_save_writes_nothing(tmp_path):
    path = tmp_path / "f.pt"

    @d2s.declarative
    def f(x):
        torch.save(x, str(path))
        return x

    with pytest.raises(d2s.ConversionError, match="torch.save"):
        f(torch.randn(2))
    assert not path.exists()


# -- denied names: refused at load, nothing run ----------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    @d2s.declarative
    def f(x):
        return torch.relu(x)

    f(torch.randn(2))
    path = str(tmp_path_factory.mktemp("denied") / "model")
    d2s.ProgramTranslator().save_inference_model(path)
    return path


@pytest.mark.parametrize("name", _denied_names())
def test_denied_name_in_a_saved_program_is_refused_at_load(saved, name, tmp_path, monkeypatch):
    import shutil
    target = str(tmp_path / "model")
    shutil.copytree(saved, target)
    with open(os.path.join(target, "program.json")) as f:
        program = json.load(f)
    for op in program["program"]["blocks"][0]["ops"] if "program" in program else program["blocks"][0]["ops"]:
        op["type"] = name
    with open(os.path.join(target, "program.json"), "w") as f:
        json.dump(program, f)
    ran = []
    monkeypatch.setattr(runtime.Executor, "run", lambda *a, **k: ran.append(1))
    with pytest.raises(d2s.ModelFormatError, match="not a registered"):
        d2s.load_inference_model(target, d2s.Executor())
    assert not ran


# -- never a frozen value --------------------------------------------------------------------------

class LogDet(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.eye(2) * 2)

    def forward(self, x):
        return x * torch.logdet(self.w)


def test_parameter_update_between_calls_is_seen():
    eager, static = LogDet(), d2s.declarative(LogDet())
    x = torch.randn(3)
    assert torch.allclose(static(x), eager(x))
    with torch.no_grad():
        eager.w.mul_(2)
        static.w.mul_(2)
    assert torch.allclose(static(x), eager(x))
    assert len(static.forward.program_cache) == 1
    program = static.forward.concrete_program.main_program
    assert "torch.logdet" in program.to_string()


def test_training_steps_follow_eager():
    eager, static = LogDet(), d2s.declarative(LogDet())
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_s = torch.optim.SGD(static.parameters(), lr=0.1)
    x = torch.randn(3)
    for _ in range(3):
        for model, opt in ((eager, opt_e), (static, opt_s)):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        assert torch.allclose(static.w.grad, eager.w.grad)
        assert torch.allclose(static.w, eager.w)
        assert torch.allclose(static(x), eager(x))


class UnknownOnParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return x * torch._cast_Float(self.w)  # NOT AN OP


def test_non_op_on_a_parameter_is_refused_not_frozen():
    with pytest.raises(d2s.ConversionError, match="_cast_Float") as info:
        d2s.declarative(UnknownOnParameter())(torch.randn(3))
    assert info.value.lineno == _line_of("# NOT AN OP")


class ItemOfBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return x * self.scale.item()  # ITEM OF BUFFER


def test_python_value_of_a_buffer_is_read_when_the_program_runs_not_frozen():
    module = ItemOfBuffer()
    static = d2s.declarative(module)
    x = torch.randn(3)
    assert torch.equal(static(x), x * 2.0)
    module.scale.fill_(3.0)  # updated between calls: the program reads it again
    assert torch.equal(static(x), x * 3.0)
    assert len(static.forward.program_cache) == 1


# -- tensor methods, metadata, equal -----------------------------------------------------------------

@pytest.mark.parametrize("form", [
    lambda x: x.softmax(-1) + x.log_softmax(dim=-1),
    lambda x: x.new(x.size()).fill_(1) + x.new(2, 3).fill_(2) + x.new_zeros(3) + x.new_tensor([1.0, 2.0, 3.0]),
    lambda x: x * (x.nelement() + torch.numel(x) + x.ndimension() + x.stride(0) + x.t().stride(0)),
    lambda x: x * (x.is_complex() + x.get_device() + x.element_size() + x.is_contiguous()),
    lambda x: torch.tanh_(x.clone()) + torch.fft.rfftn(x).abs().sum(),
])
def test_methods_and_metadata_match_eager(form):
    check(form, lambda n: [randn(2, 3)], exact=False)


def test_if_on_torch_equal_is_a_graph_branch():
    def f(x, y):
        if torch.equal(x, y):
            return x + 1
        return x - 1

    static = d2s.declarative(f)
    x = torch.randn(3)
    assert torch.equal(static(x, x.clone()), f(x, x.clone()))
    assert torch.equal(static(x, x + 1), f(x, x + 1))
    assert len(static.program_cache) == 1
    assert any(op.type == "cond" for op in static.concrete_program.main_program.global_block().ops)


class GroupedExperts(nn.Module):
    """A mixture of experts as transformers' Mixtral runs it: tokens sorted
    by expert, one torch._grouped_mm over the groups, scattered back."""

    def __init__(self, experts=4, dim=16, hidden=32):
        super().__init__()
        self.router = nn.Linear(dim, experts)
        self.weight = nn.Parameter(torch.randn(experts, dim, hidden) / 4)
        self.experts = experts

    def forward(self, x):
        expert = self.router(x).argmax(-1)
        order = expert.argsort(stable=True)
        offsets = torch.nn.functional.one_hot(expert, self.experts).sum(0).cumsum(0).to(torch.int32)
        y = torch._grouped_mm(x[order], self.weight, offs=offsets)[order.argsort()]
        if y.sum() > 0:
            y = y * 2
        return y


@pytest.mark.parametrize("spec", [None, [d2s.InputSpec([None, 16])]])
def test_grouped_mm_is_an_op(spec):
    """Its meta kernel is CUDA's (bfloat16 only): float32 shapes come from d2s."""
    torch.manual_seed(0)
    model = GroupedExperts()
    static = d2s.declarative(model, input_spec=spec)
    taken = set()
    for n in (7, 12, 3, 5, 9, 1) if spec else (7,) * 6:
        x = torch.randn(n, 16)
        expected = model(x)
        taken.add(bool(expected.sum() > 0))
        assert torch.equal(static(x), expected)
    assert taken == {True, False}  # both branches of the cond
    program = static.forward.concrete_program.main_program
    ops = [op.type for op in program.global_block().ops]
    assert "torch._grouped_mm" in ops and "cond" in ops and len(static.forward.program_cache) == 1
