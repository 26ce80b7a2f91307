// torch.gru_cell with one autograd node and eager's gradients, bit for bit.
// Included by segment.cpp after lstm_cell.h (whose Addmm, plain() and
// recomputation scheme it shares).
//
// On CPU, at::gru_cell is a composite (ATen's GRUCell<CellParams>):
//   ig = linear(x, w_ih, b_ih).unsafe_chunk(3, 1)      addmm(b_ih, x, w_ih.t())
//   hg = linear(hx, w_hh, b_hh).unsafe_chunk(3, 1)     addmm(b_hh, hx, w_hh.t())
//   r  = hg[0].add_(ig[0]).sigmoid_()
//   z  = hg[1].add_(ig[1]).sigmoid_()
//   n  = ig[2].add(hg[2].mul_(r)).tanh_()
//   hy = (hx - n).mul_(z).add_(n)
// and with grad mode on records 16 autograd nodes. `exact_gru_cell` makes
// the same calls under no_grad and records one node, `D2SGruCellBackward`,
// whose backward makes the calls eager's nodes make (derivatives.yaml:
// add's and sub's pass-through and negation, mul's grad * other,
// tanh_backward, sigmoid_backward, unsafe_split's cat with the chunks in
// order, addmm's stride-dependent mm formulas and t()), on tensors equal to
// eager's and laid out as eager's.
//
// Two of the calls are made out of place where eager writes in place:
// `hg[2] * r` for `hg[2].mul_(r)` and `s * z` for `(hx - n).mul_(z)`
// (s = hx - n). Eager's MulBackward0 keeps a copy of the overwritten
// operand for the other operand's gradient; here the operand itself is
// kept. Multiplication is exactly rounded, so the products are equal bit for
// bit; every transcendental (sigmoid_, tanh_) and its backward runs on the
// very layouts eager's run on (the chunks, the fresh [batch, hidden] sum).
//
// Why the gradients are eager's exactly (the argument of lstm_cell.h, per
// buffer): each value is made by the same kernel from equal operands, and
// where eager sums several contributions to one tensor the order is kept.
// Inside the cell, eager sums two contributions: new_gate's (add_'s pass-
// through, then sub's negation: two terms, so the order cannot matter) and
// hx's (SubBackward0's, which runs before the hh AddmmBackward0's: higher
// sequence number). The node has two edges to hx, in that order, so the
// engine's buffer for hx sums them where eager does; contributions from
// outside the cell come before (nodes made after the cell) or after (nodes
// made before it) both, as in eager, since the cell's 16 nodes have
// consecutive sequence numbers. What would break that argument takes
// at::gru_cell (eager's per-op nodes): see `d2s_lstm::eligible`, checked
// here with GRU's shapes.
//
// Not the same as eager, by design: the grad_fn is this one node, and double
// backward (create_graph=True) runs the same formulas on a recomputation of
// the cell from its inputs (with history): first-order gradients are eager's
// bit for bit, second-order ones equal up to rounding. The recomputation
// reads the inputs, so an input written in place since the call is refused
// there.

namespace d2s_gru {

using at::Tensor;
using d2s_lstm::Addmm;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// The cell's inputs, in at::gru_cell's argument order.
enum Input : int { X = 0, HX, W_IH, W_HH, B_IH, B_HH, N_INPUTS };
// The node's edges: hx twice (through `hx - n`, then through linear_hh, the
// order eager's buffer for hx receives them).
enum Edge : int { E_X = 0, E_HX_SUB, E_HX_MM, E_W_IH, E_W_HH, E_B_IH, E_B_HH, N_EDGES };

struct Intermediates {
  Tensor r, z, n;        // the gates after activation (r, z: chunks of linear_hh's result)
  Tensor hg2;            // hg[2] before it is multiplied by r (what eager's MulBackward0 copies)
  Tensor s;              // hx - n (what the other MulBackward0 copies)
  Tensor w_ih_t, w_hh_t; // recomputed only: the weights' t() with history (Addmm::input_grad)
};

// The composite's calls, in its order, under the caller's grad mode.
Intermediates cell_ops(const Tensor& x, const Tensor& hx, const Tensor& w_ih_t, const Tensor& w_hh_t,
                       const Tensor& b_ih, const Tensor& b_hh, Tensor& hy) {
  Intermediates m;
  auto ig = at::addmm(b_ih, x, w_ih_t).unsafe_chunk(3, 1);
  auto hg = at::addmm(b_hh, hx, w_hh_t).unsafe_chunk(3, 1);
  m.r = hg[0].add_(ig[0]).sigmoid_();
  m.z = hg[1].add_(ig[1]).sigmoid_();
  m.hg2 = hg[2];
  m.n = ig[2].add(m.hg2 * m.r).tanh_();
  m.s = hx - m.n;
  hy = (m.s * m.z).add_(m.n);
  if (torch::autograd::GradMode::is_enabled()) {
    m.w_ih_t = w_ih_t;
    m.w_hh_t = w_hh_t;
  }
  return m;
}

// One call's state.
struct State {
  Addmm ih, hh;                // what eager's two AddmmBackward0 keep (version-checked at backward)
  Intermediates saved;         // made under no_grad at the call (nothing outside can write them)
  bool gates_req = false;      // the gates carry gradient (x, hx, a weight or a bias does)
  std::array<Tensor, N_INPUTS> inputs;  // double backward: the inputs and their versions at the call
  std::array<uint32_t, N_INPUTS> versions{};
  std::optional<Intermediates> recomputed;
  bool released = false;

  std::array<SavedVariable*, 4> saved_variables() { return {&ih.mat1, &ih.mat2, &hh.mat1, &hh.mat2}; }

  void release() {
    for (SavedVariable* v : saved_variables()) v->reset_data();
    saved = Intermediates();
    for (auto& t : inputs) t.reset();
    recomputed.reset();
    released = true;
  }

  // The saved intermediates, or under create_graph=True a recomputation
  // whose results carry history.
  const Intermediates& intermediates() {
    TORCH_CHECK(!released, torch::autograd::ERR_BACKWARD_TWICE);
    if (!torch::autograd::GradMode::is_enabled()) return saved;
    if (!recomputed) {
      static const char* names[N_INPUTS] = {"input", "hx", "w_ih", "w_hh", "b_ih", "b_hh"};
      for (SavedVariable* v : saved_variables()) v->unpack();  // eager's version errors first
      for (int k = 0; k < N_INPUTS; ++k) {
        TORCH_CHECK(inputs[k]._version() == versions[k],
                    std::string("d2s: double backward (create_graph=True) through gru_cell recomputes the cell "
                                "from its inputs, and its ") + names[k] +
                        " argument was modified by an inplace operation after the call");  // no iostreams: segment.cpp
      }
      Tensor hy;
      recomputed = cell_ops(inputs[X], inputs[HX], inputs[W_IH].t(), inputs[W_HH].t(), inputs[B_IH], inputs[B_HH],
                            hy);
    }
    return *recomputed;
  }
};

struct GruBackward : public torch::autograd::Node {
  std::shared_ptr<State> st;

  std::string name() const override { return "D2SGruCellBackward"; }
  void release_variables() override { st->release(); }
  bool wants(int k) { return task_should_compute_output(static_cast<size_t>(k)); }

  variable_list apply(variable_list&& grads) override {
    variable_list out = gradients(grads[0]);
    st->recomputed.reset();
    return out;
  }

  variable_list gradients(const Tensor& grad) {
    const Intermediates& m = st->intermediates();
    variable_list out(N_EDGES);
    if (!grad.defined()) return out;
    bool need_gates = st->gates_req && (wants(E_X) || wants(E_HX_MM) || wants(E_W_IH) || wants(E_W_HH) ||
                                        wants(E_B_IH) || wants(E_B_HH));
    // hy = t.add_(n), t = s.mul_(z), s = hx - n: AddBackward0 passes grad
    // to t and n; MulBackward0 gives s grad * z, z grad * s; SubBackward0
    // gives hx the former and n its negation.
    Tensor grad_s = grad * m.z;
    if (wants(E_HX_SUB)) out[E_HX_SUB] = grad_s;
    if (!need_gates) return out;
    Tensor grad_z = grad * m.s;
    Tensor grad_a = at::tanh_backward(grad + grad_s.neg(), m.n);  // n's buffer: add_'s grad, then sub's
    // n = ig[2].add(hg[2].mul_(r)).tanh_(): add passes grad_a to both; mul gives hg[2] grad_a * r, r grad_a * hg[2].
    Tensor grad_hg2 = grad_a * m.r;
    Tensor grad_r = at::sigmoid_backward(grad_a * m.hg2, m.r);
    Tensor grad_zg = at::sigmoid_backward(grad_z, m.z);
    // r, z = (hg[k].add_(ig[k])).sigmoid_(): both chunks get the same
    // gradient; unsafe_chunk(3, 1) (UnsafeSplitBackward0) concatenates.
    Tensor grad_ih = at::cat({grad_r, grad_zg, grad_a}, 1);
    Tensor grad_hh = at::cat({grad_r, grad_zg, grad_hg2}, 1);
    // The two addmm (AddmmBackward0) and the weights' t() (TBackward0); a
    // bias gets [batch, 3*hidden], which the engine reduces to its shape
    // exactly as for eager's addmm.
    if (wants(E_X)) out[E_X] = st->ih.input_grad(grad_ih, m.w_ih_t);
    if (wants(E_W_IH)) out[E_W_IH] = st->ih.weight_grad(grad_ih);
    if (wants(E_B_IH)) out[E_B_IH] = grad_ih;
    if (wants(E_HX_MM)) out[E_HX_MM] = st->hh.input_grad(grad_hh, m.w_hh_t);
    if (wants(E_W_HH)) out[E_W_HH] = st->hh.weight_grad(grad_hh);
    if (wants(E_B_HH)) out[E_B_HH] = grad_hh;
    return out;
  }
};

// Whether this call may take the one-node path: lstm_cell.h's conditions
// (grad mode, modes, hooks, plain float/double CPU tensors, no aliasing)
// with GRU's shapes.
bool eligible(const std::array<const Tensor*, N_INPUTS>& in) {
  if (!torch::autograd::GradMode::is_enabled() || torch::autograd::AnomalyMode::is_enabled()) return false;
  if (!at::SavedTensorDefaultHooks::get_tls_state().stack.empty()) return false;
  if (at::autocast::is_autocast_enabled(at::kCPU)) return false;
  if (!(c10::impl::tls_local_dispatch_key_set().included_ - c10::default_included_set).empty()) return false;
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return false;
  const Tensor& x = *in[X];
  if (!x.defined()) return false;
  auto dtype = x.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble) return false;
  bool any_req = false;
  for (const Tensor* t : in) {
    if (!d2s_lstm::plain(*t, dtype)) return false;
    any_req = any_req || t->requires_grad();
  }
  if (!any_req) return false;
  const Tensor& w_hh = *in[W_HH];
  const Tensor& w_ih = *in[W_IH];
  int64_t batch = x.dim() == 2 ? x.size(0) : -1;
  int64_t hidden = w_hh.dim() == 2 ? w_hh.size(1) : -1;
  if (batch <= 0 || hidden <= 0 || x.size(1) <= 0) return false;
  if (w_ih.dim() != 2 || w_ih.size(0) != 3 * hidden || w_ih.size(1) != x.size(1)) return false;
  if (w_hh.size(0) != 3 * hidden) return false;
  if (in[HX]->sizes() != at::IntArrayRef({batch, hidden})) return false;
  for (int k : {B_IH, B_HH}) {
    if (in[k]->sizes() != at::IntArrayRef({3 * hidden})) return false;
  }
  for (int a = 0; a < N_INPUTS; ++a) {
    for (int b = a + 1; b < N_INPUTS; ++b) {
      if (in[a]->is_alias_of(*in[b])) return false;
    }
  }
  return true;
}

// hy of torch.gru_cell(x, hx, w_ih, w_hh, b_ih, b_hh) with one autograd
// node; false (nothing done) when the call must take at::gru_cell.
bool exact_gru_cell(const Tensor& x, const Tensor& hx, const Tensor& w_ih, const Tensor& w_hh,
                    const std::optional<Tensor>& b_ih_opt, const std::optional<Tensor>& b_hh_opt, Tensor& hy) {
  if (!b_ih_opt || !b_hh_opt) return false;
  const Tensor& b_ih = *b_ih_opt;
  const Tensor& b_hh = *b_hh_opt;
  std::array<const Tensor*, N_INPUTS> in = {&x, &hx, &w_ih, &w_hh, &b_ih, &b_hh};
  if (!eligible(in)) return false;

  auto st = std::make_shared<State>();
  auto node = d2s_autograd::make_node<GruBackward>();
  node->st = st;
  node->set_next_edges(torch::autograd::collect_next_edges(x, hx, hx, w_ih, w_hh, b_ih, b_hh));
  Tensor w_ih_t, w_hh_t;
  {
    at::AutoGradMode no_grad(false);
    w_ih_t = d2s_lstm::weight_t(w_ih);
    w_hh_t = d2s_lstm::weight_t(w_hh);
    {
      // Below autograd, as lstm_cell.h's cell: same kernels and values; hy's
      // version is set to eager's, whose composite writes it in place twice
      // (`(hx - n).mul_(z).add_(n)`).
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      st->saved = cell_ops(x, hx, w_ih_t, w_hh_t, b_ih, b_hh, hy);
    }
    torch::autograd::impl::bump_version(hy);
    torch::autograd::impl::bump_version(hy);
  }
  auto req = [&](int k) { return in[k]->requires_grad(); };
  st->gates_req = req(X) || req(HX) || req(W_IH) || req(W_HH) || req(B_IH) || req(B_HH);
  st->ih.save(x, w_ih_t, req(X), req(W_IH));
  st->hh.save(hx, w_hh_t, req(HX), req(W_HH));
  for (int k = 0; k < N_INPUTS; ++k) {
    st->inputs[k] = *in[k];
    st->versions[k] = in[k]->_version();
  }
  torch::autograd::set_history(hy, node);
  return true;
}

}  // namespace d2s_gru
