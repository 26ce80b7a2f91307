"""d2s walks the converted code's module globals and the modules'
attributes (d2s/module_state.py: tensors lifted from state, Variables that
escape into it). A container subclass there is read through its base
class: its own methods are user code that the walk must not run.
transformers' lazy mappings import modules in `values()`; calling it
raised NameError in 447 ParityBench tests (adapter-transformers)."""

import collections

import pytest
import torch
import torch.nn as nn

import d2s


class _Lazy(collections.OrderedDict):
    """Like transformers' `_LazyConfigMapping`: its methods run code."""

    def _refuse(self, *args):
        raise NameError("name 'importlib' is not defined")

    values = items = keys = __iter__ = __len__ = __getitem__ = _refuse


class _LazyList(list):
    __iter__ = __len__ = __getitem__ = _Lazy._refuse


MAPPING = _Lazy()
dict.__setitem__(MAPPING, "scale", torch.tensor(2.0))
LISTED = _LazyList()
list.append(LISTED, torch.tensor(3.0))


def _uses_the_globals(x):
    if x.sum() > 0:
        return x * dict.__getitem__(MAPPING, "scale")
    return x - list.__getitem__(LISTED, 0)


class _HoldsThem(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.table = _Lazy()
        self.rows = _LazyList()

    def forward(self, x):
        return _uses_the_globals(self.fc(x))


@pytest.mark.parametrize("make", [lambda: _uses_the_globals, _HoldsThem])
def test_walks_of_state_run_no_method_of_a_container_subclass(make):
    torch.manual_seed(0)
    fn = make()
    static = d2s.declarative(fn)
    for sign in (1, -1):
        x = torch.full((2, 3), 1.5 * sign)
        assert torch.equal(static(x), fn(x))
    program = static.concrete_program.main_program if hasattr(static, "concrete_program") \
        else static.forward.concrete_program.main_program
    assert "cond" in {op.type for op in program.global_block().ops}
