// d2s native control flow: a `while` or `cond` op whose blocks lower to
// segments runs as one C++ call (runtime/native/lower_flow.py builds it).
//
// Included by segment.cpp inside its anonymous namespace: a flow's
// straight-line runs are Segments (their Code runs through `run_code`, so the
// ATen calls, the autograd graph and the fast level's fused nodes are exactly
// those of the segment calls the generated Python would make), and between
// them the flow does what the generated Python does: Python int/bool
// arithmetic of the `scalars` pass (`ctr + 1`, `ctr < n`, `not broke`),
// `py.index` into `loop_slices`' unbound views, `fill_constant` of such a
// number, `array_append`, the fast level's hoisted invariants (a segment
// run while its result is unset), the `if`/`while` tests (`Tensor.__bool__`
// is `is_nonzero`), and the rebinding of loop variables.
//
// Contract with the Python side:
//   Flow(n_regs, input_regs, input_kinds, root_step, output_regs, fused_autograd)
//   flow(*inputs) -> (done, *outputs)
// `done` is True when the op ran to its end. Otherwise nothing observable
// happened after the state handed back, and the generated code runs the
// op's own Python statements from there:
//   - a `cond` (root) hands back (False, None, ...): Python runs the `if`;
//   - a `while` (root) hands back (False, *loop variables) as they were at
//     the head of the trip the flow could not finish (the initial values if
//     it could not start): Python runs that trip and the rest of the loop.
// A trip's ops are pure (segments hold no random or in-place-on-inputs op),
// so a trip abandoned half-way has done nothing but make tensors nobody
// sees; appends to a tensor array reach the Python list only for finished
// trips, and warnings of an abandoned trip are dropped (Python raises them).
// Reasons to give back: an input that is not what the program expects (a
// tensor subclass, ...), a torch function mode, any error (a kernel's, an
// index past the end, int64 overflow, `bool()` of a many-element tensor):
// Python raises eager's error at the user's line.

enum ValueKind : int { V_EMPTY = -1, V_TENSOR = 0, V_INT = 1, V_BOOL = 2, V_LIST = 3, V_SEQ = 4 };

struct Value {
  int kind = V_EMPTY;
  int64_t i = 0;  // V_INT / V_BOOL: the value; V_LIST / V_SEQ: its index in the call's lists / seqs
  at::Tensor t;   // V_TENSOR
};

enum StepKind : int { S_SEG = 0, S_SCALAR = 1, S_INDEX = 2, S_APPEND = 3, S_COND = 4, S_WHILE = 5, S_TENSOR = 6 };

// The `scalars` pass's Python operators, on Python ints and bools.
enum ScalarOp : int { P_CONST = 0, P_ADD, P_SUB, P_MUL, P_LT, P_LE, P_GT, P_GE, P_EQ, P_NE, P_AND, P_OR, P_NOT };

struct ScalarArg {
  int reg = -1;    // a register, or -1 for the constant
  Value constant;  // V_INT or V_BOOL
};

struct Step;
using Steps = std::vector<Step>;

struct Step {
  int kind = S_SEG;
  std::shared_ptr<const Code> code;  // S_SEG
  bool once = false;                 // S_SEG: a hoisted invariant, run while its result is unset
  int op = 0;                        // S_SCALAR
  std::vector<ScalarArg> args;       // S_SCALAR
  std::vector<int> ins;   // S_SEG: the segment's inputs; S_INDEX: seq, index; S_APPEND: list, tensor;
                          // S_COND: the test; S_WHILE: the loop variables
  std::vector<int> outs;  // results (S_COND, S_WHILE: the op's outputs)
  Steps first, second;    // S_COND: the branches; S_WHILE: the test block, the body
  std::vector<int> srcs0; // S_COND: the true branch's values; S_WHILE: the body's values of the loop variables
  std::vector<int> srcs1; // S_COND: the false branch's values; S_WHILE: the initial values
  int test = -1;          // S_WHILE: the test block's result
  std::vector<int> frees; // registers dead after this step
};

struct FlowCode {
  int n_regs = 0;
  std::vector<int> input_regs, input_kinds, output_regs;
  Step root;
};

// The tensor arrays (Python lists) a call appends to: the list, what this
// call appended, and how many of those belong to finished trips.
struct ListState {
  PyObject* list;
  std::vector<at::Tensor> added;
  size_t committed = 0;
};

struct FlowRun {
  const FlowCode& code;
  bool fused_autograd;
  std::vector<Value> regs;
  std::vector<ListState> lists;
  std::vector<std::vector<at::Tensor>> seqs;
  Collect warnings;
  size_t committed_warnings = 0;
  // The root `while`, if the flow is one: its loop variables at the head of
  // the current trip are what the call hands back if the trip fails.
  const Step* root_loop = nullptr;
  PyThreadState* released = nullptr;  // the thread state while the GIL is released
  uint64_t trips = 0;
};

// Thrown when a signal handler raised (Ctrl-C): the Python exception is set.
struct Interrupted {};

// Python checks for signals between bytecodes, so its `while` loop can be
// interrupted; the flow checks every 64 trips (a GIL round trip each).
void check_signals(FlowRun& run) {
  if ((++run.trips & 63) != 0 || run.released == nullptr) return;
  PyEval_RestoreThread(run.released);
  int raised = PyErr_CheckSignals();
  run.released = PyEval_SaveThread();
  if (raised != 0) throw Interrupted();
}

[[noreturn]] void flow_error(const std::string& why) { throw std::runtime_error(why); }

bool truth(const Value& v) {
  switch (v.kind) {
    case V_TENSOR: return v.t.is_nonzero();  // what Tensor.__bool__ calls
    case V_INT: case V_BOOL: return v.i != 0;
    default: flow_error("d2s flow: the truth of a list");
  }
}

const Value& scalar_arg(const FlowRun& run, const ScalarArg& a) {
  const Value& v = a.reg < 0 ? a.constant : run.regs[a.reg];
  if (v.kind != V_INT && v.kind != V_BOOL) flow_error("d2s flow: a scalar operand holds no number");
  return v;
}

Value scalar_step(const FlowRun& run, const Step& s) {
  Value out;
  out.kind = V_INT;
  if (s.op == P_CONST) return s.args[0].constant;
  const Value& a = scalar_arg(run, s.args[0]);
  if (s.op == P_NOT) {
    out.kind = V_BOOL;
    out.i = a.i == 0;
    return out;
  }
  const Value& b = scalar_arg(run, s.args[1]);
  int64_t r = 0;
  switch (s.op) {
    // Python ints never overflow: past int64 the Python path computes it.
    case P_ADD: if (__builtin_add_overflow(a.i, b.i, &r)) flow_error("int64 overflow"); out.i = r; return out;
    case P_SUB: if (__builtin_sub_overflow(a.i, b.i, &r)) flow_error("int64 overflow"); out.i = r; return out;
    case P_MUL: if (__builtin_mul_overflow(a.i, b.i, &r)) flow_error("int64 overflow"); out.i = r; return out;
    case P_AND: return a.i == 0 ? a : b;  // Python's `a and b` is one of its operands
    case P_OR: return a.i != 0 ? a : b;
    default: break;
  }
  out.kind = V_BOOL;
  switch (s.op) {
    case P_LT: out.i = a.i < b.i; break;
    case P_LE: out.i = a.i <= b.i; break;
    case P_GT: out.i = a.i > b.i; break;
    case P_GE: out.i = a.i >= b.i; break;
    case P_EQ: out.i = a.i == b.i; break;
    case P_NE: out.i = a.i != b.i; break;
    default: flow_error("d2s flow: unknown scalar op");
  }
  return out;
}

void run_steps(FlowRun& run, const Steps& steps);

void run_segment_step(FlowRun& run, const Step& s) {
  if (s.once && run.regs[s.outs[0]].kind != V_EMPTY) return;  // computed in an earlier trip
  std::vector<at::Tensor> local(s.code->n_regs);
  for (size_t k = 0; k < s.ins.size(); ++k) {
    const Value& v = run.regs[s.ins[k]];
    if (v.kind != V_TENSOR) flow_error("d2s flow: a segment input holds no tensor");
    local[k] = v.t;
  }
  run_code(s.code, local, run.fused_autograd);
  for (size_t k = 0; k < s.outs.size(); ++k) {
    at::Tensor& t = local[s.code->outputs[k]];
    if (!t.defined()) flow_error("d2s flow: an output register holds no tensor");
    Value& out = run.regs[s.outs[k]];
    out.kind = V_TENSOR;
    out.t = std::move(t);
  }
}

// Copies `srcs` into `dsts` as one parallel assignment (a loop variable may
// be another's new value).
void assign(FlowRun& run, const std::vector<int>& dsts, const std::vector<int>& srcs) {
  std::vector<Value> values;
  values.reserve(srcs.size());
  for (int r : srcs) values.push_back(run.regs[r]);
  for (size_t k = 0; k < dsts.size(); ++k) run.regs[dsts[k]] = std::move(values[k]);
}

void run_while(FlowRun& run, const Step& s) {
  const bool root = &s == run.root_loop;  // nested loops resume with their enclosing trip
  if (s.srcs1 != s.ins) assign(run, s.ins, s.srcs1);
  while (true) {
    if (root) {
      // The head of a trip: everything before it is kept, whatever happens next.
      for (ListState& l : run.lists) l.committed = l.added.size();
      run.committed_warnings = run.warnings.items.size();
    }
    run_steps(run, s.first);
    if (!truth(run.regs[s.test])) break;
    run_steps(run, s.second);
    assign(run, s.ins, s.srcs0);
    check_signals(run);
  }
  assign(run, s.outs, s.ins);
}

void run_step(FlowRun& run, const Step& s) {
  switch (s.kind) {
    case S_SEG: run_segment_step(run, s); break;
    case S_SCALAR: run.regs[s.outs[0]] = scalar_step(run, s); break;
    case S_INDEX: {
      const Value& seq = run.regs[s.ins[0]];
      const Value& index = run.regs[s.ins[1]];
      if (seq.kind != V_SEQ || (index.kind != V_INT && index.kind != V_BOOL)) flow_error("d2s flow: bad index");
      const auto& items = run.seqs[seq.i];
      int64_t i = index.i < 0 ? index.i + static_cast<int64_t>(items.size()) : index.i;
      if (i < 0 || i >= static_cast<int64_t>(items.size())) flow_error("tuple index out of range");
      Value out;
      out.kind = V_TENSOR;
      out.t = items[i];
      run.regs[s.outs[0]] = std::move(out);
      break;
    }
    case S_APPEND: {
      const Value& list = run.regs[s.ins[0]];
      const Value& x = run.regs[s.ins[1]];
      if (list.kind != V_LIST || x.kind != V_TENSOR) flow_error("d2s flow: bad append");
      run.lists[list.i].added.push_back(x.t);
      run.regs[s.outs[0]] = list;
      break;
    }
    case S_TENSOR: {
      // `fill_constant` of a Python int/bool: `torch.tensor(v, dtype=int64 or bool)`, no history.
      const Value& v = run.regs[s.ins[0]];
      if (v.kind != V_INT && v.kind != V_BOOL) flow_error("d2s flow: fill_constant of a non-number");
      Value out;
      out.kind = V_TENSOR;
      out.t = v.kind == V_INT ? at::scalar_tensor(v.i, at::kLong) : at::scalar_tensor(v.i != 0, at::kBool);
      run.regs[s.outs[0]] = std::move(out);
      break;
    }
    case S_COND: {
      bool taken = truth(run.regs[s.ins[0]]);
      run_steps(run, taken ? s.first : s.second);
      assign(run, s.outs, taken ? s.srcs0 : s.srcs1);
      break;
    }
    case S_WHILE: run_while(run, s); break;
    default: flow_error("d2s flow: unknown step");
  }
  for (int r : s.frees) run.regs[r] = Value();
}

void run_steps(FlowRun& run, const Steps& steps) {
  for (const Step& s : steps) run_step(run, s);
}

// -- the Python type ---------------------------------------------------------------

struct FlowObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  FlowCode* code;
  bool fused_autograd;
  Py_ssize_t fallbacks;
  std::string* last_fallback;
};

// Reads the call's inputs into registers; false (nothing done) when one is
// not of the kind the program expects.
bool read_inputs(FlowRun& run, PyObject* const* args, std::string& why) {
  const FlowCode& code = run.code;
  for (size_t k = 0; k < code.input_regs.size(); ++k) {
    PyObject* a = args[k];
    Value v;
    v.kind = code.input_kinds[k];
    switch (v.kind) {
      case V_TENSOR:
        if (!THPVariable_CheckExact(a)) return why = "an input is not a plain tensor", false;
        v.t = THPVariable_Unpack(a);
        break;
      case V_INT: {
        int overflow = 0;
        if (!PyLong_CheckExact(a)) return why = "an input is not a Python int", false;
        long long x = PyLong_AsLongLongAndOverflow(a, &overflow);
        if (overflow != 0) return why = "an int input past int64", false;
        v.i = x;
        break;
      }
      case V_BOOL:
        if (!PyBool_Check(a)) return why = "an input is not a Python bool", false;
        v.i = a == Py_True;
        break;
      case V_LIST: {
        if (!PyList_CheckExact(a)) return why = "a tensor array is not a list", false;
        size_t i = 0;
        while (i < run.lists.size() && run.lists[i].list != a) ++i;  // one list under two names: one state
        if (i == run.lists.size()) run.lists.push_back({a, {}, 0});
        v.i = static_cast<int64_t>(i);
        break;
      }
      case V_SEQ: {
        if (!PyTuple_CheckExact(a)) return why = "a sequence input is not a tuple", false;
        std::vector<at::Tensor> items;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(a); ++j) {
          PyObject* item = PyTuple_GET_ITEM(a, j);
          if (!THPVariable_CheckExact(item)) return why = "a sequence item is not a plain tensor", false;
          items.push_back(THPVariable_Unpack(item));
        }
        v.i = static_cast<int64_t>(run.seqs.size());
        run.seqs.push_back(std::move(items));
        break;
      }
      default:
        return why = "an input of an unknown kind", false;
    }
    run.regs[code.input_regs[k]] = std::move(v);
  }
  return true;
}

PyObject* to_python(const FlowRun& run, const Value& v, PyObject* original) {
  switch (v.kind) {
    case V_TENSOR: return THPVariable_Wrap(v.t);
    case V_INT: return PyLong_FromLongLong(v.i);
    case V_BOOL: return PyBool_FromLong(v.i != 0);
    case V_LIST: Py_INCREF(run.lists[v.i].list); return run.lists[v.i].list;
    default:
      // A sequence (only ever an input) or nothing: what the caller gave.
      if (original == nullptr) Py_RETURN_NONE;
      Py_INCREF(original);
      return original;
  }
}

// (done, *values): `values` are the output registers, or on a give-back the
// root loop's variables at the failed trip's head (the arguments as given
// when the flow did not `start`; a `cond`: Nones).
PyObject* flow_result(FlowRun& run, bool done, bool started, PyObject* const* args) {
  const FlowCode& code = run.code;
  const size_t n = code.output_regs.size();
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(n + 1));
  if (tuple == nullptr) return nullptr;
  PyTuple_SET_ITEM(tuple, 0, PyBool_FromLong(done));
  for (size_t k = 0; k < n; ++k) {
    PyObject* v;
    if (!done && run.root_loop != nullptr && !started) {
      v = args[k];  // a root loop's variable k is its input k
      Py_INCREF(v);
    } else if (done || run.root_loop != nullptr) {
      v = to_python(run, run.regs[code.output_regs[k]], run.root_loop != nullptr ? args[k] : nullptr);
    } else {
      v = Py_None;
      Py_INCREF(v);
    }
    if (v == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(k + 1), v);
  }
  return tuple;
}

PyObject* flow_give_back(FlowObject* self, FlowRun& run, PyObject* const* args, const std::string& why,
                         bool started) {
  ++self->fallbacks;
  *self->last_fallback = why;
  return flow_result(run, false, started, args);
}

// Appends the finished trips' elements to the Python lists and raises their warnings.
bool flow_commit(FlowRun& run, bool done) {
  for (ListState& l : run.lists) {
    size_t n = done ? l.added.size() : l.committed;
    for (size_t j = 0; j < n; ++j) {
      PyObject* t = THPVariable_Wrap(l.added[j]);
      if (t == nullptr || PyList_Append(l.list, t) < 0) {
        Py_XDECREF(t);
        return false;
      }
      Py_DECREF(t);
    }
  }
  size_t n = done ? run.warnings.items.size() : run.committed_warnings;
  for (size_t j = 0; j < n; ++j) {
    const auto& w = run.warnings.items[j];
    if (PyErr_WarnEx(w.deprecation ? PyExc_DeprecationWarning : PyExc_UserWarning, w.msg.c_str(), 1) < 0) {
      return false;  // warnings raised as errors: as the binding would
    }
  }
  return true;
}

PyObject* flow_call(PyObject* obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<FlowObject*>(obj);
  const FlowCode& code = *self->code;
  if (kwnames != nullptr || PyVectorcall_NARGS(nargsf) != static_cast<Py_ssize_t>(code.input_regs.size())) {
    PyErr_SetString(PyExc_TypeError, "d2s native flow called with the wrong arguments");
    return nullptr;
  }
  FlowRun run{code, self->fused_autograd};
  run.regs.resize(code.n_regs);
  if (code.root.kind == S_WHILE) run.root_loop = &code.root;
  if (at::impl::torch_function_mode_enabled()) {
    return flow_give_back(self, run, args, "a torch function mode is active", false);
  }
  std::string why;
  if (!read_inputs(run, args, why)) return flow_give_back(self, run, args, why, false);
  bool failed = false, interrupted = false;
  run.released = PyEval_SaveThread();
  try {
    c10::WarningUtils::WarningHandlerGuard guard(&run.warnings);
    run_step(run, code.root);
  } catch (const Interrupted&) {
    interrupted = true;
  } catch (const c10::Error& e) {
    failed = true;
    why = e.what_without_backtrace();
  } catch (const std::exception& e) {
    failed = true;
    why = e.what();
  }
  PyEval_RestoreThread(run.released);
  if (interrupted) return nullptr;  // the handler's exception (KeyboardInterrupt) propagates
  if (failed && PyErr_Occurred()) {  // a Python hook's exception propagates (segment_call says why)
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    bool committed = flow_commit(run, false);
    if (committed) {
      PyErr_Restore(type, value, traceback);
    } else {
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(traceback);
    }
    return nullptr;
  }
  if (!flow_commit(run, !failed)) return nullptr;
  if (failed) return flow_give_back(self, run, args, why, true);
  return flow_result(run, true, true, args);
}

// -- building a flow from its description (lower_flow.py) -------------------------------

bool read_steps(PyObject* seq, int n_regs, Steps& out);

bool read_reg_list(PyObject* seq, int n_regs, std::vector<int>& out) { return read_regs(seq, n_regs, out); }

bool read_one_reg(PyObject* v, int n_regs, int& out) {
  long r = PyLong_AsLong(v);
  if (r == -1 && PyErr_Occurred()) return false;
  if (r < 0 || r >= n_regs) {
    PyErr_SetString(PyExc_ValueError, "d2s native flow: register out of range");
    return false;
  }
  out = static_cast<int>(r);
  return true;
}

bool read_scalar_value(PyObject* v, Value& out) {
  if (PyBool_Check(v)) {
    out.kind = V_BOOL;
    out.i = v == Py_True;
    return true;
  }
  int overflow = 0;
  long long x = PyLong_Check(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : 0;
  if (!PyLong_Check(v) || overflow != 0 || (x == -1 && PyErr_Occurred())) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "d2s native flow: a constant must be an int64 or bool");
    return false;
  }
  out.kind = V_INT;
  out.i = x;
  return true;
}

// One step: (kind, ...) as lower_flow.py writes it; the last item is the frees.
bool read_step(PyObject* item, int n_regs, Step& s) {
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 2) {
    PyErr_SetString(PyExc_ValueError, "d2s native flow: a step must be a tuple");
    return false;
  }
  auto at = [&](Py_ssize_t i) { return PyTuple_GET_ITEM(item, i); };
  Py_ssize_t n = PyTuple_GET_SIZE(item);
  s.kind = static_cast<int>(PyLong_AsLong(at(0)));
  if (!read_reg_list(at(n - 1), n_regs, s.frees)) return false;
  auto reg = [&](PyObject* v, int& out) { return read_one_reg(v, n_regs, out); };
  switch (s.kind) {
    case S_SEG: {  // (S_SEG, segment, ins, outs, once, frees)
      if (n != 6 || Py_TYPE(at(1)) != &SegmentType) break;
      s.code = *reinterpret_cast<SegmentObject*>(at(1))->code;
      s.once = PyObject_IsTrue(at(4)) == 1;
      return read_reg_list(at(2), n_regs, s.ins) && read_reg_list(at(3), n_regs, s.outs) &&
             s.ins.size() == static_cast<size_t>(s.code->n_inputs) && s.outs.size() == s.code->outputs.size();
    }
    case S_SCALAR: {  // (S_SCALAR, op, [(reg or -1, constant)], out, frees)
      if (n != 5) break;
      s.op = static_cast<int>(PyLong_AsLong(at(1)));
      PyObject* fast = PySequence_Fast(at(2), "scalar operands");
      if (fast == nullptr) return false;
      bool ok = true;
      for (Py_ssize_t j = 0; ok && j < PySequence_Fast_GET_SIZE(fast); ++j) {
        ScalarArg a;
        PyObject *r, *c;
        ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, j), "OO", &r, &c);
        if (ok && r == Py_None) {
          ok = read_scalar_value(c, a.constant);
        } else if (ok) {
          ok = reg(r, a.reg);
        }
        s.args.push_back(a);
      }
      Py_DECREF(fast);
      s.outs.resize(1);
      return ok && reg(at(3), s.outs[0]) && s.op >= P_CONST && s.op <= P_NOT &&
             s.args.size() == (s.op == P_CONST || s.op == P_NOT ? 1u : 2u);
    }
    case S_INDEX: case S_APPEND: case S_TENSOR:  // (kind, [a, b] or [a], out, frees)
      if (n != 4) break;
      s.outs.resize(1);
      return read_reg_list(at(1), n_regs, s.ins) && s.ins.size() == (s.kind == S_TENSOR ? 1u : 2u) &&
             reg(at(2), s.outs[0]);
    case S_COND:  // (S_COND, test, then, else, then_srcs, else_srcs, outs, frees)
      if (n != 8) break;
      s.ins.resize(1);
      return reg(at(1), s.ins[0]) && read_steps(at(2), n_regs, s.first) && read_steps(at(3), n_regs, s.second) &&
             read_reg_list(at(4), n_regs, s.srcs0) && read_reg_list(at(5), n_regs, s.srcs1) &&
             read_reg_list(at(6), n_regs, s.outs) && s.srcs0.size() == s.outs.size() &&
             s.srcs1.size() == s.outs.size();
    case S_WHILE:  // (S_WHILE, inits, loop_vars, test_steps, test, body, body_srcs, outs, frees)
      if (n != 9) break;
      return read_reg_list(at(1), n_regs, s.srcs1) && read_reg_list(at(2), n_regs, s.ins) &&
             read_steps(at(3), n_regs, s.first) && reg(at(4), s.test) && read_steps(at(5), n_regs, s.second) &&
             read_reg_list(at(6), n_regs, s.srcs0) && read_reg_list(at(7), n_regs, s.outs) &&
             s.srcs1.size() == s.ins.size() && s.srcs0.size() == s.ins.size() && s.outs.size() == s.ins.size();
    default:
      break;
  }
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "d2s native flow: a malformed step");
  return false;
}

bool read_steps(PyObject* seq, int n_regs, Steps& out) {
  PyObject* fast = PySequence_Fast(seq, "steps must be a sequence");
  if (fast == nullptr) return false;
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(fast); ++i) {
    out.emplace_back();
    ok = read_step(PySequence_Fast_GET_ITEM(fast, i), n_regs, out.back());
  }
  Py_DECREF(fast);
  return ok;
}

PyObject* flow_new(PyTypeObject* type, PyObject* args, PyObject*) {
  int n_regs, fused_autograd = 0;
  PyObject *input_regs, *input_kinds, *root, *output_regs;
  if (!PyArg_ParseTuple(args, "iOOOO|p", &n_regs, &input_regs, &input_kinds, &root, &output_regs, &fused_autograd)) {
    return nullptr;
  }
  auto code = std::make_unique<FlowCode>();
  code->n_regs = n_regs;
  std::vector<int64_t> kinds;
  if (!read_reg_list(input_regs, n_regs, code->input_regs) || !read_ints(input_kinds, kinds) ||
      !read_step(root, n_regs, code->root) || !read_reg_list(output_regs, n_regs, code->output_regs)) {
    return nullptr;
  }
  code->input_kinds.assign(kinds.begin(), kinds.end());
  if (code->input_kinds.size() != code->input_regs.size() ||
      (code->root.kind != S_WHILE && code->root.kind != S_COND) ||
      (code->root.kind == S_WHILE && code->output_regs.size() > code->input_regs.size())) {
    PyErr_SetString(PyExc_ValueError, "d2s native flow: bad layout");
    return nullptr;
  }
  return new_object<FlowObject>(type, flow_call, code.release(), fused_autograd != 0);
}

PyMethodDef flow_methods[] = {
    {"fallbacks", count_fallbacks<FlowObject>, METH_NOARGS, "how many calls gave (part of) the op back to Python"},
    {"last_fallback", why_fallback<FlowObject>, METH_NOARGS, "why the last of those did"},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject FlowType = {PyVarObject_HEAD_INIT(nullptr, 0)};
