// The parameter counts configs/qwen2_moe_0p5b.yaml claims (~0.5B in all, ~0.19B active per
// token) are what the model registry builds. Building the 0.5B model itself takes ~2 GiB and
// seconds of initialisation, so the count is a formula of the Qwen2-MoE shapes, written here
// from the architecture (not from the model code), checked to equal the registry's model
// exactly on small configs of several shapes, then evaluated on the shipped config.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdint>

#include "mixtrain/config/load.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/registry.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

struct Counts {
  int64_t total = 0;
  int64_t active = 0;  // one token's forward: no input embedding, k of the E experts
};

// Qwen2-MoE: q/k/v projections with bias, o without; router [E, H]; E SwiGLU experts of width
// I (gate, up [I, H], down [H, I]); a shared SwiGLU expert of width Is and its [1, H] gate;
// two RMSNorms a layer; embedding [V, H], final norm, untied output head [V, H].
Counts qwen2_moe_counts(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  const int64_t attention = (h * q + q) + 2 * (h * kv + kv) + q * h;
  const int64_t expert = 3 * h * moe_config(c).moe_intermediate_size;
  const int64_t layer_without_experts = attention + moe_config(c).num_experts * h +
                                        3 * h * moe_config(c).shared_expert_intermediate_size + h +
                                        2 * h;
  const int64_t embedding = c.vocab_size * h;
  Counts counts;
  counts.total = c.num_layers * (layer_without_experts + moe_config(c).num_experts * expert) +
                 embedding + h + embedding;
  counts.active =
      c.num_layers * (layer_without_experts + moe_config(c).num_experts_per_tok * expert) + h +
      embedding;
  return counts;
}

int64_t built_param_count(const ModelConfig& c) {
  int64_t n = 0;
  for (const auto& p : build_model(c, 1)->parameters()) n += p.numel();
  return n;
}

TEST(ShippedConfigSize, FormulaMatchesTheRegistryOnSmallShapes) {
  ModelConfig tiny;  // the tiny defaults: 4 experts of 64, 2 layers
  EXPECT_EQ(qwen2_moe_counts(tiny).total, built_param_count(tiny));
  // The 0.5B config's structure (GQA 4:1, 16 experts top 2, shared = 4 x expert) at small sizes.
  ModelConfig small;
  small.vocab_size = 100;
  small.hidden_size = 32;
  small.num_layers = 3;
  small.num_heads = 8;
  small.num_kv_heads = 2;
  small.head_dim = 4;
  moe_config(small).moe_intermediate_size = 12;
  moe_config(small).num_experts = 16;
  moe_config(small).num_experts_per_tok = 2;
  moe_config(small).shared_expert_intermediate_size = 48;
  EXPECT_EQ(qwen2_moe_counts(small).total, built_param_count(small));
  // head_dim x heads != hidden, and an odd layer count.
  small.head_dim = 6;
  small.num_layers = 1;
  EXPECT_EQ(qwen2_moe_counts(small).total, built_param_count(small));
}

TEST(ShippedConfigSize, Qwen2Moe0p5bIsHalfABillion) {
  const ResolvedConfig r =
      load_config(MIXTRAIN_SOURCE_DIR "/configs/qwen2_moe_0p5b.yaml", /*overrides=*/{});
  const ModelConfig& m = r.config.model;
  ASSERT_EQ(m.name, "qwen2_moe");
  const Counts counts = qwen2_moe_counts(m);
  // The figures the config's header and bench/README.md state.
  EXPECT_EQ(counts.total, 485303296);
  EXPECT_EQ(counts.active, 188294144);
  // "~0.5B": within 10% of 5e8.
  EXPECT_GT(counts.total, 450000000);
  EXPECT_LT(counts.total, 550000000);
  EXPECT_EQ(r.config.model_init_dtype.value_or(""), "bfloat16");
  EXPECT_TRUE(r.config.optimizer.fp32_main_params);
  EXPECT_EQ(r.config.optimizer.target, "Muon");
  EXPECT_EQ(r.config.data.seq_len, 2048);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
