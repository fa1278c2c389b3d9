#include "mixtrain/distributed/fsdp.h"

#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <map>
#include <stdexcept>
#include <utility>

#include "mixtrain/core/dtype.h"
#include "mixtrain/distributed/context_parallel.h"
#include "mixtrain/distributed/dim0_shard_grad.h"
#include "mixtrain/distributed/tensor_parallel.h"

namespace mixtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

c10::ScalarType dtype_or_throw(const std::string& role, const std::string& name) {
  const auto dtype = parse_float_dtype(name);
  if (!dtype) throw std::invalid_argument("parallelize: unknown " + role + " '" + name + "'");
  return *dtype;
}

// FSDP's _free_storage / _alloc_storage: the memory goes, the StorageImpl (which autograd's
// saved tensors reference) stays, so it can be refilled in place before backward reads it.
void free_storage(const c10::Storage& storage) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, impl->device()));
  impl->set_nbytes(0);
}

bool storage_is_freed(const c10::Storage& storage) {
  return storage.unsafeGetStorageImpl()->nbytes() == 0;
}

// A tensor over `storage` (re-allocated to hold `shape` when freed), detached from autograd and
// with its own version counter, so writing it does not trip the saved-tensor version checks.
at::Tensor tensor_over(const c10::Storage& storage, at::IntArrayRef shape, c10::ScalarType dtype) {
  const int64_t numel = c10::multiply_integers(shape);
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (impl->nbytes() != nbytes) {
    impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
    impl->set_nbytes(nbytes);
  }
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(storage.device()))
      .set_(storage, 0, shape, strides);
}

FullyShardedModel* model_of(const AutogradContext* ctx) {
  return reinterpret_cast<FullyShardedModel*>(ctx->saved_data.at("fsdp").toInt());
}

// all_gather_params: forward gathers (or, unsharded, casts) the parameter in param_dtype;
// backward is reduce_scatter_main_grads.
struct AllGatherParam : public torch::autograd::Function<AllGatherParam> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& param, FullyShardedModel* fsdp,
                            int64_t index, bool sharded, c10::ScalarType param_dtype) {
    ctx->saved_data["fsdp"] = reinterpret_cast<int64_t>(fsdp);
    ctx->saved_data["index"] = index;
    if (!sharded) return param.to(param_dtype);  // DDP: the replicated parameter itself
    // A fresh, exactly sized allocation, so post_forward / backward can free and refill it.
    const auto& shape = fsdp->param(index).layout.global_shape;
    at::Tensor full = at::empty(shape, param.options().dtype(param_dtype));
    fsdp->all_gather_into(index, full);
    ctx->saved_data["full"] = c10::IValue(full.storage());
    return full;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    FullyShardedModel* fsdp = model_of(ctx);
    at::Tensor grad =
        fsdp->reduce_scatter_main_grads(ctx->saved_data.at("index").toInt(), grads[0]);
    // Every consumer of the full parameter has run its backward: free it now.
    auto it = ctx->saved_data.find("full");
    if (it != ctx->saved_data.end()) free_storage(it->second.toStorage());
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Identity on a module's output whose backward gathers the module's parameters again (into the
// storages post_forward freed) before the module's own backward reads them: FSDP2's
// pre-backward unshard.
struct PreBackwardUnshard : public torch::autograd::Function<PreBackwardUnshard> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& output, FullyShardedModel* fsdp,
                            const std::vector<int64_t>& indices,
                            const std::vector<c10::Storage>& storages) {
    ctx->saved_data["fsdp"] = reinterpret_cast<int64_t>(fsdp);
    ctx->saved_data["count"] = static_cast<int64_t>(indices.size());
    for (size_t i = 0; i < indices.size(); ++i) {
      ctx->saved_data["index" + std::to_string(i)] = indices[i];
      ctx->saved_data["storage" + std::to_string(i)] = c10::IValue(storages[i]);
    }
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    FullyShardedModel* fsdp = model_of(ctx);
    const int64_t count = ctx->saved_data.at("count").toInt();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t index = ctx->saved_data.at("index" + std::to_string(i)).toInt();
      const c10::Storage storage = ctx->saved_data.at("storage" + std::to_string(i)).toStorage();
      if (!storage_is_freed(storage)) continue;
      const auto& p = fsdp->param(index);
      c10::NoGradGuard no_grad;
      fsdp->all_gather_into(index,
                            tensor_over(storage, p.layout.global_shape, fsdp->param_dtype()));
    }
    return {grads[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void plan_data_parallel(const DeviceMesh& mesh, ParallelPlan& plan) {
  plan.shard_group = mesh.dp_shard_group;
  plan.replicate_group = mesh.dp_replicate_group;
  const Collectives& shard = *plan.shard_group;
  for (PlannedParam& p : plan.params) {
    if (p.expert) continue;  // expert parallelism placed it
    p.layout = chunk_layout(p.placement.tp_shape(), shard.size(), shard.rank());
    p.placement.offset = p.layout.offset;
    p.placement.rows = p.layout.rows;
    if (shard.size() > 1) {
      p.placement.kind = ParamPlacement::Kind::kDim0Shard;
      p.placement.shard_group = plan.shard_group;
      p.placement.replicate_group = plan.replicate_group;
    } else if (plan.replicate_group->size() > 1) {
      p.placement.kind = ParamPlacement::Kind::kReplicated;
      p.placement.replicate_group = plan.replicate_group;
    }
  }
}

FullyShardedModel::FullyShardedModel(const ParallelPlan& plan, FsdpOptions options)
    : shard_group_(plan.shard_group),
      replicate_group_(plan.replicate_group),
      options_(std::move(options)),
      params_(plan.params),
      ep_group_(plan.ep_group),
      expert_dp_group_(plan.expert_dp_group),
      context_parallel_(plan.context_parallel),
      tp_group_(plan.tp_group),
      tensor_parallel_(plan.tensor_parallel) {
  if (!shard_group_ || !replicate_group_) {
    throw std::invalid_argument("fsdp: a plan without data parallelism (plan_data_parallel)");
  }
  if (ep_group_) {
    expert_parallel_ =
        std::make_shared<ExpertParallel>(ep_group_, [this] { queue_expert_grad_sync(); });
  }
  const auto& mp = options_.mix_precision;
  // fp32-main-params §2.5: main_grads need reduce_dtype float32 as the user set it; never
  // filled in.
  if (options_.fp32_main_params && mp.reduce_dtype.value_or("") != "float32") {
    throw std::invalid_argument(
        "parallelize: fp32 main grads need reduce dtype float32, got " +
        (mp.reduce_dtype ? "'" + *mp.reduce_dtype + "'" : std::string("none")));
  }
  param_dtype_ = dtype_or_throw("param_dtype", mp.param_dtype);
  if (mp.reduce_dtype) reduce_dtype_ = dtype_or_throw("reduce_dtype", *mp.reduce_dtype);
  output_dtype_ = dtype_or_throw("output_dtype", mp.output_dtype);
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    index_[params_[i].name] = i;
    names_.push_back(params_[i].name);
    placements_.push_back(params_[i].placement);
  }
  full_storages_.resize(params_.size());
}

ContextParallelHooks* FullyShardedModel::context_parallel() {
  return context_parallel_.get();
}

TensorParallelHooks* FullyShardedModel::tensor_parallel() {
  return tensor_parallel_.get();
}

int64_t FullyShardedModel::index_of(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw std::invalid_argument("fsdp: unknown parameter " + name);
  return it->second;
}

const ShardLayout& FullyShardedModel::layout(const std::string& name) const {
  return params_[index_of(name)].layout;
}

bool FullyShardedModel::is_expert_parallel(const std::string& name) const {
  return params_[index_of(name)].expert;
}

at::Tensor FullyShardedModel::gather_full(const std::string& name, const at::Tensor& local) const {
  const Param& p = params_[index_of(name)];
  const ShardLayout& l = p.layout;
  // Expert slices are equal (E divisible by ep) and ordered by ep rank.
  if (p.expert) return ep_group_->all_gather(local.detach().contiguous());
  if (shard_group_->size() == 1) return local.clone();
  return shard_group_->all_gather(pad_rows(local.detach(), l.chunk_rows))
      .narrow(0, 0, l.global_shape[0])
      .contiguous();
}

at::Tensor FullyShardedModel::gather_global(const std::string& name,
                                            const at::Tensor& local) const {
  return gather_global(std::vector<std::string>{name}, std::vector<at::Tensor>{local})[0];
}

namespace {

// group.all_gather(tensors[i]) for every i, in one all_gather per dtype: each rank's tensors
// flattened into one buffer; row r of the gathered [ranks, length] is rank r's buffer, and
// tensor i's columns of it, taken rank after rank, are its concatenation along dim 0.
std::vector<at::Tensor> all_gather_each(Collectives& group,
                                        const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out(tensors.size());
  std::map<c10::ScalarType, std::vector<size_t>> by_dtype;  // ordered alike on every rank
  for (size_t i = 0; i < tensors.size(); ++i) by_dtype[tensors[i].scalar_type()].push_back(i);
  for (const auto& [dtype, items] : by_dtype) {
    std::vector<at::Tensor> flat;
    for (const size_t i : items) flat.push_back(tensors[i].reshape(-1));
    const at::Tensor buffer = at::cat(flat);
    const at::Tensor gathered = group.all_gather(buffer).view({group.size(), buffer.numel()});
    int64_t offset = 0;
    for (const size_t i : items) {
      std::vector<int64_t> shape = tensors[i].sizes().vec();
      shape[0] *= group.size();
      out[i] = gathered.narrow(1, offset, tensors[i].numel()).reshape(shape);
      offset += tensors[i].numel();
    }
  }
  return out;
}

}  // namespace

std::vector<at::Tensor> FullyShardedModel::gather_global(
    const std::vector<std::string>& names, const std::vector<at::Tensor>& locals) const {
  if (names.size() != locals.size()) {
    throw std::invalid_argument("fsdp: gather_global of " + std::to_string(names.size()) +
                                " names with " + std::to_string(locals.size()) + " tensors");
  }
  // gather_full: expert slices over ep, dim-0 shards (padded to equal rows) over dp_shard.
  std::vector<at::Tensor> out(names.size());
  std::vector<size_t> expert, sharded;
  std::vector<at::Tensor> expert_in, sharded_in;
  for (size_t i = 0; i < names.size(); ++i) {
    const Param& p = params_[index_of(names[i])];
    const at::Tensor local = locals[i].detach().contiguous();
    if (p.expert) {
      expert.push_back(i);
      expert_in.push_back(local);
    } else if (shard_group_->size() > 1) {
      sharded.push_back(i);
      sharded_in.push_back(pad_rows(local, p.layout.chunk_rows));
    } else {
      out[i] = local.clone();
    }
  }
  if (!expert.empty()) {
    const auto gathered = all_gather_each(*ep_group_, expert_in);
    for (size_t j = 0; j < expert.size(); ++j) out[expert[j]] = gathered[j];
  }
  if (!sharded.empty()) {
    const auto gathered = all_gather_each(*shard_group_, sharded_in);
    for (size_t j = 0; j < sharded.size(); ++j) {
      const int64_t rows = params_[index_of(names[sharded[j]])].layout.global_shape[0];
      out[sharded[j]] = gathered[j].narrow(0, 0, rows).contiguous();
    }
  }
  // Tensor parallelism: the tp slices along tp_dim (brought to dim 0 for the gather).
  std::vector<size_t> split;
  std::vector<at::Tensor> split_in;
  for (size_t i = 0; i < names.size(); ++i) {
    const ParamPlacement& p = placement(names[i]);
    if (!p.tp_split()) continue;
    split.push_back(i);
    split_in.push_back(out[i].movedim(p.tp_dim, 0).contiguous());
  }
  if (!split.empty()) {
    const auto gathered = all_gather_each(*tp_group_, split_in);
    for (size_t j = 0; j < split.size(); ++j) {
      out[split[j]] = gathered[j].movedim(0, placement(names[split[j]]).tp_dim).contiguous();
    }
  }
  return out;
}

at::Tensor FullyShardedModel::local_rows(const std::string& name, const at::Tensor& full) const {
  const ShardLayout& l = params_[index_of(name)].layout;
  return full.narrow(0, l.offset, l.rows);
}

const ParamPlacement& FullyShardedModel::placement(const std::string& name) const {
  return placements_[index_of(name)];
}

void FullyShardedModel::all_gather_into(int64_t index, const at::Tensor& full) const {
  const Param& p = params_[index];
  c10::NoGradGuard no_grad;
  // Cast before the wire: the gather moves param_dtype bytes (bfloat16 as its bits).
  const at::Tensor local = p.param.detach().to(param_dtype_);
  if (shard_group_->size() == 1) {
    full.copy_(local);
    return;
  }
  full.copy_(shard_group_->all_gather(pad_rows(local, p.layout.chunk_rows))
                 .narrow(0, 0, p.layout.global_shape[0]));
}

at::Tensor FullyShardedModel::reduce_scatter_main_grads(int64_t index,
                                                        const at::Tensor& full_grad) {
  const Param& p = params_[index];
  c10::NoGradGuard no_grad;
  if (p.expert) {
    // Reduced at the end of backward (sync_expert_grads), in a fixed order on every rank.
    expert_grads_.add(index, full_grad);
    return at::Tensor();
  }
  at::Tensor grad = reduce_dim0_shard_grad(full_grad, p.layout, *shard_group_, *replicate_group_);
  if (reduce_dtype_ && *reduce_dtype_ != at::kFloat) grad = grad.to(*reduce_dtype_);
  if (options_.fp32_main_params) {
    deliver_grad(p, grad);
    return at::Tensor();  // .grad stays empty (fp32-main-params §8.1)
  }
  return grad.to(p.param.scalar_type());
}

void FullyShardedModel::deliver_grad(const Param& p, at::Tensor grad) {
  if (options_.fp32_main_params) {
    if (main_grads_ == nullptr) {
      throw std::logic_error(
          "fsdp: fp32_main_params is on but no optimizer was attached (set_main_grads) before "
          "backward");
    }
    main_grads_->accumulate_main_grad(p.name, grad);
    return;
  }
  // Outside autograd (the final callback), so accumulate into .grad as the engine would.
  grad = grad.to(p.param.scalar_type());
  at::Tensor param = p.param;
  if (param.grad().defined()) {
    param.mutable_grad().add_(grad);
  } else {
    param.mutable_grad() = grad;
  }
}

void FullyShardedModel::queue_expert_grad_sync() {
  if (expert_sync_queued_) return;
  expert_sync_queued_ = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { sync_expert_grads(); });
}

void FullyShardedModel::sync_expert_grads() {
  expert_sync_queued_ = false;
  c10::NoGradGuard no_grad;
  const double ranks = static_cast<double>(shard_group_->size() * replicate_group_->size());
  // Every expert param, in model order, whether or not its experts saw a token on this rank:
  // the ranks of expert_dp_group must issue the same all_reduces.
  for (int64_t index = 0; index < static_cast<int64_t>(params_.size()); ++index) {
    const Param& p = params_[index];
    if (!p.expert) continue;
    at::Tensor grad =
        expert_grads_.reduce(index, p.param.sizes(), p.param.device(), *expert_dp_group_, ranks);
    if (reduce_dtype_ && *reduce_dtype_ != at::kFloat) grad = grad.to(*reduce_dtype_);
    deliver_grad(p, grad);
  }
  expert_grads_.clear();
}

at::Tensor FullyShardedModel::unshard(const std::string& name, const at::Tensor& param) {
  const int64_t index = index_of(name);
  const bool sharded = shard_group_->size() > 1 && !params_[index].expert;
  at::Tensor full = AllGatherParam::apply(param, this, index, sharded, param_dtype_);
  if (sharded) full_storages_[index] = full.storage();
  return full;
}

at::Tensor FullyShardedModel::post_forward(const std::vector<std::string>& names,
                                           const at::Tensor& output) {
  // Unsharded (DDP) parameters are the model's own: nothing to free.
  if (shard_group_->size() == 1 || !options_.reshard_after_forward) return output;
  std::vector<int64_t> indices;
  std::vector<c10::Storage> storages;
  for (const auto& name : names) {
    const int64_t index = index_of(name);
    if (!full_storages_[index]) continue;  // not gathered in this forward
    indices.push_back(index);
    storages.push_back(std::move(full_storages_[index]));
    full_storages_[index] = c10::Storage();
  }
  at::Tensor result = output;
  if (at::GradMode::is_enabled() && output.requires_grad()) {
    result = PreBackwardUnshard::apply(output, this, indices, storages);
  }
  for (const auto& storage : storages) free_storage(storage);
  return result;
}

at::Tensor FullyShardedModel::cast_forward_input(const at::Tensor& input) {
  // A new forward: nothing of an earlier, failed backward may leak into this one's expert
  // gradients or keep its reduction from being queued.
  expert_grads_.clear();
  expert_sync_queued_ = false;
  if (!options_.mix_precision.cast_forward_inputs || !at::isFloatingType(input.scalar_type())) {
    return input;
  }
  return input.to(param_dtype_);
}

at::Tensor FullyShardedModel::cast_forward_output(const at::Tensor& output) {
  if (!at::isFloatingType(output.scalar_type())) return output;
  return output.to(output_dtype_);
}

}  // namespace mixtrain
