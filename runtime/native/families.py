"""The op families of the native executor, each declared once.

A family is a list of canonical ATen names (`OpDef.aten`) that both
`segment.cpp` and `lower.py` need. The build passes each list to the
compiler as an X-macro (`-DD2S_UNARY(X)=X(tanh) X(sigmoid) ...`), from which
segment.cpp makes the opcodes and their cases; lower.py lowers every op
whose canonical name is in a family. So an elementwise op of one tensor
that `at::NAME(x)` computes is one word in `UNARY`: every spelling of it
(`torch.NAME(x)`, `x.NAME()`, a wrapper such as `F.tanh`, an operator
such as `-x`) lowers, and so does its in-place form `x.NAME_()` that the
`inplace` pass makes where ATen says it writes the same values
(runtime/aten.py `inplace_unary`). Its gradient is eager's per-op autograd
unless segment.cpp's `fused_grad_kind` knows its derivative (the one fact
per op that stays in C++).
"""

from ..aten import inplace_unary

# at::NAME(x)
UNARY = ("tanh", "sigmoid", "relu", "exp", "log", "neg", "abs", "sqrt", "rsqrt", "sin", "cos", "reciprocal",
         "logical_not", "bitwise_not", "floor", "ceil", "sign", "erf", "log1p", "expm1", "tan", "sinh", "cosh",
         "atan", "trunc")

# x.NAME_() on a temporary the segment made (the `inplace` pass, grad mode
# off). Opcodes: NAME_.
UNARY_INPLACE = tuple(name for name in UNARY if inplace_unary(name))


def _x_list(names):
    return " ".join(f"X({name})" for name in names)


def compiler_definitions():
    """The families as the compiler's -D arguments (segment.cpp's X-macros);
    D2S_UNARY_TWIN pairs each op with its in-place form (NAME, NAME_)."""
    return [f"-DD2S_UNARY(X)={_x_list(UNARY)}",
            f"-DD2S_UNARY_INPLACE(X)={_x_list(name + '_' for name in UNARY_INPLACE)}",
            f"-DD2S_UNARY_TWIN(X)={_x_list(f'{name},{name}_' for name in UNARY_INPLACE)}"]
