// Muon (MomentUm Orthogonalized by Newton–Schulz) for matrix parameters, docs/architecture.md §5.
//
// Per parameter p with gradient g, in this order:
//   momentum_buffer, u = muon_momentum_update(...)         (sum | ema | ema_add, Nesterov or not)
//   O = newton_schulz(u, schedule(ns_variant, ns_steps), ns_epsilon, ns_dtype,
//                     norm_scale(ns_variant, ns_steps))
//   O = normuon_normalize(O, normuon_v, ...)                (muon_normuon only; normuon.h)
//   p *= 1 - lr * weight_decay;  p -= lr * scale * O       (lr: the group's base lr)
//     (cautious_weight_decay: the decay only where cautious_decay_mask(O, p), p before the step)
//   scale = sqrt(max(1, A/B))               (adjust_lr_fn original)
//         = matched_adamw_rms * sqrt(max(A, B))   (match_rms_adamw; A, B: last two dims)
// A 3-D parameter [E, A, B] is E independent A x B matrices (MoE experts). Within a group, all
// matrices of one shape go through batched newton_schulz calls (of whole parameters, at most
// newton_schulz_matrices_per_call() matrices each); that changes nothing but GEMM rounding
// (newton_schulz treats the leading dim as independent matrices).
//
// The same-shape batches are cached per parameter object (fp32-main-params §7.3);
// reset_parameter_caches() rebuilds them after replace_parameter(). step() also rebuilds them when
// it finds the group lists changed, so a stale cache can never update a replaced tensor.
//
// Device: the step runs on the params' device (CPU or CUDA: the fused passes' CUDA twins, the
// Newton–Schulz GEMMs through ATen, i.e. cuBLAS) with no host synchronisation on the local
// path; the distributed paths read back one 2-int check per path (distributed_muon.cpp).
//
// Distributed layouts (distributed_muon.h): set_sharding() marks a parameter FSDP-sharded or
// replicated over a Collectives group; step() then runs the local batches first (step_experts)
// and then, per group, step_fsdp / step_ddp, all giving the single-process result.
//
// Per-head (muon_heads.h): set_head_split() makes Newton–Schulz run on each head block of an
// attention matrix (the blocks join their shape's batch on the local path; the distributed
// owner splits the whole matrix it assembled) and the scale use the block's shape.
// Telemetry (muon_telemetry.h): arm_telemetry() records the next step's sample of O and update
// sums of squares on every path; take_telemetry() hands them over and stops recording.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/optim/distributed_muon.h"
#include "mixtrain/optim/leaf_optimizer.h"
#include "mixtrain/optim/muon_heads.h"
#include "mixtrain/optim/muon_owner_plan.h"
#include "mixtrain/optim/muon_telemetry.h"
#include "mixtrain/optim/newton_schulz.h"

namespace mixtrain {

enum class MomentumStyle { kSum, kEma, kEmaAdd };
enum class AdjustLrFn { kOriginal, kMatchRmsAdamw };

// "sum" | "ema" | "ema_add"; "original" | "match_rms_adamw". Anything else: invalid_argument.
MomentumStyle parse_momentum_style(const std::string& name);
AdjustLrFn parse_adjust_lr_fn(const std::string& name);
std::string momentum_style_name(MomentumStyle style);
std::string adjust_lr_fn_name(AdjustLrFn fn);

// Updates momentum_buffer in place from grad (converted to the buffer's dtype) and returns the
// direction u to orthogonalize (mu = momentum):
//   sum:     buf = mu*buf + g;          u = nesterov ? g + mu*buf : buf
//   ema:     buf = lerp(buf, g, 1-mu);  u = nesterov ? lerp(g, buf, mu) : buf
//   ema_add: buf = lerp(buf, g, 1-mu);  u = nesterov ? g + mu*buf : buf
// Without Nesterov, u IS the buffer (no copy): do not modify it in place.
at::Tensor muon_momentum_update(at::Tensor& momentum_buffer, const at::Tensor& grad, double mu,
                                MomentumStyle style, bool nesterov);

// original: sqrt(max(1, rows/cols)); match_rms_adamw: matched_adamw_rms * sqrt(max(rows, cols)).
double muon_update_scale(int64_t rows, int64_t cols, AdjustLrFn fn, double matched_adamw_rms);

// p *= 1 - lr*weight_decay; p -= lr*scale*O. O (same shape as p) is added as p.add_(O, alpha)
// does: in the promoted dtype of p and O, rounded once into p's dtype. cautious: the decay only
// where cautious_decay_mask(O, p) (normuon.h) holds for p before the update; elsewhere p keeps
// its value before adding O (the factor is 1 there, rounded as p.mul_ rounds).
void muon_apply_update(at::Tensor& param, const at::Tensor& orthogonalized, double lr,
                       double weight_decay, double scale, bool cautious = false);

template <typename Owner>
struct OptionField;

// Muon's options, declared here once: each TORCH_ARG with its default (the YAML dialect's,
// docs/config.md), and one line in muon_option_fields() (muon.cpp) giving its config key,
// rule, TOML spelling and checkpoint round trip.
struct MuonOptions : public torch::optim::OptimizerCloneableOptions<MuonOptions> {
  MuonOptions() = default;
  TORCH_ARG(double, lr) = 0.02;
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(double, momentum) = 0.95;
  TORCH_ARG(bool, nesterov) = true;
  TORCH_ARG(int64_t, ns_steps) = 5;
  TORCH_ARG(std::string, ns_variant) = "asym5";
  TORCH_ARG(std::vector<NsCoefficients>, ns_coefficients);  // custom only
  TORCH_ARG(double, ns_epsilon) = 1e-7;
  TORCH_ARG(c10::ScalarType, ns_dtype) = c10::ScalarType::BFloat16;
  TORCH_ARG(double, matched_adamw_rms) = 0.2;
  TORCH_ARG(AdjustLrFn, adjust_lr_fn) = AdjustLrFn::kMatchRmsAdamw;
  TORCH_ARG(MomentumStyle, momentum_style) = MomentumStyle::kSum;
  // Wire dtype of u and O on the distributed paths (bfloat16 or float32; distributed_muon.h).
  TORCH_ARG(c10::ScalarType, communication_dtype) = c10::ScalarType::BFloat16;
  // NorMuon (normuon.h): a float32 per-row second moment of O, state "normuon_v".
  TORCH_ARG(bool, normuon) = false;
  TORCH_ARG(double, normuon_beta2) = 0.95;
  TORCH_ARG(double, normuon_epsilon) = 1e-10;
  // Cautious weight decay (muon_apply_update).
  TORCH_ARG(bool, cautious_weight_decay) = false;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double new_lr) override { lr(new_lr); }

  // Throws std::invalid_argument "Muon: <option> <rule>, got <value>" for the first option
  // that breaks its field's rule (muon_option_fields), or for an invalid schedule.
  void validate() const;
};

// Every option of MuonOptions, in the config's display order (option_fields.h). Keys are
// "optimizer.muon_config.muon_<name>"; every field but lr is a per-group hyper-parameter.
const std::vector<OptionField<MuonOptions>>& muon_option_fields();

struct MuonParamState : public torch::optim::OptimizerCloneableParamState<MuonParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, momentum_buffer);  // param's dtype (float32 for main params)
  // NorMuon only: float32, the param's shape without its last dim (one value per row).
  TORCH_ARG(at::Tensor, normuon_v);
};

class Muon : public LeafOptimizer {
 public:
  // Every parameter must have ndim >= 2 (std::invalid_argument naming its shape otherwise);
  // groups without options get `defaults`.
  explicit Muon(std::vector<torch::optim::OptimizerParamGroup> groups, MuonOptions defaults = {});
  explicit Muon(std::vector<at::Tensor> params, MuonOptions defaults = {});

  // Parameters without a gradient are skipped (no state, no update).
  at::Tensor step(LossClosure closure = nullptr) override;
  std::string kind() const override { return "muon"; }

  // "momentum_buffer" (aliases the live buffer), "step" (0-dim int64) and, once the parameter
  // stepped with normuon, "normuon_v" (float32, a kPerRow field); empty before the first step.
  NamedTensorList export_state(const at::Tensor& param) const override;
  // The same names (LeafOptimizer::read_state); an empty list clears the param's state.
  void import_state(const at::Tensor& param, const NamedTensorList& state) override;
  std::vector<StateField> state_fields() const override;
  void set_lr(double lr) override;
  void reset_parameter_caches() override;

  // Every hyper-parameter field of muon_option_fields() (all but lr) by name, as the config
  // spells its values (dtypes "bfloat16"/"float32", ns_coefficients [[a, b, c], ...]).
  // options_with_hyperparameters checks the result with validate().
  nlohmann::json group_hyperparameters(size_t group) const override;
  std::unique_ptr<torch::optim::OptimizerOptions> options_with_hyperparameters(
      size_t group, const nlohmann::json& values) const override;

  // The cached same-shape batches of one group, in first-appearance order (for logs and
  // tests): each is one newton_schulz call per step over all of its matrices (heads, for a
  // parameter with a head split: rows x cols is then the head's shape).
  struct BatchInfo {
    int64_t rows;
    int64_t cols;
    std::vector<at::Tensor> params;
  };
  std::vector<BatchInfo> batches(size_t group) const;

  // Declares how this rank holds `param` (distributed_muon.h). Throws std::invalid_argument
  // naming the parameter when it is in no group, a non-local kind has no group, or (kFsdp) the
  // shape is not chunk group->rank() of full_shape on dim 0, or a tp split is set on anything
  // but a 2-D kFsdp / kReplicated parameter. Kept by position in the group, so
  // replace_parameter() keeps it.
  void set_sharding(const at::Tensor& param, MuonSharding sharding);
  // LeafOptimizer: the MuonSharding of a placement (muon_sharding_of) via set_sharding.
  void set_placement(const at::Tensor& param, const ParamPlacement& placement) override;
  // kLocal for a parameter that was never given one.
  const MuonSharding& sharding(const at::Tensor& param) const;

  // The smallest bucket bound of the distributed owner plan (muon_owner_plan.h; >= 0, else
  // std::invalid_argument); kMuonOwnerMinBucketNumel unless set. Every rank must set the same.
  void set_owner_min_bucket_numel(int64_t numel);

  // Orthogonalize `param` per head (muon_heads.h). Throws std::invalid_argument when it is in
  // no group, not 2-D, or split.dim is not 0 or 1 or block < 1; a matrix (whole, as the step
  // sees it) whose split dim is no multiple of block makes step() throw. Kept by position in
  // the group, as the sharding is. An inactive split (dim -1) clears it.
  void set_head_split(const at::Tensor& param, MuonHeadSplit split);
  // Inactive for a parameter that was never given one.
  const MuonHeadSplit& head_split(const at::Tensor& param) const;

  // Telemetry (muon_telemetry.h): record from now until take_telemetry(), which returns what
  // was recorded (an empty recorder when no step ran; null when not armed).
  void arm_telemetry(int64_t sample = kMuonTelemetrySample);
  std::unique_ptr<MuonTelemetryRecorder> take_telemetry();

 private:
  // All parameters of one group whose matrices (or heads) are rows x cols on one device.
  struct ShapeBatch {
    c10::Device device;
    int64_t rows;
    int64_t cols;
    std::vector<at::Tensor> params;
    std::vector<MuonHeadSplit> splits;  // parallel to params
  };
  void rebuild_batches();
  bool batches_match_groups() const;
  void step_batch(size_t group, const MuonOptions& options,
                  const std::vector<NsCoefficients>& schedule, const ShapeBatch& batch);
  // Momentum, one newton_schulz() call, NorMuon (if on) and the update for the batch's params at
  // `indices`.
  void step_slice(size_t group, const MuonOptions& options,
                  const std::vector<NsCoefficients>& schedule, const ShapeBatch& batch,
                  const std::vector<size_t>& indices);
  // O of a whole matrix `u` (in ns_dtype, u's shape): newton_schulz of u, or of each head under
  // `split`; recorded for telemetry as group's. The distributed owners' call.
  at::Tensor orthogonalize(size_t group, const MuonOptions& options, const MuonHeadSplit& split,
                           const at::Tensor& u);
  // Counts p's step, updates its momentum (state created, zeros in p's dtype, on first use; with
  // normuon also normuon_v, float32 zeros) with
  // `grad` and writes u, the direction to orthogonalize, into `out` (p's numel, contiguous;
  // rounded to out's dtype as to() rounds). A float32 buffer, grad and out of float32, bfloat16
  // or float16, contiguous on one CPU or CUDA device, take the fused pass (muon_fused.h),
  // anything else muon_momentum_update; the bits are the same.
  void momentum_direction_into(const at::Tensor& p, const at::Tensor& grad,
                               const MuonOptions& options, const at::Tensor& out);
  // NorMuon on `o`, the orthogonalized matrices of p (p's numel, in p's layout): p's normuon_v
  // updated, the float32 update returned (p's shape); `o` itself when off.
  at::Tensor normuon_update(const MuonOptions& options, const at::Tensor& p, const at::Tensor& o);
  // For the distributed paths, each under its own state lease: a copy of p's normuon_v (which
  // momentum_direction_into created), and writing `value` into it.
  at::Tensor read_normuon_v(const at::Tensor& p);
  void write_normuon_v(const at::Tensor& p, const at::Tensor& value);
  // The same into a fresh tensor of p's shape and `dtype`.
  at::Tensor momentum_direction(const at::Tensor& p, const at::Tensor& grad,
                                const MuonOptions& options, c10::ScalarType dtype);
  // muon_apply_update(p, o, lr, weight_decay, scale, cautious_weight_decay), then p's
  // copy-back target (if any) rounded from p: one fused pass for a float32 p (muon_fused.h;
  // cautious decay takes the unfused ops, which the fused kernels do not have), the same bits
  // either way. Recorded for telemetry when armed.
  void apply_update(const at::Tensor& p, const at::Tensor& o, const MuonOptions& options,
                    double scale);

  // A parameter that takes a communicating path; defined in distributed_muon.cpp.
  struct DistributedParam {
    size_t group;  // param group index (its MuonOptions)
    at::Tensor param;
    const MuonSharding* sharding;
    const MuonHeadSplit* head_split;
  };
  void step_distributed();
  void step_fsdp(Collectives& comm, const std::vector<DistributedParam>& params);
  void step_ddp(Collectives& comm, const std::vector<DistributedParam>& params);
  // The owner's part of both: the whole matrix (u's tp slices gathered over the tp group when
  // split) orthogonalized (per head under a split), then (NorMuon) normuon_normalize of the
  // whole O with the whole matrix's v rows (`v`: this rank's tp slice's rows, float32, the
  // param's shape without its last dim; gathered like u, replaced by the new rows of the
  // slice); this rank's tp slice of the update, flat, in `wire`. `v` is unused without NorMuon.
  at::Tensor owner_update(const DistributedParam& d, const at::Tensor& u, c10::ScalarType wire,
                          at::Tensor& v);
  const MuonOptions& group_options(size_t group) const;
  // check_same_params (distributed_muon.cpp) of `path` over `comm`, unless this rank's count
  // and numel are the ones its last check of that path and group agreed on.
  void check_params_once(Collectives& comm, const char* path, int64_t count, int64_t numel,
                         c10::Device device);

  std::vector<std::vector<ShapeBatch>> batches_;         // per param group
  std::vector<std::vector<const void*>> cached_params_;  // TensorImpl of each group's params
  // Per group, per param position (parallel to param_groups_[g].params()).
  std::vector<std::vector<MuonSharding>> sharding_;
  std::vector<std::vector<MuonHeadSplit>> head_split_;
  int64_t owner_min_bucket_numel_ = kMuonOwnerMinBucketNumel;
  std::string split_problem_;  // a local matrix its head split does not divide; step() throws
  std::unique_ptr<MuonTelemetryRecorder> telemetry_;  // armed: records every path's step
  // (group, path) -> the (count, numel) every rank of the group last agreed on.
  std::map<std::pair<const Collectives*, std::string>, std::pair<int64_t, int64_t>> agreed_;
  // (group, path) -> its owner plan, computed again only when the path's items change.
  std::map<std::pair<const Collectives*, std::string>, MuonOwnerPlanCache> plans_;
};

}  // namespace mixtrain
