"""FloorDiv's common-factor step is `sympy.cancel` while a trace runs
(ops/light_simplify.py): `jit.save` of timm's mobilevitv2_050 with free
height and width took minutes in `sympy.simplify`. The sizes a program
computes are the same; torch's own module is left as it was."""

import math

import pytest
import torch
from torch.utils._sympy import functions

import d2s
from ops import light_simplify


def _patches(x):
    # mobilevit's unfolding: sides rounded up to whole 2x2 patches, then split into them.
    n, c, h, w = x.shape
    new_h, new_w = math.ceil(h / 2) * 2, math.ceil(w / 2) * 2
    if new_h != h or new_w != w:
        x = torch.nn.functional.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False)
    x = x.reshape(n * c * (new_h // 2), 2, new_w // 2, 2).transpose(1, 2)
    return x.reshape(n, c, -1, 4).sum(-1)


@pytest.mark.parametrize("side, common_factor", [((4, 6), True), ((5, 7), False), ((8, 3), False)])
def test_sizes_from_rounded_sides_equal_eager(side, common_factor, tmp_path):
    seen = []
    real = light_simplify._LIGHT.simplify

    def spy(expr, *args, **kwargs):
        seen.append(functions.sympy is light_simplify._LIGHT)
        return real(expr, *args, **kwargs)

    light_simplify._LIGHT.simplify = spy
    try:
        static = d2s.declarative(_patches, input_spec=[d2s.InputSpec([None, 2, None, None])])
        x = torch.randn(2, 2, *side)
        assert torch.equal(static(x), _patches(x))
        d2s.jit.save(static, str(tmp_path / "m"))
    finally:
        light_simplify._LIGHT.simplify = real
    assert functions.sympy is light_simplify._original  # put back when the trace ends
    loaded = d2s.jit.load(str(tmp_path / "m"))
    for other in [(4, 6), (6, 10)]:
        y = torch.randn(1, 2, *other)
        assert torch.equal(loaded(y), _patches(y))
    assert all(seen) and bool(seen) == common_factor  # the step is taken where sizes share a factor


def test_outside_a_trace_simplify_is_sympys():
    import sympy
    s = sympy.Symbol("s", integer=True, positive=True)
    assert light_simplify._simplify(2 * s / 2) == sympy.simplify(2 * s / 2)
    assert functions.sympy is sympy
