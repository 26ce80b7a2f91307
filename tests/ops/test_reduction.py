"""Reductions, including the ones that return (values, indices) tuples."""

import pytest
import torch

from opcheck import check, randn

DYN = [None, {0: [0]}]
IDS = ["static", "dynamic"]


@pytest.mark.parametrize("dyn", DYN, ids=IDS)
@pytest.mark.parametrize("name", "sum mean prod amax amin std var logsumexp cumsum argmax argmin".split())
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_reduce_dim(name, dim, dyn):
    fn = getattr(torch, name)
    check(lambda x: fn(x, dim), lambda n: (randn(n, 4, 2),), dyn)


@pytest.mark.parametrize("dyn", DYN, ids=IDS)
@pytest.mark.parametrize("name", "sum mean prod max min all any count_nonzero norm".split())
def test_reduce_all(name, dyn):
    check(lambda x: getattr(torch, name)(x), lambda n: (randn(n, 4) > 0 if name in ("all", "any") else randn(n, 4),), dyn)


@pytest.mark.parametrize("dyn", DYN, ids=IDS)
def test_keepdim_and_tuple_dims(dyn):
    check(lambda x: (x.sum((0, 2), keepdim=True), x.mean(-1, keepdim=True), torch.std_mean(x, 1)),
          lambda n: (randn(n, 4, 2),), dyn)


@pytest.mark.parametrize("dyn", DYN, ids=IDS)
@pytest.mark.parametrize("name", ["max", "min", "median", "mode", "cummax", "sort", "kthvalue", "topk"])
def test_tuple_returning(name, dyn):
    extra = {"kthvalue": (2,), "topk": (2,)}.get(name, ())

    def fn(x):
        r = getattr(x, name)(*extra, 1) if extra else getattr(x, name)(1)
        # The named fields and tuple unpacking both give Variables.
        values, indices = r
        return r.values, r.indices, values * 2, indices + 1
    check(fn, lambda n: (randn(n, 5),), dyn)


@pytest.mark.parametrize("dyn", DYN, ids=IDS)
def test_topk_dim0_depends_on_nothing_dynamic(dyn):
    # topk along the unknown dim keeps k: the result is [k, 5], fully known.
    check(lambda x: torch.topk(x, 2, dim=0, largest=False), lambda n: (randn(n, 5),), dyn)


def test_argsort_and_unique():
    check(lambda x: (torch.argsort(x, dim=1, descending=True), x.sort(dim=0, stable=True)[1]),
          lambda n: (randn(n, 5),), {0: [0]})
    # unique's length depends on the values.
    check(lambda x: torch.unique(x), lambda n: (torch.tensor([3, 1, 3, 2]),), shapes=[(-1,)])
