#include "mixtrain/optim/muon_telemetry.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "mixtrain/core/collectives.h"
#include "mixtrain/core/host_sync.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/grad_clip.h"
#include "mixtrain/optim/muon.h"

namespace mixtrain {

at::Tensor orthogonality_error(const at::Tensor& o) {
  at::Tensor x = o.to(at::kFloat).reshape({-1, o.size(-2), o.size(-1)});
  if (x.size(1) > x.size(2)) x = x.transpose(1, 2);  // short side first: m x m Gram
  const int64_t m = x.size(1);
  const at::Tensor gram = at::bmm(x, x.transpose(1, 2));
  const at::Tensor eye = at::eye(m, gram.options());
  const at::Tensor error = at::linalg_vector_norm(gram - eye, 2, at::IntArrayRef({1, 2})) /
                           std::sqrt(static_cast<double>(m));
  std::vector<int64_t> leading(o.sizes().begin(), o.sizes().end() - 2);
  return error.reshape(leading);
}

void MuonTelemetryRecorder::record_orthogonalized(size_t group, const at::Tensor& o) {
  const int64_t take = std::min(sample_ - sampled_.at(group), o.size(0));
  if (take <= 0) return;
  errors_[group].push_back(orthogonality_error(o.narrow(0, 0, take)));
  sampled_[group] += take;
}

void MuonTelemetryRecorder::record_update(const at::Tensor& param, const at::Tensor& o,
                                          double lr_scale) {
  const at::Tensor squares = o.to(at::kFloat).square().sum() * (lr_scale * lr_scale);
  auto [it, fresh] = update_squares_.emplace(param.unsafeGetTensorImpl(), squares);
  if (!fresh) it->second = it->second + squares;
}

at::Tensor MuonTelemetryRecorder::update_sum_of_squares(const at::Tensor& param) const {
  const auto it = update_squares_.find(param.unsafeGetTensorImpl());
  return it == update_squares_.end() ? at::Tensor() : it->second;
}

void arm_muon_telemetry(ChainedOptimizer& chained, int64_t sample) {
  for (const auto& leaf : chained.leaves()) {
    if (auto* muon = dynamic_cast<Muon*>(leaf.get())) muon->arm_telemetry(sample);
  }
}

namespace {

// Update RMS of one group: the placed norm of the pieces' updates over the whole numel. Each
// stepped piece enters clip_grad_norm's placed form as the one-element tensor sqrt(its sum of
// squares), so its placement decides where the square is summed, as for gradients.
double update_rms(ChainedOptimizer& chained, const std::vector<at::Tensor>& params,
                  const MuonTelemetryRecorder* recorder) {
  std::vector<at::Tensor> squares;
  std::vector<size_t> stepped;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor s = recorder ? recorder->update_sum_of_squares(params[i]) : at::Tensor();
    if (!s.defined()) continue;
    squares.push_back(s.reshape({1}));
    stepped.push_back(i);
  }
  // One device-to-host copy for the group.
  const at::Tensor host =
      squares.empty() ? at::Tensor()
                      : read_to_host(at::cat(squares).to(at::kDouble), "muon telemetry").sqrt();
  std::vector<at::Tensor> pieces(params.size());
  std::vector<const ParamPlacement*> placements;
  double numel = 0.0;
  for (size_t k = 0; k < stepped.size(); ++k) pieces[stepped[k]] = host.narrow(0, k, 1);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamPlacement& placement = chained.placement(chained.name_of(params[i]));
    placements.push_back(&placement);
    if (!pieces[i].defined()) continue;
    const auto& shape = placement.global_shape;
    numel += shape.empty() ? static_cast<double>(params[i].numel())
                           : static_cast<double>(c10::multiply_integers(shape));
  }
  const double norm = clip_grad_norm(pieces, placements, /*max_norm=*/0.0);  // collective
  return numel > 0.0 ? norm / std::sqrt(numel) : std::nan("");
}

}  // namespace

std::vector<MuonGroupTelemetry> muon_step_telemetry(ChainedOptimizer& chained, Collectives* world) {
  std::vector<MuonGroupTelemetry> out;
  for (const auto& leaf : chained.leaves()) {
    auto* muon = dynamic_cast<Muon*>(leaf.get());
    if (muon == nullptr) continue;
    const std::unique_ptr<MuonTelemetryRecorder> recorder = muon->take_telemetry();
    for (size_t g = 0; g < muon->param_groups().size(); ++g) {
      MuonGroupTelemetry t;
      t.group = static_cast<int64_t>(g);
      t.update_rms = update_rms(chained, muon->param_groups()[g].params(), recorder.get());
      // {sum, count} summed and the max gathered over the world; -1: no sample on this rank.
      double sum = 0.0, count = 0.0, max = -1.0;
      if (recorder && !recorder->errors(g).empty()) {
        const at::Tensor errors =
            read_to_host(at::cat(recorder->errors(g)).to(at::kDouble), "muon telemetry");
        sum = errors.sum().item<double>();
        count = static_cast<double>(errors.numel());
        max = errors.max().item<double>();
      }
      if (world != nullptr && world->size() > 1) {
        at::Tensor totals = at::tensor(std::vector<double>{sum, count}, at::kDouble);
        world->all_reduce_sum(totals);
        sum = totals[0].item<double>();
        count = totals[1].item<double>();
        max = world->all_gather(at::full({1}, max, at::kDouble)).max().item<double>();
      }
      t.sampled = static_cast<int64_t>(count);
      if (count > 0) {
        t.ortho_error_mean = sum / count;
        t.ortho_error_max = max;
      }
      out.push_back(t);
    }
  }
  return out;
}

std::string format_muon_telemetry(const std::vector<MuonGroupTelemetry>& groups) {
  std::string text;
  for (const MuonGroupTelemetry& t : groups) {
    char line[160];
    std::snprintf(line, sizeof(line),
                  "g%lld: ortho err %.3g (max %.3g, %lld matrices), update rms %.3g",
                  static_cast<long long>(t.group), t.ortho_error_mean, t.ortho_error_max,
                  static_cast<long long>(t.sampled), t.update_rms);
    text += (text.empty() ? "muon " : "; ") + std::string(line);
  }
  return text;
}

}  // namespace mixtrain
