#include "mixtrain/model/routed_experts.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "mixtrain/core/cpu_gemm.h"
#include "mixtrain/core/device.h"
#include "mixtrain/core/host_sync.h"
#include "mixtrain/model/layers.h"

namespace mixtrain {
namespace {

// The (token, slot) rows in expert order: a stable sort keeps tokens in order within an expert.
torch::Tensor expert_order(const torch::Tensor& selected) {
  return std::get<1>(selected.reshape({-1}).sort(/*stable=*/c10::optional<bool>(true), /*dim=*/0));
}

torch::Tensor swiglu_rows(const torch::Tensor& x, const torch::Tensor& gate,
                          const torch::Tensor& up, const torch::Tensor& down) {
  return dense(torch::silu(dense(x, gate)) * dense(x, up), down);
}

// `index` (int64, CPU) cut into blocks of `rows[e]` entries, each block followed by `to` (or,
// without it, the block's first entry again) up to `padded[e]` entries.
torch::Tensor pad_blocks(const torch::Tensor& index, const std::vector<int64_t>& rows,
                         const std::vector<int64_t>& padded, std::optional<int64_t> to) {
  int64_t total = 0;
  for (const int64_t p : padded) total += p;
  auto out = at::empty({total}, index.options());
  const torch::Tensor src = index.contiguous();
  const int64_t* from = src.data_ptr<int64_t>();
  int64_t* dst = out.data_ptr<int64_t>();
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] == 0) continue;
    const int64_t fill = to.value_or(*from);
    dst = std::copy(from, from + rows[e], dst);
    dst = std::fill_n(dst, padded[e] - rows[e], fill);
    from += rows[e];
  }
  return out;
}

}  // namespace

int64_t expert_gemm_rows(int64_t rows) {
  int64_t floor_pow2 = 1;
  while (floor_pow2 <= rows / 2) floor_pow2 *= 2;
  const int64_t step = std::max<int64_t>(kExpertRowStep, floor_pow2 / 8);
  return (rows + step - 1) / step * step;
}

int64_t padded_expert_rows(int64_t rows, const torch::Tensor& x, const torch::Tensor& gate) {
  const bool on_onednn = x.is_cpu() && x.scalar_type() == at::kBFloat16 && !widens_gemm(x) &&
                         rows * gate.size(0) * gate.size(1) > kOneDnnMinGemmSize;
  return on_onednn ? expert_gemm_rows(rows) : rows;
}

torch::Tensor expert_mlp(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                         const torch::Tensor& down) {
  const int64_t n = x.size(0), padded = padded_expert_rows(n, x, gate);
  const auto rows = padded == n ? x : at::constant_pad_nd(x, {0, 0, 0, padded - n});
  const auto y = swiglu_rows(rows, gate, up, down);
  return padded == n ? y : y.narrow(0, 0, n);
}

ExpertRows rows_by_expert(const torch::Tensor& selected, const torch::Tensor& weights,
                          int64_t experts) {
  ExpertRows rows;
  rows.order = expert_order(selected);
  const auto counts =
      read_to_host(torch::bincount(selected.reshape({-1}), {}, experts), "moe: tokens per expert");
  const auto* count = counts.data_ptr<int64_t>();
  rows.per_expert.assign(count, count + experts);
  rows.token_index = rows.order.div(selected.size(1), "floor");
  rows.weights = weights.reshape({-1}).index_select(0, rows.order);
  return rows;
}

torch::Tensor routed_experts_loop(const torch::Tensor& hidden, const torch::Tensor& selected,
                                  const torch::Tensor& weights, const torch::Tensor& gate,
                                  const torch::Tensor& up, const torch::Tensor& down) {
  const int64_t experts = gate.size(0), tokens = hidden.size(0);
  const ExpertRows rows = rows_by_expert(selected, weights, experts);
  // unbind: one backward node that stacks the per-expert gradients, instead of one full-size
  // zero-padded gradient per select.
  const auto g = gate.unbind(0), u = up.unbind(0), d = down.unbind(0);
  std::vector<int64_t> padded(experts);
  for (int64_t e = 0; e < experts; ++e) {
    padded[e] = padded_expert_rows(rows.per_expert[e], hidden, g[0]);
  }
  if (padded == rows.per_expert) {
    // Each expert's rows as pieces of one split (one op and one backward node each, where a
    // narrow per expert costs a view op and a full-size slice_backward per expert).
    const auto idx = rows.token_index.split_with_sizes(rows.per_expert);
    const auto w = rows.weights.unsqueeze(-1).split_with_sizes(rows.per_expert);
    auto out = torch::zeros_like(hidden);
    for (int64_t e = 0; e < experts; ++e) {
      if (rows.per_expert[e] == 0) continue;
      out.index_add_(0, idx[e],
                     swiglu_rows(hidden.index_select(0, idx[e]), g[e], u[e], d[e]) * w[e]);
    }
    return out;
  }
  // expert_mlp's padding, for every expert at once. A padding row repeats its expert's first
  // row and weight (finite values; their gradients are exact zeros, which leave the sums of the
  // repeated token's and weight's gradients as they are) and adds into an extra output row
  // (index `tokens`), cut off at the end: the real rows' results and sums are the unpadded
  // loop's. The rows are gathered from `hidden` itself, as unpadded, so its gradient takes the
  // experts' pieces in the same order among its other terms.
  const auto gather =
      pad_blocks(rows.token_index, rows.per_expert, padded, std::nullopt).split_with_sizes(padded);
  const auto scatter =
      pad_blocks(rows.token_index, rows.per_expert, padded, tokens).split_with_sizes(padded);
  const auto w = weights.reshape({-1})
                     .index_select(0, pad_blocks(rows.order, rows.per_expert, padded, std::nullopt))
                     .unsqueeze(-1)
                     .split_with_sizes(padded);
  auto out = at::zeros({tokens + 1, hidden.size(1)}, hidden.options());
  for (int64_t e = 0; e < experts; ++e) {
    if (rows.per_expert[e] == 0) continue;
    const auto y = swiglu_rows(hidden.index_select(0, gather[e]), g[e], u[e], d[e]);
    out.index_add_(0, scatter[e], y * w[e]);
  }
  return out.narrow(0, 0, tokens);
}

torch::Tensor routed_experts_grouped(const torch::Tensor& hidden, const torch::Tensor& selected,
                                     const torch::Tensor& weights, const torch::Tensor& gate,
                                     const torch::Tensor& up, const torch::Tensor& down) {
  const int64_t tokens = hidden.size(0), top_k = selected.size(1), width = hidden.size(1);
  const auto flat = selected.reshape({-1});
  const auto order = expert_order(selected);
  // Group ends: the running count of rows per expert, on the device (an empty expert repeats
  // the previous end).
  const auto counts =
      at::zeros({gate.size(0)}, flat.options()).scatter_add_(0, flat, at::ones_like(flat));
  const auto ends = counts.cumsum(0).to(at::kInt);
  // Each token's row once per slot, then in expert order: a permutation, so no two rows add
  // into one in the backward (deterministic on every device).
  const auto slots = hidden.unsqueeze(1).expand({tokens, top_k, width}).reshape({-1, width});
  const auto x = slots.index_select(0, order);
  const auto h = torch::silu(at::_grouped_mm(x, gate.transpose(-2, -1), ends)) *
                 at::_grouped_mm(x, up.transpose(-2, -1), ends);
  const auto y = at::_grouped_mm(h, down.transpose(-2, -1), ends);
  const auto in_slot_order = at::index_copy(at::zeros_like(y), 0, order, y);
  return (in_slot_order * weights.reshape({-1, 1}))
      .view({tokens, top_k, width})
      .sum(1)
      .to(hidden.scalar_type());
}

bool grouped_experts_supported(const torch::Tensor& hidden, const torch::Tensor& gate,
                               const torch::Tensor& up, const torch::Tensor& down) {
  if (!hidden.is_cuda() || hidden.scalar_type() != at::kBFloat16 || hidden.size(1) % 8 != 0) {
    return false;
  }
  for (const torch::Tensor& w : {gate, up, down}) {
    if (w.scalar_type() != at::kBFloat16 || !w.is_contiguous() || w.size(1) % 8 != 0 ||
        w.size(2) % 8 != 0 || reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 != 0) {
      return false;
    }
  }
  return cuda_compute_capability_major(hidden.device()) >= 9;
}

}  // namespace mixtrain
