#include "mixtrain/model/recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <memory>
#include <utility>

namespace mixtrain {
namespace {

using torch::autograd::variable_list;

thread_local bool t_recomputing = false;  // recomputing()

class RecomputeBackward final : public torch::autograd::Node {
 public:
  RecomputeBackward(RecomputeFn fn, std::vector<torch::Tensor> inputs)
      : fn_(std::move(fn)), inputs_(std::move(inputs)) {}

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(fn_, "recompute_in_backward: backward ran twice (retain_graph is not supported)");
    std::vector<torch::Tensor> leaves;
    leaves.reserve(inputs_.size());
    for (const torch::Tensor& x : inputs_) {
      torch::Tensor leaf = x.defined() ? x.detach() : x;
      if (x.defined() && x.requires_grad()) leaf.requires_grad_(true);
      leaves.push_back(std::move(leaf));
    }
    std::vector<torch::Tensor> outputs;
    {
      at::AutoGradMode enable(true);
      const bool outer = t_recomputing;
      t_recomputing = true;
      try {
        outputs = fn_(leaves);
      } catch (...) {
        t_recomputing = outer;
        throw;
      }
      t_recomputing = outer;
    }
    TORCH_CHECK(outputs.size() == grads.size(), "recompute_in_backward: fn returned ",
                outputs.size(), " outputs in backward, ", grads.size(), " in forward");
    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (grads[i].defined() && outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    variable_list input_grads;
    for (const torch::Tensor& leaf : leaves) {
      input_grads.push_back(leaf.defined() && leaf.requires_grad() ? leaf.grad() : torch::Tensor());
    }
    release_variables();
    return input_grads;
  }

  void release_variables() override {
    inputs_.clear();
    fn_ = nullptr;
  }

 private:
  RecomputeFn fn_;
  std::vector<torch::Tensor> inputs_;
};

}  // namespace

bool recomputing() {
  return t_recomputing;
}

std::vector<torch::Tensor> recompute_in_backward(const RecomputeFn& fn,
                                                 const std::vector<torch::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return fn(inputs);
  std::vector<torch::Tensor> outputs;
  {
    at::NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  auto node = std::shared_ptr<RecomputeBackward>(new RecomputeBackward(fn, inputs),
                                                 torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  for (torch::Tensor& output : outputs) {
    if (output.defined() && at::isFloatingType(output.scalar_type())) {
      // A view made without grad mode cannot take a history: its own copy (the same bits).
      if (output.is_view()) {
        at::NoGradGuard no_grad;
        output = output.clone();
      }
      torch::autograd::set_history(output, node);
    } else {
      node->add_input_metadata(torch::autograd::Node::undefined_input());
    }
  }
  return outputs;
}

}  // namespace mixtrain
