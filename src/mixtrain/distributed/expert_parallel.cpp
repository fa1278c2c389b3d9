#include "mixtrain/distributed/expert_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "mixtrain/core/host_sync.h"
#include "mixtrain/distributed/device_mesh.h"

namespace mixtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// all_to_all whose backward is the reverse all_to_all.
struct AllToAll : public torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, ExpertParallel* ep,
                            const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& recv_counts,
                            const std::function<void()>* on_backward) {
    ctx->saved_data["ep"] = reinterpret_cast<int64_t>(ep);
    ctx->saved_data["on_backward"] = reinterpret_cast<int64_t>(on_backward);
    ctx->saved_data["send"] = send_counts;
    ctx->saved_data["recv"] = recv_counts;
    at::Tensor output = ep->ep_group().all_to_all(input.contiguous(), send_counts, recv_counts);
    ctx->saved_data["shape"] = output.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<int64_t>(output.scalar_type());
    ctx->saved_data["device"] = output.device();
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* ep = reinterpret_cast<ExpertParallel*>(ctx->saved_data.at("ep").toInt());
    const auto* on_backward =
        reinterpret_cast<const std::function<void()>*>(ctx->saved_data.at("on_backward").toInt());
    if (on_backward != nullptr && *on_backward) (*on_backward)();
    at::Tensor grad = grads[0];
    const auto send = ctx->saved_data.at("send").toIntVector();
    const auto recv = ctx->saved_data.at("recv").toIntVector();
    if (!grad.defined()) {
      // Every rank must still take part in the exchange.
      const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data.at("dtype").toInt());
      grad = at::zeros(
          ctx->saved_data.at("shape").toIntVector(),
          at::TensorOptions().dtype(dtype).device(ctx->saved_data.at("device").toDevice()));
    }
    c10::NoGradGuard no_grad;
    return {ep->ep_group().all_to_all(grad.contiguous(), recv, send), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void plan_expert_parallel(const CausalLM& model, const DeviceMesh& mesh, ParallelPlan& plan) {
  const int64_t ep = mesh.ep_group->size();
  for (PlannedParam& p : plan.params) {
    if (!model.is_expert(p.name)) continue;
    const std::vector<int64_t>& shape = p.placement.global_shape;
    if (shape[0] % ep != 0) {
      throw std::invalid_argument("parallelize: the ep group of " + std::to_string(ep) +
                                  " does not divide the " + std::to_string(shape[0]) +
                                  " experts of " + p.name);
    }
    if (p.tp_dim >= 0) {
      throw std::invalid_argument("parallelize: the tp group of " +
                                  std::to_string(plan.tp_group->size()) + " cannot split " +
                                  p.name + " along dim " + std::to_string(p.tp_dim));
    }
    p.expert = true;
    p.layout = chunk_layout(shape, ep, mesh.ep_group->rank());
    p.placement.kind = ParamPlacement::Kind::kExpertSlice;
    p.placement.shard_group = mesh.ep_group;
    p.placement.replicate_group = mesh.expert_dp_group;
    p.placement.offset = p.layout.offset;
    p.placement.rows = p.layout.rows;
  }
  plan.ep_group = mesh.ep_group;
  plan.expert_dp_group = mesh.expert_dp_group;
}

ExpertParallel::ExpertParallel(std::shared_ptr<Collectives> ep_group,
                               std::function<void()> on_backward)
    : ep_group_(std::move(ep_group)), on_backward_(std::move(on_backward)) {}

at::Tensor ExpertParallel::all_to_all(const at::Tensor& input,
                                      const std::vector<int64_t>& send_counts,
                                      const std::vector<int64_t>& recv_counts) {
  return AllToAll::apply(input, this, send_counts, recv_counts, &on_backward_);
}

DispatchedTokens ExpertParallel::token_dispatch(const at::Tensor& tokens,
                                                const std::vector<int64_t>& tokens_per_expert) {
  const int64_t ranks = ep_size();
  const int64_t experts = static_cast<int64_t>(tokens_per_expert.size());
  if (experts % ranks != 0) {
    throw std::invalid_argument("token_dispatch: " + std::to_string(experts) +
                                " experts do not split over " + std::to_string(ranks) +
                                " ep ranks");
  }
  const int64_t local = experts / ranks;
  // Counts first: peer j learns how many rows of each of its experts this rank sends. They are
  // host values (the split sizes below), so they travel as a CPU tensor.
  at::Tensor counts = at::tensor(tokens_per_expert, at::kLong);
  const std::vector<int64_t> per_rank(ranks, local);
  at::Tensor received_counts;
  {
    c10::NoGradGuard no_grad;
    received_counts = ep_group_->all_to_all(counts, per_rank, per_rank).view({ranks, local});
  }
  const auto* rc = received_counts.data_ptr<int64_t>();  // [source rank][local expert]

  DispatchedTokens out;
  out.send_counts.assign(ranks, 0);
  out.recv_counts.assign(ranks, 0);
  out.tokens_per_expert.assign(local, 0);
  out.tokens_per_expert_and_source.assign(local * ranks, 0);
  for (int64_t j = 0; j < ranks; ++j) {
    for (int64_t e = 0; e < local; ++e) {
      out.send_counts[j] += tokens_per_expert[j * local + e];
      out.recv_counts[j] += rc[j * local + e];
      out.tokens_per_expert[e] += rc[j * local + e];
      out.tokens_per_expert_and_source[e * ranks + j] = rc[j * local + e];
    }
  }
  const at::Tensor received = all_to_all(tokens, out.send_counts, out.recv_counts);

  // Received rows: source-rank-major, within a source grouped by local expert. Regroup by
  // local expert (source order kept within an expert, as a stable sort would).
  std::vector<int64_t> start(ranks * local);  // first received row of (source, expert)
  int64_t row = 0;
  for (int64_t i = 0; i < ranks * local; ++i) {
    start[i] = row;
    row += rc[i];
  }
  std::vector<int64_t> order;
  order.reserve(row);
  for (int64_t e = 0; e < local; ++e) {
    for (int64_t j = 0; j < ranks; ++j) {
      for (int64_t k = 0; k < rc[j * local + e]; ++k) order.push_back(start[j * local + e] + k);
    }
  }
  out.grouped_to_received =
      copy_to_device(at::tensor(order, at::kLong), tokens.device(), "expert parallel: order");
  out.tokens = received.index_select(0, out.grouped_to_received);
  return out;
}

at::Tensor ExpertParallel::token_combine(const at::Tensor& expert_output,
                                         const DispatchedTokens& dispatched) {
  // Back to the received order (the inverse permutation), then to the sending ranks.
  const int64_t rows = dispatched.grouped_to_received.numel();
  const at::TensorOptions index_options = dispatched.grouped_to_received.options();
  at::Tensor to_grouped = at::empty({rows}, index_options);
  if (rows > 0) {
    to_grouped.index_put_({dispatched.grouped_to_received}, at::arange(rows, index_options));
  }
  const at::Tensor received_order = expert_output.index_select(0, to_grouped);
  return all_to_all(received_order, dispatched.recv_counts, dispatched.send_counts);
}

}  // namespace mixtrain
