// d2s native segments: a straight-line run of program ops executed by C++.
//
// The generated Python code of a program calls one torch function per op;
// most of each call's time on small tensors is the Python binding (argument
// parsing, overload resolution, wrapping the result), not the kernel. A
// Segment holds a run of such ops as instructions and calls the very ATen
// functions those bindings call (at::linear for F.linear, at::add for
// Tensor.__add__, ...), with the arguments the bindings would build, so the
// kernels, their results and the autograd graph are the same as eager's.
//
// Contract with the Python side (runtime/native/lower.py):
//   Segment(n_regs, n_inputs, instructions, outputs)
//     instructions: [(opcode, [operand, ...], [out_reg, ...], [reg_to_free, ...]), ...]
//     operand: (kind, value), kinds below (K_*).
//   segment(*tensors) -> one tensor, or a tuple when there are several outputs,
//   or None: "run these ops in Python". Anything this file cannot run exactly
//   as eager would (an input that is not a plain tensor, a torch function
//   mode, any error raised by a kernel) returns None with nothing observable
//   done (ops are pure: no input is written, no random number drawn), and the
//   generated code then runs the same ops in Python: the user gets eager's
//   error, at the op's line, from there, with no exception of ours chained to
//   it. `fallbacks()` counts those returns; `last_fallback()` says why.

#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/ScalarOps.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "autograd_compat.h"
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/PythonTorchFunctionTLS.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "lstm_cell.h"
#include "gru_cell.h"

namespace {

// Operand kinds (mirrored by runtime/native/lower.py through `operand_kinds()`).
enum Kind : int {
  K_REG = 0,      // a tensor register
  K_SCALAR = 1,   // a Python number as at::Scalar (bool, int64 or double, as the binding reads it)
  K_WRAPPED = 2,  // a Python number where the binding wants a Tensor: a wrapped-number 0-d tensor
  K_INTS = 3,     // a list of ints
  K_NONE = 4,     // None for an optional argument
  K_DTYPE = 5,    // a torch.dtype
  K_STR = 6,      // a string
  K_REGS = 7,     // a list of tensor registers (a TensorList)
};

// The families of runtime/native/families.py, which the build passes as
// X-macros: D2S_UNARY (at::NAME(x)), D2S_UNARY_INPLACE (x.NAME_()) and
// D2S_UNARY_TWIN (the pairs NAME, NAME_).
#if !defined(D2S_UNARY) || !defined(D2S_UNARY_INPLACE) || !defined(D2S_UNARY_TWIN)
#error "build with runtime/native/__init__.py: it defines the op families of families.py"
#endif

// The opcodes; their names are what lower.py asks for (`opcodes()`).
#define D2S_OPS(X)                                                                           \
  D2S_UNARY(X) X(contiguous) X(t) X(detach) X(silu) X(gelu)                                  \
  X(add) X(sub) X(mul) X(div) X(rsub) X(matmul) X(mm) X(bmm) X(pow) X(maximum) X(minimum)    \
  X(eq) X(ne) X(lt) X(le) X(gt) X(ge) X(and_) X(or_) X(xor_) X(logical_and) X(logical_or)      \
  X(where) X(masked_fill)                                                                     \
  X(sum) X(sum_dim) X(mean) X(mean_dim) X(amax) X(amin) X(all) X(all_dim) X(any) X(any_dim)  \
  X(argmax) X(argmin) X(max_all) X(min_all)                                                   \
  X(view) X(reshape) X(flatten) X(unsqueeze) X(squeeze) X(squeeze_dim) X(transpose)           \
  X(permute) X(expand) X(select)                                                              \
  X(linear) X(addmm) X(conv1d) X(conv2d) X(max_pool2d) X(avg_pool2d) X(adaptive_avg_pool2d)   \
  X(embedding) X(gru_cell) X(lstm_cell) X(rnn_tanh_cell) X(rnn_relu_cell) X(softmax)          \
  X(log_softmax) X(cross_entropy) X(layer_norm) X(cat) X(stack) X(zeros) X(ones)             \
  D2S_UNARY_INPLACE(X) X(add_) X(sub_) X(mul_) X(div_)

enum Op : int {
#define D2S_ENUM(name) OP_##name,
  D2S_OPS(D2S_ENUM)
#undef D2S_ENUM
  OP_COUNT
};

const char* kOpNames[] = {
#define D2S_NAME(name) #name,
    D2S_OPS(D2S_NAME)
#undef D2S_NAME
};

struct Operand {
  int kind = K_NONE;
  int reg = -1;
  c10::Scalar scalar;
  at::Tensor wrapped;  // K_WRAPPED: made once, read-only (like eager's, a fresh-per-call value nobody writes)
  std::vector<int64_t> ints;
  std::vector<int> regs;
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::string str;
};

struct Instr {
  int op = 0;
  std::vector<Operand> args;
  std::vector<int> outs;
  std::vector<int> frees;
};

// What a Segment runs; shared with the backward nodes of its fused calls,
// which may outlive the Segment object.
struct Code {
  int n_regs = 0;
  int n_inputs = 0;
  std::vector<Instr> instrs;
  std::vector<int> outputs;
  bool fusable = false;       // every instruction has a fused gradient (fused_grad_kind)
  std::vector<char> needed;   // registers the fused gradient reads
  // By instruction, for the fused path: the in-place form of an elementwise
  // op whose operand is a temporary dead after it that the gradient does not
  // read (`tanh(linear(x))` writes tanh into linear's result), as the
  // `inplace` pass does with grad mode off; op -1 where there is none.
  std::vector<Instr> in_place;
};

struct SegmentObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  std::shared_ptr<const Code>* code;
  bool fused_autograd;  // the fast level: one autograd node per call (see run_fused)
  Py_ssize_t fallbacks;
  std::string* last_fallback;
};

// Collects the warnings kernels raise while the GIL is released; they become
// Python warnings, worded as torch's own binding words them, once the segment
// has run (and are dropped when it falls back: the Python path raises them).
class Collect : public c10::WarningHandler {
 public:
  struct Item {
    bool deprecation;
    std::string msg;
  };
  std::vector<Item> items;
  void process(const c10::Warning& w) override {
    std::string msg = w.msg();
    if (!w.verbatim()) {
      const auto& loc = w.source_location();
      msg += std::string(" (Triggered internally at ") + loc.file + ":" + std::to_string(loc.line) + ".)";
    }
    items.push_back({std::holds_alternative<c10::DeprecationWarning>(w.type()), std::move(msg)});
  }
};

// -- operand access ------------------------------------------------------------------

// A tensor operand's value: its register in `regs`, or the wrapped number.
const at::Tensor& tensor_of(const Operand& o, const std::vector<at::Tensor>& regs) {
  return o.kind == K_WRAPPED ? o.wrapped : regs[o.reg];
}

struct Frame {
  std::vector<at::Tensor>& regs;
  const Instr& in;
  const at::Tensor& T(size_t i) const { return tensor_of(in.args[i], regs); }
  std::optional<at::Tensor> OT(size_t i) const {
    if (in.args[i].kind == K_NONE) return std::nullopt;
    return T(i);
  }
  // A tensor (register or wrapped number), not a Scalar: picks the Tensor overload.
  bool is_tensor(size_t i) const { return in.args[i].kind == K_REG || in.args[i].kind == K_WRAPPED; }
  const c10::Scalar& S(size_t i) const { return in.args[i].scalar; }
  int64_t I(size_t i) const { return in.args[i].scalar.toLong(); }
  bool B(size_t i) const { return in.args[i].scalar.toBool(); }
  double D(size_t i) const { return in.args[i].scalar.toDouble(); }
  at::IntArrayRef L(size_t i) const { return in.args[i].ints; }
  std::optional<int64_t> OI(size_t i) const {
    if (in.args[i].kind == K_NONE) return std::nullopt;
    return I(i);
  }
  std::optional<at::ScalarType> DT(size_t i) const {
    if (in.args[i].kind == K_NONE) return std::nullopt;
    return in.args[i].dtype;
  }
  std::vector<at::Tensor> TL(size_t i) const {
    std::vector<at::Tensor> out;
    out.reserve(in.args[i].regs.size());
    for (int r : in.args[i].regs) out.push_back(regs[r]);
    return out;
  }
  const std::string& STR(size_t i) const { return in.args[i].str; }
};

// Factories read the default dtype when they run, as torch.zeros does.
at::TensorOptions factory_options(const Frame& f, size_t i) {
  auto dt = f.DT(i);
  return at::TensorOptions().dtype(dt ? *dt : c10::typeMetaToScalarType(c10::get_default_dtype()));
}

// One instruction: the ATen call the op's Python binding makes.
// `keep_all`: free nothing (the fused path records each result's shape
// first, then frees only what its gradient does not read).
void run_one(std::vector<at::Tensor>& regs, const Instr& in, bool keep_all = false) {
  Frame f{regs, in};
  at::Tensor r;
  switch (in.op) {
#define D2S_UNARY_CASE(name) \
  case OP_##name:            \
    r = at::name(f.T(0));    \
    break;
      D2S_UNARY(D2S_UNARY_CASE)
#undef D2S_UNARY_CASE
    case OP_contiguous: r = f.T(0).contiguous(); break;
    case OP_t: r = f.T(0).t(); break;
    case OP_detach: r = f.T(0).detach(); break;
    case OP_silu: r = at::silu(f.T(0)); break;
    case OP_gelu: r = at::gelu(f.T(0), f.STR(1)); break;

    // Binary arithmetic: the bindings read a Python number operand as a
    // wrapped-number tensor (K_WRAPPED), so these are the Tensor overloads.
    case OP_add: r = at::add(f.T(0), f.T(1), f.S(2)); break;
    case OP_sub: r = at::sub(f.T(0), f.T(1), f.S(2)); break;
    case OP_rsub: r = at::rsub(f.T(0), f.T(1), f.S(2)); break;
    case OP_mul: r = at::mul(f.T(0), f.T(1)); break;
    case OP_div: r = at::div(f.T(0), f.T(1)); break;
    case OP_matmul: r = at::matmul(f.T(0), f.T(1)); break;
    case OP_mm: r = at::mm(f.T(0), f.T(1)); break;
    case OP_bmm: r = at::bmm(f.T(0), f.T(1)); break;
    case OP_maximum: r = at::maximum(f.T(0), f.T(1)); break;
    case OP_minimum: r = at::minimum(f.T(0), f.T(1)); break;
    case OP_logical_and: r = at::logical_and(f.T(0), f.T(1)); break;
    case OP_logical_or: r = at::logical_or(f.T(0), f.T(1)); break;

    // Tensor or Scalar overloads, as the binding picks by the operand.
#define D2S_TS(name, fn)                                                  \
  case OP_##name:                                                         \
    r = f.is_tensor(1) ? at::fn(f.T(0), f.T(1)) : at::fn(f.T(0), f.S(1)); \
    break;
      D2S_TS(pow, pow)
      D2S_TS(eq, eq)
      D2S_TS(ne, ne)
      D2S_TS(lt, lt)
      D2S_TS(le, le)
      D2S_TS(gt, gt)
      D2S_TS(ge, ge)
      D2S_TS(and_, __and__)
      D2S_TS(or_, __or__)
      D2S_TS(xor_, __xor__)
#undef D2S_TS
    case OP_where: r = at::where(f.T(0), f.T(1), f.T(2)); break;
    case OP_masked_fill:
      r = f.is_tensor(2) ? at::masked_fill(f.T(0), f.T(1), f.T(2)) : at::masked_fill(f.T(0), f.T(1), f.S(2));
      break;

    case OP_sum: r = at::sum(f.T(0), f.DT(1)); break;
    case OP_sum_dim: r = at::sum(f.T(0), f.L(1), f.B(2), f.DT(3)); break;
    case OP_mean: r = at::mean(f.T(0), f.DT(1)); break;
    case OP_mean_dim: r = at::mean(f.T(0), f.L(1), f.B(2), f.DT(3)); break;
    case OP_amax: r = at::amax(f.T(0), f.L(1), f.B(2)); break;
    case OP_amin: r = at::amin(f.T(0), f.L(1), f.B(2)); break;
    case OP_all: r = at::all(f.T(0)); break;
    case OP_all_dim: r = at::all(f.T(0), f.I(1), f.B(2)); break;
    case OP_any: r = at::any(f.T(0)); break;
    case OP_any_dim: r = at::any(f.T(0), f.I(1), f.B(2)); break;
    case OP_argmax: r = at::argmax(f.T(0), f.OI(1), f.B(2)); break;
    case OP_argmin: r = at::argmin(f.T(0), f.OI(1), f.B(2)); break;
    case OP_max_all: r = at::max(f.T(0)); break;
    case OP_min_all: r = at::min(f.T(0)); break;

    case OP_view: r = f.T(0).view(f.L(1)); break;
    case OP_reshape: r = at::reshape(f.T(0), f.L(1)); break;
    case OP_flatten: r = at::flatten(f.T(0), f.I(1), f.I(2)); break;
    case OP_unsqueeze: r = at::unsqueeze(f.T(0), f.I(1)); break;
    case OP_squeeze: r = at::squeeze(f.T(0)); break;
    case OP_squeeze_dim: r = at::squeeze(f.T(0), f.I(1)); break;
    case OP_transpose: r = at::transpose(f.T(0), f.I(1), f.I(2)); break;
    case OP_permute: r = at::permute(f.T(0), f.L(1)); break;
    case OP_expand: r = f.T(0).expand(f.L(1)); break;
    case OP_select: r = at::select(f.T(0), f.I(1), f.I(2)); break;

    case OP_linear: r = at::linear(f.T(0), f.T(1), f.OT(2)); break;
    case OP_addmm: r = at::addmm(f.T(0), f.T(1), f.T(2)); break;
    case OP_conv1d: r = at::conv1d(f.T(0), f.T(1), f.OT(2), f.L(3), f.L(4), f.L(5), f.I(6)); break;
    case OP_conv2d: r = at::conv2d(f.T(0), f.T(1), f.OT(2), f.L(3), f.L(4), f.L(5), f.I(6)); break;
    case OP_max_pool2d: r = at::max_pool2d(f.T(0), f.L(1), f.L(2), f.L(3), f.L(4), f.B(5)); break;
    case OP_avg_pool2d: r = at::avg_pool2d(f.T(0), f.L(1), f.L(2), f.L(3), f.B(4), f.B(5), f.OI(6)); break;
    case OP_adaptive_avg_pool2d: r = at::adaptive_avg_pool2d(f.T(0), f.L(1)); break;
    case OP_embedding: r = at::embedding(f.T(0), f.T(1), f.I(2), f.B(3), f.B(4)); break;
    case OP_gru_cell:
      // With grad on: one autograd node, eager's gradients (gru_cell.h).
      if (!d2s_gru::exact_gru_cell(f.T(0), f.T(1), f.T(2), f.T(3), f.OT(4), f.OT(5), r)) {
        r = at::gru_cell(f.T(0), f.T(1), f.T(2), f.T(3), f.OT(4), f.OT(5));
      }
      break;
    case OP_rnn_tanh_cell: r = at::rnn_tanh_cell(f.T(0), f.T(1), f.T(2), f.T(3), f.OT(4), f.OT(5)); break;
    case OP_rnn_relu_cell: r = at::rnn_relu_cell(f.T(0), f.T(1), f.T(2), f.T(3), f.OT(4), f.OT(5)); break;
    case OP_lstm_cell: {
      auto hx = f.TL(1);
      at::Tensor hy, cy;
      // With grad on: two autograd nodes, eager's gradients (lstm_cell.h).
      if (hx.size() != 2 || !d2s_lstm::exact_lstm_cell(f.T(0), hx[0], hx[1], f.T(2), f.T(3), f.OT(4), f.OT(5), hy, cy)) {
        std::tie(hy, cy) = at::lstm_cell(f.T(0), hx, f.T(2), f.T(3), f.OT(4), f.OT(5));
      }
      regs[in.outs[0]] = std::move(hy);
      regs[in.outs[1]] = std::move(cy);
      for (int dead : in.frees) regs[dead] = at::Tensor();  // never fused
      return;
    }
    case OP_softmax: r = at::softmax(f.T(0), f.I(1), f.DT(2)); break;
    case OP_log_softmax: r = at::log_softmax(f.T(0), f.I(1), f.DT(2)); break;
    case OP_cross_entropy: r = at::cross_entropy_loss(f.T(0), f.T(1), f.OT(2), f.I(3), f.I(4), f.D(5)); break;
    case OP_layer_norm: r = at::layer_norm(f.T(0), f.L(1), f.OT(2), f.OT(3), f.D(4), f.B(5)); break;
    case OP_cat: r = at::cat(f.TL(0), f.I(1)); break;
    case OP_stack: r = at::stack(f.TL(0), f.I(1)); break;
    case OP_zeros: r = at::zeros(f.L(0), factory_options(f, 1)); break;
    case OP_ones: r = at::ones(f.L(0), factory_options(f, 1)); break;

    // In place, into a temporary made earlier in the same segment (the
    // `inplace` pass, grad mode off): the result register is the operand's.
#define D2S_INPLACE_CASE(name_) \
  case OP_##name_:              \
    f.T(0).name_();             \
    r = f.T(0);                 \
    break;
      D2S_UNARY_INPLACE(D2S_INPLACE_CASE)
#undef D2S_INPLACE_CASE
    case OP_add_: f.T(0).add_(f.T(1), f.S(2)); r = f.T(0); break;
    case OP_sub_: f.T(0).sub_(f.T(1), f.S(2)); r = f.T(0); break;
    case OP_mul_: f.T(0).mul_(f.T(1)); r = f.T(0); break;
    case OP_div_: f.T(0).div_(f.T(1)); r = f.T(0); break;
    default: TORCH_CHECK(false, "d2s native segment: unknown opcode " + std::to_string(in.op));
  }
  regs[in.outs[0]] = std::move(r);
  if (!keep_all) {
    for (int dead : in.frees) regs[dead] = at::Tensor();
  }
}


// -- fused autograd (the fast level) -------------------------------------------------
//
// With grad mode on, each op a segment runs records its own autograd node,
// as eager's do: most of a small op's cost. At the fast level a segment whose
// ops all have a gradient here runs them under no_grad and records one node
// for the whole call (as TorchScript's differentiable graphs do); its
// backward walks the instructions in reverse with the formulas below. Values
// are eager's (the same kernels); gradients equal eager's up to the order
// contributions are summed in (docs/performance.md gives the tolerance).
// Not supported, and refused loudly: double backward (create_graph=True).
// Inputs with forward-mode tangents, and calls under saved-tensor hooks
// (`torch.autograd.graph.save_on_cpu`, checkpointing), run the per-op path.

enum GradKind : int {
  G_NO = -1,       // no fused gradient: the segment runs with per-op autograd
  G_SHAPES = 0,    // the gradient needs operand shapes only
  G_RESULT = 1,    // ... the op's result
  G_OPERANDS = 2,  // ... its tensor operands
  G_NONDIFF = 3,   // results never carry gradient (comparisons, argmax, ...)
};

int fused_grad_kind(const Instr& in) {
  switch (in.op) {
    case OP_tanh: case OP_sigmoid: case OP_relu: case OP_exp: case OP_sqrt: case OP_rsqrt: case OP_reciprocal:
    case OP_expm1: case OP_softmax: case OP_log_softmax:
      return G_RESULT;
    case OP_neg: case OP_add: case OP_sub: case OP_rsub: case OP_sum: case OP_mean: case OP_sum_dim:
    case OP_mean_dim: case OP_view: case OP_reshape: case OP_flatten: case OP_unsqueeze: case OP_squeeze:
    case OP_squeeze_dim: case OP_transpose: case OP_permute: case OP_t: case OP_contiguous: case OP_expand:
    case OP_select: case OP_cat: case OP_stack:
      return G_SHAPES;
    case OP_mul: case OP_div: case OP_linear: case OP_addmm: case OP_mm: case OP_log: case OP_sin: case OP_cos:
    case OP_abs: case OP_log1p: case OP_silu: case OP_gelu: case OP_embedding: case OP_where: case OP_masked_fill:
      return G_OPERANDS;
    case OP_cross_entropy:  // logits (N, C), class indices (N): lower.py decides from the program's types
      return in.args[6].scalar.toBool() ? G_OPERANDS : G_NO;
    case OP_pow:  // x ** number only; a tensor exponent keeps per-op autograd
      return in.args[1].kind == K_SCALAR ? G_OPERANDS : G_NO;
    case OP_eq: case OP_ne: case OP_lt: case OP_le: case OP_gt: case OP_ge: case OP_logical_not:
    case OP_logical_and: case OP_logical_or: case OP_and_: case OP_or_: case OP_xor_: case OP_argmax:
    case OP_argmin: case OP_all: case OP_any: case OP_all_dim: case OP_any_dim: case OP_detach: case OP_zeros:
    case OP_ones: case OP_bitwise_not:  // bitwise_not: bool/integer tensors only
      return G_NONDIFF;
    default:
      return G_NO;
  }
}

// Results that may share storage with an operand. As a segment's output
// such a view would be a view made under no_grad of a tensor that requires
// grad, which autograd treats differently from eager's view: never fused.
bool aliases(int op) {
  switch (op) {
    case OP_view: case OP_reshape: case OP_flatten: case OP_unsqueeze: case OP_squeeze: case OP_squeeze_dim:
    case OP_transpose: case OP_permute: case OP_t: case OP_contiguous: case OP_expand: case OP_select:
    case OP_detach:
      return true;
    default:
      return false;
  }
}

// Calls whose choice of kernels reads autograd state: matmul folds a batched
// operand into one mm when the other requires grad, which a view made below
// autograd (the weight's t() inside linear) does not, and another fold
// rounds differently. Only a batched (3-d or more) operand is folded; with
// 1-d and 2-d ones linear is addmm and matmul is mm, mv or dot. Such calls
// run above autograd (under no_grad).
bool reads_autograd_state(const Instr& in, const std::vector<at::Tensor>& regs) {
  if (in.op != OP_linear && in.op != OP_matmul) return false;
  return tensor_of(in.args[0], regs).dim() >= 3 || tensor_of(in.args[1], regs).dim() >= 3;
}

// Whether a cross_entropy call has the fused gradient below: a batch of
// logits (N, C) and class indices (N) (no weight, no label smoothing), where
// at::cross_entropy_loss is nll_loss(log_softmax(x, 1), y). lower.py marks
// the calls it knows to be such from the program's dtypes and ranks; this
// checks the values too, before the gradient assumes them (a mismatch, not
// expected, runs the call again per op).
bool fused_cross_entropy(const Instr& in, const std::vector<at::Tensor>& regs) {
  const at::Tensor& x = tensor_of(in.args[0], regs);
  const at::Tensor& y = tensor_of(in.args[1], regs);
  return x.dim() == 2 && y.dim() == 1 && y.scalar_type() == at::kLong && at::isFloatingType(x.scalar_type());
}

// The opcode of a unary op's in-place form (D2S_UNARY_TWIN), or -1.
int in_place_twin(int op) {
  switch (op) {
#define D2S_TWIN_CASE(name, name_) \
  case OP_##name:                  \
    return OP_##name_;
    D2S_UNARY_TWIN(D2S_TWIN_CASE)
#undef D2S_TWIN_CASE
    default:
      return -1;
  }
}

// Decides `fusable` and `needed` once, when the segment is made.
void plan_fused(Code& code) {
  code.needed.assign(code.n_regs, 0);
  code.fusable = false;
  std::vector<int> producer(code.n_regs, -1);
  for (const Instr& in : code.instrs) {
    int kind = fused_grad_kind(in);
    if (kind == G_NO || in.outs.size() != 1) return;
    producer[in.outs[0]] = in.op;
    if (kind == G_RESULT) code.needed[in.outs[0]] = 1;
    if (kind == G_OPERANDS) {
      for (const Operand& o : in.args) {
        if (o.kind == K_REG) code.needed[o.reg] = 1;
      }
    }
  }
  for (int o : code.outputs) {
    if (producer[o] >= 0 && aliases(producer[o])) return;
  }
  code.fusable = true;
  code.in_place.assign(code.instrs.size(), Instr{-1, {}, {}, {}});
  for (size_t i = 0; i < code.instrs.size(); ++i) {
    const Instr& in = code.instrs[i];
    int twin = in_place_twin(in.op);
    if (twin < 0 || fused_grad_kind(in) == G_NONDIFF || in.args.empty() || in.args[0].kind != K_REG) continue;
    int r = in.args[0].reg;
    bool dies_here = std::find(in.frees.begin(), in.frees.end(), r) != in.frees.end();
    if (r < code.n_inputs || code.needed[r] || !dies_here) continue;
    code.in_place[i] = in;
    code.in_place[i].op = twin;
  }
}

struct SegmentBackward : public torch::autograd::Node {
  std::shared_ptr<const Code> code;
  std::vector<at::Tensor> saved;       // by register: detached values the gradient reads
  std::vector<uint32_t> versions;      // their versions when saved
  std::vector<at::DimVector> shapes;   // by register (inline storage: no allocation per op)
  std::vector<at::ScalarType> dtypes;
  std::vector<char> req;               // the register's value depends on an input that requires grad
  std::vector<int> grad_outputs;       // output registers, in the order of this node's inputs
  bool released = false;

  std::string name() const override { return "D2SSegmentBackward"; }
  void release_variables() override {
    saved.clear();
    released = true;
  }

  const at::Tensor& value(const Operand& o) const { return tensor_of(o, saved); }
  bool need(const Operand& o) const { return o.kind == K_REG && req[o.reg]; }

  void acc(std::vector<at::Tensor>& g, const Operand& o, at::Tensor t) const {
    if (o.kind != K_REG) return;
    acc_reg(g, o.reg, std::move(t));
  }

  void acc_reg(std::vector<at::Tensor>& g, int r, at::Tensor t) const {
    if (!req[r] || !t.defined()) return;
    // Cast, then reduce a broadcast: the order eager's formulas and engine use.
    if (t.scalar_type() != dtypes[r]) t = t.to(dtypes[r]);
    if (t.sizes() != at::IntArrayRef(shapes[r])) t = at::sum_to(t, shapes[r]);
    g[r] = g[r].defined() ? g[r] + t : std::move(t);
  }

  void backward_one(const Instr& in, std::vector<at::Tensor>& g) const {
    const at::Tensor& go = g[in.outs[0]];
    const auto& a = in.args;
    switch (in.op) {
      case OP_tanh: acc(g, a[0], at::tanh_backward(go, saved[in.outs[0]])); break;
      case OP_sigmoid: acc(g, a[0], at::sigmoid_backward(go, saved[in.outs[0]])); break;
      case OP_relu: acc(g, a[0], at::threshold_backward(go, saved[in.outs[0]], 0)); break;
      case OP_exp: acc(g, a[0], go * saved[in.outs[0]]); break;
      case OP_neg: acc(g, a[0], go.neg()); break;
      case OP_add:
        acc(g, a[0], go);
        acc(g, a[1], a[2].scalar.equal(1) ? go : go * a[2].scalar);
        break;
      case OP_sub:
        acc(g, a[0], go);
        acc(g, a[1], a[2].scalar.equal(1) ? go.neg() : go * (-a[2].scalar));
        break;
      case OP_rsub:  // other - alpha * input
        acc(g, a[0], a[2].scalar.equal(1) ? go.neg() : go * (-a[2].scalar));
        acc(g, a[1], go);
        break;
      case OP_mul:
        if (need(a[0])) acc(g, a[0], go * value(a[1]));
        if (need(a[1])) acc(g, a[1], go * value(a[0]));
        break;
      case OP_div: {
        const at::Tensor& x = value(a[0]);
        const at::Tensor& y = value(a[1]);
        if (need(a[0])) acc(g, a[0], go / y);
        if (need(a[1])) acc(g, a[1], -go * x / (y * y));
        break;
      }
      case OP_sum: acc(g, a[0], go.expand(shapes[a[0].reg])); break;
      case OP_mean: {
        int64_t n = c10::multiply_integers(shapes[a[0].reg]);
        acc(g, a[0], go.expand(shapes[a[0].reg]) / static_cast<double>(n));
        break;
      }
      case OP_linear: {  // y = x @ w.t() + b
        const at::Tensor& x = saved[a[0].reg];
        const at::Tensor& w = saved[a[1].reg];
        if (need(a[0])) acc(g, a[0], at::matmul(go, w));
        if (need(a[1])) {
          acc(g, a[1], go.reshape({-1, go.size(-1)}).t().mm(x.reshape({-1, x.size(-1)})));
        }
        if (a[2].kind == K_REG) acc(g, a[2], go);
        break;
      }
      case OP_addmm: {  // y = b + m1 @ m2
        acc(g, a[0], go);
        if (need(a[1])) acc(g, a[1], go.mm(saved[a[2].reg].t()));
        if (need(a[2])) acc(g, a[2], saved[a[1].reg].t().mm(go));
        break;
      }
      case OP_mm:
        if (need(a[0])) acc(g, a[0], go.mm(saved[a[1].reg].t()));
        if (need(a[1])) acc(g, a[1], saved[a[0].reg].t().mm(go));
        break;
      case OP_sqrt: acc(g, a[0], go / (saved[in.outs[0]] * 2)); break;
      case OP_rsqrt: acc(g, a[0], go * saved[in.outs[0]].pow(3) * -0.5); break;
      case OP_reciprocal: {
        const at::Tensor& y = saved[in.outs[0]];
        acc(g, a[0], -go * (y * y));
        break;
      }
      case OP_expm1: acc(g, a[0], go * (saved[in.outs[0]] + 1)); break;
      case OP_softmax:
        acc(g, a[0], at::_softmax_backward_data(go, saved[in.outs[0]], a[1].scalar.toLong(), dtypes[a[0].reg]));
        break;
      case OP_log_softmax:
        acc(g, a[0],
            at::_log_softmax_backward_data(go, saved[in.outs[0]], a[1].scalar.toLong(), dtypes[a[0].reg]));
        break;
      case OP_cross_entropy: {  // eager's two nodes: NllLossBackward0, then LogSoftmaxBackward0
        const at::Tensor& x = saved[a[0].reg];
        const at::Tensor& y = saved[a[1].reg];
        const int64_t ignore_index = a[4].scalar.toLong();
        // The forward's intermediates, made again by the same kernels: its
        // log_softmax, and nll_loss's total weight (the count of targets
        // not ignored, without a weight).
        at::Tensor log_probs = at::_log_softmax(x, 1, false);
        at::Tensor total_weight = at::ne(y, ignore_index).sum().to(x.scalar_type());
        at::Tensor grad = at::nll_loss_backward(go, log_probs, y, {}, a[3].scalar.toLong(), ignore_index, total_weight);
        acc(g, a[0], at::_log_softmax_backward_data(grad, log_probs, 1, dtypes[a[0].reg]));
        break;
      }
      case OP_log: acc(g, a[0], go / saved[a[0].reg]); break;
      case OP_sin: acc(g, a[0], go * saved[a[0].reg].cos()); break;
      case OP_cos: acc(g, a[0], go * -saved[a[0].reg].sin()); break;
      case OP_abs: acc(g, a[0], go * saved[a[0].reg].sgn()); break;
      case OP_log1p: acc(g, a[0], go / (saved[a[0].reg] + 1)); break;
      case OP_silu: acc(g, a[0], at::silu_backward(go, saved[a[0].reg])); break;
      case OP_gelu: acc(g, a[0], at::gelu_backward(go, saved[a[0].reg], a[1].str)); break;
      case OP_pow: {
        const c10::Scalar& e = a[1].scalar;
        const at::Tensor& x = saved[a[0].reg];
        if (e.equal(0)) {
          acc(g, a[0], at::zeros_like(x));
        } else {
          c10::Scalar e1 = e.isIntegral(false) ? c10::Scalar(e.toLong() - 1) : c10::Scalar(e.toDouble() - 1);
          acc(g, a[0], go * (x.pow(e1) * e));
        }
        break;
      }
      case OP_embedding:  // (weight, indices, padding_idx, scale_grad_by_freq, sparse)
        acc(g, a[0], at::embedding_backward(go, saved[a[1].reg], shapes[a[0].reg][0], a[2].scalar.toLong(),
                                            a[3].scalar.toBool(), a[4].scalar.toBool()));
        break;
      case OP_where: {
        const at::Tensor& c = saved[a[0].reg];
        if (need(a[1])) acc(g, a[1], at::where(c, go, c10::Scalar(0)));
        if (need(a[2])) acc(g, a[2], at::where(c, c10::Scalar(0), go));
        break;
      }
      case OP_masked_fill: {
        const at::Tensor& m = saved[a[1].reg];
        if (need(a[0])) acc(g, a[0], go.masked_fill(m, 0));
        if (need(a[2])) acc(g, a[2], at::where(m, go, c10::Scalar(0)).sum());
        break;
      }
      case OP_view: case OP_reshape: case OP_flatten: case OP_unsqueeze: case OP_squeeze: case OP_squeeze_dim:
        acc(g, a[0], go.reshape(shapes[a[0].reg]));
        break;
      case OP_transpose: acc(g, a[0], go.transpose(a[1].scalar.toLong(), a[2].scalar.toLong())); break;
      case OP_t: acc(g, a[0], go.t()); break;
      case OP_contiguous: case OP_expand: acc(g, a[0], go); break;  // acc sums an expanded gradient back
      case OP_permute: {
        const auto& dims = a[1].ints;
        std::vector<int64_t> inverse(dims.size());
        for (size_t i = 0; i < dims.size(); ++i) {
          inverse[c10::maybe_wrap_dim(dims[i], static_cast<int64_t>(dims.size()))] = static_cast<int64_t>(i);
        }
        acc(g, a[0], go.permute(inverse));
        break;
      }
      case OP_select:
        acc(g, a[0], at::select_backward(go, shapes[a[0].reg], a[1].scalar.toLong(), a[2].scalar.toLong()));
        break;
      case OP_sum_dim: case OP_mean_dim: {
        const auto& shape = shapes[a[0].reg];
        const int64_t rank = static_cast<int64_t>(shape.size());
        std::vector<int64_t> dims;
        for (int64_t d : a[1].ints) dims.push_back(c10::maybe_wrap_dim(d, rank));
        if (dims.empty()) {  // dim=[] reduces every dimension
          for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
        }
        std::sort(dims.begin(), dims.end());
        dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
        at::Tensor t = go;
        if (!a[2].scalar.toBool()) {
          for (int64_t d : dims) t = t.unsqueeze(d);
        }
        t = t.expand(shape);
        if (in.op == OP_mean_dim) {
          int64_t n = 1;
          for (int64_t d : dims) n *= shape[d];
          t = t / static_cast<double>(n);
        }
        acc(g, a[0], t);
        break;
      }
      case OP_cat: {
        const auto& regs = a[0].regs;
        int64_t dim = c10::maybe_wrap_dim(a[1].scalar.toLong(), go.dim());
        int64_t offset = 0;
        for (int r : regs) {
          const auto& shape = shapes[r];
          if (shape.size() == 1 && shape[0] == 0 && go.dim() != 1) continue;  // a legacy empty tensor: skipped
          int64_t size = shape[dim];
          acc_reg(g, r, go.narrow(dim, offset, size));
          offset += size;
        }
        break;
      }
      case OP_stack: {
        const auto& regs = a[0].regs;
        int64_t dim = c10::maybe_wrap_dim(a[1].scalar.toLong(), go.dim());
        for (size_t i = 0; i < regs.size(); ++i) acc_reg(g, regs[i], go.select(dim, static_cast<int64_t>(i)));
        break;
      }
      default:
        break;  // G_NONDIFF: nothing flows back
    }
  }

  // Eager's message for a saved value written in place, made of plain
  // strings. No iostreams in this library (no c10::str of numbers): built
  // by a newer compiler than the process's libstdc++ (GCC 13 beside torch
  // 2.11's runtime, seen on a GPU machine), the stream code it instantiates
  // crashed formatting an integer.
  static std::string version_error(const at::Tensor& t, uint32_t expected) {
    std::string sizes;
    for (int64_t d = 0; d < t.dim(); ++d) sizes += (d ? ", " : "") + std::to_string(t.size(d));
    return std::string("one of the variables needed for gradient computation has been modified by an inplace "
                       "operation: [") + c10::toString(t.scalar_type()) + " [" + sizes + "]] is at version " +
           std::to_string(t._version()) + "; expected version " + std::to_string(expected) + " instead.";
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    TORCH_CHECK(!released,
                "Trying to backward through the graph a second time (or directly access saved tensors after "
                "they have already been freed). Specify retain_graph=True if you need to backward through the "
                "graph a second time.");
    TORCH_CHECK(!torch::autograd::GradMode::is_enabled(),
                "d2s: double backward (create_graph=True) through a program compiled with optimize=\"fast\" "
                "is not supported; use the default level for higher-order gradients");
    for (size_t r = 0; r < saved.size(); ++r) {
      if (saved[r].defined() && saved[r]._version() != versions[r]) {
        TORCH_CHECK(false, version_error(saved[r], versions[r]));
      }
    }
    std::vector<at::Tensor> g(code->n_regs);
    for (size_t k = 0; k < grad_outputs.size() && k < grads.size(); ++k) g[grad_outputs[k]] = grads[k];
    for (auto it = code->instrs.rbegin(); it != code->instrs.rend(); ++it) {
      if (g[it->outs[0]].defined() && req[it->outs[0]]) backward_one(*it, g);
    }
    torch::autograd::variable_list out(code->n_inputs);
    for (int r = 0; r < code->n_inputs; ++r) out[r] = std::move(g[r]);
    return out;
  }
};

// The forward of a fused call, under no_grad: runs the instructions and
// records in `node`, for every result, whether it carries gradient, its shape
// and its dtype. The GIL is released by the caller.
//
// The calls dispatch below autograd (AutoDispatchBelowADInplaceOrView): under
// no_grad the autograd and ADInplaceOrView kernels of every op would only
// check that there is nothing to record, a large share of a small op's time,
// and this node records the gradient itself. What the ADInplaceOrView
// kernels would have done that is observable is done here: a view shares
// the version counter of the tensor it views, so a later in-place write to
// either fails the version check in backward as eager's does. Results are
// made by the same kernels (values bit for bit), except where a composite
// picks its kernels by autograd state it would not see below autograd
// (`reads_autograd_state`): those ops dispatch as usual. A dead register the
// gradient does not read is freed at its last use, as the per-op path frees
// it; inputs stay (a call that falls back runs again from them). False,
// part way, where a call has no fused gradient (`fused_cross_entropy`).
bool run_fused(const Code& code, std::vector<at::Tensor>& regs, SegmentBackward& node) {
  auto& req = node.req;
  at::AutoGradMode no_grad(false);
  for (size_t i = 0; i < code.instrs.size(); ++i) {
    const Instr& in = code.instrs[i];
    if (in.op == OP_cross_entropy && !fused_cross_entropy(in, regs)) return false;
    c10::impl::ExcludeDispatchKeyGuard below_autograd(
        reads_autograd_state(in, regs) ? c10::DispatchKeySet() : c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    const Instr& twin = code.in_place[i];
    // In place only on a floating-point temporary nothing else holds or
    // views (the in-place form writes the out-of-place form's dtype there),
    // laid out densely without overlap (where the out-of-place form's
    // result has the operand's strides; it could not write an expanded one).
    const at::Tensor* operand = twin.op >= 0 ? &regs[twin.args[0].reg] : nullptr;
    bool reuse = operand != nullptr && operand->use_count() == 1 && operand->storage().use_count() == 1 &&
                 at::isFloatingType(operand->scalar_type()) && operand->is_non_overlapping_and_dense();
    run_one(regs, reuse ? twin : in, /*keep_all=*/true);
    int o = in.outs[0];
    if (aliases(in.op)) {
      const at::Tensor& base = tensor_of(in.args[0], regs);
      if (!regs[o].is_same(base) && regs[o].is_alias_of(base)) {
        regs[o].unsafeGetTensorImpl()->set_version_counter(base.unsafeGetTensorImpl()->version_counter());
      }
    }
    bool r = false;
    if (fused_grad_kind(in) != G_NONDIFF) {
      for (const Operand& a : in.args) {
        r = r || (a.kind == K_REG && req[a.reg]);
        for (int x : a.regs) r = r || req[x];  // a TensorList (cat, stack)
      }
    }
    req[o] = r;
    node.shapes[o] = at::DimVector(regs[o].sizes());
    node.dtypes[o] = regs[o].scalar_type();
    for (int dead : in.frees) {
      if (dead >= code.n_inputs && !code.needed[dead]) regs[dead] = at::Tensor();
    }
  }
  return true;
}

// -- the Python type ---------------------------------------------------------------

PyObject* fall_back(SegmentObject* self, const std::string& why) {
  ++self->fallbacks;
  *self->last_fallback = why;
  Py_RETURN_NONE;
}


// The fused path of a call: runs the instructions under no_grad, then gives
// the outputs that carry gradient one SegmentBackward node as grad_fn.
// Returns false, having recorded nothing, when an output shares storage
// with an input (eager's result would be a view of it, which autograd must
// track) or a call has no fused gradient: the caller then runs the (pure)
// instructions again per op.
bool run_with_one_node(const std::shared_ptr<const Code>& code, std::vector<at::Tensor>& regs) {
  const int n = code->n_regs;
  std::vector<at::Tensor> inputs(regs.begin(), regs.begin() + code->n_inputs);
  auto node = d2s_autograd::make_node<SegmentBackward>();
  node->req.assign(n, 0);
  node->shapes.resize(n);
  node->dtypes.assign(n, at::ScalarType::Undefined);
  for (int i = 0; i < code->n_inputs; ++i) {
    node->req[i] = regs[i].requires_grad();
    node->shapes[i] = at::DimVector(regs[i].sizes());
    node->dtypes[i] = regs[i].scalar_type();
  }
  if (!run_fused(*code, regs, *node)) return false;
  for (int o : code->outputs) {
    // Storage held by this output alone can alias nothing (the usual case:
    // the scans below are for views and ops that return their operand).
    const bool shared = regs[o].has_storage() && regs[o].storage().use_count() > 1;
    if (!shared && !regs[o].is_view()) continue;
    for (const at::Tensor& in : inputs) {
      if (regs[o].is_alias_of(in)) return false;
    }
    // A result sharing storage with a tensor made inside the call (`linear`
    // of a 3-d input is a view of its matmul's result, made under no_grad)
    // would share it with no tensor autograd knows of: give the caller a
    // tensor of its own, with the same values and strides.
    bool copy = regs[o].is_view();
    for (int r = code->n_inputs; r < n && !copy; ++r) {
      copy = r != o && regs[r].defined() && regs[o].is_alias_of(regs[r]) && !regs[o].is_same(regs[r]);
    }
    if (copy) {
      at::AutoGradMode no_grad(false);
      regs[o] = regs[o].clone();
    }
  }
  node->code = code;
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  node->saved.resize(n);
  node->versions.assign(n, 0);
  std::vector<char> is_output(n, 0);
  for (int o : code->outputs) is_output[o] = 1;
  for (int r = 0; r < n; ++r) {
    if (!code->needed[r] || !regs[r].defined()) continue;
    // An output gets this node as grad_fn: keep a detached alias (same
    // storage and version counter), not the tensor, or the two keep each
    // other alive.
    node->saved[r] = is_output[r] ? regs[r].detach() : regs[r];
    node->versions[r] = node->saved[r]._version();
  }
  for (int o : code->outputs) {
    if (node->req[o] && torch::autograd::isDifferentiableType(regs[o].scalar_type())) {
      torch::autograd::set_history(regs[o], node);
      node->grad_outputs.push_back(o);
    }
  }
  return true;
}

// Runs a segment's instructions on `regs` (its inputs in the low registers),
// with one autograd node at the fast level where it applies, else per-op
// nodes as eager's. Throws what a kernel throws. Needs no GIL (flow.h runs
// segments inside a loop with it released).
void run_code(const std::shared_ptr<const Code>& code, std::vector<at::Tensor>& regs, bool fused_autograd) {
  bool fused = false;
  // Saved-tensor hooks (offloading, checkpointing) act on each op's saved
  // tensors: with any active, calls record per-op nodes, as eager's.
  if (fused_autograd && code->fusable && torch::autograd::GradMode::is_enabled() &&
      at::SavedTensorDefaultHooks::get_tls_state().stack.empty()) {
    bool wants_grad = false, tangents = false, inference = false;
    for (int i = 0; i < code->n_inputs; ++i) {
      wants_grad = wants_grad || regs[i].requires_grad();
      tangents = tangents || regs[i]._fw_grad(/*level=*/0).defined();
      inference = inference || regs[i].is_inference();  // its views have no version counter to share
    }
    // forward-mode AD: the per-op path computes tangents
    fused = wants_grad && !tangents && !inference;
  }
  if (fused && !run_with_one_node(code, regs)) {
    fused = false;  // run again with per-op autograd (fused calls never free their inputs)
  }
  if (!fused) {
    for (const Instr& in : code->instrs) run_one(regs, in);
  }
}

PyObject* segment_call(PyObject* obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<SegmentObject*>(obj);
  const std::shared_ptr<const Code>& code = *self->code;
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr || nargs != code->n_inputs) {
    PyErr_SetString(PyExc_TypeError, "d2s native segment called with the wrong arguments");
    return nullptr;
  }
  // A torch function mode (`with torch.device(...)`, ...) or a tensor
  // subclass (it may override __torch_function__) must see the Python calls:
  // run the Python path.
  if (at::impl::torch_function_mode_enabled()) {
    return fall_back(self, "a torch function mode is active");
  }
  std::vector<at::Tensor> regs(code->n_regs);
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* a = args[i];
    if (!THPVariable_CheckExact(a)) {
      return fall_back(self, "an input is not a plain tensor");
    }
    regs[i] = THPVariable_Unpack(a);
  }
  Collect warnings;
  bool failed = false;
  std::string error;
  {
    Py_BEGIN_ALLOW_THREADS
    try {
      c10::WarningUtils::WarningHandlerGuard guard(&warnings);
      run_code(code, regs, self->fused_autograd);
    } catch (const c10::Error& e) {
      failed = true;
      error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      failed = true;
      error = e.what();
    }
    Py_END_ALLOW_THREADS
  }
  if (failed && PyErr_Occurred()) {
    // A Python hook an op called raised (a saved-tensor hook: checkpoint's
    // recomputation stops early by raising from one): its exception
    // propagates, as from the op's binding; the Python path would run the
    // ops the segment already ran once more.
    return nullptr;
  }
  if (failed) {
    return fall_back(self, error);
  }
  for (const auto& w : warnings.items) {
    if (PyErr_WarnEx(w.deprecation ? PyExc_DeprecationWarning : PyExc_UserWarning, w.msg.c_str(), 1) < 0) {
      return nullptr;  // warnings raised as errors: as the binding would
    }
  }
  const auto& outs = code->outputs;
  for (int o : outs) {
    // Never hand Python None for a tensor: a layout mistake costs speed (the
    // Python path runs), not a wrong value.
    if (!regs[o].defined()) return fall_back(self, "an output register holds no tensor");
  }
  if (outs.size() == 1) return THPVariable_Wrap(std::move(regs[outs[0]]));
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
  if (tuple == nullptr) return nullptr;
  for (size_t i = 0; i < outs.size(); ++i) {
    PyObject* v = THPVariable_Wrap(regs[outs[i]]);
    if (v == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), v);
  }
  return tuple;
}

bool read_ints(PyObject* seq, std::vector<int64_t>& out) {
  PyObject* fast = PySequence_Fast(seq, "a list of ints");
  if (fast == nullptr) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
    out.push_back(v);
  }
  Py_DECREF(fast);
  return true;
}

// The number as the binding reads it: bool, then int (int64), then float.
bool read_scalar(PyObject* v, c10::Scalar& out) {
  if (PyBool_Check(v)) {
    out = c10::Scalar(v == Py_True);
  } else if (PyLong_Check(v)) {
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return false;
    out = c10::Scalar(static_cast<int64_t>(x));
  } else if (PyFloat_Check(v)) {
    out = c10::Scalar(PyFloat_AsDouble(v));
  } else {
    PyErr_SetString(PyExc_TypeError, "d2s native segment: a scalar operand must be a bool, int or float");
    return false;
  }
  return true;
}

bool read_regs(PyObject* seq, int n_regs, std::vector<int>& out) {
  std::vector<int64_t> ints;
  if (!read_ints(seq, ints)) return false;
  for (int64_t r : ints) {
    if (r < 0 || r >= n_regs) {
      PyErr_SetString(PyExc_ValueError, "d2s native segment: register out of range");
      return false;
    }
    out.push_back(static_cast<int>(r));
  }
  return true;
}

bool read_operand(PyObject* item, int n_regs, Operand& o) {
  int kind;
  PyObject* value;
  if (!PyArg_ParseTuple(item, "iO", &kind, &value)) return false;
  o.kind = kind;
  switch (kind) {
    case K_REG:
      o.reg = static_cast<int>(PyLong_AsLong(value));
      if (o.reg < 0 || o.reg >= n_regs) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "d2s native segment: register out of range");
        return false;
      }
      return true;
    case K_SCALAR:
      return read_scalar(value, o.scalar);
    case K_WRAPPED:
      if (!read_scalar(value, o.scalar)) return false;
      o.wrapped = at::native::wrapped_scalar_tensor(o.scalar);
      return true;
    case K_INTS:
      return read_ints(value, o.ints);
    case K_NONE:
      return true;
    case K_DTYPE:
      if (!THPDtype_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "d2s native segment: expected a torch.dtype");
        return false;
      }
      o.dtype = reinterpret_cast<THPDtype*>(value)->scalar_type;
      return true;
    case K_STR: {
      const char* s = PyUnicode_AsUTF8(value);
      if (s == nullptr) return false;
      o.str = s;
      return true;
    }
    case K_REGS:
      return read_regs(value, n_regs, o.regs);
    default:
      PyErr_Format(PyExc_ValueError, "d2s native segment: unknown operand kind %d", kind);
      return false;
  }
}

// A Segment or a Flow (flow.h) holding `code` (owned: deleted with the object).
template <class Object, class CodeHolder>
PyObject* new_object(PyTypeObject* type, vectorcallfunc call, CodeHolder* code, bool fused_autograd) {
  auto* self = reinterpret_cast<Object*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    delete code;
    return nullptr;
  }
  self->vectorcall = call;
  self->code = code;
  self->fused_autograd = fused_autograd;
  self->fallbacks = 0;
  self->last_fallback = new std::string();
  return reinterpret_cast<PyObject*>(self);
}

template <class Object>
void dealloc_object(PyObject* obj) {
  auto* self = reinterpret_cast<Object*>(obj);
  delete self->code;
  delete self->last_fallback;
  Py_TYPE(obj)->tp_free(obj);
}

PyObject* segment_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  int n_regs, n_inputs, fused_autograd = 0;
  PyObject *instrs, *outputs;
  if (!PyArg_ParseTuple(args, "iiOO|p", &n_regs, &n_inputs, &instrs, &outputs, &fused_autograd)) return nullptr;
  if (n_inputs > n_regs || n_inputs < 0) {
    PyErr_SetString(PyExc_ValueError, "d2s native segment: bad register layout");
    return nullptr;
  }
  auto built = std::make_shared<Code>();
  built->n_regs = n_regs;
  built->n_inputs = n_inputs;
  auto* code = &built->instrs;
  auto* outs = &built->outputs;
  try {
    PyObject* fast = PySequence_Fast(instrs, "instructions must be a sequence");
    if (fast == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
      PyObject *op_args, *op_outs, *op_frees;
      Instr in;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "iOOO", &in.op, &op_args, &op_outs, &op_frees)) {
        Py_DECREF(fast);
        return nullptr;
      }
      bool ok = in.op >= 0 && in.op < OP_COUNT;
      if (!ok) PyErr_Format(PyExc_ValueError, "d2s native segment: unknown opcode %d", in.op);
      PyObject* arg_fast = ok ? PySequence_Fast(op_args, "operands must be a sequence") : nullptr;
      ok = arg_fast != nullptr;
      for (Py_ssize_t j = 0; ok && j < PySequence_Fast_GET_SIZE(arg_fast); ++j) {
        in.args.emplace_back();
        ok = read_operand(PySequence_Fast_GET_ITEM(arg_fast, j), n_regs, in.args.back());
      }
      Py_XDECREF(arg_fast);
      ok = ok && read_regs(op_outs, n_regs, in.outs) && read_regs(op_frees, n_regs, in.frees) && !in.outs.empty();
      if (!ok) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "d2s native segment: an instruction has no output");
        Py_DECREF(fast);
        return nullptr;
      }
      code->push_back(std::move(in));
    }
    Py_DECREF(fast);
    if (!read_regs(outputs, n_regs, *outs)) return nullptr;
    if (outs->empty()) {
      PyErr_SetString(PyExc_ValueError, "d2s native segment: no outputs");
      return nullptr;
    }
    plan_fused(*built);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  return new_object<SegmentObject>(type, segment_call, new std::shared_ptr<const Code>(std::move(built)),
                                   fused_autograd != 0);
}

PyObject* segment_size(PyObject* obj, PyObject*) {
  return PyLong_FromSize_t((*reinterpret_cast<SegmentObject*>(obj)->code)->instrs.size());
}

PyObject* segment_codes(PyObject* obj, PyObject*) {
  const auto& code = (*reinterpret_cast<SegmentObject*>(obj)->code)->instrs;
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(code.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < code.size(); ++i) {
    PyObject* v = PyLong_FromLong(code[i].op);
    if (v == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), v);
  }
  return list;
}

// `fallbacks()` and `last_fallback()` of a Segment or a Flow (flow.h).
template <class Object>
PyObject* count_fallbacks(PyObject* obj, PyObject*) {
  return PyLong_FromSsize_t(reinterpret_cast<Object*>(obj)->fallbacks);
}

template <class Object>
PyObject* why_fallback(PyObject* obj, PyObject*) {
  const std::string& why = *reinterpret_cast<Object*>(obj)->last_fallback;
  return PyUnicode_DecodeUTF8(why.data(), static_cast<Py_ssize_t>(why.size()), "replace");
}

PyObject* segment_fused(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<SegmentObject*>(obj);
  return PyBool_FromLong(self->fused_autograd && (*self->code)->fusable);
}

PyMethodDef segment_methods[] = {
    {"fused", segment_fused, METH_NOARGS, "whether grad-mode calls record one autograd node (the fast level)"},
    {"fallbacks", count_fallbacks<SegmentObject>, METH_NOARGS, "how many calls left their ops to Python"},
    {"last_fallback", why_fallback<SegmentObject>, METH_NOARGS, "why the last of those did"},
    {"size", segment_size, METH_NOARGS, "the number of instructions"},
    {"codes", segment_codes, METH_NOARGS, "the opcode of every instruction, in order"},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject SegmentType = {PyVarObject_HEAD_INIT(nullptr, 0)};

#include "flow.h"  // control flow: uses Code, run_code, Collect, read_regs, SegmentType

PyObject* opcodes(PyObject*, PyObject*) {
  PyObject* d = PyDict_New();
  if (d == nullptr) return nullptr;
  for (int i = 0; i < OP_COUNT; ++i) {
    PyObject* v = PyLong_FromLong(i);
    if (v == nullptr || PyDict_SetItemString(d, kOpNames[i], v) < 0) {
      Py_XDECREF(v);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(v);
  }
  return d;
}

PyObject* operand_kinds(PyObject*, PyObject*) {
  return Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "reg", K_REG, "scalar", K_SCALAR, "wrapped", K_WRAPPED,
                       "ints", K_INTS, "none", K_NONE, "dtype", K_DTYPE, "str", K_STR, "regs", K_REGS);
}

// torch.autograd.grad(loss, inputs, grad_outputs=grad, retain_graph=retain,
// allow_unused=True) for plain tensors (the caller checks: no subclass, so
// no __torch_function__), without its Python layers: the same engine call
// (torch::autograd::grad is what the Python function reaches), with the GIL
// released as there, and its errors raised as there (HANDLE_TH_ERRORS
// restores a Python exception raised by a hook, and maps c10's errors to
// the Python types torch's bindings use).
// args: (loss, (inputs...), grad or None, retain_graph: None or bool) -> tuple, None for an unused input.
PyObject* autograd_grad(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *loss_obj, *inputs_obj, *grad_obj, *retain_obj;
  if (!PyArg_ParseTuple(args, "OO!OO", &loss_obj, &PyTuple_Type, &inputs_obj, &grad_obj, &retain_obj)) return nullptr;
  if (!THPVariable_Check(loss_obj) || (grad_obj != Py_None && !THPVariable_Check(grad_obj)) ||
      (retain_obj != Py_None && !PyBool_Check(retain_obj))) {
    PyErr_SetString(PyExc_TypeError, "autograd_grad: expected (tensor, (tensors...), tensor or None, bool or None)");
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(inputs_obj);
  torch::autograd::variable_list inputs;
  inputs.reserve(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GET_ITEM(inputs_obj, i);
    if (!THPVariable_Check(item)) {
      PyErr_SetString(PyExc_TypeError, "autograd_grad: inputs must be tensors");
      return nullptr;
    }
    inputs.push_back(THPVariable_Unpack(item));
  }
  torch::autograd::variable_list outputs{THPVariable_Unpack(loss_obj)};
  torch::autograd::variable_list grad_outputs;
  if (grad_obj != Py_None) grad_outputs.push_back(THPVariable_Unpack(grad_obj));
  std::optional<bool> retain;
  if (retain_obj != Py_None) retain = retain_obj == Py_True;
  torch::autograd::variable_list grads;
  {
    pybind11::gil_scoped_release no_gil;
    grads = torch::autograd::grad(outputs, inputs, grad_outputs, retain, /*create_graph=*/false,
                                  /*allow_unused=*/true);
  }
  PyObject* out = PyTuple_New(n);
  if (out == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = grads[i].defined() ? THPVariable_Wrap(std::move(grads[i])) : (Py_INCREF(Py_None), Py_None);
    if (item == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, i, item);
  }
  return out;
  END_HANDLE_TH_ERRORS
}

// `loss.backward()` of a plain scalar tensor: the engine call eager's
// `torch.autograd.backward` ends in (accumulate_grad=true), so the leaves get
// their `.grad` through eager's AccumulateGrad nodes: its layout rule for a new
// `.grad`, its in-place sum into an existing one, tensor hooks and
// post-accumulate-grad hooks alike. Python's `_make_grads` seeds a scalar with
// `ones_like`, as torch::autograd::backward does; a loss with a `gradient`
// argument takes the Python path (its shape check raises Python's message).
PyObject* autograd_backward(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *loss_obj, *retain_obj;
  if (!PyArg_ParseTuple(args, "OO", &loss_obj, &retain_obj)) return nullptr;
  if (!THPVariable_Check(loss_obj) || (retain_obj != Py_None && !PyBool_Check(retain_obj))) {
    PyErr_SetString(PyExc_TypeError, "autograd_backward: expected (tensor, bool or None)");
    return nullptr;
  }
  torch::autograd::variable_list outputs{THPVariable_Unpack(loss_obj)};
  std::optional<bool> retain;
  if (retain_obj != Py_None) retain = retain_obj == Py_True;
  {
    pybind11::gil_scoped_release no_gil;
    torch::autograd::backward(outputs, {}, retain, /*create_graph=*/false);
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// One parameter group of a torch.optim.SGD whose `step()` is exactly the
// single-tensor path's calls made here: numbers (an int or a float, not a
// bool or a tensor) for lr, momentum, dampening and weight decay, bools for
// nesterov and maximize, differentiable, foreach and fused off, and plain
// CPU tensors for the parameters (a subclass may override
// __torch_function__; elsewhere SGD picks its foreach kernels by default).
// optimizer_ops._plain_sgd_groups is the same test in Python.
struct SgdGroup {
  c10::Scalar lr, momentum, dampening, decay;
  bool nesterov = false, maximize = false;
  // The parameters' objects, held: reading the state later may run Python
  // (a `__missing__`), which could drop them from the group's list.
  std::vector<pybind11::object> objects;
  std::vector<at::Tensor> params;
};

// The keys of a param group and of a parameter's state, as interned strings
// made once: a lookup then hashes nothing (PyDict_GetItemString makes and
// hashes a new string on every call). Null when they could not be made (a
// Python error is set).
struct GroupKeys {
  PyObject *lr, *momentum, *dampening, *weight_decay, *nesterov, *maximize, *differentiable, *foreach, *fused, *params,
      *momentum_buffer;
};

const GroupKeys* group_keys() {
  static const GroupKeys keys{
      PyUnicode_InternFromString("lr"),        PyUnicode_InternFromString("momentum"),
      PyUnicode_InternFromString("dampening"), PyUnicode_InternFromString("weight_decay"),
      PyUnicode_InternFromString("nesterov"),  PyUnicode_InternFromString("maximize"),
      PyUnicode_InternFromString("differentiable"), PyUnicode_InternFromString("foreach"),
      PyUnicode_InternFromString("fused"),     PyUnicode_InternFromString("params"),
      PyUnicode_InternFromString("momentum_buffer")};
  static const bool made = keys.lr && keys.momentum && keys.dampening && keys.weight_decay && keys.nesterov &&
                           keys.maximize && keys.differentiable && keys.foreach && keys.fused && keys.params &&
                           keys.momentum_buffer;
  return made ? &keys : nullptr;
}

// 1: `group` is such a group (read into `out`); 0: it is not; -1: a Python error.
int read_sgd_group(PyObject* group, SgdGroup& out) {
  const GroupKeys* keys = group_keys();
  if (keys == nullptr) return -1;
  if (!PyDict_Check(group)) return 0;
  // A setting as Python passes it to the calls: an int stays an int Scalar.
  auto number = [group](PyObject* key, c10::Scalar& value) {
    PyObject* obj = PyDict_GetItemWithError(group, key);
    if (obj != nullptr && PyFloat_CheckExact(obj)) {
      value = c10::Scalar(PyFloat_AS_DOUBLE(obj));
      return true;
    }
    if (obj == nullptr || !PyLong_CheckExact(obj)) return false;
    const long long n = PyLong_AsLongLong(obj);
    if (n == -1 && PyErr_Occurred()) {  // beyond int64: Python's own calls say what they do with it
      PyErr_Clear();
      return false;
    }
    value = c10::Scalar(static_cast<int64_t>(n));
    return true;
  };
  auto flag = [group](PyObject* key, bool& value) {
    PyObject* obj = PyDict_GetItemWithError(group, key);
    if (obj != Py_True && obj != Py_False) return false;
    value = obj == Py_True;
    return true;
  };
  if (!number(keys->lr, out.lr) || !number(keys->momentum, out.momentum) ||
      !number(keys->dampening, out.dampening) || !number(keys->weight_decay, out.decay) ||
      !flag(keys->nesterov, out.nesterov) || !flag(keys->maximize, out.maximize))
    return PyErr_Occurred() ? -1 : 0;  // (a key's __eq__ may raise in a lookup)
  for (PyObject* key : {keys->differentiable, keys->foreach, keys->fused}) {
    PyObject* obj = PyDict_GetItemWithError(group, key);  // absent reads as None, as `group.get(key)`
    const int on = obj == nullptr ? 0 : PyObject_IsTrue(obj);
    if (on != 0) return on < 0 ? -1 : 0;  // -1: its truth raised
  }
  PyObject* params = PyDict_GetItemWithError(group, keys->params);
  if (params == nullptr || !PyList_Check(params)) return PyErr_Occurred() ? -1 : 0;
  const Py_ssize_t n = PyList_GET_SIZE(params);
  out.objects.reserve(n);
  out.params.reserve(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* p = PyList_GET_ITEM(params, i);
    if (!THPVariable_CheckExact(p)) return 0;
    const at::Tensor& tensor = THPVariable_Unpack(p);
    if (!tensor.is_cpu()) return 0;
    out.objects.push_back(pybind11::reinterpret_borrow<pybind11::object>(p));
    out.params.push_back(tensor);
  }
  return 1;
}

// Whether the momentum buffers `state` already holds for the group's
// parameters are plain tensors (a subclass may override __torch_function__,
// which SGD's calls on it would reach), read without making entries: 1, 0,
// or -1 on a Python error.
int plain_buffers(const SgdGroup& g, PyObject* state, PyObject* key) {
  if (!PyDict_Check(state)) return 0;
  for (const pybind11::object& p : g.objects) {
    PyObject* entry = PyDict_GetItemWithError(state, p.ptr());  // (no __missing__: nothing made)
    if (entry == nullptr) {
      if (PyErr_Occurred()) return -1;
      continue;
    }
    if (!PyDict_Check(entry)) return 0;
    PyObject* buf = PyDict_GetItemWithError(entry, key);
    if (buf == nullptr && PyErr_Occurred()) return -1;
    if (buf != nullptr && buf != Py_None && !THPVariable_CheckExact(buf)) return 0;
  }
  return 1;
}

bool scalar_is_zero(const c10::Scalar& s) { return s.isIntegral(false) ? s.toLong() == 0 : s.toDouble() == 0; }

// `_single_tensor_sgd`'s calls for one group, in its order, under no_grad,
// for the parameters that have a gradient (`bufs`: their momentum buffers,
// undefined where there is none yet, or empty without momentum).
void sgd_group_update(const SgdGroup& g, std::vector<at::Tensor>& params, std::vector<at::Tensor>& bufs) {
  const bool with_momentum = !scalar_is_zero(g.momentum);
  const bool with_decay = !scalar_is_zero(g.decay);
  // `-lr` and `1 - dampening` as Python computes them (an int stays an int).
  const c10::Scalar neg_lr = g.lr.isIntegral(false) ? c10::Scalar(-g.lr.toLong()) : c10::Scalar(-g.lr.toDouble());
  const c10::Scalar keep = g.dampening.isIntegral(false) ? c10::Scalar(1 - g.dampening.toLong())
                                                         : c10::Scalar(1 - g.dampening.toDouble());
  pybind11::gil_scoped_release no_gil;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& param = params[i];
    const at::Tensor& own = param.grad();
    at::Tensor grad = g.maximize ? own.neg() : own;
    if (with_decay) grad = grad.add(param, g.decay);
    if (with_momentum) {
      at::Tensor& buf = bufs[i];
      if (!buf.defined()) {
        buf = grad.detach().clone();
      } else {
        buf.mul_(g.momentum).add_(grad, keep);
      }
      grad = g.nesterov ? grad.add(buf, g.momentum) : buf;
    }
    param.add_(grad, neg_lr);
  }
}

// `opt.step()` of a torch.optim.SGD (optimizer_ops checks the optimizer
// itself: its class, hooks, profiler) without its Python layers, when every
// group is one `read_sgd_group` accepts: each group in order, its buffers
// read from `state` before and written there after, as SGD.step does (an
// entry made only for a parameter with a gradient). Returns False, having
// done nothing, when a group is not, or a torch function mode is on (it
// must see the Python calls).
// args: (param_groups: list, state: the optimizer's defaultdict(dict)) -> bool
PyObject* sgd_step(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *groups_obj, *state;
  if (!PyArg_ParseTuple(args, "OO", &groups_obj, &state)) return nullptr;
  const GroupKeys* keys = group_keys();
  if (keys == nullptr) return nullptr;
  if (at::impl::torch_function_mode_enabled() || !PyList_Check(groups_obj)) Py_RETURN_FALSE;
  const Py_ssize_t n_groups = PyList_GET_SIZE(groups_obj);
  std::vector<SgdGroup> groups(n_groups);
  for (Py_ssize_t k = 0; k < n_groups; ++k) {
    int plain = read_sgd_group(PyList_GET_ITEM(groups_obj, k), groups[k]);
    if (plain > 0 && !scalar_is_zero(groups[k].momentum)) plain = plain_buffers(groups[k], state, keys->momentum_buffer);
    if (plain < 0) return nullptr;
    if (plain == 0) Py_RETURN_FALSE;
  }
  for (const SgdGroup& g : groups) {
    const bool with_momentum = !scalar_is_zero(g.momentum);
    std::vector<at::Tensor> params, bufs;
    std::vector<pybind11::object> entries;  // the state dicts of `params`, with momentum
    for (size_t i = 0; i < g.params.size(); ++i) {
      if (!g.params[i].grad().defined()) continue;  // torch.optim skips it
      params.push_back(g.params[i]);
      if (!with_momentum) continue;
      // `state[p]`: a new {} for a parameter without one, as SGD's own read makes it.
      PyObject* entry = PyObject_GetItem(state, g.objects[i].ptr());
      if (entry == nullptr) return nullptr;
      entries.push_back(pybind11::reinterpret_steal<pybind11::object>(entry));
      PyObject* buf = PyDict_Check(entry) ? PyDict_GetItemWithError(entry, keys->momentum_buffer) : nullptr;
      if (PyErr_Occurred()) return nullptr;
      if (!PyDict_Check(entry) || (buf != nullptr && buf != Py_None && !THPVariable_CheckExact(buf))) {
        PyErr_SetString(PyExc_TypeError, "SGD's state: expected a dict holding a tensor as its momentum_buffer");
        return nullptr;
      }
      bufs.push_back(buf == nullptr || buf == Py_None ? at::Tensor() : THPVariable_Unpack(buf));
    }
    sgd_group_update(g, params, bufs);
    for (size_t i = 0; i < entries.size(); ++i) {
      PyObject* buf = THPVariable_Wrap(bufs[i]);
      const bool failed = buf == nullptr || PyDict_SetItem(entries[i].ptr(), keys->momentum_buffer, buf) < 0;
      Py_XDECREF(buf);
      if (failed) return nullptr;
    }
  }
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

// Optimizer.zero_grad(set_to_none=True)'s loop (optimizer_ops checks the
// optimizer): `p.grad = None` for each parameter of each group, which for a
// plain tensor is this reset (the setter's own). Returns False, having done
// nothing, for anything else (a subclass may override the setter; a torch
// function mode sees the setter called).
// args: param_groups (a list of dicts holding "params" lists) -> bool
PyObject* zero_grads(PyObject*, PyObject* groups_obj) {
  HANDLE_TH_ERRORS
  const GroupKeys* keys = group_keys();
  if (keys == nullptr) return nullptr;
  if (at::impl::torch_function_mode_enabled() || !PyList_Check(groups_obj)) Py_RETURN_FALSE;
  std::vector<at::Tensor> params;
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(groups_obj); ++k) {
    PyObject* group = PyList_GET_ITEM(groups_obj, k);
    PyObject* list = PyDict_Check(group) ? PyDict_GetItemWithError(group, keys->params) : nullptr;
    if (list == nullptr || !PyList_Check(list)) {
      if (PyErr_Occurred()) return nullptr;
      Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
      PyObject* p = PyList_GET_ITEM(list, i);
      if (!THPVariable_CheckExact(p)) Py_RETURN_FALSE;
      params.push_back(THPVariable_Unpack(p));
    }
  }
  for (at::Tensor& p : params) p.mutable_grad().reset();
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef module_methods[] = {
    {"opcodes", opcodes, METH_NOARGS, "opcode name -> number"},
    {"autograd_grad", autograd_grad, METH_VARARGS, "torch.autograd.grad(..., allow_unused=True) of plain tensors"},
    {"autograd_backward", autograd_backward, METH_VARARGS, "torch.autograd.backward(loss) of a plain scalar tensor"},
    {"sgd_step", sgd_step, METH_VARARGS, "torch.optim.SGD.step() of plain CPU parameter groups, or False"},
    {"zero_grads", zero_grads, METH_O, "Optimizer.zero_grad(set_to_none=True) of plain parameters, or False"},
    {"operand_kinds", operand_kinds, METH_NOARGS, "operand kind name -> number"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "d2s_native", "d2s native segments", -1, module_methods};

// Readies the type of a Segment or a Flow and adds it to the module as `name`.
template <class Object>
bool add_type(PyObject* module, PyTypeObject& type, const char* name, const char* qualified, newfunc make,
              PyMethodDef* methods, const char* doc) {
  type.tp_name = qualified;
  type.tp_basicsize = sizeof(Object);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  type.tp_vectorcall_offset = offsetof(Object, vectorcall);
  type.tp_call = PyVectorcall_Call;
  type.tp_new = make;
  type.tp_dealloc = dealloc_object<Object>;
  type.tp_methods = methods;
  type.tp_doc = doc;
  if (PyType_Ready(&type) < 0) return false;
  Py_INCREF(&type);
  if (PyModule_AddObject(module, name, reinterpret_cast<PyObject*>(&type)) < 0) {
    Py_DECREF(&type);
    return false;
  }
  return true;
}

}  // namespace

PyMODINIT_FUNC PyInit_d2s_native(void) {
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  if (!add_type<SegmentObject>(m, SegmentType, "Segment", "d2s_native.Segment", segment_new, segment_methods,
                               "A straight-line run of program ops run by ATen calls (see segment.cpp).") ||
      !add_type<FlowObject>(m, FlowType, "Flow", "d2s_native.Flow", flow_new, flow_methods,
                            "A while or cond op whose blocks run as segments, in one C++ call (see flow.h).")) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
