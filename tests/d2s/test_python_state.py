"""Tensors kept in Python state between calls (a global container, a
function attribute) are refused, never staged: a cached program would
recompute them on every call where eager reads the stored tensor back (a
silent wrong result on the second call), and a later conversion would read
a Variable of another program under a name that means something else there."""

import pytest
import torch

import d2s

CACHE = {}
SEEN = []


def _cache_in_dict(x):
    if "k" not in CACHE:
        CACHE["k"] = x * 2
    return CACHE["k"] + (x + 10)


def _append_to_list(x):
    SEEN.append(x.sum())
    return x * 2


def _buffer(x):
    if not hasattr(_buffer, "buf"):
        _buffer.buf = x * 3
    return _buffer.buf + x


def _reads_a_global_tensor(x):
    return x + GLOBAL_TENSOR


GLOBAL_TENSOR = torch.tensor([1.0, 2.0, 3.0])


@pytest.fixture(autouse=True)
def _fresh_state():
    CACHE.clear()
    SEEN.clear()
    if hasattr(_buffer, "buf"):
        del _buffer.buf
    yield
    CACHE.clear()
    SEEN.clear()
    if hasattr(_buffer, "buf"):
        del _buffer.buf


@pytest.mark.parametrize("fn, name", [(_cache_in_dict, "CACHE"), (_append_to_list, "SEEN"),
                                      (_buffer, "_buffer")])
def test_state_kept_in_python_is_refused_naming_it(fn, name):
    static = d2s.declarative(fn)
    with pytest.raises(d2s.ConversionError, match=f"`{name}` \\(a global of {__name__}\\) holds a tensor") as err:
        static(torch.ones(3))
    assert err.value.filename == __file__
    # The failed conversion left no graph value behind: the state is as
    # before, and the next conversion (with grad the key differs: a new
    # trace) refuses the same way.
    assert CACHE == {} and SEEN == [] and not hasattr(_buffer, "buf")
    with pytest.raises(d2s.ConversionError, match=f"`{name}` \\(a global of {__name__}\\) holds a tensor"):
        static(torch.full((3,), 5.0, requires_grad=True))
    assert CACHE == {} and SEEN == [] and not hasattr(_buffer, "buf")


def test_a_global_tensor_that_is_only_read_is_a_constant():
    static = d2s.declarative(_reads_a_global_tensor)
    x = torch.ones(3)
    torch.testing.assert_close(static(x), _reads_a_global_tensor(x), rtol=0, atol=0)
