"""The cache hit: training flags re-read only when a module changed, a
bounded LRU program cache, clear()."""

import warnings

import pytest
import torch
import torch.nn as nn

import d2s
from d2s import module_watch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.blocks = nn.ModuleList([nn.ReLU()])
        self.extra = nn.ModuleDict({"a": nn.ReLU()})

    def forward(self, x):
        return self.drop(x) + 1


@pytest.mark.parametrize("change", ["eval", "assign_flag", "child_flag", "append", "delete_attr",
                                    "delete_dict_item", "replace_child", "insert"])
def test_training_flags_follow_every_kind_of_change(change):
    net = d2s.declarative(Net())
    x = torch.ones(1000)
    before = net.forward.cache_key((x,), {})[0]
    if change == "eval":
        net.eval()
    elif change == "assign_flag":
        net.training = False
    elif change == "child_flag":
        net.drop.training = False
    elif change == "append":
        net.blocks.append(nn.Tanh())
    elif change == "delete_attr":
        del net.blocks
    elif change == "delete_dict_item":
        del net.extra["a"]
    elif change == "replace_child":
        net.blocks = nn.ModuleList([nn.ReLU(), nn.ReLU()])
    elif change == "insert":  # writes _modules directly
        net.blocks.insert(0, nn.Dropout())
    assert net.forward.cache_key((x,), {})[0] != before


def test_eval_after_train_runs_the_eval_program():
    torch.manual_seed(0)
    net = d2s.declarative(Net())
    x = torch.ones(1000)
    assert not torch.equal(net(x), x + 1)  # dropout active
    net.eval()
    assert torch.equal(net(x), x + 1)
    net.train()
    assert not torch.equal(net(x), x + 1)
    assert len(net.forward.program_cache) == 2


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.act = nn.ReLU()
        self.register_buffer("shift", torch.ones(3))

    def forward(self, x):
        return self.act(self.fc(x)) + self.shift


@pytest.mark.parametrize("change", [
    lambda n: setattr(n, "fc", nn.Linear(3, 3)),                              # same shapes, new weights
    lambda n: setattr(n, "act", nn.Tanh()),                                   # a module without parameters
    lambda n: setattr(n.fc, "weight", nn.Parameter(torch.randn(3, 3))),
    lambda n: setattr(n, "shift", torch.zeros(3)),                            # a buffer
    lambda n: n.fc.register_parameter("bias", nn.Parameter(torch.ones(3))),
    lambda n: setattr(n.fc.weight, "data", torch.randn(3, 3)),                # same Parameter, new data
], ids=["submodule", "activation", "parameter", "buffer", "register_parameter", "data"])
def test_replaced_submodule_parameter_or_buffer_is_never_run_stale(change):
    """A program binds the tensors it was traced with: after a replacement
    the next call traces anew (before the fix it silently ran the old ones)."""
    torch.manual_seed(0)
    net = d2s.declarative(Affine())
    x = torch.randn(2, 3)
    net(x)
    change(net)
    with torch.no_grad():
        assert torch.equal(net(x), net.forward.dygraph_function(x))


def test_structure_unchanged_keeps_one_key_object():
    """eval()/train() re-read the flags but keep the identity part of the
    key the same object, so hits compare it in constant time."""
    net = d2s.declarative(Affine())
    x = torch.randn(2, 3)
    net(x)
    tree = net.forward.program_cache.flags[2]
    net.eval()
    net(x)
    net.train()
    net(x)
    assert net.forward.program_cache.flags[2] is tree and len(net.forward.program_cache) == 2


@pytest.mark.parametrize("back", ["same_module", "new_module"])
def test_swapping_a_submodule_back_hits_its_program_again(back):
    """Keys compare the module tree by identity of an interned object: a
    tree equal to any cached one (not only the last) reuses that object, so
    its program is hit; a new module of the same type is another tree."""
    net = d2s.declarative(Affine())
    x = torch.randn(2, 3)
    first_fc = net.fc
    net(x)
    net.fc = nn.Linear(3, 3)
    net(x)
    net.fc = first_fc if back == "same_module" else nn.Linear(3, 3)
    with torch.no_grad():
        assert torch.equal(net(x), net.forward.dygraph_function(x))
    assert len(net.forward.program_cache) == (2 if back == "same_module" else 3)


def test_touch_marks_flags_stale():
    net = d2s.declarative(Net())
    x = torch.ones(3)
    net(x)
    count = net.forward.program_cache.flags[0]  # (modules, bit mask of their training flags, identities)
    net.drop._modules["inner"] = nn.Dropout()  # private edit: needs touch()
    module_watch.touch()
    net.forward.cache_key((x,), {})
    assert net.forward.program_cache.flags[0] == count + 1


def test_cache_evicts_least_recently_used_past_max_size():
    # Ranks, not sizes: sizes that vary share a program (d2s/varying_sizes.py).
    f = d2s.declarative(lambda x: x * 2)
    f.program_cache.max_size = 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (1, 2, 3):
            f(torch.ones([2] * n))
        f(torch.ones([2]))          # rank 1 is now the most recently used
        f(torch.ones([2] * 4))      # evicts rank 2
    assert len(f.program_cache) == 3
    ranks = sorted(len(c.inputs[0].shape) for c in f.program_cache)
    assert ranks == [1, 3, 4]
    assert torch.equal(f(torch.ones(2, 2)), torch.full((2, 2), 2.0))


def test_many_programs_warning_is_kept_with_a_bounded_cache():
    f = d2s.declarative(lambda x: x + 1)
    with pytest.warns(UserWarning, match="has built 8 programs"):
        for n in range(1, 10):
            f(torch.ones([1] * n))


def test_clear_drops_every_program():
    f = d2s.declarative(lambda x: x - 1)
    f(torch.ones(2))
    f.program_cache.clear()
    assert len(f.program_cache) == 0 and f.program_cache.last is None
    assert torch.equal(f(torch.ones(2)), torch.zeros(2))
    assert len(f.program_cache) == 1


def test_module_argument_flags_are_part_of_the_key():
    @d2s.declarative
    def apply(m, x):
        return m(x)

    drop = nn.Dropout(0.5)
    x = torch.ones(1000)
    apply(drop, x)
    drop.eval()
    assert torch.equal(apply(drop, x), x)
    assert len(apply.program_cache) == 2


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x, y=None):
        out = self.fc(x)
        return out if y is None else out + y


def _hooked(kind, net, seen):
    """Register one hook of `kind` on `net` that records its call; the handle."""
    if kind == "forward":
        return net.register_forward_hook(lambda m, a, out: seen.append("forward") or out * 2)
    if kind == "pre":
        return net.register_forward_pre_hook(lambda m, a: seen.append("pre") or (a[0] * 2,))
    if kind == "global":
        # Only on `net` (a program does not run its submodules' hooks).
        return nn.modules.module.register_module_forward_hook(
            lambda m, a, out: (seen.append("global") or out * 2) if m is net else None)
    if kind == "backward":
        return net.register_full_backward_hook(lambda m, gi, go: seen.append("backward"))
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["forward", "pre", "global", "backward"])
def test_module_call_runs_hooks_registered_after_conversion(kind):
    """A declarative module's call takes a short path when nothing surrounds
    forward; a hook registered later (or removed) is seen on the next call,
    exactly as with nn.Module.__call__."""
    torch.manual_seed(0)
    eager, static = Scaled(), Scaled()
    static.load_state_dict(eager.state_dict())
    static = d2s.declarative(static)
    x = torch.randn(4, 3, requires_grad=True)
    assert torch.equal(static(x), eager(x))  # cached: the next calls are hits
    seen_eager, seen_static = [], []
    handles = [_hooked(kind, eager, seen_eager), _hooked(kind, static, seen_static)]
    try:
        want, got = eager(x), static(x)
        assert torch.equal(got, want)
        if kind == "backward":
            want.sum().backward()
            got.sum().backward()
        assert seen_static == seen_eager and seen_static
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(static(x), eager(x))
    assert len(seen_static) == len(seen_eager)


def test_declarative_module_keeps_its_class_name_and_hits_with_keywords():
    net = d2s.declarative(Scaled())
    assert isinstance(net, Scaled) and type(net).__name__ == "Scaled" and type(net).__qualname__ == "Scaled"
    x, y = torch.randn(2, 3), torch.randn(2, 2)
    assert torch.equal(net(x, y=y), net.fc(x) + y)
    assert torch.equal(net(x), net.fc(x))
    assert len(net.forward.program_cache) == 2
    # A parameter (a Tensor subclass) as an argument takes the general path, same result.
    p = nn.Parameter(torch.randn(2, 3))
    assert torch.equal(net(p), net.fc(p))


def test_declarative_module_is_a_same_named_subclass_with_the_same_state():
    """The short call path swaps the instance's class for a subclass:
    everything but `type(net) is Scaled` reads as before."""
    torch.manual_seed(0)
    eager = Scaled()
    net = d2s.declarative(Scaled())
    net.load_state_dict(eager.state_dict())
    assert type(net) is not Scaled and type(net).__mro__[1] is Scaled
    assert type(net).__module__ == Scaled.__module__ and type(net).__doc__ == Scaled.__doc__
    assert repr(net) == repr(eager)
    assert list(net.state_dict()) == list(eager.state_dict())
    x = torch.randn(4, 3)
    assert torch.equal(net(x), eager(x))
    plain = Scaled()
    plain.load_state_dict(net.state_dict())
    assert torch.equal(plain(x), eager(x))
    # A second conversion keeps the class (no subclass of the subclass).
    assert type(d2s.declarative(net)) is type(net)


def test_torch_classes_keep_their_type():
    """torch looks some of its module classes up by exact type."""
    lin = d2s.declarative(nn.Linear(3, 2))
    assert type(lin) is nn.Linear
    x = torch.randn(4, 3)
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))


class OwnCall(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        return x + 1

    def __call__(self, *args):
        self.calls += 1
        return super().__call__(*args)


def test_a_class_with_its_own_call_keeps_it():
    net = d2s.declarative(OwnCall())
    assert type(net) is OwnCall
    net(torch.ones(2))
    net(torch.ones(2))
    assert net.calls == 2


@d2s.declarative
def _double(x):
    return x * 2


@d2s.declarative
def _double_sum(x, y):
    return (x + y) * 2


@pytest.mark.parametrize("fn", [_double, _double_sum])
def test_hit_with_plain_tensors_builds_the_key_inline(fn, monkeypatch):
    """StaticFunction.__call__ builds the key itself for plain tensor
    arguments; it must stay the key `cache_key` builds, or every call
    would take the slow path (a hit here never calls `cache_key`)."""
    fn.program_cache.clear()
    xs = [torch.randn(3) for _ in range(fn._n_positional)]
    want = fn.dygraph_function(*xs)
    assert torch.equal(fn(*xs), want)
    assert list(fn.program_cache._programs) == [fn.cache_key(tuple(xs), {})[0]]

    def refuse(*args, **kwargs):
        raise AssertionError("cache_key called")

    monkeypatch.setattr(fn, "cache_key", refuse)
    assert torch.equal(fn(*xs), want)
    with pytest.raises(AssertionError, match="cache_key called"):
        fn(*[x.requires_grad_() for x in xs])  # a miss builds its key the general way


def test_hit_with_grad_mode_off_calls_the_in_place_variant_directly(monkeypatch):
    """With grad mode off a hit calls the variant that reuses temporaries in
    place (compiled by the first such call, through ConcreteProgram.run)."""
    from d2s.concrete_program import ConcreteProgram

    net = d2s.declarative(nn.Linear(3, 2))
    x = torch.randn(4, 3)
    with torch.no_grad():
        want = net(x)  # compiles the in-place variant
        monkeypatch.setattr(ConcreteProgram, "run", lambda self, tensors: pytest.fail("run called"))
        assert torch.equal(net(x), want) and torch.equal(want, nn.functional.linear(x, net.weight, net.bias))
    assert net.forward.concrete_program._inference is not None
    assert torch.equal(net(x), want)  # grad mode on: the ordinary program, also called directly


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.k, self.sign = 2, (1, -1)

    def forward(self, x):
        if x.sum() > 0:  # a tensor condition: the program holds a cond op
            return x * self.k * self.sign[0]
        return x * self.sign[1]


class _ScaledDeclarative(_Scaled):
    forward = d2s.declarative(_Scaled.forward)


@pytest.mark.parametrize("form", ["instance", "class"])
@pytest.mark.parametrize("change", [("k", 5), ("sign", (3, -3)), ("k", 2.5)])
def test_a_plain_attribute_read_as_a_constant_is_part_of_the_key(form, change):
    # `self.k` is a constant of the program traced with it: after `m.k = 5`
    # that program must not run again (it silently gave 2 * x).
    m = d2s.declarative(_Scaled()) if form == "instance" else _ScaledDeclarative()
    ref = _Scaled()
    for x in (torch.ones(3), -torch.ones(3)):  # both branches
        assert torch.equal(m(x), ref(x))
    for module in (m, ref):
        setattr(module, *change)
    for x in (torch.ones(3), -torch.ones(3)):
        assert torch.equal(m(x), ref(x))
    main = m.forward.concrete_program.main_program
    assert any(op.type == "cond" for op in main.global_block().ops)
    for module in (m, ref):  # back to the first value: its program again, not a third
        setattr(module, change[0], _Scaled().__dict__[change[0]])
    n = len(m.forward.program_cache)
    assert torch.equal(m(torch.ones(3)), ref(torch.ones(3)))
    assert len(m.forward.program_cache) == n


@pytest.mark.parametrize("calls", [2, 5])
def test_a_class_decorated_forward_converts_once_per_instance(calls):
    # The bound StaticFunction of a class-level `@declarative` used to be
    # made anew for each call, its key state with it: every call missed and
    # converted again (one program per call, 100x slower than a hit).
    m, other, ref = _ScaledDeclarative(), _ScaledDeclarative(), _Scaled()
    for _ in range(calls):
        for x in (torch.ones(3), -torch.ones(3)):  # both branches, one program
            assert torch.equal(m(x), ref(x)) and torch.equal(other(x), ref(x))
    for module in (m, other):
        assert len(module.forward.program_cache) == 1
        main = module.forward.concrete_program.main_program
        assert any(op.type == "cond" for op in main.global_block().ops)
    assert m.forward.program_cache is m.forward.program_cache  # one cache per instance
    assert m.forward.program_cache is not other.forward.program_cache


def _identity_matters(a, b, scale):
    if a is b:  # eager code may ask; nn.MultiheadAttention does (`query is key`)
        return a * scale + 1
    return a + b * scale


@pytest.mark.parametrize("order", ["same_first", "distinct_first"])
@pytest.mark.parametrize("form", ["positional", "keyword", "in_a_list"])
def test_one_tensor_passed_twice_is_one_value_as_eagerly(order, form):
    """The same tensor object as two arguments keys a program of its own,
    traced with one value for both, so `a is b` answers as it does eagerly;
    it used to be two feeds, and `a is b` was False (a silent wrong value)."""
    if form == "in_a_list":
        def fn(pair):
            return _identity_matters(pair[0], pair[1], 3.0)

        def call(f, a, b):
            return f([a, b])
    else:
        fn = _identity_matters

        def call(f, a, b):
            return f(a, b, 3.0) if form == "positional" else f(a=a, b=b, scale=3.0)
    static = d2s.declarative(fn)
    x, y = torch.randn(4), torch.randn(4)
    calls = [(x, x), (x, y)] if order == "same_first" else [(x, y), (x, x)]
    for a, b in calls + calls:
        assert torch.equal(call(static, a, b), call(fn, a, b))
    assert len(static.program_cache) == 2
    assert torch.equal(call(static, y, y), call(fn, y, y))  # another tensor, passed twice: the same program
    assert len(static.program_cache) == 2
