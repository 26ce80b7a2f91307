"""The allowlist of PyTorch functions a program may call, by family.

Each name becomes one call-style op type (its qualified name, e.g.
`torch.nn.functional.conv2d`) whose kernel is that very function, so the
executor runs exactly what eager PyTorch runs. Shape/dtype inference for all
of them is shared: the kernel runs on meta tensors (see `ops/infer.py`).

Nothing outside these lists can be captured or loaded: no `torch.load`,
`torch.save`, no I/O, no global state setters.
"""

import torch
import torch.nn.functional as F

from .registry import OpDef, is_registered, register

ELEMENTWISE = """
abs absolute neg negative exp exp2 expm1 log log2 log10 log1p sqrt rsqrt square sin cos tan
asin acos atan sinh cosh tanh asinh acosh atanh sigmoid logit relu floor ceil round trunc frac
sign sgn reciprocal erf erfc erfinv lgamma digamma pow float_power add sub subtract mul multiply
div divide true_divide floor_divide remainder fmod maximum minimum fmax fmin clamp clip
clamp_min clamp_max where lerp atan2 hypot isnan isinf isfinite isposinf isneginf nan_to_num
eq ne lt le gt ge greater less greater_equal less_equal not_equal logical_and logical_or
logical_not logical_xor bitwise_and bitwise_or bitwise_not bitwise_xor addcmul addcdiv
heaviside xlogy sinc deg2rad rad2deg polar real imag conj angle
"""

REDUCTION = """
sum mean nansum nanmean prod max min amax amin aminmax argmax argmin std var std_mean var_mean
norm logsumexp cumsum cumprod cummax cummin logcumsumexp all any topk kthvalue sort argsort
median nanmedian mode count_nonzero quantile nanquantile unique unique_consecutive bincount
histc diff dist cdist renorm
"""

SHAPE = """
reshape flatten unflatten squeeze unsqueeze transpose swapaxes swapdims permute t adjoint cat
concat concatenate stack hstack vstack dstack column_stack split tensor_split chunk narrow
select index_select gather scatter scatter_add scatter_reduce masked_fill masked_scatter
masked_select index_add index_copy index_fill index_put take take_along_dim tile flip fliplr
flipud roll rot90 movedim moveaxis broadcast_to broadcast_tensors unbind tril triu diag
diagonal diag_embed diagflat block_diag einsum matmul mm bmm mv addmm addbmm baddbmm addmv
addr outer ger dot vdot inner cross kron tensordot meshgrid nonzero argwhere repeat_interleave
searchsorted bucketize atleast_1d atleast_2d atleast_3d ravel clone detach flatten cartesian_prod
combinations trace tril_indices triu_indices view_as_real view_as_complex chain_matmul
"""

NN = """
relu lstm gru rnn_tanh rnn_relu lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell embedding
batch_norm layer_norm group_norm instance_norm dropout feature_dropout alpha_dropout conv1d
conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d max_pool1d max_pool2d
max_pool3d avg_pool1d adaptive_avg_pool1d adaptive_max_pool1d softmax log_softmax selu celu
prelu rrelu hardshrink threshold cosine_similarity pairwise_distance pdist pixel_shuffle
pixel_unshuffle channel_shuffle bilinear ctc_loss
"""

FACTORY = """
zeros ones full empty arange range linspace logspace eye zeros_like ones_like full_like
empty_like tensor as_tensor scalar_tensor complex
"""

RANDOM = """
rand randn randint randperm rand_like randn_like randint_like normal bernoulli multinomial
poisson
"""

FUNCTIONAL = """
linear bilinear conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d unfold
fold avg_pool1d avg_pool2d avg_pool3d max_pool1d max_pool2d max_pool3d lp_pool1d lp_pool2d
adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d
adaptive_max_pool2d adaptive_max_pool3d fractional_max_pool2d batch_norm layer_norm group_norm
instance_norm local_response_norm rms_norm normalize dropout dropout1d dropout2d dropout3d
alpha_dropout feature_alpha_dropout relu relu6 leaky_relu elu selu celu gelu silu mish
softplus softsign softshrink hardshrink tanhshrink hardtanh hardswish hardsigmoid sigmoid
tanh logsigmoid glu threshold prelu rrelu softmax log_softmax softmin gumbel_softmax
embedding embedding_bag one_hot pad interpolate upsample grid_sample affine_grid
pixel_shuffle pixel_unshuffle cosine_similarity pairwise_distance pdist
scaled_dot_product_attention multi_head_attention_forward cross_entropy nll_loss mse_loss
l1_loss smooth_l1_loss huber_loss binary_cross_entropy binary_cross_entropy_with_logits
kl_div poisson_nll_loss gaussian_nll_loss margin_ranking_loss hinge_embedding_loss
multilabel_margin_loss soft_margin_loss multilabel_soft_margin_loss cosine_embedding_loss
multi_margin_loss triplet_margin_loss ctc_loss
"""

LINALG = """
norm vector_norm matrix_norm det slogdet inv pinv solve cholesky qr svd svdvals eigh eigvalsh
matrix_power matrix_rank cross multi_dot householder_product lstsq vecdot
"""

SPECIAL = """
expit logit erf erfc erfinv gammaln digamma softmax log_softmax xlogy entr sinc logsumexp
"""

# Tensor methods (and the Python operators, which forward to them).
METHODS = """
__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__ __floordiv__
__rfloordiv__ __mod__ __rmod__ __pow__ __rpow__ __matmul__ __rmatmul__ __and__ __rand__
__or__ __ror__ __xor__ __rxor__ __lshift__ __rshift__ __neg__ __pos__ __abs__ __invert__
__eq__ __ne__ __lt__ __le__ __gt__ __ge__ __getitem__ __setitem__ __iadd__ __isub__ __imul__
__itruediv__ __ifloordiv__ __imod__ __ipow__ __iand__ __ior__ __ixor__
view view_as reshape_as expand expand_as repeat contiguous clone detach float double half
bfloat16 long int short bool byte char to type_as cpu cuda new_zeros new_ones new_full
new_empty new_tensor unfold masked_fill masked_scatter index_put type
add_ sub_ mul_ div_ pow_ neg_ abs_ exp_ log_ sqrt_ clamp_ clamp_min_ clamp_max_ relu_
sigmoid_ tanh_ fill_ zero_ copy_ masked_fill_ masked_scatter_ index_fill_ index_add_
index_copy_ index_put_ scatter_ scatter_add_ scatter_reduce_ unsqueeze_ squeeze_ t_
transpose_ floor_ ceil_ round_ lerp_ addcmul_ addcdiv_ clip_ detach_ requires_grad_
logical_and_ logical_or_ logical_not_ bernoulli_ uniform_ normal_ exponential_ random_
addmm_ baddbmm_ tril_ triu_ fmod_ remainder_ reciprocal_ sign_ sin_ cos_ square_ rsqrt_
"""

# Properties read through `x.T` etc.
PROPERTIES = "T mT H mH real imag data"

_RANDOM_METHODS = {"bernoulli_", "uniform_", "normal_", "exponential_", "random_"}
_NAMESPACES = {
    "torch": torch,
    "torch.nn.functional": F,
    "torch.linalg": torch.linalg,
    "torch.special": torch.special,
}


def _is_inplace(name):
    return (name.endswith("_") and not name.endswith("__")) or name in (
        "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
        "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__")


def _register_namespace(prefix, names, **flags):
    module = _NAMESPACES[prefix]
    for name in names.split():
        fn = getattr(module, name, None)
        type_name = f"{prefix}.{name}"
        if fn is None or not callable(fn):
            continue  # not in this torch version
        if is_registered(type_name):
            continue
        register(OpDef(type_name, kernel=fn, **flags), fn)


def _register_methods():
    for name in METHODS.split():
        fn = getattr(torch.Tensor, name, None)
        if fn is None:
            continue
        register(OpDef(f"torch.Tensor.{name}", kernel=fn, mutates=_is_inplace(name),
                       random=name in _RANDOM_METHODS), fn)
    for name in PROPERTIES.split():
        getter = getattr(torch.Tensor, name).__get__
        register(OpDef(f"torch.Tensor.{name}", kernel=getter, extra={"property": True}), getter)
    # Tensor methods that share a name with a torch function run the same
    # kernel; record them under the method's own name so that printing and
    # errors show what the user wrote.
    for family in (ELEMENTWISE, REDUCTION, SHAPE):
        for name in family.split():
            fn = getattr(torch.Tensor, name, None)
            type_name = f"torch.Tensor.{name}"
            if fn is not None and not is_registered(type_name):
                register(OpDef(type_name, kernel=fn), fn)


def _register_all():
    for family in (ELEMENTWISE, REDUCTION, SHAPE, NN):
        _register_namespace("torch", family)
    _register_namespace("torch", FACTORY, extra={"factory": True})
    _register_namespace("torch", RANDOM, random=True, extra={"factory": True})
    _register_namespace("torch.nn.functional", FUNCTIONAL)
    _register_namespace("torch.linalg", LINALG)
    _register_namespace("torch.special", SPECIAL)
    _register_methods()


_register_all()
