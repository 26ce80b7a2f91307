"""A draw from Python's or numpy's global random state while a program is
built would be a constant of the program, repeated on every run: refused at
the user's line (ops/host_random.py); outside a trace nothing changes."""

import random
import threading
from random import random as bound_random

import numpy as np
import pytest
import torch

import d2s
from runtime.errors import ConversionError


def draw_random(x):
    if random.random() < 0.5:
        return x + 1
    return x - 1


def draw_numpy(x):
    return x * torch.from_numpy(np.random.rand(x.shape[0]) > 0.5)


def shuffle_list(x):
    order = [0, 1, 2]
    random.shuffle(order)
    return x[order]


def seed_numpy(x):
    np.random.seed(0)  # a write to the global state the program would not repeat
    return x + 1


def unseeded_generator(x):
    return x * float(np.random.default_rng().random())


def seeded_generator(x):  # the same draw on every call: exact as a constant
    return x * float(np.random.default_rng(7).random())


def choice_under_branch(x):
    if x.sum() > 0:  # a tensor branch: both sides are traced
        return x * int(np.random.choice([1, 2]))
    return x


@pytest.mark.parametrize("fn, label", [(draw_random, "random.random"), (draw_numpy, "np.random.rand"),
                                       (shuffle_list, "random.shuffle"), (seed_numpy, "np.random.seed"),
                                       (choice_under_branch, "np.random.choice"),
                                       (unseeded_generator, r"np.random.default_rng\(\)")])
def test_a_global_draw_while_tracing_is_refused_at_the_users_line(fn, label):
    x = torch.ones(3)
    fn(x)  # eager: fine
    with pytest.raises(ConversionError, match=f"`{label}` uses the global random state") as info:
        d2s.declarative(fn)(x)
    assert info.value.filename == __file__
    # nothing is left wrapped after the trace
    for module, name in ((random, "random"), (random, "shuffle"), (np.random, "rand"), (np.random, "seed"),
                         (np.random, "default_rng")):
        assert not hasattr(getattr(module, name), "__wrapped__")


def test_a_seeded_local_generator_is_a_constant_of_the_program():
    static = d2s.declarative(seeded_generator)
    for _ in range(2):
        assert torch.equal(static(torch.ones(2)), seeded_generator(torch.ones(2)))


def test_a_draw_through_a_name_bound_before_the_conversion_is_refused_too():
    def f(x):
        return x + bound_random()

    with pytest.raises(ConversionError, match="changed while the program was built"):
        d2s.declarative(f)(torch.ones(2))


def test_other_threads_draw_as_usual_while_a_program_is_built():
    drawn, stop = [], threading.Event()

    def eager_worker():
        while not stop.is_set():
            drawn.append(np.random.rand() + random.random())  # another thread: never refused

    def traced(x):
        if x.sum() > 0:
            return torch.rand(x.shape) + x  # torch's draw: staged, again on every run
        return x

    worker = threading.Thread(target=eager_worker)
    worker.start()
    try:
        static = d2s.declarative(traced)
        first, second = static(torch.ones(4)), static(torch.ones(4))
    except ConversionError as exc:  # the state check cannot tell whose draw moved the state
        assert "changed while the program was built" in str(exc)
        first = second = None
    finally:
        stop.set()
        worker.join()
    assert drawn
    if first is not None:
        assert not torch.equal(first, second)
