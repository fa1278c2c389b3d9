#include "mixtrain/trainer/optim_replay.h"

#include <ATen/ATen.h>

#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mixtrain/config/validate.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/core/safetensors.h"
#include "mixtrain/core/text.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/distributed/rendezvous.h"
#include "mixtrain/model/hf_param_roles.h"
#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/lr_schedule.h"

namespace mixtrain {
namespace {

using GradsByStep = std::vector<std::map<std::string, at::Tensor>>;  // [k-1][name]

NamedTensors read_params(const std::string& path) {
  NamedTensors params = read_safetensors(path).tensors;
  if (params.empty()) throw UserError(path + ": no parameters in the file");
  for (auto& [name, tensor] : params) {
    const auto dtype = tensor.scalar_type();
    if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
      throw UserError(path + ": " + name + ": dtype " + dtype_name(dtype) +
                      " is not a parameter dtype (float32, bfloat16 or float16)");
    }
    tensor.requires_grad_(true);
  }
  return params;
}

// Checks every "step.<k>.<name>" key against the parameters before anything runs.
GradsByStep read_grads(const std::string& path, const NamedTensors& params) {
  std::map<std::string, at::Tensor> param_by_name(params.begin(), params.end());
  std::map<int64_t, std::map<std::string, at::Tensor>> by_step;
  for (auto& [key, grad] : read_safetensors(path).tensors) {
    const size_t dot = key.find('.', 5);
    int64_t step = 0;
    bool well_formed = key.rfind("step.", 0) == 0 && dot != std::string::npos && dot > 5;
    if (well_formed) {
      const std::string digits = key.substr(5, dot - 5);
      well_formed = digits.find_first_not_of("0123456789") == std::string::npos &&
                    digits.size() < 10 && digits[0] != '0';
      if (well_formed) step = std::stoll(digits);
    }
    if (!well_formed)
      throw UserError(path + ": " + key + ": expected a key step.<k>.<name>, k >= 1");
    const std::string name = key.substr(dot + 1);
    auto param = param_by_name.find(name);
    if (param == param_by_name.end()) {
      throw UserError(path + ": " + key + ": no parameter named " + name + " in the params file");
    }
    if (grad.scalar_type() != at::kFloat) {
      throw UserError(path + ": " + key + ": gradients must be float32, got " +
                      dtype_name(grad.scalar_type()));
    }
    if (!grad.sizes().equals(param->second.sizes())) {
      throw UserError(path + ": " + key + ": shape " + format_list(grad.sizes()) +
                      " differs from the " + "parameter's " + format_list(param->second.sizes()));
    }
    by_step[step][name] = grad;
  }
  if (by_step.empty()) throw UserError(path + ": no gradients in the file");
  GradsByStep grads;
  for (int64_t k = 1; k <= by_step.rbegin()->first; ++k) {
    auto it = by_step.find(k);
    if (it == by_step.end()) {
      throw UserError(path + ": step." + std::to_string(k) + ".*: step missing (steps must be 1.." +
                      std::to_string(by_step.rbegin()->first) + ")");
    }
    for (const auto& [name, param] : params) {
      if (!it->second.count(name)) {
        throw UserError(path + ": step." + std::to_string(k) + "." + name + ": gradient missing");
      }
    }
    grads.push_back(std::move(it->second));
  }
  return grads;
}

bool schedule_configured(const ResolvedConfig& resolved) {
  for (const auto& leaf : resolved.leaves) {
    if (leaf.key.rfind("train.lr_scheduler.", 0) == 0 && leaf.source != ValueSource::kDefault) {
      return true;
    }
  }
  return false;
}

// Replay on several ranks uses the FSDP layout: every tensor is split on dim 0 (torch.chunk
// semantics) over all ranks, and the output is gathered back on rank 0.
struct ReplayLayout {
  DeviceMesh mesh;
  bool sharded() const { return mesh.world_size > 1; }

  ShardLayout layout_of(const at::Tensor& full) const {
    return chunk_layout(full.sizes().vec(), mesh.world_size, mesh.rank);
  }
  // Rows of dim 0 split over every rank; a 0-dim tensor is whole on each rank (replicated).
  ParamPlacement placement_of(const std::string& name, const at::Tensor& full) const {
    ParamPlacement p = whole_placement(name, full.sizes().vec());
    if (full.dim() == 0) {
      p.kind = ParamPlacement::Kind::kReplicated;
      p.replicate_group = mesh.world;
      return p;
    }
    const ShardLayout l = layout_of(full);
    p.kind = ParamPlacement::Kind::kDim0Shard;
    p.offset = l.offset;
    p.rows = l.rows;
    p.shard_group = mesh.dp_shard_group;
    p.replicate_group = mesh.dp_replicate_group;
    return p;
  }
  at::Tensor local_rows(const at::Tensor& full) const {
    if (!sharded() || full.dim() == 0) return full;
    ShardLayout l = layout_of(full);
    return full.narrow(0, l.offset, l.rows).clone();
  }
  // Collective: the full tensor from every rank's rows (padded to equal chunks on the wire).
  at::Tensor gather(const at::Tensor& local, const std::vector<int64_t>& global_shape) const {
    if (!sharded() || local.dim() == 0) return local;
    ShardLayout l = chunk_layout(global_shape, mesh.world_size, mesh.rank);
    std::vector<int64_t> padded_shape = global_shape;
    padded_shape[0] = l.chunk_rows;
    at::Tensor padded = at::zeros(padded_shape, local.options());
    padded.narrow(0, 0, l.rows).copy_(local);
    return mesh.world->all_gather(padded).narrow(0, 0, global_shape[0]).contiguous();
  }
};

ReplayLayout join_replay_mesh(const TrainerConfig& config) {
  RankInfo rank = detect_rank_info();
  if (rank.world_size == 1) return {make_single_process_mesh()};
  set_log_rank(rank.rank);
  ParallelConfig fsdp;
  fsdp.dp_shard = rank.world_size;
  return {make_device_mesh(rank, fsdp, config.distributed.timeout_s)};
}

}  // namespace

int64_t run_optim_replay(const ResolvedConfig& resolved, const ReplayPaths& paths) {
  const TrainerConfig& config = resolved.config;
  validate_config(resolved);  // also a config built in code, before any process group exists
  // Without a model there is no column / row split to replay: refuse rather than silently
  // replaying the FSDP layout (whose result, the single-process one, TP would match anyway).
  if (config.parallel.tp > 1 || config.parallel.cp > 1) {
    throw ConfigError(
        "optim-replay has no model to split over tensor or context parallel ranks: "
        "parallel.tp (tensor_parallel_degree) = " +
        std::to_string(config.parallel.tp) + " and parallel.cp (context_parallel_degree) = " +
        std::to_string(config.parallel.cp) + " must both be 1 (--nproc N replays the FSDP layout)");
  }
  ReplayLayout layout = join_replay_mesh(config);
  NamedTensors full_params = read_params(paths.params);
  GradsByStep grads = read_grads(paths.grads, full_params);
  const int64_t steps = static_cast<int64_t>(grads.size());
  if (layout.mesh.rank == 0) {
    log_info("optim-replay: " + std::to_string(full_params.size()) + " parameters, " +
             std::to_string(steps) + " steps, " + std::to_string(layout.mesh.world_size) +
             " rank(s)");
    for (const std::string& warning : config_warnings(config)) log_warn(warning);
  }
  std::map<std::string, std::vector<int64_t>> global_shape;
  NamedTensors params;
  std::vector<ParamPlacement> placements;
  for (const auto& [name, full] : full_params) {
    global_shape[name] = full.sizes().vec();
    params.emplace_back(name, layout.local_rows(full.detach()).requires_grad_(true));
    if (layout.sharded()) placements.push_back(layout.placement_of(name, full));
  }
  for (auto& step_grads : grads) {
    for (auto& [name, grad] : step_grads) grad = layout.local_rows(grad);
  }

  // The files carry names only: their roles from the decoder layout the models share.
  std::vector<std::string> names;
  for (const auto& [name, unused] : params) names.push_back(name);
  std::unique_ptr<TrainingOptimizer> optimizer =
      build_optimizer(params, config, hf_param_roles(names, &config.model));
  optimizer->chained().set_placements(placements);
  const bool schedule = schedule_configured(resolved);
  LrSchedule lr_schedule(config.train.lr_scheduler, steps);
  for (int64_t k = 1; k <= steps; ++k) {
    optimizer->set_lr_factor(schedule ? lr_schedule.factor(k) : 1.0);
    // The given grads are true gradients; a float16 stack expects them as a loss-scaled
    // backward would deliver them (the scale is a power of two, so unscaling is exact).
    const double loss_scale = optimizer->loss_scale();
    for (auto& [name, param] : params) {
      const at::Tensor grad = grads[k - 1].at(name) * loss_scale;
      if (config.optimizer.fp32_main_params) {
        optimizer->main_grad(name).copy_(grad);
      } else {
        param.mutable_grad() = grad.to(param.scalar_type());
      }
    }
    optimizer->prepare_grads();
    optimizer->chained().clip_grad_norm(config.train.max_grad_norm);
    if (!optimizer->step_with_ready_grads()) {
      log_warn("optim-replay: step " + std::to_string(k) + " skipped (non-finite gradients)");
    }
    optimizer->zero_grad();
  }

  // Keys of one parameter's tensors end in ".<name>" or ".<name>.<state>": map them back to
  // the parameter to find its global shape.
  auto global_shape_of = [&](const std::string& key, const at::Tensor& local) {
    for (const auto& [name, shape] : global_shape) {
      const bool is_param = key == "model." + name || key == kMainParamPrefix + name;
      const bool is_state = key.rfind(kOptimizerStatePrefix + name + ".", 0) == 0 &&
                            key.find('.', std::string(kOptimizerStatePrefix).size() + name.size() +
                                              1) == std::string::npos;
      if ((is_param || is_state) && local.dim() == static_cast<int64_t>(shape.size())) return shape;
    }
    return local.sizes().vec();
  };
  NamedTensors out;
  for (const auto& [name, param] : params) out.emplace_back("model." + name, param.detach());
  for (const auto& entry : optimizer->state_dict()) out.push_back(entry);
  for (auto& [key, tensor] : out)
    tensor = layout.gather(tensor.contiguous(), global_shape_of(key, tensor));
  if (layout.mesh.rank == 0) {
    write_safetensors(paths.out, out);
    log_info("optim-replay: wrote " + paths.out);
  }
  return steps;
}

}  // namespace mixtrain
