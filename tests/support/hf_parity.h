// Parity with Hugging Face transformers for the model tests (qwen2_test.cpp: qwen2, llama, llama
// with llama3 rope scaling;
// qwen2_moe_test.cpp: qwen2_moe, qwen3_moe; deepseek_v3_test.cpp: deepseek_v3, whose selection
// biases, model state, load with the weights). tests/python/hf_parity.py builds the family tiny
// with random weights, save_pretrained()s it and writes float64 logits, loss (with the router
// aux loss) and every saved tensor's gradient; run_hf_parity builds our model from the saved
// config.json (model/hf_config.h: read_hf_config), loads the weights, and the gradients into
// float64 tensors of our shapes, through the product's loader (checkpoint/hf_import.h:
// import_hf_weights, which stacks HF's per-expert 2-D tensors into our [E, out, in]), runs our
// float32 forward and backward, and returns both sides for expect_hf_parity to compare.
#pragma once

#include <gtest/gtest.h>
#include <torch/nn/functional.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mixtrain/checkpoint/hf_import.h"
#include "mixtrain/core/param_placement.h"
#include "mixtrain/core/safetensors.h"
#include "mixtrain/model/deepseek_v3_config.h"
#include "mixtrain/model/hf_config.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/model/sliding_window_config.h"
#include "support/python_script.h"
#include "support/scoped_temp_dir.h"

namespace mixtrain::test_support {

// Loads DIR's model.safetensors through import_hf_weights into `tensors` (whole tensors, one
// rank), named as our parameters.
inline void import_whole(const std::string& dir,
                         const std::map<std::string, torch::Tensor>& tensors) {
  std::vector<HfImportTarget> targets;
  for (const auto& [name, t] : tensors) {
    targets.push_back({name, t, whole_placement(name, t.sizes().vec())});
  }
  import_hf_weights(dir, targets);
}

struct HfParity {
  // Ours (float32, widened to float64) and HF's (float64) on the same weights and tokens.
  torch::Tensor logits, hf_logits;
  double loss = 0, hf_loss = 0;
  double aux_loss = 0, hf_aux_loss = 0;                  // MoE only
  std::map<std::string, torch::Tensor> grads, hf_grads;  // our parameter names
};

// Runs tests/python/hf_parity.py for `c` (model.name = the family) with the given seed and
// shape, builds our model from the config.json it saved (checking that its keys are c's), loads
// the weights and HF's gradients, and computes our side. Fails the test (gtest
// assertion in the caller's scope: check HasFatalFailure) when the oracle fails.
inline HfParity run_hf_parity(const ModelConfig& c, int seed, int batch, int seq) {
  const ScopedTempDir scoped("hf_parity.");  // removed however this returns
  const std::string dir = scoped.path().string();
  {
    std::ofstream json(dir + "/case.json");
    json.precision(17);
    json << "{\"family\": \"" << c.name << "\", \"seed\": " << seed << ", \"batch\": " << batch
         << ", \"seq\": " << seq << ", \"keys\": {\"vocab_size\": " << c.vocab_size
         << ", \"hidden_size\": " << c.hidden_size << ", \"num_layers\": " << c.num_layers
         << ", \"num_heads\": " << c.num_heads << ", \"num_kv_heads\": " << c.num_kv_heads
         << ", \"head_dim\": " << c.head_dim << ", \"intermediate_size\": " << c.intermediate_size
         << ", \"moe_intermediate_size\": " << moe_config(c).moe_intermediate_size
         << ", \"num_experts\": " << moe_config(c).num_experts
         << ", \"num_experts_per_tok\": " << moe_config(c).num_experts_per_tok
         << ", \"shared_expert_intermediate_size\": "
         << moe_config(c).shared_expert_intermediate_size << ", \"max_seq_len\": " << c.max_seq_len
         << ", \"rope_theta\": " << c.rope_theta << ", \"rope_scaling\": \"" << c.rope_scaling
         << "\", \"rope_scaling_factor\": " << c.rope_scaling_factor
         << ", \"rope_low_freq_factor\": " << c.rope_low_freq_factor
         << ", \"rope_high_freq_factor\": " << c.rope_high_freq_factor
         << ", \"rope_original_max_seq_len\": " << c.rope_original_max_seq_len
         << ", \"rope_yarn_beta_fast\": " << c.rope_yarn_beta_fast
         << ", \"rope_yarn_beta_slow\": " << c.rope_yarn_beta_slow
         << ", \"rope_yarn_mscale\": " << c.rope_yarn_mscale
         << ", \"rope_yarn_mscale_all_dim\": " << c.rope_yarn_mscale_all_dim
         << ", \"rms_norm_eps\": " << c.rms_norm_eps
         << ", \"router_aux_loss_coef\": " << moe_config(c).router_aux_loss_coef
         << ", \"attention_bias\": " << (c.attention_bias ? "true" : "false")
         << ", \"tie_word_embeddings\": " << (c.tie_word_embeddings ? "true" : "false")
         << ", \"sliding_window\": " << sliding_window_config(c).sliding_window
         << ", \"norm_topk_prob\": " << (moe_config(c).norm_topk_prob ? "true" : "false");
    const DeepseekV3Config& d = deepseek_v3_config(c);
    json << ", \"q_lora_rank\": " << d.q_lora_rank << ", \"kv_lora_rank\": " << d.kv_lora_rank
         << ", \"qk_nope_head_dim\": " << d.qk_nope_head_dim
         << ", \"qk_rope_head_dim\": " << d.qk_rope_head_dim << ", \"v_head_dim\": " << d.v_head_dim
         << ", \"rope_interleave\": " << (d.rope_interleave ? "true" : "false")
         << ", \"n_shared_experts\": " << d.n_shared_experts << ", \"n_group\": " << d.n_group
         << ", \"topk_group\": " << d.topk_group
         << ", \"routed_scaling_factor\": " << d.routed_scaling_factor
         << ", \"first_k_dense_replace\": " << d.first_k_dense_replace << "}}\n";
  }
  HfParity r;
  if (!python_script_succeeds({"hf_parity.py", "model", dir + "/case.json", dir})) return r;
  std::map<std::string, torch::Tensor> ref;
  for (const auto& [name, t] : read_safetensors(dir + "/reference.safetensors").tensors) {
    ref[name] = t;
  }
  // Our model from HF's config.json: its keys must be the ones the oracle was given.
  const ModelConfig loaded = read_hf_config(dir + "/config.json").model;
  EXPECT_EQ(loaded.name, c.name);
  std::vector<std::tuple<const char*, double, double>> keys = {
      {"vocab_size", c.vocab_size, loaded.vocab_size},
      {"hidden_size", c.hidden_size, loaded.hidden_size},
      {"num_layers", c.num_layers, loaded.num_layers},
      {"num_heads", c.num_heads, loaded.num_heads},
      {"num_kv_heads", c.num_kv_heads, loaded.num_kv_heads},
      {"head_dim", c.head_dim, loaded.head_dim},
      {"rope_theta", c.rope_theta, loaded.rope_theta},
      {"rms_norm_eps", c.rms_norm_eps, loaded.rms_norm_eps},
      {"max_seq_len", c.max_seq_len, loaded.max_seq_len},
      {"attention_bias", c.attention_bias, loaded.attention_bias},
      {"tie_word_embeddings", c.tie_word_embeddings, loaded.tie_word_embeddings},
      {"sliding_window", static_cast<double>(sliding_window_config(c).sliding_window),
       static_cast<double>(sliding_window_config(loaded).sliding_window)}};
  EXPECT_EQ(loaded.rope_scaling, c.rope_scaling);
  if (c.rope_scaling == "yarn") {
    keys.insert(keys.end(),
                {{"rope_scaling_factor", c.rope_scaling_factor, loaded.rope_scaling_factor},
                 {"rope_original_max_seq_len", static_cast<double>(c.rope_original_max_seq_len),
                  static_cast<double>(loaded.rope_original_max_seq_len)},
                 {"rope_yarn_beta_fast", c.rope_yarn_beta_fast, loaded.rope_yarn_beta_fast},
                 {"rope_yarn_beta_slow", c.rope_yarn_beta_slow, loaded.rope_yarn_beta_slow},
                 {"rope_yarn_mscale", c.rope_yarn_mscale, loaded.rope_yarn_mscale},
                 {"rope_yarn_mscale_all_dim", c.rope_yarn_mscale_all_dim,
                  loaded.rope_yarn_mscale_all_dim}});
  }
  if (c.rope_scaling == "llama3") {
    keys.insert(keys.end(),
                {{"rope_scaling_factor", c.rope_scaling_factor, loaded.rope_scaling_factor},
                 {"rope_low_freq_factor", c.rope_low_freq_factor, loaded.rope_low_freq_factor},
                 {"rope_high_freq_factor", c.rope_high_freq_factor, loaded.rope_high_freq_factor},
                 {"rope_original_max_seq_len", static_cast<double>(c.rope_original_max_seq_len),
                  static_cast<double>(loaded.rope_original_max_seq_len)}});
  }
  // moe: the aux loss is HF's (deepseek_v3 has routed experts but HF computes no aux loss).
  const bool moe = c.name == "qwen2_moe" || c.name == "qwen3_moe";
  if (moe || c.name == "deepseek_v3") {
    keys.insert(
        keys.end(),
        {{"moe_intermediate_size", moe_config(c).moe_intermediate_size,
          moe_config(loaded).moe_intermediate_size},
         {"num_experts", moe_config(c).num_experts, moe_config(loaded).num_experts},
         {"num_experts_per_tok", moe_config(c).num_experts_per_tok,
          moe_config(loaded).num_experts_per_tok},
         {"norm_topk_prob", moe_config(c).norm_topk_prob, moe_config(loaded).norm_topk_prob}});
  }
  if (moe) {
    keys.emplace_back("router_aux_loss_coef", moe_config(c).router_aux_loss_coef,
                      moe_config(loaded).router_aux_loss_coef);
  } else {
    keys.emplace_back("intermediate_size", c.intermediate_size, loaded.intermediate_size);
  }
  if (c.name == "deepseek_v3") {
    const DeepseekV3Config &d = deepseek_v3_config(c), &l = deepseek_v3_config(loaded);
    keys.insert(keys.end(),
                {{"q_lora_rank", d.q_lora_rank, l.q_lora_rank},
                 {"kv_lora_rank", d.kv_lora_rank, l.kv_lora_rank},
                 {"qk_nope_head_dim", d.qk_nope_head_dim, l.qk_nope_head_dim},
                 {"qk_rope_head_dim", d.qk_rope_head_dim, l.qk_rope_head_dim},
                 {"v_head_dim", d.v_head_dim, l.v_head_dim},
                 {"rope_interleave", d.rope_interleave, l.rope_interleave},
                 {"n_shared_experts", d.n_shared_experts, l.n_shared_experts},
                 {"n_group", d.n_group, l.n_group},
                 {"topk_group", d.topk_group, l.topk_group},
                 {"routed_scaling_factor", d.routed_scaling_factor, l.routed_scaling_factor},
                 {"first_k_dense_replace", d.first_k_dense_replace, l.first_k_dense_replace}});
  }
  if (c.name == "qwen2_moe") {
    keys.emplace_back("shared_expert_intermediate_size",
                      moe_config(c).shared_expert_intermediate_size,
                      moe_config(loaded).shared_expert_intermediate_size);
  }
  for (const auto& [key, ours, theirs] : keys) EXPECT_EQ(ours, theirs) << key;
  auto model = build_model(loaded, 1);
  std::map<std::string, torch::Tensor> params, hf_grads;
  for (auto& item : model->named_parameters()) {
    params[item.key()] = item.value().detach();
    hf_grads[item.key()] = torch::zeros_like(item.value(), torch::kFloat64);
  }
  // The model's own state (deepseek_v3's selection biases) is filled in place with the weights.
  for (const auto& [name, t] : model->model_state()) params[name] = t;
  import_whole(dir, params);
  import_whole(dir + "/grads", hf_grads);
  const auto ids = ref.at("input_ids");
  const auto out = model->forward(ids);
  // HF ForCausalLM with labels = input_ids: position t predicts token t + 1.
  const int64_t s = ids.size(1), vocab = out.logits.size(-1);
  const auto ce = torch::nn::functional::cross_entropy(
      out.logits.narrow(1, 0, s - 1).reshape({-1, vocab}), ids.narrow(1, 1, s - 1).reshape({-1}));
  const auto loss = moe ? ce + moe_config(loaded).router_aux_loss_coef * out.aux_loss : ce;
  loss.backward();

  r.logits = out.logits.detach().to(torch::kFloat64);
  r.hf_logits = ref.at("logits");
  r.loss = loss.item<double>();
  r.hf_loss = ref.at("loss").item<double>();
  if (moe) {
    r.aux_loss = out.aux_loss.item<double>();
    r.hf_aux_loss = ref.at("aux_loss").item<double>();
  }
  for (const auto& item : model->named_parameters()) {
    r.grads[item.key()] = item.value().grad().to(torch::kFloat64);
  }
  r.hf_grads = std::move(hf_grads);
  return r;
}

// max |ours - HF| over one tensor, and max |HF|.
inline std::pair<double, double> max_error_and_scale(const torch::Tensor& ours,
                                                     const torch::Tensor& hf) {
  return {(ours - hf).abs().max().item<double>(), hf.abs().max().item<double>()};
}

// The tolerances of every family's parity test. Ours runs in float32, HF in float64 on the same
// (float32-exact) weights, so the differences are float32 rounding, u = 2^-24 = 6e-8 per op:
//   logits: ~20 sequential rounded ops per logit (2 layers of norm, projections, attention, MLP
//     or experts, final norm, lm_head), dot products of <= 32 terms: a few 1e-7 of the logits'
//     scale (measured when written: 2.2e-7 to 4.8e-7 over the six cases;
//     the llama3 rope-scaled llama 3.1e-7); bound 1e-5;
//   loss: a mean over the tokens of such quantities (measured when written: 6e-9 to 8e-8
//     relative); bound 1e-6 relative. aux loss: HF's is float32-accurate (it sums the router
//     probabilities in float32) and ours is float32: measured equal; bound 1e-6 relative;
//   gradients: backward doubles the chain, and a gradient summing terms of both signs loses
//     relative precision to cancellation; each tensor is held to 2e-5 of its own max |HF grad|
//     (measured: worst tensor 1.6e-6 of its own scale) plus 1e-7 of the largest gradient of all
//     parameters (an expert that saw few tokens has a small gradient whose error still carries
//     the rounding of the shared activations).
// A wrong formula moves these by far more: a dropped bias, norm scale or rotary base changes the
// logits by 0.1 to 0.2 of their scale (measured for qwen2 when its logits test was written),
// dropping the llama3 rope scaling by 0.33 (1.07 of 3.23, measured by the oracle), a
// wrongly chosen expert by O(1) of its tokens' logits, and a missing aux-loss term the loss by
// router_aux_loss_coef * aux (0.05 * ~2 here).
inline void expect_hf_parity(const HfParity& r, const std::string& label) {
  ASSERT_TRUE(r.logits.defined());
  ASSERT_EQ(r.logits.sizes(), r.hf_logits.sizes());
  const auto [logit_error, logit_scale] = max_error_and_scale(r.logits, r.hf_logits);
  EXPECT_GT(logit_scale, 1.0);
  EXPECT_LE(logit_error, 1e-5 * logit_scale) << label << " logits";
  EXPECT_LE(std::abs(r.loss - r.hf_loss), 1e-6 * std::abs(r.hf_loss)) << label << " loss";
  EXPECT_LE(std::abs(r.aux_loss - r.hf_aux_loss), 1e-6 * std::abs(r.hf_aux_loss))
      << label << " aux loss";
  double largest = 0;
  for (const auto& [name, g] : r.hf_grads)
    largest = std::max(largest, g.abs().max().item<double>());
  double worst = 0;  // max over tensors of error / own scale, for the log line
  ASSERT_EQ(r.grads.size(), r.hf_grads.size());
  for (const auto& [name, hf] : r.hf_grads) {
    const auto [error, scale] = max_error_and_scale(r.grads.at(name), hf);
    EXPECT_LE(error, 2e-5 * scale + 1e-7 * largest)
        << label << " grad " << name << ": max |ours - HF| " << error << ", max |HF| " << scale;
    if (scale > 0) worst = std::max(worst, error / scale);
  }
  std::printf(
      "%s vs transformers: logits max err %.3g (max |logit| %.3g), loss %.9g (err %.2g), aux "
      "%.9g (err %.2g), %zu grads: worst max err / max |grad| %.3g (largest grad %.3g)\n",
      label.c_str(), logit_error, logit_scale, r.hf_loss, std::abs(r.loss - r.hf_loss),
      r.hf_aux_loss, std::abs(r.aux_loss - r.hf_aux_loss), r.grads.size(), worst, largest);
}

}  // namespace mixtrain::test_support
