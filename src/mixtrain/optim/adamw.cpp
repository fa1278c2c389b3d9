#include "mixtrain/optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/Version.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <utility>

#include "mixtrain/core/dtype.h"
#include "mixtrain/optim/adamw_fused.h"
#include "mixtrain/optim/python_scalar.h"

namespace mixtrain {
namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

// The first out-of-range option, or "" when all are valid.
std::string adamw_options_problem(const AdamWOptions& options) {
  if (options.amsgrad()) return "amsgrad is not supported";
  if (!(options.lr() >= 0)) return "invalid learning rate " + std::to_string(options.lr());
  if (!(options.eps() >= 0)) return "invalid eps " + std::to_string(options.eps());
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  if (!(beta1 >= 0 && beta1 < 1)) return "invalid beta1 " + std::to_string(beta1);
  if (!(beta2 >= 0 && beta2 < 1)) return "invalid beta2 " + std::to_string(beta2);
  if (!(options.weight_decay() >= 0)) {
    return "invalid weight_decay " + std::to_string(options.weight_decay());
  }
  return "";
}

// The double scalars of torch/optim/adamw.py, cast to float as each ATen op casts its Scalar.
AdamWStepScalars step_scalars(const AdamWOptions& options, int64_t step) {
  const double lr = options.lr();
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  AdamWStepScalars s;
  s.decay = static_cast<float>(1 - lr * options.weight_decay());
  s.exp_avg_weight = static_cast<float>(1 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(options.eps());
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  return s;
}

// The reference op sequence (adamw.h), for every case the fused kernel does not take.
void unfused_step(const AdamWOptions& options, int64_t step, const at::Tensor& param,
                  const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) {
  const double lr = options.lr();
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  const double step_size = lr / bias_correction1;
  mul_python_float_(param, 1 - lr * options.weight_decay());
  exp_avg.lerp_(grad, 1 - beta1);
  mul_python_float_(exp_avg_sq, beta2).addcmul_(grad, grad, 1 - beta2);
  const at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options.eps());
  param.addcdiv_(exp_avg, denom, -step_size);
}

// Elements [begin, begin + count) of a contiguous tensor, flat (the tensor itself when that is
// all of it).
at::Tensor flat_part(const at::Tensor& t, int64_t begin, int64_t count) {
  if (begin == 0 && count == t.numel()) return t;
  return t.view(-1).narrow(0, begin, count);
}

// Float lanes of ATen's Vectorized<float> at the capability ATen runs (ATen/cpu/vec/vec_base.h:
// 64-byte vectors with AVX-512, 32-byte ones otherwise on x86-64).
int64_t aten_float_lanes() {
  static const int64_t lanes = at::get_cpu_capability() == "AVX512" ? 16 : 8;
  return lanes;
}

// torch.optim.AdamW(fused=True)'s update of elements [head, numel) of a float32 contiguous CPU
// param, by ATen's _fused_adamw_ on those elements: fewer than one of its vectors, so its tail
// loop, exactly as in its call on the whole tensor (same addresses; its work splits at
// multiples of 16 elements, so only the tensor's last elements are ever a tail).
void aten_fused_tail(const AdamWOptions& options, int64_t step, const at::Tensor& param,
                     const at::Tensor& grad, const at::Tensor& exp_avg,
                     const at::Tensor& exp_avg_sq, int64_t head) {
  const int64_t count = param.numel() - head;
  const at::Tensor steps = at::scalar_tensor(static_cast<double>(step), at::kFloat);
  at::_fused_adamw_({flat_part(param, head, count)}, {flat_part(grad, head, count)},
                    {flat_part(exp_avg, head, count)}, {flat_part(exp_avg_sq, head, count)}, {},
                    {steps}, options.lr(), std::get<0>(options.betas()),
                    std::get<1>(options.betas()), options.weight_decay(), options.eps(),
                    /*amsgrad=*/false, /*maximize=*/false);
}

at::Tensor state_tensor_like(const at::Tensor& value, const at::Tensor& param) {
  // A private copy in the param's dtype, laid out like the param.
  at::Tensor out = at::empty_like(param, at::MemoryFormat::Preserve);
  out.copy_(value);
  return out;
}

// Fused updates waiting to run (adamw_fused.h), and the copy-backs that must follow them (a
// model param the pass cannot write). A CPU update runs at once; the CUDA updates of a step are
// launched together at its end (one multi-tensor pass per device).
struct FusedBatch {
  std::vector<AdamWFusedUpdate> updates;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (model param, param)

  // One pass per device, in order of first appearance, then the copies (same streams).
  void run() {
    std::vector<AdamWFusedUpdate> rest = std::move(updates);
    while (!rest.empty()) {
      const at::Device device = rest.front().param.device();
      std::vector<AdamWFusedUpdate> here, elsewhere;
      for (auto& u : rest) (u.param.device() == device ? here : elsewhere).push_back(std::move(u));
      adamw_step_fused(here);
      rest = std::move(elsewhere);
    }
    for (const auto& [model, param] : copies) model.copy_(param);
    updates.clear();
    copies.clear();
  }
};

}  // namespace

AdamW::AdamW(std::vector<torch::optim::OptimizerParamGroup> groups, AdamWOptions defaults)
    : LeafOptimizer(std::move(groups), std::make_unique<AdamWOptions>(defaults)) {
  check_options(adamw_options_problem);
}

at::Tensor AdamW::step(LossClosure closure) {
  const at::Tensor loss = evaluate_closure(closure);
  c10::NoGradGuard no_grad;
  // Without the swap optimizer every CUDA parameter of the step goes into one batch; with it,
  // a parameter's state is only acquired while its lease lasts, so each is launched on its own.
  FusedBatch batch;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const AdamWOptions&>(group.options());
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      const at::Tensor& grad = param.grad();
      TORCH_CHECK(!grad.is_sparse(), "adamw: sparse gradients are not supported");
      const StateLease lease(*this, param);
      auto& slot = state_[state_key(param)];
      if (!slot) {
        auto fresh = std::make_unique<AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(at::zeros_like(param, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<AdamWParamState&>(*slot);
      state.step(state.step() + 1);
      const at::Tensor model = copy_back_target(param);

      if (adamw_fusable(param, grad, state.exp_avg(), state.exp_avg_sq())) {
        const bool fuse_model = model.defined() && adamw_fusable_model(model, param);
        AdamWStepScalars scalars = step_scalars(options, state.step());
        scalars.correctly_rounded_sqrt = fused_form_;
        // The fused form on the CPU: ATen's _fused_adamw_ itself for the last elements that do
        // not fill one of its vectors (its scalar tail, whose operations its compiler chose),
        // first; the kernel for the rest.
        const int64_t tail = fused_form_ && param.is_cpu() ? param.numel() % aten_float_lanes() : 0;
        const int64_t head = param.numel() - tail;
        if (tail > 0) {
          aten_fused_tail(options, state.step(), param, grad, state.exp_avg(), state.exp_avg_sq(),
                          head);
          if (fuse_model) flat_part(model, head, tail).copy_(flat_part(param, head, tail));
        }
        batch.updates.push_back({flat_part(param, 0, head), flat_part(grad, 0, head),
                                 flat_part(state.exp_avg(), 0, head),
                                 flat_part(state.exp_avg_sq(), 0, head),
                                 fuse_model ? flat_part(model, 0, head) : at::Tensor(), scalars});
        if (model.defined() && !fuse_model) batch.copies.emplace_back(model, param);
        if (param.is_cpu() || state_swap() != nullptr) batch.run();  // (inside the lease)
        continue;
      }
      unfused_step(options, state.step(), param, grad.to(param.scalar_type()), state.exp_avg(),
                   state.exp_avg_sq());
      if (model.defined()) model.copy_(param);  // copy_ rounds to nearest even, as to() does
    }
  }
  batch.run();
  return loss;
}

NamedTensorList AdamW::export_state(const at::Tensor& param) const {
  auto it = state_.find(state_key(param));
  if (it == state_.end()) return {};
  const auto& state = static_cast<const AdamWParamState&>(*it->second);
  return {{"exp_avg", state.exp_avg()},
          {"exp_avg_sq", state.exp_avg_sq()},
          {"step", at::scalar_tensor(state.step(), at::kLong)}};
}

std::vector<StateField> AdamW::state_fields() const {
  return {{"exp_avg"}, {"exp_avg_sq"}, {"step", StateField::Kind::kCount}};
}

void AdamW::import_state(const at::Tensor& param, const NamedTensorList& state) {
  const CheckedState checked = read_state(param, state);
  void* const key = state_key(param);
  if (checked.empty()) {
    state_.erase(key);
    return;
  }
  auto fresh = std::make_unique<AdamWParamState>();
  fresh->step(checked.counts.at("step"));
  fresh->exp_avg(state_tensor_like(checked.tensors.at("exp_avg"), param));
  fresh->exp_avg_sq(state_tensor_like(checked.tensors.at("exp_avg_sq"), param));
  state_[key] = std::move(fresh);
}

void AdamW::set_lr(double lr) {
  for (auto& group : param_groups_) group.options().set_lr(lr);
}

nlohmann::json AdamW::group_hyperparameters(size_t group) const {
  const auto& options = static_cast<const AdamWOptions&>(param_groups_.at(group).options());
  return {{"betas", {std::get<0>(options.betas()), std::get<1>(options.betas())}},
          {"eps", options.eps()},
          {"weight_decay", options.weight_decay()},
          {"amsgrad", options.amsgrad()}};
}

std::unique_ptr<torch::optim::OptimizerOptions> AdamW::options_with_hyperparameters(
    size_t group, const nlohmann::json& values) const {
  const auto& options = static_cast<const AdamWOptions&>(param_groups_.at(group).options());
  HyperparameterReader reader(values);
  const nlohmann::json& betas = reader.field("betas");
  if (!betas.is_array() || betas.size() != 2 || !betas[0].is_number() || !betas[1].is_number()) {
    throw std::invalid_argument(
        hyperparameter_type_error("betas", "an array of two numbers", betas) +
        (betas.is_array() ? " of size " + std::to_string(betas.size()) : ""));
  }
  AdamWOptions candidate = options;
  candidate.betas({betas[0].get<double>(), betas[1].get<double>()})
      .eps(reader.number("eps"))
      .weight_decay(reader.number("weight_decay"))
      .amsgrad(reader.boolean("amsgrad"));
  reader.finish();
  const std::string problem = adamw_options_problem(candidate);
  if (!problem.empty()) throw std::invalid_argument(problem);
  return std::make_unique<AdamWOptions>(candidate);
}

}  // namespace mixtrain
