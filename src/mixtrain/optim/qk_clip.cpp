#include "mixtrain/optim/qk_clip.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "mixtrain/core/host_sync.h"

namespace mixtrain {
namespace {

int64_t row_offset_of(const std::string& name, const std::vector<ParamPlacement>& placements) {
  for (const ParamPlacement& p : placements) {
    if (p.name == name) return p.global_offsets().at(0);
  }
  return 0;  // whole on this rank
}

bool any_scaled(const std::vector<double>& scale) {
  return std::any_of(scale.begin(), scale.end(), [](double s) { return s != 1.0; });
}

// Multiplies local row r of `piece` by row_scale[row_offset + r], in place, in piece's dtype.
void scale_rows(const at::Tensor& piece, int64_t row_offset, const std::vector<double>& row_scale) {
  c10::NoGradGuard no_grad;
  const int64_t rows = piece.size(0);
  if (rows == 0) return;
  if (row_offset < 0 || row_offset + rows > static_cast<int64_t>(row_scale.size())) {
    throw std::invalid_argument("qk-clip: rows [" + std::to_string(row_offset) + ", " +
                                std::to_string(row_offset + rows) + ") past the " +
                                std::to_string(row_scale.size()) + " rows of the heads");
  }
  // The factor in float64, rounded once to the piece's dtype by the in-place multiply.
  std::vector<int64_t> shape(piece.dim(), 1);
  shape[0] = rows;
  const std::vector<double> mine(row_scale.begin() + row_offset,
                                 row_scale.begin() + row_offset + rows);
  const at::Tensor factor = copy_to_device(at::tensor(mine, at::kDouble).view(shape),
                                           piece.device(), "qk-clip: row scales");
  piece.detach().mul_(factor);
}

// Scales the optimizer param of `name` by head (its HeadLayout, or rows of head_dim), then
// rewrites a separate model param from it.
void scale_param(ChainedOptimizer& chain, const std::string& name,
                 const std::vector<ParamPlacement>& placements, const HeadLayout& layout,
                 const std::vector<double>& head_scale) {
  const at::Tensor& main = chain.optimizer_param(name);
  if (main.size(0) == 0) return;  // a trailing FSDP rank may hold no rows
  scale_rows(main, row_offset_of(name, placements), head_layout_row_scales(layout, head_scale));
  const at::Tensor& model = chain.model_param(name);
  if (!model.is_same(main)) model.detach().copy_(main.detach());  // round to nearest even
}

}  // namespace

QkClipScales qk_clip_scales(const std::vector<double>& max_logits, int64_t num_kv_heads,
                            double tau) {
  const int64_t heads = static_cast<int64_t>(max_logits.size());
  if (tau <= 0 || num_kv_heads <= 0 || heads % num_kv_heads != 0) {
    throw std::invalid_argument("qk_clip_scales: need tau > 0 and kv heads dividing " +
                                std::to_string(heads) + " query heads");
  }
  const int64_t group = heads / num_kv_heads;
  QkClipScales scales;
  scales.q.assign(heads, 1.0);
  scales.k.assign(num_kv_heads, 1.0);
  for (int64_t g = 0; g < num_kv_heads; ++g) {
    double gamma_min = 1.0;
    std::vector<double> gamma(group, 1.0);
    for (int64_t i = 0; i < group; ++i) {
      const double s = max_logits[g * group + i];
      if (s > tau) gamma[i] = tau / s;
      gamma_min = std::min(gamma_min, gamma[i]);
    }
    if (gamma_min == 1.0) continue;  // nothing clipped in this group: all factors stay 1
    const double k_scale = std::sqrt(gamma_min);
    scales.k[g] = k_scale;
    for (int64_t i = 0; i < group; ++i) scales.q[g * group + i] = gamma[i] / k_scale;
  }
  return scales;
}

std::vector<double> head_layout_row_scales(const HeadLayout& layout,
                                           const std::vector<double>& head_scale) {
  std::vector<double> rows(head_scale.size() * layout.block, 1.0);
  for (size_t h = 0; h < head_scale.size(); ++h) {
    for (int64_t i = 0; i < layout.content + layout.rotary && i < layout.block; ++i) {
      rows[h * layout.block + i] =
          i < layout.content ? head_scale[h] : head_scale[h] * head_scale[h];
    }
  }
  return rows;
}

std::map<std::string, std::vector<double>> reduce_max_logits(
    Collectives& world, const std::map<std::string, at::Tensor>& layers) {
  std::map<std::string, std::vector<double>> result;
  if (layers.empty()) {
    // No forward recorded anything (all ranks alike): nothing to clip.
    return result;
  }
  std::vector<at::Tensor> rows;
  for (const auto& [name, heads] : layers) {
    rows.push_back(heads.detach().to(layers.begin()->second.device(), at::kFloat));
  }
  // Stacked where the forwards left them and read once (one host wait per step, not per layer).
  at::Tensor stacked = read_to_host(at::stack(rows), "qk-clip: max logits");
  world.all_reduce(stacked, ReduceOp::kMax);
  const at::Tensor reduced = stacked.to(at::kDouble).contiguous();
  const double* value = reduced.data_ptr<double>();
  const int64_t heads = reduced.size(1);
  int64_t i = 0;
  for (const auto& [name, unused] : layers) {
    result[name].assign(value + i * heads, value + (i + 1) * heads);
    ++i;
  }
  return result;
}

QkClipStats apply_qk_clip(ChainedOptimizer& chain,
                          const std::map<std::string, std::vector<double>>& max_logits,
                          const std::vector<ParamPlacement>& placements, const ModelConfig& model,
                          double tau, const ParamRoles& roles) {
  // Each layer's query and key projections (weights and biases), as the model declares them;
  // with latent attention the key's content is kv_b_proj's (kAttentionKeyValue).
  std::map<std::string, std::map<ParamRole, std::vector<std::string>>> projections;
  for (const auto& [name, info] : roles) {
    if (info.role == ParamRole::kAttentionQuery || info.role == ParamRole::kAttentionKey ||
        info.role == ParamRole::kAttentionKeyValue) {
      projections[info.attention_layer][info.role].push_back(name);
    }
  }
  QkClipStats stats;
  stats.max_logit = -std::numeric_limits<double>::infinity();
  for (const auto& [layer, logits] : max_logits) {
    auto& own = projections[layer];
    const bool latent = !own[ParamRole::kAttentionKeyValue].empty();
    const ParamRole key_role = latent ? ParamRole::kAttentionKeyValue : ParamRole::kAttentionKey;
    for (const ParamRole role : {ParamRole::kAttentionQuery, key_role}) {
      const auto& names = own[role];
      const bool trainable_weight = std::any_of(names.begin(), names.end(), [&](const auto& n) {
        return chain.contains(n) && chain.optimizer_param(n).dim() == 2;
      });
      if (!trainable_weight) {
        throw std::invalid_argument("QK-clip: layer " + layer + " has no trainable " +
                                    param_role_name(role) + " projection weight");
      }
    }
    stats.heads += static_cast<int64_t>(logits.size());
    for (double s : logits) {
      stats.max_logit = std::max(stats.max_logit, s);
      if (s > tau) ++stats.heads_clipped;
    }
    // Latent attention: every head its own key content (K2's sqrt(gamma_h) on both sides).
    const int64_t kv_heads = latent ? static_cast<int64_t>(logits.size()) : model.num_kv_heads;
    const QkClipScales scales = qk_clip_scales(logits, kv_heads, tau);
    for (const auto& [role, scale] :
         {std::pair<ParamRole, const std::vector<double>*>{ParamRole::kAttentionQuery, &scales.q},
          {key_role, &scales.k}}) {
      if (!any_scaled(*scale)) continue;
      for (const std::string& name : own[role]) {
        if (!chain.contains(name)) continue;
        scale_param(chain, name, placements,
                    head_layout_or_standard(roles.at(name).heads, model.head_dim), *scale);
      }
    }
  }
  return stats;
}

}  // namespace mixtrain
