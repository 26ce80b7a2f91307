// The kernels' own time (benchmarks/floor.py): each workload of
// benchmarks/speed.py written as the ATen calls eager makes, in a C++ loop,
// with no Python between them. Built by floor.py with the native
// extension's toolchain (runtime/native: same compiler, flags, torch).
// Autograd records as in eager (grad mode is the caller's), so with grad
// on this is the floor of the kernels plus their per-op autograd nodes.
// The training step runs eager's backward (the autograd engine, from C++)
// and SGD's update kernels.

#include <Python.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

namespace {

using at::Tensor;

bool tensors(PyObject* seq, std::vector<Tensor>& out) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of tensors");
  if (!fast) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(fast, i);
    if (!THPVariable_Check(item)) {
      Py_DECREF(fast);
      PyErr_SetString(PyExc_TypeError, "expected tensors");
      return false;
    }
    out.push_back(THPVariable_Unpack(item));
  }
  Py_DECREF(fast);
  return true;
}

// Runs `body` with Python errors for C++ exceptions.
template <typename F>
PyObject* guarded(F body) {
  try {
    return body();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// LSTMLoop: h, c zeros; `for t in range(length)`: lstm_cell on x[:, t].
// args: (x, length, hidden, [w_ih, w_hh, b_ih, b_hh])
PyObject* lstm_loop(PyObject*, PyObject* args) {
  PyObject *x_obj, *ws_obj;
  long long length, hidden;
  if (!PyArg_ParseTuple(args, "OLLO", &x_obj, &length, &hidden, &ws_obj)) return nullptr;
  std::vector<Tensor> w;
  if (!tensors(ws_obj, w)) return nullptr;
  Tensor x = THPVariable_Unpack(x_obj);
  return guarded([&]() {
    Tensor h = at::zeros({x.size(0), hidden});
    Tensor c = at::zeros({x.size(0), hidden});
    auto steps = x.unbind(1);
    for (long long t = 0; t < length; ++t) {
      std::tie(h, c) = at::lstm_cell(steps[t], {h, c}, w[0], w[1], w[2], w[3]);
    }
    return THPVariable_Wrap(std::move(h));
  });
}

// DeepResidual: x = x + tanh(linear(x, w, b)) per layer, then the tensor if.
// args: (x, [w0, b0, w1, b1, ...])
PyObject* deep_residual(PyObject*, PyObject* args) {
  PyObject *x_obj, *ws_obj;
  if (!PyArg_ParseTuple(args, "OO", &x_obj, &ws_obj)) return nullptr;
  std::vector<Tensor> w;
  if (!tensors(ws_obj, w)) return nullptr;
  Tensor x = THPVariable_Unpack(x_obj);
  return guarded([&]() {
    for (size_t k = 0; k + 1 < w.size(); k += 2) x = at::add(x, at::tanh(at::linear(x, w[k], w[k + 1])));
    bool positive = at::gt(at::mean(x), 0).item<bool>();
    Tensor out = positive ? at::mul(x, at::scalar_to_tensor(0.5)) : at::sub(x, at::scalar_to_tensor(1.0));
    return THPVariable_Wrap(std::move(out));
  });
}

// GreedyDecoder: `while step < max_len`, break once every sequence is done.
// args: (h, max_len, eos, [embed, w_ih, w_hh, b_ih, b_hh, out_w, out_b]) -> (tokens, step)
PyObject* decoder(PyObject*, PyObject* args) {
  PyObject *h_obj, *ws_obj;
  long long max_len, eos;
  if (!PyArg_ParseTuple(args, "OLLO", &h_obj, &max_len, &eos, &ws_obj)) return nullptr;
  std::vector<Tensor> w;
  if (!tensors(ws_obj, w)) return nullptr;
  Tensor h = THPVariable_Unpack(h_obj);
  return guarded([&]() -> PyObject* {
    Tensor token = at::zeros({h.size(0)}, at::kLong);
    Tensor done = at::zeros({h.size(0)}, at::kBool);
    std::vector<Tensor> tokens;
    long long step = 0;
    while (step < max_len) {
      h = at::gru_cell(at::embedding(w[0], token, -1, false, false), h, w[1], w[2], w[3], w[4]);
      token = at::argmax(at::linear(h, w[5], w[6]), -1);
      tokens.push_back(token);
      done = at::bitwise_or(done, at::eq(token, eos));
      step += 1;
      if (at::all(done).item<bool>()) break;
    }
    PyObject* out = THPVariable_Wrap(at::stack(tokens, 1));
    return Py_BuildValue("(NL)", out, step);
  });
}

// ConvNet: two conv+relu+max_pool2d, flatten, linear.
// args: (x, [w1, b1, w2, b2, wf, bf])
PyObject* conv_net(PyObject*, PyObject* args) {
  PyObject *x_obj, *ws_obj;
  if (!PyArg_ParseTuple(args, "OO", &x_obj, &ws_obj)) return nullptr;
  std::vector<Tensor> w;
  if (!tensors(ws_obj, w)) return nullptr;
  Tensor x = THPVariable_Unpack(x_obj);
  return guarded([&]() {
    x = at::max_pool2d(at::relu(at::conv2d(x, w[0], w[1], 1, 1)), 2);
    x = at::max_pool2d(at::relu(at::conv2d(x, w[2], w[3], 1, 1)), 2);
    return THPVariable_Wrap(at::linear(x.flatten(1), w[4], w[5]));
  });
}

// MLPLoss's training step as speed.py runs it: zero_grad(set_to_none=True),
// cross_entropy of Linear-ReLU-Linear-ReLU-Linear, backward, then SGD's
// update (no momentum: `param.add_(grad, alpha=-lr)` under no_grad, its
// single-tensor path on the CPU). args: (x, y, lr, [w0, b0, w1, b1, w2, b2]) -> loss
PyObject* mlp_step(PyObject*, PyObject* args) {
  PyObject *x_obj, *y_obj, *ws_obj;
  double lr;
  if (!PyArg_ParseTuple(args, "OOdO", &x_obj, &y_obj, &lr, &ws_obj)) return nullptr;
  std::vector<Tensor> w;
  if (!tensors(ws_obj, w)) return nullptr;
  Tensor x = THPVariable_Unpack(x_obj);
  Tensor y = THPVariable_Unpack(y_obj);
  return guarded([&]() {
    Tensor loss;
    // The engine runs without the GIL (as loss.backward() releases it).
    PyThreadState* saved = PyEval_SaveThread();
    try {
      for (Tensor& p : w) p.mutable_grad() = Tensor();
      Tensor h = at::relu(at::linear(x, w[0], w[1]));
      h = at::relu(at::linear(h, w[2], w[3]));
      loss = at::cross_entropy_loss(at::linear(h, w[4], w[5]), y, {}, at::Reduction::Mean, -100, 0.0);
      torch::autograd::backward({loss});
      at::NoGradGuard no_grad;
      for (Tensor& p : w) p.add_(p.grad(), -lr);
    } catch (...) {
      PyEval_RestoreThread(saved);
      throw;
    }
    PyEval_RestoreThread(saved);
    return THPVariable_Wrap(std::move(loss));
  });
}

PyMethodDef methods[] = {
    {"lstm_loop", lstm_loop, METH_VARARGS, nullptr},
    {"deep_residual", deep_residual, METH_VARARGS, nullptr},
    {"decoder", decoder, METH_VARARGS, nullptr},
    {"conv_net", conv_net, METH_VARARGS, nullptr},
    {"mlp_step", mlp_step, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "d2s_floor", "d2s floor references", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_d2s_floor(void) { return PyModule_Create(&module_def); }
