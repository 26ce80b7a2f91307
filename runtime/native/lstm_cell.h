// torch.lstm_cell with two autograd nodes and eager's gradients, bit for bit.
// Included by segment.cpp (one translation unit, one library).
//
// On CPU, at::lstm_cell is a composite of 15 ATen calls (two addmm through
// at::linear, an in-place add, unsafe_chunk, sigmoid_/tanh_ on the chunks,
// two mul, an add_, a tanh and a mul), and with grad mode on each records an
// autograd node: at the sizes RNN loops use, recording costs about as much
// as the math. `exact_lstm_cell` makes the same calls under no_grad, on the
// same operands in the same order (so values and strides are eager's, bit
// for bit), and records two nodes where eager records 16: `CyBackward`,
// cy's grad_fn, and `HyBackward`, hy's, which feeds cy's node the gradient
// that reaches cy through hy = outgate * tanh(cy), as eager's tanh node does
// (so a hook or retain_grad on cy sees the whole gradient of cy, as in
// eager). Their backward makes the calls eager's nodes make
// (derivatives.yaml and FunctionsManual.cpp: mul's, tanh_backward,
// sigmoid_backward, unsafe_split's cat, addmm's stride-dependent
// mm_mat1/mm_mat2 formulas, t()), on the same tensors.
//
// Why the gradients are eager's exactly, not only close: every value is made
// by the same kernel from the same operands. Where eager sums contributions
// to one tensor, the order is the order its producers run in, and the engine
// runs the ready node with the highest sequence number first; every node
// made after the cell runs before any node of the cell (gradients flow from
// later nodes to earlier ones), so cy's buffer gets the contributions from
// outside the cell, in arrival order, then the one through hy, in both
// graphs, and the cell's contributions to its inputs reach each input's
// buffer at the same place in the order. What would break that argument
// takes at::lstm_cell (per-op nodes, as eager): inputs sharing storage (one
// buffer fed by several of the cell's nodes), forward-mode tangents,
// saved-tensor hooks (they must see every op's saved tensors), anomaly mode
// (per-op tracebacks), autocast, functorch transforms and dispatch modes,
// other devices, dtypes, layouts and shapes.
//
// Not the same as eager, by design: the grad_fns are these two nodes
// ("D2SLstmCellBackward", "D2SLstmCellHyBackward"), and double backward
// (create_graph=True) runs the same formulas on a recomputation of the cell
// from its inputs (with history, so the gradient is differentiable):
// first-order gradients are still eager's bit for bit, second-order ones
// equal up to rounding (the recomputed nodes are made during the backward,
// so the second backward sums in another order). The recomputation reads
// the inputs, so an input written in place since the call is refused there.

#include <ATen/ATen.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "autograd_compat.h"
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

namespace d2s_lstm {

using at::Tensor;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// Edges of cy's node, in the order of at::lstm_cell's arguments.
enum Input : int { X = 0, HX, CX, W_IH, W_HH, B_IH, B_HH, N_INPUTS };

// addmm's gradient for mat1 (FunctionsManual's mm_mat1_backward, alpha 1,
// strided tensors): a column-major mat1 gets its gradient column-major.
Tensor mm_mat1_grad(const Tensor& grad, const Tensor& mat2, at::IntArrayRef sizes, at::IntArrayRef strides) {
  if (strides[0] == 1 && strides[1] == sizes[0]) return mat2.conj().mm(grad.t()).t();
  return grad.mm(mat2.t().conj());
}

// ... and for mat2 (mm_mat2_backward).
Tensor mm_mat2_grad(const Tensor& grad, const Tensor& mat1, at::IntArrayRef sizes, at::IntArrayRef strides) {
  if (strides[0] == 1 && strides[1] == sizes[0]) return grad.t().mm(mat1.conj()).t();
  return mat1.t().conj().mm(grad);
}

// weight.t() as the cell's addmm reads it, made below autograd: a tensor on
// the weight's storage sharing its version counter, so that a write to the
// weight before backward fails the saved variable's version check with
// eager's error (the t() of a weight made under no_grad is a view autograd
// refuses to rebase, with an error about no_grad views instead).
Tensor weight_t(const Tensor& w) {
  Tensor t;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    t = w.t();
  }
  t.unsafeGetTensorImpl()->set_version_counter(w.unsafeGetTensorImpl()->version_counter());
  return t;
}

// What eager's AddmmBackward0 keeps of one `addmm(bias, mat1, weight.t())`,
// and only when it keeps it: mat1 when the weight needs a gradient, mat2
// (weight.t()) when mat1 does, and the sizes/strides its formulas test.
struct Addmm {
  SavedVariable mat1, mat2;
  std::vector<int64_t> mat1_sizes, mat1_strides, mat2_sizes, mat2_strides;

  void save(const Tensor& input, const Tensor& weight_t, bool input_req, bool weight_req) {
    if (weight_req) mat1 = SavedVariable(input, false);
    if (input_req) {
      mat2 = SavedVariable(weight_t, false);
      mat1_sizes = input.sizes().vec();
      mat1_strides = input.strides().vec();
    }
    mat2_sizes = weight_t.sizes().vec();
    mat2_strides = weight_t.strides().vec();
  }

  // The input's gradient. `recomputed_t`: under create_graph, the weight's
  // t() with history (the saved one, made under no_grad, has none, and the
  // next order must reach the weight through it); the saved one is
  // unpacked either way, for eager's version check.
  Tensor input_grad(const Tensor& grad, const Tensor& recomputed_t) const {
    Tensor t = mat2.unpack();
    return mm_mat1_grad(grad, recomputed_t.defined() ? recomputed_t : t, mat1_sizes, mat1_strides);
  }

  // The weight's gradient (TBackward0 of mm_mat2_backward's).
  Tensor weight_grad(const Tensor& grad) const {
    return mm_mat2_grad(grad, mat1.unpack(), mat2_sizes, mat2_strides).t();
  }
};

// What the gradient formulas read besides the saved inputs.
struct Intermediates {
  Tensor gates;                // addmm(b_hh, hx, w_hh.t()).add_(addmm(b_ih, x, w_ih.t())), activated in place
  std::array<Tensor, 4> gate;  // its chunks after activation: ingate, forgetgate, cellgate, outgate
  Tensor tanh_cy;
  Tensor w_ih_t, w_hh_t;       // recomputed only: the weights' t() with history (Addmm::input_grad)
};

// The composite's calls, in its order (at::linear of a 2-d input with a bias
// is addmm(bias, input, weight.t())), under the caller's grad mode.
Intermediates cell_ops(const Tensor& x, const Tensor& hx, const Tensor& cx, const Tensor& w_ih_t,
                       const Tensor& w_hh_t, const Tensor& b_ih, const Tensor& b_hh, Tensor& hy, Tensor& cy) {
  Intermediates m;
  m.gates = at::addmm(b_hh, hx, w_hh_t);
  m.gates.add_(at::addmm(b_ih, x, w_ih_t));
  auto chunks = m.gates.unsafe_chunk(4, 1);
  m.gate[0] = chunks[0].sigmoid_();
  m.gate[1] = chunks[1].sigmoid_();
  m.gate[2] = chunks[2].tanh_();
  m.gate[3] = chunks[3].sigmoid_();
  cy = (m.gate[1] * cx).add_(m.gate[0] * m.gate[2]);
  m.tanh_cy = cy.tanh();
  hy = m.gate[3] * m.tanh_cy;
  if (torch::autograd::GradMode::is_enabled()) {
    m.w_ih_t = w_ih_t;
    m.w_hh_t = w_hh_t;
  }
  return m;
}

// One call's state, shared by its two nodes.
struct State {
  // What eager's nodes save, and only when they save it (version-checked
  // at backward, as eager): the two addmm's, and cx, which `forgetgate * cx`
  // keeps when the gates need a gradient.
  Addmm ih, hh;
  SavedVariable cx_;
  Intermediates saved;         // made under no_grad at the call (nothing outside can write them)
  bool gates_req = false;      // the gates carry gradient (x, hx, a weight or a bias does)
  // Double backward: the inputs and their versions at the call, and the
  // recomputation (with history) the two nodes share within one backward.
  std::array<Tensor, N_INPUTS> inputs;
  std::array<uint32_t, N_INPUTS> versions{};
  std::optional<Intermediates> recomputed;
  bool released = false;

  std::array<SavedVariable*, 5> saved_variables() { return {&ih.mat1, &ih.mat2, &hh.mat1, &hh.mat2, &cx_}; }

  void release() {
    for (SavedVariable* v : saved_variables()) v->reset_data();
    saved = Intermediates();
    for (auto& t : inputs) t.reset();
    recomputed.reset();
    released = true;
  }

  // The intermediates the formulas read: the saved ones, or under
  // create_graph=True a recomputation whose results carry history.
  const Intermediates& intermediates() {
    TORCH_CHECK(!released, torch::autograd::ERR_BACKWARD_TWICE);
    if (!torch::autograd::GradMode::is_enabled()) return saved;
    if (!recomputed) {
      static const char* names[N_INPUTS] = {"input", "hx", "cx", "w_ih", "w_hh", "b_ih", "b_hh"};
      for (SavedVariable* v : saved_variables()) v->unpack();  // eager's version errors first
      for (int k = 0; k < N_INPUTS; ++k) {
        TORCH_CHECK(inputs[k]._version() == versions[k],
                    std::string("d2s: double backward (create_graph=True) through lstm_cell recomputes the cell "
                                "from its inputs, and its ") + names[k] +
                        " argument was modified by an inplace operation after the call");  // no iostreams: segment.cpp
      }
      Tensor hy, cy;
      recomputed = cell_ops(inputs[X], inputs[HX], inputs[CX], inputs[W_IH].t(), inputs[W_HH].t(), inputs[B_IH],
                            inputs[B_HH], hy, cy);
    }
    return *recomputed;
  }
};

// cy's grad_fn. Input 0: cy's gradient (from outside, then the part through
// hy, as eager's buffer for cy sums them); input 1: outgate's, from hy's node.
struct CyBackward : public torch::autograd::Node {
  std::shared_ptr<State> st;

  std::string name() const override { return "D2SLstmCellBackward"; }
  void release_variables() override { st->release(); }
  bool wants(int k) { return task_should_compute_output(static_cast<size_t>(k)); }

  variable_list apply(variable_list&& grads) override {
    variable_list out = gradients(grads);
    st->recomputed.reset();  // cy's node runs last of the two in a backward
    return out;
  }

  variable_list gradients(const variable_list& grads) {
    const Intermediates& m = st->intermediates();
    const Tensor& grad_cy = grads[0];
    const Tensor& grad_outgate = grads[1];
    bool need_gates =
        st->gates_req && (wants(X) || wants(HX) || wants(W_IH) || wants(W_HH) || wants(B_IH) || wants(B_HH));
    variable_list out(N_INPUTS);
    // cy = (forgetgate * cx).add_(ingate * cellgate): AddBackward0 hands
    // grad to both products, MulBackward0 is grad * other, grad * self.
    std::array<Tensor, 4> grad_gate;
    if (grad_cy.defined()) {
      if (need_gates) {
        grad_gate[1] = at::sigmoid_backward(grad_cy * st->cx_.unpack(), m.gate[1]);
        grad_gate[0] = at::sigmoid_backward(grad_cy * m.gate[2], m.gate[0]);
        grad_gate[2] = at::tanh_backward(grad_cy * m.gate[0], m.gate[2]);
      }
      if (wants(CX)) out[CX] = grad_cy * m.gate[1];
    }
    if (!need_gates) return out;
    if (grad_outgate.defined()) grad_gate[3] = at::sigmoid_backward(grad_outgate, m.gate[3]);
    // unsafe_chunk(4, 1) (UnsafeSplitBackward0): a chunk with no gradient is zeros.
    std::vector<Tensor> parts;
    for (auto& g : grad_gate) {
      parts.push_back(g.defined() ? g : at::zeros({m.gates.size(0), m.gates.size(1) / 4}, m.gates.options()));
    }
    Tensor grad_gates = at::cat(parts, 1);
    // The two addmm (AddmmBackward0) and the weights' t() (TBackward0). A
    // bias gets the [batch, 4*hidden] gradient, which the engine reduces to
    // the bias's shape exactly as it does for eager's addmm.
    if (wants(X)) out[X] = st->ih.input_grad(grad_gates, m.w_ih_t);
    if (wants(W_IH)) out[W_IH] = st->ih.weight_grad(grad_gates);
    if (wants(B_IH)) out[B_IH] = grad_gates;
    if (wants(HX)) out[HX] = st->hh.input_grad(grad_gates, m.w_hh_t);
    if (wants(W_HH)) out[W_HH] = st->hh.weight_grad(grad_gates);
    if (wants(B_HH)) out[B_HH] = grad_gates;
    return out;
  }
};

// hy's grad_fn: hy = outgate * tanh(cy) (MulBackward0, then TanhBackward0
// for the part that goes on to cy's node).
struct HyBackward : public torch::autograd::Node {
  std::shared_ptr<State> st;
  bool released = false;

  std::string name() const override { return "D2SLstmCellHyBackward"; }
  void release_variables() override { released = true; }  // the state is cy's node's to free

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(!released, torch::autograd::ERR_BACKWARD_TWICE);
    const Intermediates& m = st->intermediates();
    const Tensor& grad_hy = grads[0];
    variable_list out(2);
    if (!grad_hy.defined()) return out;
    if (task_should_compute_output(0)) out[0] = at::tanh_backward(grad_hy * m.gate[3], m.tanh_cy);
    if (st->gates_req && task_should_compute_output(1)) out[1] = grad_hy * m.tanh_cy;
    return out;
  }
};

bool plain(const Tensor& t, at::ScalarType dtype) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.scalar_type() == dtype &&
         !t.is_inference() && !t.is_conj() && !t.is_neg() && !t._is_zerotensor() &&
         !t.unsafeGetTensorImpl()->is_wrapped_number() && !t._fw_grad(/*level=*/0).defined() &&
         !t.key_set().has_any(c10::DispatchKeySet({c10::DispatchKey::FuncTorchBatched,
                                                   c10::DispatchKey::FuncTorchGradWrapper,
                                                   c10::DispatchKey::Python, c10::DispatchKey::Functionalize}));
}

// Whether this call may take the two-node path (see the file's comment).
bool eligible(const std::array<const Tensor*, N_INPUTS>& in) {
  if (!torch::autograd::GradMode::is_enabled() || torch::autograd::AnomalyMode::is_enabled()) return false;
  if (!at::SavedTensorDefaultHooks::get_tls_state().stack.empty()) return false;
  if (at::autocast::is_autocast_enabled(at::kCPU)) return false;
  // A functorch transform or a Python dispatch mode adds keys to the thread's included set.
  if (!(c10::impl::tls_local_dispatch_key_set().included_ - c10::default_included_set).empty()) return false;
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return false;
  const Tensor& x = *in[X];
  if (!x.defined()) return false;
  auto dtype = x.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble) return false;
  bool any_req = false;
  for (const Tensor* t : in) {
    if (!plain(*t, dtype)) return false;
    any_req = any_req || t->requires_grad();
  }
  if (!any_req) return false;
  // Shapes at::lstm_cell accepts, batched; anything else takes its path (and its errors).
  const Tensor& w_hh = *in[W_HH];
  int64_t batch = x.dim() == 2 ? x.size(0) : -1;
  int64_t hidden = w_hh.dim() == 2 ? w_hh.size(1) : -1;
  if (batch <= 0 || hidden <= 0 || x.size(1) <= 0) return false;
  const Tensor& w_ih = *in[W_IH];
  if (w_ih.dim() != 2 || w_ih.size(0) != 4 * hidden || w_ih.size(1) != x.size(1)) return false;
  if (w_hh.size(0) != 4 * hidden) return false;
  for (int k : {HX, CX}) {
    if (in[k]->sizes() != at::IntArrayRef({batch, hidden})) return false;
  }
  for (int k : {B_IH, B_HH}) {
    if (in[k]->sizes() != at::IntArrayRef({4 * hidden})) return false;
  }
  // Inputs sharing memory would have several of the cell's nodes feed one
  // gradient buffer, summed in an order this node does not reproduce.
  for (int a = 0; a < N_INPUTS; ++a) {
    for (int b = a + 1; b < N_INPUTS; ++b) {
      if (in[a]->is_alias_of(*in[b])) return false;
    }
  }
  return true;
}

// hy, cy of torch.lstm_cell(x, (hx, cx), w_ih, w_hh, b_ih, b_hh) with two
// autograd nodes; false (nothing done) when the call must take at::lstm_cell.
bool exact_lstm_cell(const Tensor& x, const Tensor& hx, const Tensor& cx, const Tensor& w_ih, const Tensor& w_hh,
                     const std::optional<Tensor>& b_ih_opt, const std::optional<Tensor>& b_hh_opt,
                     Tensor& hy, Tensor& cy) {
  if (!b_ih_opt || !b_hh_opt) return false;
  const Tensor& b_ih = *b_ih_opt;
  const Tensor& b_hh = *b_hh_opt;
  std::array<const Tensor*, N_INPUTS> in = {&x, &hx, &cx, &w_ih, &w_hh, &b_ih, &b_hh};
  if (!eligible(in)) return false;

  auto st = std::make_shared<State>();
  // cy's node first, as eager makes cy's before hy's (sequence numbers order the backward).
  auto cy_node = d2s_autograd::make_node<CyBackward>();
  cy_node->st = st;
  cy_node->set_next_edges(torch::autograd::collect_next_edges(x, hx, cx, w_ih, w_hh, b_ih, b_hh));
  auto hy_node = d2s_autograd::make_node<HyBackward>();
  hy_node->st = st;
  Tensor w_ih_t, w_hh_t;
  {
    at::AutoGradMode no_grad(false);
    w_hh_t = weight_t(w_hh);
    w_ih_t = weight_t(w_ih);
    {
      // The cell's own calls skip the autograd and ADInplaceOrView kernels,
      // which under no_grad only check there is nothing to record (a large
      // share of each call's time at RNN sizes); same kernels, same values.
      // What those kernels would leave observable is the version of cy,
      // which eager's composite writes in place once: bumped below.
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      st->saved = cell_ops(x, hx, cx, w_ih_t, w_hh_t, b_ih, b_hh, hy, cy);
    }
    torch::autograd::impl::bump_version(cy);
  }
  auto req = [&](int k) { return in[k]->requires_grad(); };
  st->gates_req = req(X) || req(HX) || req(W_IH) || req(W_HH) || req(B_IH) || req(B_HH);
  st->ih.save(x, w_ih_t, req(X), req(W_IH));
  st->hh.save(hx, w_hh_t, req(HX), req(W_HH));
  if (st->gates_req) st->cx_ = SavedVariable(cx, false);
  for (int k = 0; k < N_INPUTS; ++k) {
    st->inputs[k] = *in[k];
    st->versions[k] = in[k]->_version();
  }
  torch::autograd::set_history(cy, cy_node);                   // cy_node input 0
  uint32_t outgate_slot = cy_node->add_input_metadata(st->saved.gate[3]);  // input 1
  hy_node->set_next_edges({torch::autograd::Edge(cy_node, 0), torch::autograd::Edge(cy_node, outgate_slot)});
  torch::autograd::set_history(hy, hy_node);
  return true;
}

}  // namespace d2s_lstm
