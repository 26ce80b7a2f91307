"""The user's code reading torch.is_grad_enabled() / is_inference_mode_enabled()
while traced sees the caller's mode, and the program serves only calls in that
mode (ops/ambient_modes.py): another mode converts again. It used to see the
trace's own mode (gradients always on) and run that branch for every call."""

import copy

import pytest
import torch

import d2s
from runtime.errors import ConversionError


def reads_grad_mode(x):
    if x.sum() > 0:  # a tensor branch: a cond op
        y = x * 2
    else:
        y = x - 3
    if torch.is_grad_enabled():
        return y + 1
    return y - 1


def reads_inference_mode(x):
    if x.sum() > 0:
        y = x * 2
    else:
        y = x - 3
    return y + 1 if torch.is_inference_mode_enabled() else y - 1


def reads_inside_no_grad(x):
    with torch.no_grad():
        inner = torch.is_grad_enabled()  # False in every caller's mode
    return x + 1 if inner else x - 1


def never_reads(x):
    with torch.no_grad():  # torch's own no_grad reads the mode: not the user's read
        s = x.sum()
    return x * s


MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode}


def _ops(static):
    return [op.type for op in static.concrete_program.main_program.global_block().ops]


@pytest.mark.parametrize("fn", [reads_grad_mode, reads_inference_mode])
@pytest.mark.parametrize("order", [("grad", "no_grad", "inference", "grad"), ("no_grad", "grad", "no_grad"),
                                   ("inference", "grad", "inference")])
def test_the_users_read_sees_the_callers_mode(fn, order):
    static = d2s.declarative(fn)
    for mode in order:
        for x in (torch.ones(3), -torch.ones(3)):  # both sides of the tensor if
            with MODES[mode]():
                assert torch.equal(static(x), fn(x)), mode
            ops = _ops(static)
            assert ops[0] == "check_modes" and "cond" in ops
    assert len(static.program_cache) >= 1


def test_gradients_flow_in_the_program_converted_with_gradients():
    static = d2s.declarative(reads_grad_mode)
    with torch.no_grad():
        static(torch.ones(3))  # first converted without gradients
    x, y = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    static(x).sum().backward()
    reads_grad_mode(y).sum().backward()
    assert torch.equal(x.grad, y.grad)


@pytest.mark.parametrize("fn", [reads_inside_no_grad, never_reads])
def test_a_read_inside_the_users_no_grad_or_by_torch_is_exact_everywhere(fn):
    static = d2s.declarative(fn)
    for mode in ("grad", "no_grad", "grad"):
        with MODES[mode]():
            assert torch.equal(static(torch.ones(3)), fn(torch.ones(3)))
    if fn is never_reads:  # nothing read by the user: one program serves both modes
        assert "check_modes" not in _ops(static) and len(static.program_cache) == 1


def test_a_read_after_the_user_turns_gradients_on_in_a_call_without_is_refused():
    def f(x):
        with torch.enable_grad():
            if torch.is_grad_enabled():
                return x + 1
        return x

    with torch.no_grad():
        with pytest.raises(ConversionError, match="turns gradients on") as info:
            d2s.declarative(f)(torch.ones(2))
    assert info.value.filename == __file__
    assert torch.is_grad_enabled is torch._C.is_grad_enabled  # nothing left wrapped


# -- torch modules with a fused inference kernel ---------------------------------------------

def _encoder_layer():
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()


def _attention():
    torch.manual_seed(0)
    return torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()


def _all_ops(static):
    return {op.type for block in static.concrete_program.main_program.blocks for op in block.ops}


FUSED = {"encoder_layer": (_encoder_layer, lambda m, x, y: m(x), "torch._transformer_encoder_layer_fwd"),
         "self_attention": (_attention, lambda m, x, y: m(x, x, x)[0], "torch._native_multi_head_attention"),
         # Not self-attention: eager's unfused path in every mode (with k/v projected once).
         "key_is_value": (_attention, lambda m, x, y: m(x, y, y, need_weights=False)[0], None)}


@pytest.mark.parametrize("order", [("no_grad", "grad", "no_grad"), ("grad", "no_grad", "grad")])
@pytest.mark.parametrize("case", sorted(FUSED))
def test_a_module_with_a_fused_inference_kernel_runs_the_kernel_eager_runs(case, order):
    """nn.TransformerEncoderLayer and nn.MultiheadAttention in eval mode call
    a fused kernel when gradients are off: the program does too, bit for bit
    with eager (it used to take the other path: other bits, slower), and
    the program converted with gradients keeps the path autograd runs."""
    make, call, kernel = FUSED[case]
    module, static = make(), d2s.declarative(make().forward)
    x, y = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    for mode in order:
        with MODES[mode]():
            assert torch.equal(call(static, x, y), call(module, x, y)), mode
        assert (kernel in _all_ops(static)) == (mode == "no_grad" and kernel is not None)
    grads = []
    for m in (static, module):
        xg = x.clone().requires_grad_()
        call(m, xg, y).sum().backward()
        grads.append(xg.grad)
    assert torch.equal(*grads)


def test_a_users_torch_function_mode_keeps_the_unfused_path_as_eagerly():
    class Count(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    module, static = _encoder_layer(), d2s.declarative(_encoder_layer().forward)
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), Count():
        assert torch.equal(static(x), module(x))
    assert "torch._transformer_encoder_layer_fwd" not in _all_ops(static)


def _encoder():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()


def test_an_encoder_with_a_padding_mask_decides_its_left_aligned_check():
    """nn.TransformerEncoder in eval mode asks whether the padding mask is
    left-aligned (a bool of the mask's values, in torch's own code): the bool
    of the converting call, checked when the program runs; a mask that
    answers otherwise converts again. It was refused. With gradients torch
    then takes the general path, which the program runs bit for bit."""
    module, static = _encoder(), d2s.declarative(_encoder().forward)
    x = torch.randn(2, 5, 16)
    left = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    gaps = torch.tensor([[False] * 5, [True] + [False] * 4])  # padding first: not left-aligned
    for mask in (left, gaps, left, gaps):
        assert torch.equal(static(x, src_key_padding_mask=mask), module(x, src_key_padding_mask=mask))
    assert len(static.program_cache) == 2  # one per answer, each checking it
    assert {"torch._nested_tensor_from_mask_left_aligned", "decision_failed"} <= _all_ops(static)


def test_an_encoder_that_would_nest_its_input_is_refused_at_the_users_line():
    """Without gradients eager runs the layers on a nested tensor and pads
    the result with zeros; a program has no nested tensors: refused."""
    static = d2s.declarative(_encoder().forward)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad(), pytest.raises(ConversionError, match="_nested_tensor_from_mask.*enable_nested_tensor=False") \
            as info:
        static(torch.randn(2, 5, 16), src_key_padding_mask=mask)
    assert info.value.filename == __file__


def test_an_encoder_built_without_nested_tensors_runs_its_fused_layers_with_a_padding_mask():
    """The way out the refusal names: each layer then runs torch's fused
    kernel with the mask, without gradients, as eagerly."""
    def make():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()

    module, static = make(), d2s.declarative(make().forward)
    x, mask = torch.randn(2, 5, 16), torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    for mode in ("no_grad", "grad"):
        with MODES[mode]():
            assert torch.equal(static(x, src_key_padding_mask=mask), module(x, src_key_padding_mask=mask))
        assert ("torch._transformer_encoder_layer_fwd" in _all_ops(static)) == (mode == "no_grad")


class Encodes(torch.nn.Module):
    """nn.TransformerEncoder as models hold it: a submodule, its forward
    torch's own code (not converted), its padding mask built in place by
    F._canonical_mask before the left-aligned check reads it."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)
        self.encoder = _encoder()

    def forward(self, x, mask):
        return self.encoder(self.embed(x), src_key_padding_mask=mask).sum(1)


def test_an_encoder_held_by_a_model_decides_its_left_aligned_check():
    """Replaying the mask's in-place fill gives the example's answer, as in
    the test above; it was refused at the model's call of the encoder."""
    torch.manual_seed(1)
    module = Encodes().eval()
    static = d2s.declarative(copy.deepcopy(module))
    x = torch.randn(2, 5, 8)
    left = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    gaps = torch.tensor([[False] * 5, [True] + [False] * 4])
    for mask in (left, gaps, left, gaps):
        want = module(x, mask)
        got = static(x, mask)
        assert torch.equal(got, want)
        grads = [torch.autograd.grad(out.sum(), list(m.parameters())) for out, m in ((want, module), (got, static))]
        assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert len(static.forward.program_cache) == 2  # one per answer, each checking it
    for concrete in static.forward.program_cache:
        types = {op.type for block in concrete.main_program.blocks for op in block.ops}
        assert {"torch.Tensor.masked_fill_", "torch._nested_tensor_from_mask_left_aligned", "check_bool"} <= types
