#include "mixtrain/model/layers.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cmath>
#include <stdexcept>

#include "mixtrain/core/cpu_gemm.h"
#include "mixtrain/core/host_sync.h"
#include "mixtrain/core/text.h"
#include "mixtrain/model/attention.h"

namespace mixtrain {
namespace {}  // namespace

torch::Tensor ParamAccess::unshard(const std::string& local_name,
                                   const torch::Tensor& param) const {
  const auto& m = *slot;
  return m ? m->unshard(prefix + local_name, param) : param;
}

torch::Tensor ParamAccess::post_forward(const std::vector<std::string>& local_names,
                                        const torch::Tensor& output) const {
  const auto& m = *slot;
  if (!m) return output;
  std::vector<std::string> names;
  names.reserve(local_names.size());
  for (const auto& n : local_names) names.push_back(prefix + n);
  return m->post_forward(names, output);
}

ExpertDispatcher* ParamAccess::expert_dispatcher() const {
  const auto& m = *slot;
  return m ? m->expert_dispatcher() : nullptr;
}

TensorParallelHooks* ParamAccess::tensor_parallel() const {
  const auto& m = *slot;
  return m ? m->tensor_parallel() : nullptr;
}

ContextParallelHooks* ParamAccess::context_parallel() const {
  const auto& m = *slot;
  return m ? m->context_parallel() : nullptr;
}

MaxLogitRecorder* ParamAccess::max_logit_recorder() const {
  return recorder_slot ? recorder_slot->get() : nullptr;
}

WeightedLayer::WeightedLayer(at::IntArrayRef weight_shape, ParamAccess access)
    : access_(std::move(access)) {
  weight = register_parameter("weight", torch::empty(weight_shape));
}

torch::Tensor tp_block_input(const ParamAccess& access, const torch::Tensor& x) {
  TensorParallelHooks* tp = access.tensor_parallel();
  return tp != nullptr ? tp->copy_to_tp(x) : x;
}

torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& weight,
                    const torch::Tensor& bias) {
  if (x.dim() < 2 || !x.is_contiguous() || weight.dim() != 2) return gemm::linear(x, weight, bias);
  const torch::Tensor rows = x.dim() == 2 ? x : x.view({-1, x.size(-1)});
  const torch::Tensor out =
      bias.defined() ? gemm::addmm(bias, rows, weight.t()) : gemm::mm(rows, weight.t());
  if (x.dim() == 2) return out;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return out.view(sizes);
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, ParamAccess access,
               TpStyle tp_style)
    : WeightedLayer({out_features, in_features}, std::move(access)), tp_style_(tp_style) {
  if (bias) this->bias = register_parameter("bias", torch::empty({out_features}));
}

torch::Tensor Linear::forward(const torch::Tensor& x) {
  TensorParallelHooks* tp = tp_style_ == TpStyle::kNone ? nullptr : access_.tensor_parallel();
  if (tp != nullptr && tp_style_ == TpStyle::kRow) {
    // Partial products summed over tp, then the (whole) bias once.
    auto out = tp->reduce_from_tp(dense(x, access_.unshard("weight", weight)));
    if (!bias.defined()) return access_.post_forward({"weight"}, out);
    return access_.post_forward({"weight", "bias"}, out + access_.unshard("bias", bias));
  }
  // Column-parallel (x came through tp_block_input) or whole: x W^T + b.
  if (!bias.defined()) {
    return access_.post_forward({"weight"}, dense(x, access_.unshard("weight", weight)));
  }
  return access_.post_forward({"weight", "bias"}, dense(x, access_.unshard("weight", weight),
                                                        access_.unshard("bias", bias)));
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, ParamAccess access)
    : WeightedLayer({num_embeddings, embedding_dim}, std::move(access)) {}

torch::Tensor Embedding::forward(const torch::Tensor& input_ids) {
  TensorParallelHooks* tp = access_.tensor_parallel();
  if (tp == nullptr) {
    return access_.post_forward({"weight"},
                                at::embedding(access_.unshard("weight", weight), input_ids));
  }
  const torch::Tensor table = access_.unshard("weight", weight);  // this rank's vocabulary rows
  const int64_t rows = table.size(0), start = tp->tp_rank() * rows;
  const torch::Tensor outside = (input_ids < start).logical_or(input_ids >= start + rows);
  const torch::Tensor local = at::embedding(table, (input_ids - start).masked_fill(outside, 0))
                                  .masked_fill(outside.unsqueeze(-1), 0.0);
  return access_.post_forward({"weight"}, tp->reduce_from_tp(local));
}

torch::Tensor Embedding::attend(const torch::Tensor& hidden) {
  return access_.post_forward({"weight"}, dense(hidden, access_.unshard("weight", weight)));
}

RMSNorm::RMSNorm(int64_t hidden_size, double eps, ParamAccess access, bool tp_local_heads)
    : WeightedLayer({hidden_size}, std::move(access)), eps_(eps), tp_local_heads_(tp_local_heads) {}

torch::Tensor RMSNorm::forward(const torch::Tensor& x) {
  const auto input_dtype = x.scalar_type();
  auto h = x.to(torch::kFloat32);
  const auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps_);
  torch::Tensor scale = access_.unshard("weight", weight);
  TensorParallelHooks* tp = tp_local_heads_ ? access_.tensor_parallel() : nullptr;
  if (tp != nullptr) scale = tp->copy_to_tp(scale);
  return access_.post_forward({"weight"}, scale * h.to(input_dtype));
}

Qwen2Attention::Qwen2Attention(const ModelConfig& c, const ParamAccess& access,
                               const AttentionOptions& options)
    : num_heads_(c.num_heads),
      num_key_value_heads_(c.num_kv_heads),
      head_dim_(c.head_dim),
      sliding_window_(options.sliding_window),
      access_(access) {
  const int64_t q_width = c.num_heads * c.head_dim, kv_width = c.num_kv_heads * c.head_dim;
  q_proj =
      register_module("q_proj", std::make_shared<Linear>(c.hidden_size, q_width, options.qkv_bias,
                                                         access.child("q_proj"), TpStyle::kColumn));
  k_proj =
      register_module("k_proj", std::make_shared<Linear>(c.hidden_size, kv_width, options.qkv_bias,
                                                         access.child("k_proj"), TpStyle::kColumn));
  v_proj =
      register_module("v_proj", std::make_shared<Linear>(c.hidden_size, kv_width, options.qkv_bias,
                                                         access.child("v_proj"), TpStyle::kColumn));
  o_proj =
      register_module("o_proj", std::make_shared<Linear>(q_width, c.hidden_size, options.o_bias,
                                                         access.child("o_proj"), TpStyle::kRow));
  if (options.qk_norm) {
    q_norm = register_module(
        "q_norm", std::make_shared<RMSNorm>(c.head_dim, c.rms_norm_eps, access.child("q_norm"),
                                            /*tp_local_heads=*/true));
    k_norm = register_module(
        "k_norm", std::make_shared<RMSNorm>(c.head_dim, c.rms_norm_eps, access.child("k_norm"),
                                            /*tp_local_heads=*/true));
  }
}

torch::Tensor Qwen2Attention::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                      const torch::Tensor& sin) {
  const int64_t bsz = x.size(0), q_len = x.size(1);
  // [B, S, heads, D]: the per-head norms act on the last dimension, before the transpose (HF).
  // The heads this rank computes: all of them, or 1/tp of each kind under tensor parallelism.
  TensorParallelHooks* tp = access_.tensor_parallel();
  const int64_t tp_size = tp != nullptr ? tp->tp_size() : 1;
  const int64_t heads = num_heads_ / tp_size, kv_heads = num_key_value_heads_ / tp_size;
  const torch::Tensor input = tp_block_input(access_, x);  // one copy_to_tp for q, k and v
  auto query = q_proj->forward(input).view({bsz, q_len, heads, head_dim_});
  auto key = k_proj->forward(input).view({bsz, q_len, kv_heads, head_dim_});
  if (q_norm) {
    query = q_norm->forward(query);
    key = k_norm->forward(key);
  }
  query = query.transpose(1, 2);
  key = key.transpose(1, 2);
  auto value = v_proj->forward(input).view({bsz, q_len, kv_heads, head_dim_}).transpose(1, 2);
  query = apply_rotary_pos_emb(query, cos, sin);
  key = apply_rotary_pos_emb(key, cos, sin);
  // On the CPU LibTorch's flash kernel in float32, HF's eager one in bf16/fp16, where flash's
  // backward makes forward + backward up to 3.1x slower (bench/README.md, attention_bench), and
  // float32's on widened bf16/fp16 GEMMs (attention_on_gemm_path); on CUDA SDPA's fused kernels.
  // With context parallelism the keys and values of the other ranks' chunks take part too.
  ContextParallelHooks* cp = access_.context_parallel();
  TORCH_CHECK(cp == nullptr || sliding_window_ == 0,
              "attention: context parallelism has no sliding window (model.sliding_window ",
              sliding_window_, "); validation refuses parallel.cp > 1 with it");
  if (MaxLogitRecorder* recorder = access_.max_logit_recorder()) {
    // QK-clip: query heads [tp_rank * heads, ...) of the model's num_heads_.
    const int64_t tp_rank = tp != nullptr ? tp->tp_rank() : 0;
    recorder->record(access_.prefix, num_heads_, tp_rank * heads,
                     cp != nullptr ? cp->max_logits(query, key)
                                   : causal_max_logits(query, key, {}, {}, sliding_window_));
  }
  auto attn_output = attention_on_gemm_path(
      query, key, value,
      [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
          AttentionKernel kernel) {
        return cp != nullptr ? cp->attention(q, k, v, kernel)
                             : causal_attention(q, k, v, kernel, sliding_window_);
      });
  attn_output = attn_output.transpose(1, 2).reshape({bsz, q_len, heads * head_dim_});
  return o_proj->forward(attn_output);
}

SwiGLUMLP::SwiGLUMLP(int64_t hidden_size, int64_t intermediate_size, const ParamAccess& access)
    : access_(access) {
  gate_proj = register_module(
      "gate_proj", std::make_shared<Linear>(hidden_size, intermediate_size, false,
                                            access.child("gate_proj"), TpStyle::kColumn));
  up_proj = register_module("up_proj",
                            std::make_shared<Linear>(hidden_size, intermediate_size, false,
                                                     access.child("up_proj"), TpStyle::kColumn));
  down_proj = register_module("down_proj",
                              std::make_shared<Linear>(intermediate_size, hidden_size, false,
                                                       access.child("down_proj"), TpStyle::kRow));
}

torch::Tensor SwiGLUMLP::forward(const torch::Tensor& x) {
  const torch::Tensor input = tp_block_input(access_, x);
  return down_proj->forward(torch::silu(gate_proj->forward(input)) * up_proj->forward(input));
}

torch::Tensor rotary_inv_freq(const ModelConfig& c) {
  // float32 throughout, as HF (which disables autocast for this): bf16 angles would be wrong by
  // whole radians at long positions.
  const auto exponents = torch::arange(0, c.head_dim, 2, torch::kInt64).to(torch::kFloat32) /
                         static_cast<float>(c.head_dim);
  const auto inv_freq = 1.0 / torch::pow(c.rope_theta, exponents);
  if (c.rope_scaling == "yarn") {
    // HF _compute_yarn_parameters op for op (truncate: true, its default): dims whose rotation
    // count over the original context is above beta_fast keep their frequency, those below
    // beta_slow are interpolated (divided by the factor), a linear ramp between.
    const int64_t dim = c.head_dim;
    const double base = c.rope_theta, original = static_cast<double>(c.rope_original_max_seq_len);
    const auto correction_dim = [&](double rotations) {
      return (dim * std::log(original / (rotations * 2 * M_PI))) / (2 * std::log(base));
    };
    const double low = std::max(std::floor(correction_dim(c.rope_yarn_beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(c.rope_yarn_beta_slow)), double(dim - 1));
    if (low == high) high += 0.001;  // HF: no zero-width ramp
    const auto pos_freqs = torch::pow(c.rope_theta, exponents);
    const auto extrapolation = 1.0 / pos_freqs;
    const auto interpolation = 1.0 / (pos_freqs * c.rope_scaling_factor);
    const auto ramp =
        ((torch::arange(dim / 2, torch::kInt64).to(torch::kFloat32) - low) / (high - low))
            .clamp(0, 1);
    const auto extrapolation_factor = torch::rsub(ramp, 1);
    return interpolation * torch::rsub(extrapolation_factor, 1) +
           extrapolation * extrapolation_factor;
  }
  if (c.rope_scaling != "llama3") return inv_freq;
  // HF's expressions op for op (python's `s / t` is t.reciprocal() * s, `1 - t` is rsub).
  const double factor = c.rope_scaling_factor, low_factor = c.rope_low_freq_factor,
               high_factor = c.rope_high_freq_factor;
  const double old_len = static_cast<double>(c.rope_original_max_seq_len);
  const double low_wavelen = old_len / low_factor, high_wavelen = old_len / high_factor;
  const auto wavelen = inv_freq.reciprocal() * (2 * M_PI);
  const auto scaled = torch::where(wavelen > low_wavelen, inv_freq / factor, inv_freq);
  const auto smooth = (wavelen.reciprocal() * old_len - low_factor) / (high_factor - low_factor);
  const auto smoothed = torch::rsub(smooth, 1) * scaled / factor + smooth * scaled;
  const auto medium =
      (wavelen < high_wavelen).logical_not() * (wavelen > low_wavelen).logical_not();
  return torch::where(medium, smoothed, scaled);
}

namespace {
std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t seq_len,
                                                      const torch::Tensor& inv_freq,
                                                      double attention_factor,
                                                      torch::Device device) {
  const auto positions = torch::arange(seq_len, torch::kInt64).to(torch::kFloat32);
  const auto freqs = torch::outer(positions, inv_freq);
  const auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = emb.cos(), sin = emb.sin();
  if (attention_factor != 1.0) {  // HF multiplies by 1.0 otherwise: the same bits
    cos = cos * attention_factor;
    sin = sin * attention_factor;
  }
  return {copy_to_device(cos, device, "rotary tables"),
          copy_to_device(sin, device, "rotary tables")};
}
}  // namespace

std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(int64_t seq_len, const ModelConfig& c,
                                                       torch::Device device) {
  return rotary_tables(seq_len, rotary_inv_freq(c), rope_attention_factor(c), device);
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

double rope_attention_factor(const ModelConfig& c) {
  if (c.rope_scaling != "yarn") return 1.0;
  const double factor = c.rope_scaling_factor;
  if (c.rope_yarn_mscale != 0 && c.rope_yarn_mscale_all_dim != 0) {
    return yarn_mscale(factor, c.rope_yarn_mscale) /
           yarn_mscale(factor, c.rope_yarn_mscale_all_dim);
  }
  return yarn_mscale(factor, 1.0);
}

std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(int64_t seq_len, int64_t head_dim,
                                                       double rope_theta, torch::Device device) {
  ModelConfig c;
  c.head_dim = head_dim;
  c.rope_theta = rope_theta;
  c.rope_scaling = "none";
  return rotary_cos_sin(seq_len, c, device);
}

std::pair<torch::Tensor, torch::Tensor> decoder_rotary(const torch::Tensor& input_ids,
                                                       const ModelConfig& c,
                                                       const ParamAccess& access) {
  const int64_t seq_len = input_ids.size(1);
  ContextParallelHooks* cp = access.context_parallel();
  if (cp == nullptr) return rotary_cos_sin(seq_len, c, input_ids.device());
  auto [cos, sin] = rotary_cos_sin(seq_len * cp->cp_size(), c);
  const torch::Tensor rows = cp->positions(seq_len);
  return {copy_to_device(cos.index_select(0, rows), input_ids.device(), "rotary tables"),
          copy_to_device(sin.index_select(0, rows), input_ids.device(), "rotary tables")};
}

std::pair<torch::Tensor, torch::Tensor> RotaryTables::operator()(const torch::Tensor& input_ids,
                                                                 const ModelConfig& c,
                                                                 const ParamAccess& access) {
  const int64_t seq_len = input_ids.size(1);
  const torch::Device device = input_ids.device();
  const void* cp = access.context_parallel();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& e : entries_) {
    if (e.seq_len == seq_len && e.device == device && e.cp == cp) return e.tables;
  }
  entries_.push_back({seq_len, device, cp, decoder_rotary(input_ids, c, access)});
  return entries_.back().tables;
}

torch::Tensor apply_rotary_pos_emb(const torch::Tensor& x, const torch::Tensor& cos,
                                   const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.to(x.scalar_type()) + rotated * sin.to(x.scalar_type());
}

torch::Tensor apply_rotary_pos_emb_interleaved(const torch::Tensor& x, const torch::Tensor& cos,
                                               const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const auto c = cos.to(x.scalar_type()).narrow(-1, 0, half);
  const auto s = sin.to(x.scalar_type()).narrow(-1, 0, half);
  using torch::indexing::Slice;
  const auto x1 = x.index({"...", Slice(0, torch::indexing::None, 2)});
  const auto x2 = x.index({"...", Slice(1, torch::indexing::None, 2)});
  return torch::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

void init_hf_weights(torch::nn::Module& model, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    auto& p = item.value();
    if (ends_with(item.key(), ".bias")) {
      p.zero_();
    } else if (ends_with(item.key(), "norm.weight")) {
      p.fill_(1.0);
    } else {
      p.normal_(0.0, 0.02, generator);
    }
  }
}

void require_model_key(bool ok, const std::string& key, const std::string& what) {
  if (!ok) throw std::invalid_argument("model config: " + key + " " + what);
}

void check_qwen2_input_ids(const char* label, const torch::Tensor& input_ids, int64_t max_seq_len) {
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == torch::kInt64, label,
              ": input_ids must be int64 [batch, seq], got ", input_ids.scalar_type(), " ",
              input_ids.sizes());
  TORCH_CHECK(input_ids.size(1) <= max_seq_len, label, ": sequence length ", input_ids.size(1),
              " exceeds max_seq_len ", max_seq_len);
}

void validate_qwen2_common(const ModelConfig& c) {
  require_model_key(c.vocab_size > 0, "vocab_size", "must be > 0");
  require_model_key(c.hidden_size > 0, "hidden_size", "must be > 0");
  require_model_key(c.num_layers > 0, "num_layers", "must be > 0");
  require_model_key(c.num_heads > 0, "num_heads", "must be > 0");
  require_model_key(c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0, "num_kv_heads",
                    "must be > 0 and divide num_heads (" + std::to_string(c.num_heads) + "), got " +
                        std::to_string(c.num_kv_heads));
  require_model_key(
      c.head_dim > 0 && c.head_dim % 2 == 0, "head_dim",
      "must be even and > 0 (rotary embeddings rotate pairs), got " + std::to_string(c.head_dim));
  require_model_key(c.max_seq_len > 0, "max_seq_len", "must be > 0");
  require_model_key(c.rope_theta > 0, "rope_theta", "must be > 0");
  require_model_key(
      c.rope_scaling == "none" || c.rope_scaling == "llama3" || c.rope_scaling == "yarn",
      "rope_scaling", "must be none, llama3 or yarn, got " + c.rope_scaling);
  if (c.rope_scaling == "llama3") {
    require_model_key(c.rope_scaling_factor > 0, "rope_scaling_factor", "must be > 0");
    require_model_key(c.rope_low_freq_factor > 0, "rope_low_freq_factor", "must be > 0");
    require_model_key(c.rope_high_freq_factor > c.rope_low_freq_factor, "rope_high_freq_factor",
                      "must be > rope_low_freq_factor");
    require_model_key(c.rope_original_max_seq_len > 0, "rope_original_max_seq_len", "must be > 0");
  }
  require_model_key(c.rms_norm_eps > 0, "rms_norm_eps", "must be > 0");
}

}  // namespace mixtrain
