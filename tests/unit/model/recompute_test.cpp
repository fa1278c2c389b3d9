// model/recompute.h: recompute_in_backward keeps no graph of fn in forward, runs fn again in
// backward, and gives bitwise the gradients of the plain call (parameters inside fn, inputs, two
// outputs of which one gets no gradient); outside grad mode it is the plain call. The models'
// use of it (every layer, every k-th) against their plain forward, bitwise.
#include "mixtrain/model/recompute.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <string>
#include <vector>

#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/registry.h"
#include "support/tiny_model_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(Recompute, SameGradientsBitwiseAndFnRunsAgainInBackward) {
  torch::manual_seed(3);
  const auto w = torch::randn({6, 5}, torch::requires_grad());
  const auto x0 = torch::randn({4, 5});
  int calls = 0;
  const RecomputeFn fn = [&](const std::vector<torch::Tensor>& in) {
    ++calls;
    const auto h = torch::tanh(at::linear(in[0], w));
    return std::vector<torch::Tensor>{h * in[1], h.sum(-1)};
  };
  const auto scale = torch::randn({4, 6});
  // Plain: the graph of fn kept.
  const auto x_plain = x0.clone().requires_grad_(true);
  auto plain = fn({x_plain, scale});
  (plain[0].square().sum() + plain[1].sum()).backward();
  const auto w_grad = w.grad().clone(), x_grad = x_plain.grad().clone();
  w.mutable_grad().reset();
  calls = 0;
  const auto x = x0.clone().requires_grad_(true);
  auto outs = recompute_in_backward(fn, {x, scale});
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(torch::equal(outs[0], plain[0]));
  EXPECT_NE(outs[0].grad_fn()->name().find("RecomputeBackward"), std::string::npos);
  (outs[0].square().sum() + outs[1].sum()).backward();
  EXPECT_EQ(calls, 2) << "fn runs again in backward";
  EXPECT_TRUE(torch::equal(w.grad(), w_grad));
  EXPECT_TRUE(torch::equal(x.grad(), x_grad));
  // Only one output used: the other's gradient is undefined, and the result is the same as the
  // plain call's for that loss.
  w.mutable_grad().reset();
  const auto x_plain2 = x0.clone().requires_grad_(true);
  fn({x_plain2, scale})[1].sum().backward();
  const auto w_grad2 = w.grad().clone();
  w.mutable_grad().reset();
  recompute_in_backward(fn, {x0.clone().requires_grad_(true), scale})[1].sum().backward();
  EXPECT_TRUE(torch::equal(w.grad(), w_grad2));
  // Without grad mode: the plain call, once, no node.
  calls = 0;
  torch::NoGradGuard no_grad;
  const auto plain_out = recompute_in_backward(fn, {x0, scale});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(plain_out[0].requires_grad());
}

// The recomputed layers are the ones recomputes_layer picks (torchtitan's count from 1).
TEST(Recompute, LayerSelection) {
  EXPECT_FALSE(recomputes_layer(0, 0));
  EXPECT_TRUE(recomputes_layer(0, 1));
  EXPECT_TRUE(recomputes_layer(5, 1));
  EXPECT_FALSE(recomputes_layer(0, 2));
  EXPECT_TRUE(recomputes_layer(1, 2));
  EXPECT_TRUE(recomputes_layer(5, 3));
  EXPECT_FALSE(recomputes_layer(4, 3));
}

// Counts the RecomputeBackward nodes of the graph behind `root`.
int recompute_nodes(const torch::Tensor& root) {
  std::vector<torch::autograd::Node*> stack = {root.grad_fn().get()};
  std::vector<torch::autograd::Node*> seen;
  int count = 0;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || std::find(seen.begin(), seen.end(), node) != seen.end()) continue;
    seen.push_back(node);
    if (node->name().find("RecomputeBackward") != std::string::npos) ++count;
    for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
  }
  return count;
}

// Dense and MoE models, 4 layers: full (4 recomputed), selective every 2 (layers 1 and 3) and
// every 3 (layer 2): loss, aux loss and every parameter's gradient bitwise those of the plain
// forward.
TEST(Recompute, ModelsGiveBitwiseTheSameLossAndGradients) {
  for (const std::string name : {"qwen2", "qwen2_moe"}) {
    ModelConfig c = test_support::tiny_config();
    c.name = name;
    c.num_layers = 4;
    c.intermediate_size = 20;
    const auto ids = torch::randint(37, {2, 11}, torch::kInt64);
    std::vector<torch::Tensor> reference;
    double reference_loss = 0;
    for (const int64_t every : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}}) {
      auto model = build_model(c, 5);
      model->set_activation_checkpointing(every);
      const auto out = model->forward(ids);
      const auto loss = out.logits.square().mean() + out.aux_loss * 0.1;
      const int expected_nodes = every == 0 ? 0 : every == 1 ? 4 : every == 2 ? 2 : 1;
      EXPECT_EQ(recompute_nodes(loss), expected_nodes) << name << " every " << every;
      loss.backward();
      std::vector<torch::Tensor> grads;
      for (const auto& item : model->named_parameters()) grads.push_back(item.value().grad());
      if (every == 0) {
        reference = grads;
        reference_loss = loss.item<double>();
        continue;
      }
      EXPECT_EQ(loss.item<double>(), reference_loss) << name << " every " << every;
      ASSERT_EQ(grads.size(), reference.size());
      for (size_t i = 0; i < grads.size(); ++i) {
        EXPECT_TRUE(torch::equal(grads[i], reference[i]))
            << name << " every " << every << " #" << i;
      }
    }
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
