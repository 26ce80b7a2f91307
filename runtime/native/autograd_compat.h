// What differs between the PyTorch releases the native executor builds
// against, in one place: where autograd's Node is declared, and the pointer
// autograd holds nodes by (std::shared_ptr with `deleteNode` as deleter up
// to PyTorch 2.11, c10::intrusive_ptr after). Nodes are made with
// `make_node<T>()`; the rest of the code passes them as `auto`, so an Edge
// or set_history takes whichever pointer the release uses.
#pragma once

#if __has_include(<torch/csrc/autograd/node.h>)
#include <torch/csrc/autograd/node.h>
#else
#include <torch/csrc/autograd/function.h>
#endif
#include <torch/csrc/autograd/edge.h>

#include <memory>
#include <type_traits>

namespace d2s_autograd {

using NodePtr = decltype(torch::autograd::Edge::function);

template <class T>
auto make_node() {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    // autograd's own deleter, which frees long chains of nodes without deep
    // recursion; found by argument-dependent lookup (T derives from Node),
    // since releases without it must still compile this discarded branch.
    return std::shared_ptr<T>(new T(), [](auto* node) { deleteNode(node); });
  } else {
    return c10::make_intrusive<T>();
  }
}

}  // namespace d2s_autograd
