"""StaticFunction and ProgramTranslator: the program cache and its key,
methods bound per instance, modules, enable(False), get_* inspection."""

import copy
import functools
import inspect
import io
import pickle
import warnings

import pytest
import torch
import torch.nn as nn

import d2s
from d2s import static_function


def _ops(program):
    return [op.type for block in program.blocks for op in block.ops]


@d2s.declarative
def scale_or_negate(x, factor=2):
    if x.sum() > 0:
        y = x * factor
    else:
        y = -x
    return y


def test_one_program_for_both_branches_and_one_for_the_sizes_that_vary():
    scale_or_negate.program_cache.clear()
    assert torch.equal(scale_or_negate(torch.ones(3)), torch.ones(3) * 2)
    assert torch.equal(scale_or_negate(-torch.ones(3)), torch.ones(3))
    assert len(scale_or_negate.program_cache) == 1
    scale_or_negate(torch.ones(4))  # a second size: traced as a run-time size (d2s/varying_sizes.py)
    assert torch.equal(scale_or_negate(-torch.ones(7)), torch.ones(7))
    assert len(scale_or_negate.program_cache) == 2
    assert scale_or_negate.concrete_program.inputs[0].shape == (-1,)
    assert "cond" in _ops(scale_or_negate.concrete_program.main_program)


@pytest.mark.parametrize("factor, expected_programs", [(2, 1), (3, 2)])
def test_non_tensor_arguments_are_part_of_the_key(factor, expected_programs):
    f = d2s.declarative(scale_or_negate.dygraph_function)
    f(torch.ones(3))
    out = f(torch.ones(3), factor)
    assert torch.equal(out, torch.ones(3) * factor)
    assert len(f.program_cache) == expected_programs


def test_input_spec_none_dims_stay_dynamic():
    f = d2s.declarative(scale_or_negate.dygraph_function, input_spec=[d2s.InputSpec([None, 3])])
    for batch in (1, 4, 9):
        x = torch.randn(batch, 3)
        assert torch.equal(f(x), scale_or_negate.dygraph_function(x))
    assert len(f.program_cache) == 1
    (feed,) = f.concrete_program.inputs
    assert feed.shape == (-1, 3)


def test_input_spec_mismatch_is_an_error():
    f = d2s.declarative(scale_or_negate.dygraph_function, input_spec=[d2s.InputSpec([None, 3])])
    with pytest.raises(ValueError, match="does not match"):
        f(torch.randn(2, 4))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    @d2s.declarative
    def forward(self, x):
        h = self.drop(self.fc(x))
        if h.mean() > 0:
            h = h * 2
        return h


def test_methods_are_bound_per_instance_and_training_flag_selects_programs():
    torch.manual_seed(0)
    a, b = Net(), Net()
    x = torch.randn(2, 4)
    a.eval()
    b.eval()
    assert torch.equal(a(x), Net.forward.dygraph_function(a, x))
    assert torch.equal(b(x), Net.forward.dygraph_function(b, x))
    assert a.forward is not b.forward and len(a.forward.program_cache) == 1
    a.train()
    torch.manual_seed(1)
    got = a(x)
    torch.manual_seed(1)
    want = Net.forward.dygraph_function(a, x)
    assert torch.equal(got, want)
    assert len(a.forward.program_cache) == 2


def test_declarative_on_a_module_instance():
    torch.manual_seed(0)

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            while x.norm() < 10:
                x = self.fc(x) + x
            return x

    eager = Plain()
    static = d2s.declarative(Plain())
    static.load_state_dict(eager.state_dict())
    for scale in (0.1, 1.0, 20.0):
        x = torch.ones(2, 3) * scale
        assert torch.equal(static(x), eager(x))
    assert len(static.forward.program_cache) == 1
    assert "while" in _ops(static.forward.concrete_program.main_program)


def test_enable_false_runs_eagerly():
    tr = d2s.ProgramTranslator()
    f = d2s.declarative(scale_or_negate.dygraph_function)
    tr.enable(False)
    try:
        assert torch.equal(f(torch.ones(3)), torch.ones(3) * 2)
        assert len(f.program_cache) == 0
    finally:
        tr.enable(True)
    f(torch.ones(3))
    assert len(f.program_cache) == 1


def test_translator_inspection():
    tr = d2s.ProgramTranslator()
    assert tr is d2s.ProgramTranslator()
    x = torch.ones(2)
    main, startup, inputs, outputs = tr.get_program(scale_or_negate.dygraph_function, x)
    assert [v.name for v in inputs] == ["x"]
    assert outputs.shape == (2,)
    assert "cond" in _ops(main)
    assert "convert_ifelse" in tr.get_code(scale_or_negate.dygraph_function)
    assert torch.equal(tr.get_output(scale_or_negate.dygraph_function, x), x * 2)
    converted = tr.get_func(scale_or_negate.dygraph_function)
    assert torch.equal(converted(-x), x)  # eager tensors: plain Python control flow


def test_many_programs_warning(monkeypatch):
    monkeypatch.setattr(static_function, "MANY_PROGRAMS", 3)
    f = d2s.declarative(scale_or_negate.dygraph_function)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 5):
            f(torch.ones([2] * n))  # ranks: sizes that vary share a program
    assert any("built 3 programs" in str(w.message) for w in caught)


def test_save_inference_model_of_latest_call(tmp_path):
    f = d2s.declarative(scale_or_negate.dygraph_function)
    x = torch.ones(3)
    f(x)
    d2s.ProgramTranslator().save_inference_model(str(tmp_path / "m"))
    program, feeds, fetches = d2s.load_inference_model(str(tmp_path / "m"), d2s.Executor())
    (out,) = d2s.Executor().run(program, feed={feeds[0]: -x.numpy()}, fetch_list=fetches)
    assert (out == 1).all()


@pytest.mark.parametrize("factory", [torch.zeros, torch.ones, torch.empty])
def test_run_time_sizes_in_factory_varargs(factory):
    @d2s.declarative(input_spec=[d2s.InputSpec([None, 4])])
    def f(x):
        h = factory(x.shape[0], 3)
        return h.shape[0] + x[:, :3] * 0 if factory is torch.empty else h + x[:, :3]

    for batch in (1, 6):
        x = torch.ones(batch, 4)
        assert torch.equal(f(x), f.dygraph_function(x))
    assert len(f.program_cache) == 1


def test_no_grad_block_inside_the_function_stays_gradient_free(tmp_path):
    w = nn.Parameter(torch.arange(1.0, 4.0))

    def f(x):
        with torch.no_grad():
            t = x * w
        return t * w

    static = d2s.declarative(f)
    x = torch.ones(3)
    with torch.no_grad():
        static(x)  # the first call, made under no_grad, must not make the whole program gradient-free
    static(x).sum().backward()
    got, w.grad = w.grad.clone(), None
    f(x).sum().backward()
    assert torch.equal(got, w.grad)
    program = static.concrete_program.main_program
    assert "{no_grad}" in program.to_string()
    from runtime.serialization import program_from_dict, program_to_dict
    assert program_from_dict(program_to_dict(program)).to_string() == program.to_string()


def test_dict_arguments_feed_each_tensor_to_its_own_key():
    # Keys out of sorted order: the feeds must follow the dict, not a sort.
    @d2s.declarative
    def f(d):
        if d["b"].sum() > 0:
            return d["b"] * 2 + d["a"]
        return d["a"]

    for b in (torch.ones(2), -torch.ones(2)):
        d = {"b": b, "a": torch.full((3, 2), 5.0)}
        assert torch.equal(f(d), f.dygraph_function(d))
    assert len(f.program_cache) == 1
    assert "cond" in _ops(f.concrete_program.main_program)


# -- copy.deepcopy / pickle of a declarative module ----------------------------------------------------

class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return x - 1


class DecoratedGate(Gate):
    @d2s.declarative
    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return x - 1


def _pickled(module):
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("copy_of", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m)), _pickled])
@pytest.mark.parametrize("make", [lambda: d2s.declarative(Gate()), DecoratedGate,
                                  lambda: d2s.declarative(torch.nn.Sequential(torch.nn.Linear(3, 3)))])
def test_a_declarative_module_copies_and_pickles_with_programs_of_its_own(make, copy_of):
    # A copy failed (the cached programs hold Variables; the short-call class could not be pickled by name).
    original = make()
    xs = [torch.ones(3), -torch.ones(3)]
    for x in xs:
        original(x)
    twin = copy_of(original)
    assert type(twin).__name__ == type(original).__name__
    for x in xs:
        assert torch.equal(twin(x), original(x))
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(2)
    for x in xs:
        assert torch.equal(twin(x), twin.forward.dygraph_function(x))  # its own weights, still a program
    assert not torch.equal(twin(xs[0]), original(xs[0]))
    if isinstance(twin, Gate):  # the copy's own program holds the tensor if
        assert "cond" in _ops(twin.forward.concrete_program.main_program)


def _config_default(name, value):
    """A wrapper that fills `name` from a config unless the caller passed it
    as a keyword, as transformers' `merge_with_config_defaults` does (its
    positional lookup is off by one under another wrapper, so a value bound
    positionally reaches the function twice)."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            if kwargs.get(name) is None:
                kwargs[name] = value
            return fn(self, *args, **kwargs)
        return wrapper
    return decorate


class ConfigDefaults(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    @_config_default("use_cache", True)
    def forward(self, x, mask=None, use_cache=None, scale=1.0):
        h = self.proj(x) * scale
        if mask is not None:
            h = h * mask
        if h.sum() > 0:  # a tensor condition: the program holds a cond
            h = h + 1
        return h, use_cache


@pytest.mark.parametrize("call", [
    lambda m, x, mask: m(x, mask=mask),
    lambda m, x, mask: m(x=x, mask=mask),
    lambda m, x, mask: m(x, mask, scale=2.0),
    lambda m, x, mask: m(x, mask=mask, use_cache=False),
])
def test_keyword_arguments_reach_the_function_as_the_caller_passed_them(call):
    torch.manual_seed(0)
    model = ConfigDefaults()
    static = d2s.declarative(model)
    mask = torch.ones(2, 4)
    for x in (torch.randn(2, 4), -torch.randn(2, 4) - 3, torch.randn(2, 4) + 3):
        expected, got = call(model, x, mask), call(static, x, mask)
        assert torch.equal(got[0], expected[0]) and got[1] == expected[1]
    assert "cond" in _ops(static.forward.concrete_program.main_program)


def _plain(a, b=2, /, c=3, *rest, d, e=5, **extra):
    return a


def _simple(x, y=None, scale=1.0):
    return x


@pytest.mark.parametrize("fn, args, kwargs", [
    (_plain, (1,), {"d": 4}),
    (_plain, (1, 2, 3, 4, 5), {"d": 4, "z": 9, "e": 6}),
    (_plain, (1,), {"c": 7, "d": 4, "q": 0}),
    (_simple, (), {"x": 1}),
    (_simple, (1,), {"scale": 2.0}),
    (_simple, (1, 2), {}),
])
def test_arguments_are_normalized_as_inspect_binds_them(fn, args, kwargs):
    # `_normalize` binds each call form once (on stand-ins) and reuses it:
    # the same positional and keyword values as Signature.bind, defaults the
    # very default objects, on every call of the form.
    static = d2s.declarative(fn)
    for _ in range(2):
        bound = inspect.signature(fn).bind(*args, **kwargs)
        bound.apply_defaults()
        got = static._normalize(args, kwargs)
        assert got == (bound.args, bound.kwargs) and list(got[1]) == list(bound.kwargs)
        assert all(a is b for a, b in zip(got[0], bound.args))
    with pytest.raises(TypeError):
        static._normalize(args, {**kwargs, "a": 0} if fn is _simple else {"nope": 1})
