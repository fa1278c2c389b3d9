#include "mixtrain/optim/grad_clip.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <optional>
#include <vector>

#include "mixtrain/core/collectives.h"
#include "mixtrain/core/host_sync.h"
#include "mixtrain/optim/scale_fused.h"
#include "mixtrain/optim/sum_of_squares_fused.h"

namespace mixtrain {

namespace {

// Sum of squares of all defined tensors: the fusable CPU ones through one pass (one parallel
// region for the whole list), those on the first CUDA device met through one CUDA pass (its
// device sum read back once, after the CPU work: the value is the caller's result), the rest
// through ATen in double (sum_of_squares_fused.h).
double total_sum_of_squares(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> on_cpu, on_cuda;
  double other = 0.0;
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    if (sum_of_squares_fusable(t) && t.is_cpu()) {
      on_cpu.push_back(t);
    } else if (sum_of_squares_fusable(t) &&
               (on_cuda.empty() || on_cuda.front().device() == t.device())) {
      on_cuda.push_back(t);
    } else {
      // Any other (float64, a second device): its sum read like the CUDA one below.
      other += read_double(t.to(at::kDouble).square().sum(), "grad norm (host form)");
    }
  }
  const double sum = sum_of_squares_fused(on_cpu, at::kCPU).item<double>() + other;
  if (on_cuda.empty()) return sum;
  return sum + read_double(sum_of_squares_fused(on_cuda, on_cuda.front().device()),
                           "grad norm (host form)");
}

}  // namespace

double sum_of_squares(const at::Tensor& tensor) {
  return total_sum_of_squares({tensor});
}

double global_grad_norm(const std::vector<at::Tensor>& grads) {
  return std::sqrt(total_sum_of_squares(grads));
}

double global_grad_norm(const std::vector<at::Tensor>& grads, Collectives& group) {
  double sum = total_sum_of_squares(grads);
  if (group.size() > 1) {
    at::Tensor total = at::full({1}, sum, at::TensorOptions().dtype(at::kDouble));
    group.all_reduce_sum(total);
    sum = total.item<double>();
  }
  return std::sqrt(sum);
}

namespace {

// `sum` summed over `group` (as is for a null or one-rank group).
double all_reduced(double sum, Collectives* group) {
  if (group == nullptr || group->size() <= 1) return sum;
  at::Tensor reduced = at::full({1}, sum, at::TensorOptions().dtype(at::kDouble));
  group->all_reduce_sum(reduced);
  return reduced.item<double>();
}

double clip_with_norm(const std::vector<at::Tensor>& grads, double max_norm, double norm) {
  if (max_norm <= 0.0 || !std::isfinite(norm)) return norm;
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    c10::NoGradGuard no_grad;  // grads may be leaves of a graph; scaling is not part of it
    // float32 CPU grads in one kernel call (the bits of mul_), the others one op each.
    std::vector<at::Tensor> fusable;
    for (const auto& grad : grads) {
      if (!grad.defined()) continue;
      if (scale_fusable(grad)) {
        fusable.push_back(grad);
      } else {
        grad.mul_(coefficient);
      }
    }
    scale_fused(fusable, coefficient);
  }
  return norm;
}

}  // namespace

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm) {
  return clip_with_norm(grads, max_norm, global_grad_norm(grads));
}

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, Collectives& group) {
  return clip_with_norm(grads, max_norm, global_grad_norm(grads, group));
}

namespace {

// The grads grouped by (pieces group, tp group) pair, pairs in order of first appearance
// (undefined grads name their pair too); null members: not split that way.
struct NormGroups {
  struct Key {
    Collectives* pieces;
    Collectives* tp;
    bool operator==(const Key& other) const { return pieces == other.pieces && tp == other.tp; }
  };
  std::vector<Key> keys;
  std::vector<std::vector<at::Tensor>> members;  // the defined grads of each pair
  std::vector<at::Tensor> defined;               // every defined grad, in order
};

NormGroups group_for_norm(const std::vector<at::Tensor>& grads,
                          const std::vector<const ParamPlacement*>& placements) {
  TORCH_CHECK(grads.size() == placements.size(), "clip_grad_norm: ", grads.size(), " grads but ",
              placements.size(), " placements");
  NormGroups groups;
  for (size_t i = 0; i < grads.size(); ++i) {
    const ParamPlacement& placement = *placements[i];
    const NormGroups::Key key{placement.pieces_group().get(),
                              placement.tp_split() ? placement.tp_group.get() : nullptr};
    size_t g = 0;
    while (g < groups.keys.size() && !(groups.keys[g] == key)) ++g;
    if (g == groups.keys.size()) {
      groups.keys.push_back(key);
      groups.members.emplace_back();
    }
    if (grads[i].defined()) {
      groups.members[g].push_back(grads[i]);
      groups.defined.push_back(grads[i]);
    }
  }
  return groups;
}

// The CUDA device every defined grad is on, in a dtype of the sum-of-squares kernel; none when
// any is elsewhere (or there are none).
std::optional<at::Device> one_cuda_device(const std::vector<at::Tensor>& grads) {
  std::optional<at::Device> device;
  for (const auto& t : grads) {
    if (!t.defined() || t.numel() == 0) continue;
    if (!t.is_cuda() || !sum_of_squares_fusable(t) || (device && *device != t.device()))
      return std::nullopt;
    device = t.device();
  }
  return device;
}

// A 0-dim device tensor summed over `group` (as is for a null or one-rank group).
at::Tensor all_reduced(const at::Tensor& sum, Collectives* group) {
  if (group == nullptr || group->size() <= 1) return sum;
  at::Tensor reduced = sum.reshape({1});
  group->all_reduce_sum(reduced);
  return reduced.reshape({});
}

}  // namespace

double clip_grad_norm(const std::vector<at::Tensor>& grads,
                      const std::vector<const ParamPlacement*>& placements, double max_norm) {
  const NormGroups groups = group_for_norm(grads, placements);
  double total = 0.0;
  for (size_t g = 0; g < groups.keys.size(); ++g) {
    // Pieces first (the tp slice's rows), then the tp slices (disjoint parts of the whole).
    double sum = all_reduced(total_sum_of_squares(groups.members[g]), groups.keys[g].pieces);
    total += all_reduced(sum, groups.keys[g].tp);
  }
  return clip_with_norm(groups.defined, max_norm, std::sqrt(total));
}

at::Tensor clip_grad_norm_unread(const std::vector<at::Tensor>& grads,
                                 const std::vector<const ParamPlacement*>& placements,
                                 double max_norm) {
  const std::optional<at::Device> device = one_cuda_device(grads);
  if (!device) {
    return at::scalar_tensor(clip_grad_norm(grads, placements, max_norm), at::kDouble);
  }
  const NormGroups groups = group_for_norm(grads, placements);
  // The host path's arithmetic, in the same order, on the device: float64 sums added from 0,
  // sqrt, then max_norm / (norm + 1e-6) applied where it is < 1 and the norm is finite
  // (multiplying by 1 elsewhere changes no bit).
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(*device));
  for (size_t g = 0; g < groups.keys.size(); ++g) {
    std::vector<at::Tensor> contiguous;
    for (const auto& t : groups.members[g]) {
      if (t.numel() > 0) contiguous.push_back(t.contiguous());
    }
    const at::Tensor sum =
        all_reduced(sum_of_squares_fused(contiguous, *device), groups.keys[g].pieces);
    total = total + all_reduced(sum, groups.keys[g].tp);
  }
  const at::Tensor norm = total.sqrt();
  if (max_norm > 0.0 && !groups.defined.empty()) {
    // float(coefficient): what multiplying a float32/bf16/fp16 grad by the double scalar
    // multiplies by (ATen's opmath is float), and the dtype of the multi-tensor fast path.
    const at::Tensor coefficient =
        at::where(norm.isfinite(), (max_norm / (norm + 1e-6)).clamp_max(1.0), at::ones_like(norm))
            .to(at::kFloat);
    c10::NoGradGuard no_grad;
    at::_foreach_mul_(groups.defined, coefficient);
  }
  return norm;
}

}  // namespace mixtrain
