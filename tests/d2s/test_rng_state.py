"""The CPU generator's state in converted code (d2s/operators/rng.py):
`torch.random.fork_rng` restores it when the program runs, not only while
tracing."""

import copy

import pytest
import torch

import d2s


def forked(x):
    with torch.random.fork_rng():
        inner = torch.rand(4)
        if x.sum() > 0:
            inner = inner + torch.rand(4)
    return inner + x, torch.rand(4) + x


def not_forked(x):
    with torch.random.fork_rng(enabled=False):
        inner = torch.rand(4)
    return inner + x, torch.rand(4) + x


@pytest.mark.parametrize("fn", [forked, not_forked])
def test_draws_after_the_block_are_eagers(fn):
    static = d2s.declarative(fn)
    for seed in (0, 1):
        for x in (torch.ones(4), -torch.ones(4)):  # both paths of the branch in the block
            torch.manual_seed(seed)
            want = fn(x)
            torch.manual_seed(seed)
            got = static(x)
            assert all(torch.equal(a, b) for a, b in zip(want, got))
    program = static.concrete_program.main_program
    types = [op.type for block in program.blocks for op in block.ops]
    assert len(static.program_cache) == 1
    forks = fn is forked
    assert ("cond" in types) == forks
    assert types.count("torch.get_rng_state") == types.count("torch.set_rng_state") == int(forks)


def fork_devices(x):
    with torch.random.fork_rng(devices=[0], device_type="cuda"):
        return x + torch.rand(2)


def test_forking_an_accelerator_generator_is_refused_at_the_users_line():
    with pytest.raises(d2s.ConversionError, match=r"fork_rng over cuda devices \[0\]") as err:
        d2s.declarative(fork_devices)(torch.ones(2))
    assert err.value.filename == __file__


# -- a torch.Generator passed in: a feed of the program --------------------------------------

def draws(x, steps, generator):
    p = torch.softmax(x, -1)
    picked = torch.multinomial(p, 2, generator=generator)
    noise = torch.randn(x.shape, generator=generator) + torch.rand(3, generator=generator).sum()
    i = 0
    while i < steps:  # draws in a graph loop, one per trip
        noise = noise + torch.bernoulli(torch.full(x.shape, 0.5), generator=generator)
        i += 1
    return picked, noise, torch.randint(0, 10, (2,), generator=generator)


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def test_each_call_draws_from_its_own_generator_in_one_program():
    static = d2s.declarative(draws)
    x = torch.randn(2, 6)
    for seed in (0, 1, 2):
        for steps in (0, 3):
            mine, theirs = _generator(seed), _generator(seed)
            want = draws(x, torch.tensor(steps), mine)
            got = static(x, torch.tensor(steps), generator=theirs)
            assert all(torch.equal(a, b) for a, b in zip(got, want))
            assert torch.equal(theirs.get_state(), mine.get_state())  # left where eager leaves it
    assert len(static.program_cache) == 1  # a new generator object is not a new program
    program = static.concrete_program.main_program
    assert "generator: generator (data)" in program.to_string()


def test_converting_draws_nothing_from_the_callers_generator():
    g = _generator(3)
    before = g.get_state()
    static = d2s.declarative(draws)
    static(torch.randn(2, 6), torch.tensor(0), g)
    again = _generator(3)
    draws(torch.randn(2, 6), torch.tensor(0), again)
    assert not torch.equal(g.get_state(), before) and torch.equal(g.get_state(), again.get_state())


def test_a_saved_program_takes_the_generator(tmp_path):
    static = d2s.declarative(draws)
    d2s.jit.save(static, str(tmp_path / "m"),
                 input_spec=[d2s.InputSpec([None, 6]), d2s.InputSpec([], "int64"), torch.Generator()])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    assert "generator: generator" in repr(loaded)
    x = torch.randn(3, 6)
    mine, theirs = _generator(5), _generator(5)
    want, got = draws(x, torch.tensor(2), mine), loaded(x, torch.tensor(2), theirs)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(theirs.get_state(), mine.get_state())
    with pytest.raises(TypeError, match="input 'generator' expects a torch.Generator"):
        loaded(x, torch.tensor(2), None)


def attends(q, generator):
    q = q + torch.rand(q.shape, generator=generator)  # a draw before the decision on the length
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=q.shape[-2] > 1)


def test_a_run_that_breaks_a_decision_after_drawing_is_repeated_from_the_same_state():
    # A run of one token breaks `is_causal` decided for 5: d2s converts again
    # and runs the call again, first putting the generator back where the
    # call found it, so the draws are made once, as eager makes them.
    static = d2s.declarative(attends, input_spec=[d2s.InputSpec([1, 2, None, 4])])
    for length in (5, 1, 3, 1):
        q = torch.randn(1, 2, length, 4)
        mine, theirs = _generator(length), _generator(length)
        assert torch.equal(static(q, theirs), attends(q, mine))
        assert torch.equal(theirs.get_state(), mine.get_state())
    assert len(static.program_cache) == 2


def attends_globally(q):
    q = q + torch.rand(q.shape)
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=q.shape[-2] > 1)


def test_draws_from_the_global_generator_before_a_broken_decision_are_made_once():
    # As for a generator the call passes: torch's own is put back before the
    # call runs again (d2s/decisions.py `global_generators`).
    static = d2s.declarative(attends_globally, input_spec=[d2s.InputSpec([1, 2, None, 4])])
    for length in (5, 1, 3, 1):
        q = torch.randn(1, 2, length, 4)
        torch.manual_seed(length)
        want, state = attends_globally(q), torch.get_rng_state()
        torch.manual_seed(length)
        assert torch.equal(static(q), want)
        assert torch.equal(torch.get_rng_state(), state)
    assert len(static.program_cache) == 2


def test_a_saved_model_repeats_a_path_from_the_same_generator_state(tmp_path):
    static = d2s.declarative(attends, input_spec=[d2s.InputSpec([1, 2, None, 4])])
    for length in (5, 1):
        static(torch.randn(1, 2, length, 4), _generator(0))  # converts the one-token program too
    d2s.jit.save(static, str(tmp_path / "m"), input_spec=[d2s.InputSpec([1, 2, None, 4]), torch.Generator()])
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for length in (1, 4):
        q = torch.randn(1, 2, length, 4)
        mine, theirs = _generator(length), _generator(length)
        assert torch.equal(loaded(q, theirs), attends(q, mine))
        assert torch.equal(theirs.get_state(), mine.get_state())


def checks_its_generator(x, generator=None):
    if isinstance(generator, torch.Generator) and not isinstance(generator, torch.Tensor):
        return x + torch.rand(x.shape, generator=generator)
    return x


def seeds_inside(x, generator):
    generator.manual_seed(0)
    return x + torch.rand(x.shape, generator=generator)


def test_a_generator_argument_is_a_generator_to_the_code():
    static = d2s.declarative(checks_its_generator)
    x = torch.zeros(3)
    assert torch.equal(static(x, _generator(1)), checks_its_generator(x, _generator(1)))
    assert torch.equal(static(x), x)
    with pytest.raises(AttributeError, match="`manual_seed` of the torch.Generator 'generator'.*seed or read it "
                                             "outside the function"):
        d2s.declarative(seeds_inside)(x, _generator(1))


def adds_noise(x, generator):
    return x + torch.rand(x.shape, generator=generator)


def test_exporters_refuse_a_generator_input(tmp_path):
    static = d2s.declarative(adds_noise)
    spec = [d2s.InputSpec([3]), torch.Generator()]
    with pytest.raises(ValueError, match="takes the torch.Generator 'generator'"):
        d2s.torch_export.export(static, input_spec=spec)
    pytest.importorskip("onnx")
    with pytest.raises(ValueError, match="takes the torch.Generator 'generator'"):
        d2s.onnx.export(static, str(tmp_path / "m.onnx"), input_spec=spec)


# Kernels with a dropout probability inside (attention's `dropout_p`, a
# stacked RNN's `dropout`) draw from the global generator like dropout: two
# equal calls are two draws (CSE merged them), and a number read after one
# is found without running it again (the replay for its example drew).
def attention_twice(q):
    a = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    b = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    return a + b


def attention_then_count(q):
    a = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    return torch.zeros(int((a > 0).sum())) + torch.rand(3).sum()


class StackedLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(4, 4, num_layers=2, dropout=0.5)

    def forward(self, x):
        a, b = self.rnn(x)[0], self.rnn(x)[0]
        return a + b, torch.zeros(int((a > 0).sum()))


@pytest.mark.parametrize("make, shape", [(lambda: attention_twice, (1, 2, 5, 4)),
                                         (lambda: attention_then_count, (1, 2, 5, 4)),
                                         (lambda: StackedLSTM().train(), (3, 2, 4))],
                         ids=["attention_twice", "attention_then_count", "stacked_lstm"])
@pytest.mark.parametrize("optimize", ["default", "fast"])
def test_kernels_with_dropout_inside_draw_as_eager(make, shape, optimize):
    fn = make()
    static = d2s.declarative(copy.deepcopy(fn), optimize=optimize)  # a module is converted in place
    q = torch.randn(shape)
    for seed in (1, 2):  # the converting call, then the program
        torch.manual_seed(seed)
        want, after = fn(q), torch.rand(2)
        torch.manual_seed(seed)
        got, got_after = static(q), torch.rand(2)
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        assert all(torch.equal(a, b) for a, b in zip(want, got))
        assert torch.equal(got_after, after)  # the generator where eager left it
    cache = static.forward.program_cache if isinstance(static, torch.nn.Module) else static.program_cache
    assert len(cache) == 1
