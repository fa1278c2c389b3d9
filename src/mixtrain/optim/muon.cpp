#include "mixtrain/optim/muon.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include "mixtrain/core/dtype.h"
#include "mixtrain/optim/kernels/muon_kernel.h"
#include "mixtrain/optim/muon_fused.h"
#include "mixtrain/optim/normuon.h"
#include "mixtrain/optim/option_fields.h"
#include "mixtrain/optim/python_scalar.h"

namespace mixtrain {

MomentumStyle parse_momentum_style(const std::string& name) {
  if (name == "sum") return MomentumStyle::kSum;
  if (name == "ema") return MomentumStyle::kEma;
  if (name == "ema_add") return MomentumStyle::kEmaAdd;
  throw std::invalid_argument("unknown Muon momentum style '" + name +
                              "' (expected sum, ema or ema_add)");
}

AdjustLrFn parse_adjust_lr_fn(const std::string& name) {
  if (name == "original") return AdjustLrFn::kOriginal;
  if (name == "match_rms_adamw") return AdjustLrFn::kMatchRmsAdamw;
  throw std::invalid_argument("unknown Muon adjust_lr_fn '" + name +
                              "' (expected original or match_rms_adamw)");
}

std::string momentum_style_name(MomentumStyle style) {
  switch (style) {
    case MomentumStyle::kSum:
      return "sum";
    case MomentumStyle::kEma:
      return "ema";
    case MomentumStyle::kEmaAdd:
      return "ema_add";
  }
  throw std::logic_error("momentum_style_name: bad enum value");
}

std::string adjust_lr_fn_name(AdjustLrFn fn) {
  switch (fn) {
    case AdjustLrFn::kOriginal:
      return "original";
    case AdjustLrFn::kMatchRmsAdamw:
      return "match_rms_adamw";
  }
  throw std::logic_error("adjust_lr_fn_name: bad enum value");
}

at::Tensor muon_momentum_update(at::Tensor& momentum_buffer, const at::Tensor& grad, double mu,
                                MomentumStyle style, bool nesterov) {
  TORCH_CHECK(momentum_buffer.sizes() == grad.sizes(), "muon_momentum_update: buffer shape ",
              momentum_buffer.sizes(), " differs from grad shape ", grad.sizes());
  // A bf16 grad of an fp32 main param accumulates in the buffer's precision.
  const at::Tensor g = grad.to(momentum_buffer.scalar_type());
  switch (style) {
    case MomentumStyle::kSum:
      mul_python_float_(momentum_buffer, mu).add_(g);
      return nesterov ? g.add(momentum_buffer, mu) : momentum_buffer;
    case MomentumStyle::kEma:
      momentum_buffer.lerp_(g, 1.0 - mu);
      return nesterov ? g.lerp(momentum_buffer, mu) : momentum_buffer;
    case MomentumStyle::kEmaAdd:
      momentum_buffer.lerp_(g, 1.0 - mu);
      return nesterov ? g.add(momentum_buffer, mu) : momentum_buffer;
  }
  throw std::logic_error("muon_momentum_update: bad MomentumStyle");
}

double muon_update_scale(int64_t rows, int64_t cols, AdjustLrFn fn, double matched_adamw_rms) {
  TORCH_CHECK(rows > 0 && cols > 0, "muon_update_scale: empty matrix ", rows, "x", cols);
  const auto a = static_cast<double>(rows);
  const auto b = static_cast<double>(cols);
  switch (fn) {
    case AdjustLrFn::kOriginal:
      return std::sqrt(std::max(1.0, a / b));
    case AdjustLrFn::kMatchRmsAdamw:
      return matched_adamw_rms * std::sqrt(std::max(a, b));
  }
  throw std::logic_error("muon_update_scale: bad AdjustLrFn");
}

void muon_apply_update(at::Tensor& param, const at::Tensor& orthogonalized, double lr,
                       double weight_decay, double scale, bool cautious) {
  TORCH_CHECK(param.sizes() == orthogonalized.sizes(), "muon_apply_update: update shape ",
              orthogonalized.sizes(), " differs from parameter shape ", param.sizes());
  // Multiplying by exactly 1 changes nothing, so skip the pass.
  if (weight_decay != 0.0 && cautious) {
    // The factor in p.mul_'s compute dtype (float for bfloat16/float16 p), so where the mask
    // holds p rounds exactly as the plain decay (mul_python_float_) does, and stays put elsewhere.
    const auto dtype = at::promote_types(param.scalar_type(), at::kFloat);
    const auto options = param.options().dtype(dtype);
    param.mul_(at::where(cautious_decay_mask(orthogonalized, param),
                         at::scalar_tensor(1.0 - lr * weight_decay, options),
                         at::scalar_tensor(1.0, options)));
  } else if (weight_decay != 0.0) {
    mul_python_float_(param, 1.0 - lr * weight_decay);
  }
  param.add_(orthogonalized, -lr * scale);
}

namespace {

// The rules of muon_momentum_update, as the kernel spells them.
MuonMomentumScalars momentum_scalars(const MuonOptions& options) {
  MuonMomentumScalars s;
  const bool ema = options.momentum_style() != MomentumStyle::kSum;
  s.buffer_rule = ema ? MuonBufferRule::kLerp : MuonBufferRule::kMulAdd;
  s.direction_rule = !options.nesterov()                               ? MuonDirectionRule::kBuffer
                     : options.momentum_style() == MomentumStyle::kEma ? MuonDirectionRule::kLerp
                                                                       : MuonDirectionRule::kAdd;
  s.mu = static_cast<float>(options.momentum());
  s.buffer_weight = static_cast<float>(1.0 - options.momentum());
  return s;
}

}  // namespace

const std::vector<OptionField<MuonOptions>>& muon_option_fields() {
  using F = OptionField<MuonOptions>;
  const NumberCodec number;
  const ChoiceCodec<c10::ScalarType> wire{{{"bfloat16", at::kBFloat16}, {"float32", at::kFloat}}};
  // A checkpoint or a program may run Newton-Schulz in float64; a config file may not.
  ChoiceCodec<c10::ScalarType> ns_dtype = wire;
  ns_dtype.json_only = {{"float64", at::kDouble}};
  const auto dtype_rule = [](const ChoiceCodec<c10::ScalarType>& codec) {
    return [codec](c10::ScalarType v) -> std::string {
      for (const auto* table : {&codec.names, &codec.json_only}) {
        for (const auto& entry : *table) {
          if (entry.second == v) return "";
        }
      }
      return "must be one of " + codec.list() + ", got " + dtype_name(v);
    };
  };
  static const std::vector<F> fields = {
      option<MuonOptions>(
          "lr", [](auto& o) -> auto& { return o.lr(); }, number, rule_non_negative)
          .toml("optimizer.muon_lr", /*by_section=*/true)
          .not_hyperparameter(),
      option<MuonOptions>(
          "weight_decay", [](auto& o) -> auto& { return o.weight_decay(); }, number,
          rule_non_negative),
      option<MuonOptions>(
          "momentum", [](auto& o) -> auto& { return o.momentum(); }, number,
          rule_unit_interval_open_right)
          .toml("optimizer.muon_momentum"),
      option<MuonOptions>(
          "nesterov", [](auto& o) -> auto& { return o.nesterov(); }, FlagCodec{})
          .toml("optimizer.muon_enable_nesterov"),
      option<MuonOptions>(
          "ns_steps", [](auto& o) -> auto& { return o.ns_steps(); }, IntegerCodec{},
          [](int64_t v) { return rule_positive(double(v)); })
          .toml("optimizer.muon_ns_steps"),
      option<MuonOptions>(
          "ns_variant", [](auto& o) -> auto& { return o.ns_variant(); }, TextCodec{},
          rule_one_of({"legacy", "asym5", "quintic", "hybrid", "polar_express", "custom"}))
          .toml("optimizer.muon_ns_variant", /*by_section=*/true),
      option<MuonOptions>(
          "ns_coefficients", [](auto& o) -> auto& { return o.ns_coefficients(); }, TriplesCodec{}),
      option<MuonOptions>(
          "ns_epsilon", [](auto& o) -> auto& { return o.ns_epsilon(); }, number, rule_positive),
      option<MuonOptions>(
          "ns_dtype", [](auto& o) -> auto& { return o.ns_dtype(); }, ns_dtype, dtype_rule(ns_dtype))
          .toml("optimizer.muon_ns_dtype"),
      option<MuonOptions>(
          "matched_adamw_rms", [](auto& o) -> auto& { return o.matched_adamw_rms(); }, number,
          rule_positive),
      option<MuonOptions>(
          "adjust_lr_fn", [](auto& o) -> auto& { return o.adjust_lr_fn(); },
          ChoiceCodec<AdjustLrFn>{{{"original", AdjustLrFn::kOriginal},
                                   {"match_rms_adamw", AdjustLrFn::kMatchRmsAdamw}}})
          .toml("optimizer.muon_adjust_lr_fn"),
      option<MuonOptions>(
          "momentum_style", [](auto& o) -> auto& { return o.momentum_style(); },
          ChoiceCodec<MomentumStyle>{{{"sum", MomentumStyle::kSum},
                                      {"ema", MomentumStyle::kEma},
                                      {"ema_add", MomentumStyle::kEmaAdd}}}),
      option<MuonOptions>(
          "communication_dtype", [](auto& o) -> auto& { return o.communication_dtype(); }, wire,
          dtype_rule(wire))
          .toml("optimizer.muon_communication_dtype"),
      option<MuonOptions>(
          "normuon", [](auto& o) -> auto& { return o.normuon(); }, FlagCodec{})
          .toml("optimizer.muon_normuon"),
      option<MuonOptions>(
          "normuon_beta2", [](auto& o) -> auto& { return o.normuon_beta2(); }, number,
          rule_unit_interval_open_right)
          .toml("optimizer.muon_normuon_beta2"),
      option<MuonOptions>(
          "normuon_epsilon", [](auto& o) -> auto& { return o.normuon_epsilon(); }, number,
          rule_positive)
          .toml("optimizer.muon_normuon_epsilon"),
      option<MuonOptions>(
          "cautious_weight_decay", [](auto& o) -> auto& { return o.cautious_weight_decay(); },
          FlagCodec{})
          .toml("optimizer.muon_cautious_weight_decay"),
  };
  return fields;
}

void MuonOptions::validate() const {
  const std::string problem = fields_problem(muon_option_fields(), *this);
  if (!problem.empty()) throw std::invalid_argument("Muon: " + problem);
  newton_schulz_schedule(ns_variant(), ns_steps(), ns_coefficients());  // throws if invalid
}

Muon::Muon(std::vector<torch::optim::OptimizerParamGroup> groups, MuonOptions defaults)
    : LeafOptimizer(std::move(groups), std::make_unique<MuonOptions>(defaults)) {
  defaults.validate();
  rebuild_batches();
}

Muon::Muon(std::vector<at::Tensor> params, MuonOptions defaults)
    : Muon(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
               std::move(params))},
           std::move(defaults)) {}

void Muon::rebuild_batches() {
  batches_.assign(param_groups_.size(), {});
  split_problem_.clear();
  cached_params_.assign(param_groups_.size(), {});
  // Shardings stay with their positions; new groups or params start local.
  sharding_.resize(param_groups_.size());
  head_split_.resize(param_groups_.size());
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    sharding_[g].resize(param_groups_[g].params().size());
    head_split_[g].resize(param_groups_[g].params().size());
  }
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto* options = dynamic_cast<const MuonOptions*>(&param_groups_[g].options());
    if (options == nullptr) {
      throw std::invalid_argument("Muon: param group " + std::to_string(g) +
                                  " has options of another optimizer");
    }
    options->validate();
    auto& batches = batches_[g];
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (p.dim() < 2) {
        throw std::invalid_argument("Muon updates matrices (ndim >= 2); got a parameter of shape " +
                                    c10::str(p.sizes()) + " (route it to AdamW)");
      }
      cached_params_[g].push_back(p.unsafeGetTensorImpl());
      if (!muon_steps_locally(sharding_[g][i], p.dim())) continue;  // step_fsdp / step_ddp
      MuonHeadSplit split = head_split_[g][i];
      // A shard held whole until set_sharding (the builder sets splits first) may not divide:
      // step() refuses it if it is still so then.
      try {
        muon_matrix_shape(
            p.sizes(), split,
            sharding_[g][i].name.empty() ? "a parameter" : "'" + sharding_[g][i].name + "'");
      } catch (const std::invalid_argument& error) {
        if (split_problem_.empty()) split_problem_ = error.what();
        split = {};
      }
      const std::pair<int64_t, int64_t> shape = muon_matrix_shape(p.sizes(), split, "");
      const int64_t rows = shape.first;  // (a lambda below captures them: no binding)
      const int64_t cols = shape.second;
      auto same_shape = [&](const ShapeBatch& b) {
        return b.device == p.device() && b.rows == rows && b.cols == cols;
      };
      auto it = std::find_if(batches.begin(), batches.end(), same_shape);
      if (it == batches.end()) it = batches.insert(batches.end(), {p.device(), rows, cols, {}, {}});
      it->params.push_back(p);
      it->splits.push_back(split);
    }
  }
}

bool Muon::batches_match_groups() const {
  if (cached_params_.size() != param_groups_.size()) return false;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    if (cached_params_[g].size() != params.size()) return false;
    for (size_t i = 0; i < params.size(); ++i) {
      if (cached_params_[g][i] != params[i].unsafeGetTensorImpl()) return false;
    }
  }
  return true;
}

void Muon::reset_parameter_caches() {
  rebuild_batches();
}

std::vector<Muon::BatchInfo> Muon::batches(size_t group) const {
  TORCH_CHECK(group < batches_.size(), "Muon::batches: no group ", group);
  std::vector<BatchInfo> out;
  for (const auto& b : batches_[group]) out.push_back({b.rows, b.cols, b.params});
  return out;
}

at::Tensor Muon::step(LossClosure closure) {
  const at::Tensor loss = evaluate_closure(closure);
  c10::NoGradGuard no_grad;
  // add_param_group() or replace_parameter() without reset_parameter_caches().
  if (!batches_match_groups()) rebuild_batches();
  if (!split_problem_.empty()) throw std::invalid_argument(split_problem_);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& options = static_cast<const MuonOptions&>(param_groups_[g].options());
    const auto schedule =
        newton_schulz_schedule(options.ns_variant(), options.ns_steps(), options.ns_coefficients());
    for (const auto& batch : batches_[g]) step_batch(g, options, schedule, batch);
  }
  step_distributed();
  return loss;
}

void Muon::momentum_direction_into(const at::Tensor& p, const at::Tensor& grad,
                                   const MuonOptions& options, const at::Tensor& out) {
  TORCH_CHECK(grad.numel() == p.numel() && out.numel() == p.numel(),
              "Muon: momentum_direction_into: grad ", grad.sizes(), " or out ", out.sizes(),
              " does not match the parameter ", p.sizes());
  const StateLease lease(*this, p);
  auto& slot = state_[state_key(p)];
  if (!slot) {
    auto fresh = std::make_unique<MuonParamState>();
    fresh->momentum_buffer(at::zeros(p.sizes(), p.options()));
    slot = std::move(fresh);
  }
  auto& state = static_cast<MuonParamState&>(*slot);
  if (options.normuon() && !state.normuon_v().defined()) {
    state.normuon_v(at::zeros(p.sizes().slice(0, p.dim() - 1), p.options().dtype(at::kFloat)));
  }
  state.step(state.step() + 1);
  at::Tensor& buffer = state.momentum_buffer();
  const c10::Device device = buffer.device();
  if (muon_fusable(buffer, /*float32_only=*/true, device) && muon_fusable(grad, false, device) &&
      muon_fusable(out, false, device)) {
    muon_momentum_fused(momentum_scalars(options), buffer, grad, out);
  } else {
    const at::Tensor u = muon_momentum_update(buffer, grad, options.momentum(),
                                              options.momentum_style(), options.nesterov());
    out.view(u.sizes()).copy_(u);
  }
}

at::Tensor Muon::momentum_direction(const at::Tensor& p, const at::Tensor& grad,
                                    const MuonOptions& options, c10::ScalarType dtype) {
  at::Tensor u = at::empty(p.sizes(), p.options().dtype(dtype));
  momentum_direction_into(p, grad, options, u);
  return u;
}

at::Tensor Muon::read_normuon_v(const at::Tensor& p) {
  const StateLease lease(*this, p);
  return static_cast<MuonParamState&>(*state_.at(state_key(p))).normuon_v().clone();
}

void Muon::write_normuon_v(const at::Tensor& p, const at::Tensor& value) {
  const StateLease lease(*this, p);
  at::Tensor& v = static_cast<MuonParamState&>(*state_.at(state_key(p))).normuon_v();
  v.copy_(value.view(v.sizes()));
}

at::Tensor Muon::normuon_update(const MuonOptions& options, const at::Tensor& p,
                                const at::Tensor& o) {
  if (!options.normuon()) return o;
  at::Tensor v = read_normuon_v(p);
  const at::Tensor update =
      normuon_normalize(o.view(p.sizes()), v, options.normuon_beta2(), options.normuon_epsilon());
  write_normuon_v(p, v);
  return update;
}

void Muon::apply_update(const at::Tensor& p, const at::Tensor& o, const MuonOptions& options,
                        double scale) {
  if (telemetry_) telemetry_->record_update(p, o, options.lr() * scale);
  const at::Tensor model = copy_back_target(p);
  const c10::Device device = p.device();
  const bool fuse_model =
      !model.defined() || (muon_fusable(model, false, device) &&
                           model.scalar_type() != at::kFloat && model.numel() == p.numel());
  const bool cautious = options.cautious_weight_decay() && options.weight_decay() != 0.0;
  if (!cautious && muon_fusable(p, /*float32_only=*/true, device) &&
      muon_fusable(o, false, device) && o.numel() == p.numel() && fuse_model) {
    MuonApplyScalars s;
    s.decay_param = options.weight_decay() != 0.0;  // as muon_apply_update skips the pass
    s.decay = static_cast<float>(1.0 - options.lr() * options.weight_decay());
    s.alpha = static_cast<float>(-options.lr() * scale);
    muon_apply_fused(s, p, o, model);
    return;
  }
  at::Tensor param = p;
  muon_apply_update(param, o.view(p.sizes()), options.lr(), options.weight_decay(), scale,
                    options.cautious_weight_decay());
  if (model.defined()) model.copy_(p);  // copy_ rounds to nearest even, as to() does
}

void Muon::step_batch(size_t group, const MuonOptions& options,
                      const std::vector<NsCoefficients>& schedule, const ShapeBatch& batch) {
  std::vector<size_t> ready;
  for (size_t k = 0; k < batch.params.size(); ++k) {
    const at::Tensor& grad = batch.params[k].grad();
    if (!grad.defined()) continue;
    TORCH_CHECK(!grad.is_sparse(), "Muon does not support sparse gradients");
    ready.push_back(k);
  }
  // Slices of whole parameters of at most one Newton-Schulz call's matrices each, so that the
  // stacked directions and the orthogonalized result are as small as the call's temporaries
  // and reused through the heap too (newton_schulz.h says why).
  const int64_t per_call = newton_schulz_matrices_per_call(batch.rows, batch.cols,
                                                           options.ns_dtype(), batch.device.type());
  std::vector<size_t> slice;
  int64_t matrices = 0;
  for (size_t k : ready) {
    const int64_t count = batch.params[k].numel() / (batch.rows * batch.cols);
    if (!slice.empty() && matrices + count > per_call) {
      step_slice(group, options, schedule, batch, slice);
      slice.clear();
      matrices = 0;
    }
    slice.push_back(k);
    matrices += count;
  }
  if (!slice.empty()) step_slice(group, options, schedule, batch, slice);
}

void Muon::step_slice(size_t group, const MuonOptions& options,
                      const std::vector<NsCoefficients>& schedule, const ShapeBatch& batch,
                      const std::vector<size_t>& indices) {
  const int64_t matrix_elements = batch.rows * batch.cols;
  int64_t matrices = 0;
  for (size_t k : indices) matrices += batch.params[k].numel() / matrix_elements;

  // One [matrices, rows, cols] tensor in ns_dtype for all of them; each parameter's u is written
  // straight into its matrices (a dim-0 head split is the same memory as the whole matrix; a
  // dim-1 one is permuted in).
  const at::Tensor stacked =
      at::empty({matrices, batch.rows, batch.cols},
                batch.params[indices[0]].options().dtype(options.ns_dtype()));
  int64_t offset = 0;
  for (size_t k : indices) {
    const at::Tensor& p = batch.params[k];
    const int64_t count = p.numel() / matrix_elements;
    const at::Tensor matrices_of_p = stacked.narrow(0, offset, count);
    if (batch.splits[k].dim == 1) {
      matrices_of_p.copy_(split_heads(momentum_direction(p, p.grad(), options, options.ns_dtype()),
                                      batch.splits[k]));
    } else {
      momentum_direction_into(p, p.grad(), options, matrices_of_p);
    }
    offset += count;
  }
  const at::Tensor orthogonalized =
      newton_schulz(stacked, schedule, options.ns_epsilon(), options.ns_dtype(),
                    newton_schulz_norm_scale(options.ns_variant(), options.ns_steps()));
  if (telemetry_) telemetry_->record_orthogonalized(group, orthogonalized);
  const double scale = muon_update_scale(batch.rows, batch.cols, options.adjust_lr_fn(),
                                         options.matched_adamw_rms());

  offset = 0;
  for (size_t k : indices) {
    const at::Tensor& p = batch.params[k];
    const int64_t count = p.numel() / matrix_elements;
    const at::Tensor o = orthogonalized.narrow(0, offset, count);
    // NorMuon per parameter, on its merged O: the neuron rows of p as stored (normuon.h: the
    // bits a batch would give, every reduction being per matrix).
    apply_update(
        p,
        normuon_update(options, p,
                       batch.splits[k].dim == 1 ? merge_heads(o, p.sizes(), batch.splits[k]) : o),
        options, scale);
    offset += count;
  }
}

at::Tensor Muon::orthogonalize(size_t group, const MuonOptions& options, const MuonHeadSplit& split,
                               const at::Tensor& u) {
  const auto schedule =
      newton_schulz_schedule(options.ns_variant(), options.ns_steps(), options.ns_coefficients());
  const double norm_scale = newton_schulz_norm_scale(options.ns_variant(), options.ns_steps());
  if (!split.active()) {
    const at::Tensor o =
        newton_schulz(u, schedule, options.ns_epsilon(), options.ns_dtype(), norm_scale);
    if (telemetry_)
      telemetry_->record_orthogonalized(group, o.reshape({-1, o.size(-2), o.size(-1)}));
    return o;
  }
  const at::Tensor heads = newton_schulz(split_heads(u, split), schedule, options.ns_epsilon(),
                                         options.ns_dtype(), norm_scale);
  if (telemetry_) telemetry_->record_orthogonalized(group, heads);
  return merge_heads(heads, u.sizes(), split);
}

void Muon::set_owner_min_bucket_numel(int64_t numel) {
  if (numel < 0) {
    throw std::invalid_argument("Muon: owner_min_bucket_numel must be >= 0, got " +
                                std::to_string(numel));
  }
  owner_min_bucket_numel_ = numel;
}

void Muon::set_head_split(const at::Tensor& param, MuonHeadSplit split) {
  if (!batches_match_groups()) rebuild_batches();  // sizes head_split_ like the groups
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].is_same(param)) continue;
      if (split.active() && (param.dim() != 2 || split.dim > 1 || split.block < 1)) {
        throw std::invalid_argument("Muon::set_head_split: a head split (dim " +
                                    std::to_string(split.dim) + ", block " +
                                    std::to_string(split.block) +
                                    ") needs a 2-D parameter, dim 0 or 1 and block >= 1; "
                                    "got shape " +
                                    c10::str(param.sizes()));
      }
      head_split_[g][i] = split.active() ? split : MuonHeadSplit{};
      rebuild_batches();
      return;
    }
  }
  throw std::invalid_argument("Muon::set_head_split: parameter is not in any group");
}

const MuonHeadSplit& Muon::head_split(const at::Tensor& param) const {
  static const MuonHeadSplit kWhole;
  for (size_t g = 0; g < param_groups_.size() && g < head_split_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size() && i < head_split_[g].size(); ++i) {
      if (params[i].is_same(param)) return head_split_[g][i];
    }
  }
  return kWhole;
}

void Muon::arm_telemetry(int64_t sample) {
  telemetry_ = std::make_unique<MuonTelemetryRecorder>(param_groups_.size(), sample);
}

std::unique_ptr<MuonTelemetryRecorder> Muon::take_telemetry() {
  return std::move(telemetry_);
}

NamedTensorList Muon::export_state(const at::Tensor& param) const {
  auto it = state_.find(state_key(param));
  if (it == state_.end()) return {};
  const auto& state = static_cast<const MuonParamState&>(*it->second);
  NamedTensorList out = {{"momentum_buffer", state.momentum_buffer()},
                         {"step", at::scalar_tensor(state.step(), at::kLong)}};
  if (state.normuon_v().defined()) out.emplace_back("normuon_v", state.normuon_v());
  return out;
}

std::vector<StateField> Muon::state_fields() const {
  return {{"momentum_buffer"},
          {"step", StateField::Kind::kCount},
          {"normuon_v", StateField::Kind::kPerRow, /*required=*/false}};
}

void Muon::import_state(const at::Tensor& param, const NamedTensorList& state) {
  const CheckedState checked = read_state(param, state);
  if (checked.empty()) {
    state_.erase(state_key(param));
    return;
  }
  auto fresh = std::make_unique<MuonParamState>();
  fresh->step(checked.counts.at("step"));
  fresh->momentum_buffer(checked.tensors.at("momentum_buffer")
                             .to(param.device(), param.scalar_type(), /*non_blocking=*/false,
                                 /*copy=*/true)
                             .contiguous());
  const auto v = checked.tensors.find("normuon_v");
  if (v != checked.tensors.end()) {
    fresh->normuon_v(v->second.to(param.device(), at::kFloat, /*non_blocking=*/false, /*copy=*/true)
                         .contiguous());
  }
  state_[state_key(param)] = std::move(fresh);
}

void Muon::set_lr(double lr) {
  for (auto& group : param_groups_) group.options().set_lr(lr);
}

nlohmann::json Muon::group_hyperparameters(size_t group) const {
  const auto& options = static_cast<const MuonOptions&>(param_groups_.at(group).options());
  return fields_to_json(muon_option_fields(), options);
}

std::unique_ptr<torch::optim::OptimizerOptions> Muon::options_with_hyperparameters(
    size_t group, const nlohmann::json& values) const {
  MuonOptions candidate =
      static_cast<const MuonOptions&>(param_groups_.at(group).options());  // keeps lr
  fields_from_json(muon_option_fields(), values, candidate);
  try {
    candidate.validate();
  } catch (const std::invalid_argument& error) {
    // Drop validate()'s "Muon: " (the caller names the leaf and group).
    const std::string message = error.what();
    const std::string prefix = "Muon: ";
    throw std::invalid_argument(
        message.compare(0, prefix.size(), prefix) == 0 ? message.substr(prefix.size()) : message);
  }
  return std::make_unique<MuonOptions>(candidate);
}

}  // namespace mixtrain
