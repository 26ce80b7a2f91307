"""f-strings in converted code (d2s/transformers/fstrings.py,
d2s/operators/fstrings.py).

With Python values an f-string is the text Python makes. An integer known
only when the program runs (`idx[0]` of a `nonzero()` row) spells text the
run decides: as the key of an `nn.ModuleDict` it picks the item when called,
a `cond` per key it may spell (switch_transformers' experts,
`self[f"expert_{expert_idx[0]}"]`); before, every such f-string was refused."""

import pytest
import torch
import torch.nn as nn

import d2s
from d2s import ConversionError
from test_translate_control_flow import all_op_types


class Experts(nn.ModuleDict):
    def __init__(self, n=3):
        super().__init__()
        for i in range(n):
            self[f"expert_{i}"] = nn.Linear(4, 4)

    def forward(self, x, chosen):
        out = torch.zeros_like(x)
        for idx in chosen.nonzero():  # a run-time number of trips, each a run-time index
            out = out + self[f"expert_{idx[0]}"](x)
        if out.sum() > 0:
            out = out * 2
        return out


CHOICES = [[1, 0, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1], [0, 0, 1]]  # zero, one and several trips; every expert


def test_a_module_dict_picked_by_run_time_text_gives_eager_results_and_gradients():
    torch.manual_seed(0)
    eager, static = Experts(), d2s.declarative(Experts())
    static.load_state_dict(eager.state_dict())
    x = torch.randn(2, 4)
    for chosen in map(torch.tensor, CHOICES):
        for model in (eager, static):
            model.zero_grad(set_to_none=True)
        want, got = eager(x, chosen), static(x, chosen)
        assert torch.equal(got, want)
        if not chosen.any():  # no expert: nothing to differentiate, in eager too
            continue
        want.sum().backward()
        got.sum().backward()
        for (name, p), q in zip(eager.named_parameters(), static.parameters()):
            assert (p.grad is None) == (q.grad is None), name  # only the experts picked get gradients
            assert p.grad is None or torch.equal(p.grad, q.grad), name
    assert len(static.forward.program_cache) == 1
    assert {"cond", "while"} <= all_op_types(static.forward.concrete_program.main_program)


def test_the_saved_program_picks_by_the_run_time_text(tmp_path):
    torch.manual_seed(0)
    model = Experts().eval()
    d2s.jit.save(model, str(tmp_path / "m"), input_spec=[d2s.InputSpec([None, 4]), d2s.InputSpec([3], "int64")])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    x = torch.randn(5, 4)
    for chosen in map(torch.tensor, CHOICES):
        assert torch.equal(loaded(x, chosen), model(x, chosen))


ACTIVATIONS = {"act_0": torch.tanh, "act_1": torch.sigmoid}


def _from_a_dict_of_functions(x, k):
    return ACTIVATIONS[f"act_{k}"](x)


def _spelling_no_key(x, k):
    return ACTIVATIONS[f"act_{k}"](x)


@pytest.mark.parametrize("k", [0, 1])
def test_a_dict_of_functions_picked_by_run_time_text(k):
    static = d2s.declarative(_from_a_dict_of_functions)
    x = torch.randn(3)
    for index in (k, 1 - k):
        n = (x.sum() * 0).long() + index  # known only when the program runs
        assert torch.equal(static(x, n), _from_a_dict_of_functions(x, n))
    assert len(static.program_cache) == 1


def test_text_spelling_no_key_raises_eagers_key_error_when_the_program_runs():
    static = d2s.declarative(_spelling_no_key)
    x = torch.randn(3)
    assert torch.equal(static(x, torch.tensor(1)), torch.sigmoid(x))
    with pytest.raises(KeyError):
        _spelling_no_key(x, torch.tensor(2))
    with pytest.raises(KeyError, match="no such key"):
        static(x, torch.tensor(2))


class Layered(nn.Module):
    """`getattr(self, f"layer_{i}")`, as older code names its layers."""

    def __init__(self):
        super().__init__()
        for i in range(3):
            setattr(self, f"layer_{i}", nn.Linear(4, 4))

    def forward(self, x, k):
        y = getattr(self, f"layer_{int(k)}")(x)  # `int(k)`: a run-time number in converted code
        if y.sum() > 0:
            y = y * 2
        return y


def test_getattr_of_a_name_spelled_at_run_time_picks_the_submodule():
    torch.manual_seed(0)
    eager, static = Layered(), d2s.declarative(Layered())
    static.load_state_dict(eager.state_dict())
    x = torch.randn(2, 4)
    for k in (0, 2, 1):
        assert torch.equal(static(x, torch.tensor(k)), eager(x, torch.tensor(k)))
    assert len(static.forward.program_cache) == 1
    assert "cond" in all_op_types(static.forward.concrete_program.main_program)
    with pytest.raises(AttributeError):
        eager(x, torch.tensor(5))
    with pytest.raises(AttributeError, match="'Layered' object has no attribute"):
        static(x, torch.tensor(5))


def _joins_the_text(x, k):
    name = f"layer_{k}"
    return x * len(name + "!")


def _formats_a_float_tensor(x):
    return x, f"{x.sum()}"


@pytest.mark.parametrize("fn, match", [(_joins_the_text, "holds an integer known only when the program runs, so it cannot be used as text"),
                                       (_formats_a_float_tensor, "cannot be used as text")])
def test_other_uses_of_run_time_text_are_refused_at_the_users_line(fn, match):
    args = (torch.randn(3), torch.tensor(1)) if fn is _joins_the_text else (torch.randn(3),)
    with pytest.raises(ConversionError, match=match) as info:
        d2s.declarative(fn)(*args)
    assert info.value.filename == __file__


def _python_text(x, scale):
    width, name = 12, "w"
    if x.sum() > 0:
        label = f"{name!r:>{width}}|{scale:.3f}|{scale=}|{x.dtype}|{x.shape[0]:04d}|{'nested':^{width - 2}}"
    else:
        label = f"neg {name!s} {name!a} {{braces}} {len(label_parts()):x}"
    return x * scale, label


def label_parts():
    return [1, 2, 3]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_f_strings_of_python_values_are_pythons_text(sign):
    static = d2s.declarative(_python_text)
    x = sign * torch.ones(3)
    assert static(x, 0.5)[1] == _python_text(x, 0.5)[1]
    assert torch.equal(static(x, 0.5)[0], _python_text(x, 0.5)[0])


def _checks_its_length(x):
    n = x.shape[0]
    assert n % 2 == 0, (
        f"the length should be even, given {n}"  # the message on a line of its own
    )
    if x.sum() > 0:
        raise ValueError(
            f"positive, length {n}"
        )
    return x * 2


@pytest.mark.parametrize("rows, sign, error", [(2, -1.0, None), (4, -1.0, None), (3, -1.0, AssertionError),
                                               (2, 1.0, ValueError)])
def test_a_message_on_a_line_of_its_own_may_hold_a_run_time_size(rows, sign, error):
    """A message inside the brackets of a `raise`/`assert` statement is a
    message: it converts at run-time sizes (Longformer's `assert ..., (\\n f"...")`,
    refused as text before), and the program raises where eager does."""
    static = d2s.declarative(_checks_its_length, input_spec=[d2s.InputSpec([None, 3])])
    x = torch.ones(rows, 3) * sign
    if error is None:
        assert torch.equal(static(x), _checks_its_length(x))
    else:
        with pytest.raises(error):
            _checks_its_length(x)
        with pytest.raises(error):
            static(x)
    assert {"cond", "assert"} <= {op.type for op in static.concrete_program.main_program.global_block().ops}


class BadInput(ValueError):
    pass


def checked(x, limit):
    m = x.sum()
    assert m < limit, f"sum {m} is not below {limit!r}: {x.shape[0]} rows, {x.size(0) * 2:>4} cells {{x}}"
    if m < -3:
        raise BadInput(f"sum {m.item():.2f} of {x.shape[0]} rows")
    if m < -2:
        raise ValueError(f"low sum {m}")
    return x * 2


@pytest.mark.parametrize("rows, value", [(2, 0.25), (3, 1.0), (2, -1.25), (4, -1.0)])
def test_assert_and_raise_messages_are_formatted_from_the_runs_values(rows, value, tmp_path):
    # Each message was made while the program was built, so it showed the
    # program's placeholders (`Variable(tmp_0: float32[] ...)`), and a number's
    # spec (`:.2f`) failed on them; it is formatted again when the check fails.
    static = d2s.declarative(checked, input_spec=[d2s.InputSpec([None, 2]), d2s.InputSpec([], "float32")])
    x, limit = torch.full((rows, 2), value), torch.tensor(2.5)
    try:
        want = checked(x, limit)
    except (AssertionError, ValueError) as exc:
        want = exc
    for run in (static, None):
        if run is None:  # the same program, saved and loaded
            d2s.jit.save(static, str(tmp_path / "m"))
            run = d2s.jit.load(str(tmp_path / "m"))
        if isinstance(want, BaseException):
            # (A user's exception class is raised as its builtin base, its name leading the message.)
            kind, text = (ValueError, "BadInput: " + str(want)) if type(want) is BadInput else (type(want), str(want))
            text = text.splitlines()[0]  # (pytest's assertion rewriting adds lines to eager's)
            with pytest.raises(kind) as info:
                run(x, limit)
            assert str(info.value).splitlines()[0] == text
        else:
            assert torch.equal(run(x, limit), want)
    assert {"assert", "raise", "cond"} <= all_op_types(static.concrete_program.main_program)
