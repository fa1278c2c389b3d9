// Muon telemetry (optimizer.muon_telemetry, docs/architecture.md §5): per Muon param group, on
// the steps the trainer logs, two figures that tell a working Muon from one that silently
// degraded (e.g. into plain SGD):
//   orthogonality error of O, as Newton–Schulz returns it (before lr and scale):
//     e(O) = ||O O^T - I||_F / sqrt(m), m = min(rows, cols), the Gram on the short side
//     (0 for an exactly semi-orthogonal O; Newton–Schulz leaves singular values in a band
//     around 1, so a few tenths is normal, sqrt(1 - 1/m)-ish or more means O is far off);
//     sampled: the first kMuonTelemetrySample matrices (heads under muon_per_head) each rank
//     orthogonalizes in the group, in the order it runs them (local batches, then the
//     distributed buckets it owns); mean and max over all ranks' samples. Ranks that
//     orthogonalize the same matrix (tp peers, HSDP replicas) each contribute it.
//   update RMS: sqrt(sum ||lr*scale*O||^2 / sum numel) over the group's stepped parameters,
//     whole parameters: each rank adds the pieces it applies, combined over their placements
//     as the gradient norm is (grad_clip.h), so every element counts once.
// Recording happens only while a Muon holds a MuonTelemetryRecorder (armed for one step); the
// reduction is collective: every rank calls muon_step_telemetry after the same step.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace mixtrain {

class ChainedOptimizer;
class Collectives;

inline constexpr int64_t kMuonTelemetrySample = 4;  // matrices per group per rank

// e(O) of every matrix of o ([..., rows, cols]) as a float32 tensor of o's leading dims,
// computed in float32.
at::Tensor orthogonality_error(const at::Tensor& o);

// What one rank recorded during one Muon step.
class MuonTelemetryRecorder {
 public:
  explicit MuonTelemetryRecorder(size_t groups, int64_t sample = kMuonTelemetrySample)
      : sample_(sample), errors_(groups), sampled_(groups, 0) {}
  // o: [n, rows, cols] as Newton–Schulz returned it; samples its first matrices while the
  // group has fewer than `sample`.
  void record_orthogonalized(size_t group, const at::Tensor& o);
  // This rank applied lr_scale * o to (its piece of) param: adds the sum of squares.
  void record_update(const at::Tensor& param, const at::Tensor& o, double lr_scale);

  const std::vector<at::Tensor>& errors(size_t group) const { return errors_.at(group); }
  // The 0-dim float32 sum of squares of param's applied update; undefined when none.
  at::Tensor update_sum_of_squares(const at::Tensor& param) const;

 private:
  int64_t sample_;
  std::vector<std::vector<at::Tensor>> errors_;  // per group: 1-D float32 pieces
  std::vector<int64_t> sampled_;
  std::unordered_map<const void*, at::Tensor> update_squares_;  // by TensorImpl
};

struct MuonGroupTelemetry {
  int64_t group = 0;    // the Muon leaf's param group
  int64_t sampled = 0;  // matrices in the sample, over all ranks
  double ortho_error_mean = std::numeric_limits<double>::quiet_NaN();
  double ortho_error_max = std::numeric_limits<double>::quiet_NaN();
  double update_rms = std::numeric_limits<double>::quiet_NaN();  // NaN: nothing stepped
};

// Arms every Muon leaf of `chained` to record its next step (no-op without Muon); `sample`:
// matrices per group per rank (tests take them all).
void arm_muon_telemetry(ChainedOptimizer& chained, int64_t sample = kMuonTelemetrySample);
// The figures of the step recorded since arm_muon_telemetry, one per Muon group, reduced over
// the placements' groups (update RMS) and `world` (orthogonality error; null: one process);
// disarms. Collective: every rank calls it after the same step.
std::vector<MuonGroupTelemetry> muon_step_telemetry(ChainedOptimizer& chained, Collectives* world);

// "muon g0: ortho err 0.123 (max 0.2, 8 matrices), update rms 1.2e-03; g1: ..." ("" for none).
std::string format_muon_telemetry(const std::vector<MuonGroupTelemetry>& groups);

}  // namespace mixtrain
