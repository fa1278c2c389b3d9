#include "mixtrain/model/moe_experts.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "mixtrain/model/routed_experts.h"

namespace mixtrain {

MoeExperts::MoeExperts(int64_t num_experts, int64_t hidden_size, int64_t intermediate_size,
                       ParamAccess access)
    : num_experts_(num_experts), access_(std::move(access)) {
  gate_proj =
      register_parameter("gate_proj", torch::empty({num_experts, intermediate_size, hidden_size}));
  up_proj =
      register_parameter("up_proj", torch::empty({num_experts, intermediate_size, hidden_size}));
  down_proj =
      register_parameter("down_proj", torch::empty({num_experts, hidden_size, intermediate_size}));
}

torch::Tensor MoeExperts::forward(const torch::Tensor& hidden,
                                  const torch::Tensor& selected_experts,
                                  const torch::Tensor& routing_weights) {
  ExpertDispatcher* dispatcher = access_.expert_dispatcher();
  if (dispatcher != nullptr && dispatcher->ep_size() > 1) {
    return forward_expert_parallel(*dispatcher, hidden, selected_experts, routing_weights);
  }
  const auto gate = access_.unshard("gate_proj", gate_proj);
  const auto up = access_.unshard("up_proj", up_proj);
  const auto down = access_.unshard("down_proj", down_proj);
  const auto final_hidden =
      grouped_experts_supported(hidden, gate, up, down)
          ? routed_experts_grouped(hidden, selected_experts, routing_weights, gate, up, down)
          : routed_experts_loop(hidden, selected_experts, routing_weights, gate, up, down);
  // Every expert's output feeds final_hidden, so a pre-backward gather hooked here runs
  // before any expert's backward.
  return access_.post_forward({"gate_proj", "up_proj", "down_proj"}, final_hidden);
}

torch::Tensor MoeExperts::forward_expert_parallel(ExpertDispatcher& dispatcher,
                                                  const torch::Tensor& hidden,
                                                  const torch::Tensor& selected_experts,
                                                  const torch::Tensor& routing_weights) {
  const ExpertRows sorted = rows_by_expert(selected_experts, routing_weights, num_experts_);
  const std::vector<int64_t>& tokens_per_expert = sorted.per_expert;

  // One index_select per expert, as in forward(): backward then accumulates the hidden
  // gradient from the same per-expert pieces in the same order, so a rank's gradients match
  // the all-experts-local model bit for bit wherever the expert GEMMs do.
  std::vector<torch::Tensor> rows;
  int64_t begin = 0;
  for (int64_t e = 0; e < num_experts_; ++e) {
    if (tokens_per_expert[e] == 0) continue;
    rows.push_back(
        hidden.index_select(0, sorted.token_index.narrow(0, begin, tokens_per_expert[e])));
    begin += tokens_per_expert[e];
  }
  const DispatchedTokens dispatched =
      dispatcher.token_dispatch(torch::cat(rows, 0), tokens_per_expert);
  // Each expert runs one GEMM per source rank, not one over all its rows: the per-row results
  // of a bfloat16 GEMM may depend on the number of rows (ATen's own kernel below 16^3
  // multiply-adds, oneDNN above; oneDNN's blocking with LibTorch 1.13), and this way every row
  // is computed exactly as the all-experts-local model computes it on the source rank's batch
  // (expert_mlp, padding included), so the result does not depend on the parallel layout. The
  // weights are materialized once per source for the same reason: each source's weight gradient
  // reaches the materializer on its own and is summed there in float32 (the fp32 main_grad's
  // unrounded sum), instead of being summed in bfloat16 by autograd. The cost is ep smaller GEMMs
  // per expert; the materialization is a cast (no copy in bf16).
  const int64_t ranks = dispatcher.ep_size();
  std::vector<std::vector<torch::Tensor>> gate, up, down;  // [source][local expert]
  for (int64_t src = 0; src < ranks; ++src) {
    gate.push_back(access_.unshard("gate_proj", gate_proj).unbind(0));
    up.push_back(access_.unshard("up_proj", up_proj).unbind(0));
    down.push_back(access_.unshard("down_proj", down_proj).unbind(0));
  }
  // A zero-row view keeps the output connected to the dispatch even when no row arrived.
  std::vector<torch::Tensor> outputs{dispatched.tokens.narrow(0, 0, 0)};
  int64_t offset = 0;
  for (size_t e = 0; e < dispatched.tokens_per_expert.size(); ++e) {
    for (int64_t src = 0; src < ranks; ++src) {
      const int64_t n = dispatched.tokens_per_expert_and_source[e * ranks + src];
      if (n == 0) continue;
      outputs.push_back(expert_mlp(dispatched.tokens.narrow(0, offset, n), gate[src][e], up[src][e],
                                   down[src][e]));
      offset += n;
    }
  }
  const auto combined = dispatcher.token_combine(torch::cat(outputs, 0), dispatched);
  // One index_add_ per expert, as in forward(): LibTorch 2.x's CPU index_add_ sums a row's
  // repeated indices of one call in float32 and rounds once, while forward() rounds to
  // bfloat16 after each expert; with 3 or more experts per token the two differ by bf16 ulps.
  const auto weighted =
      (combined * sorted.weights.unsqueeze(-1)).split_with_sizes(tokens_per_expert);
  const auto indices = sorted.token_index.split_with_sizes(tokens_per_expert);
  auto final_hidden = torch::zeros_like(hidden);
  for (int64_t e = 0; e < num_experts_; ++e) {
    if (tokens_per_expert[e] > 0) final_hidden.index_add_(0, indices[e], weighted[e]);
  }
  return access_.post_forward({"gate_proj", "up_proj", "down_proj"}, final_hidden);
}

}  // namespace mixtrain
