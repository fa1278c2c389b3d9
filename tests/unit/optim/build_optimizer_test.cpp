#include "mixtrain/optim/build_optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

#include "mixtrain/core/error.h"
#include "mixtrain/optim/adamw.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "mixtrain/optim/muon.h"
#include "mixtrain/optim/muon_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

// One layer of the tiny Qwen2-MoE's parameter set, small: V=32, H=16, 2 KV heads x 4,
// E=4 experts with I=8, shared expert 16. Values are fixed pseudo-random.
NamedParams tiny_qwen2_moe(at::ScalarType dtype) {
  const int64_t V = 32, H = 16, KV = 8, E = 4, I = 8, S = 16;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"model.embed_tokens.weight", {V, H}},
      {"model.layers.0.self_attn.q_proj.weight", {H, H}},
      {"model.layers.0.self_attn.q_proj.bias", {H}},
      {"model.layers.0.self_attn.k_proj.weight", {KV, H}},
      {"model.layers.0.self_attn.k_proj.bias", {KV}},
      {"model.layers.0.self_attn.v_proj.weight", {KV, H}},
      {"model.layers.0.self_attn.v_proj.bias", {KV}},
      {"model.layers.0.self_attn.o_proj.weight", {H, H}},
      {"model.layers.0.mlp.gate.weight", {E, H}},
      {"model.layers.0.mlp.experts.gate_proj", {E, I, H}},
      {"model.layers.0.mlp.experts.up_proj", {E, I, H}},
      {"model.layers.0.mlp.experts.down_proj", {E, H, I}},
      {"model.layers.0.mlp.shared_expert.gate_proj.weight", {S, H}},
      {"model.layers.0.mlp.shared_expert.up_proj.weight", {S, H}},
      {"model.layers.0.mlp.shared_expert.down_proj.weight", {H, S}},
      {"model.layers.0.mlp.shared_expert_gate.weight", {1, H}},
      {"model.layers.0.input_layernorm.weight", {H}},
      {"model.layers.0.post_attention_layernorm.weight", {H}},
      {"model.norm.weight", {H}},
      {"lm_head.weight", {V, H}},
  };
  NamedParams params;
  double phase = 0.0;
  for (const auto& [name, shape] : shapes) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    at::Tensor values = at::sin(at::arange(numel, at::kDouble) * 0.37 + phase) * 0.1;
    phase += 1.0;
    params.emplace_back(name, values.reshape(shape).to(dtype).requires_grad_(true));
  }
  return params;
}

TrainerConfig yaml_muon(bool fp32_main_params) {
  TrainerConfig config;
  config.optimizer.target = "Muon";
  config.optimizer.routing = "yaml";
  config.optimizer.fp32_main_params = fp32_main_params;
  config.mix_precision.reduce_dtype = "float32";  // fp32-main-params §2.5
  adamw_config(config).lr(1e-3);
  adamw_config(config).weight_decay(0.01);
  adamw_config(config).betas({0.9, 0.95});
  adamw_config(config).eps(1e-6);
  muon_config(config).options.lr(0.02);
  muon_config(config).options.weight_decay(0.1);
  muon_config(config).options.ns_variant("legacy");
  return config;
}

void set_grads(const NamedParams& params, int step) {
  double phase = step * 10.0;
  for (const auto& [name, p] : params) {
    at::Tensor g = at::cos(at::arange(p.numel(), at::kDouble) * 0.71 + phase).reshape(p.sizes());
    p.mutable_grad() = g.to(p.scalar_type());
    phase += 1.0;
  }
}

TEST(BuildOptimizer, MuonWithMainParamsBuildsTheRfcStack) {
  const NamedParams params = tiny_qwen2_moe(at::kBFloat16);
  auto built = build_optimizer(params, yaml_muon(true));
  auto* wrapper = dynamic_cast<MixedPrecisionOptimizer*>(built.get());
  ASSERT_NE(wrapper, nullptr);
  const ChainedOptimizer& chain = wrapper->chained();
  ASSERT_EQ(chain.leaves().size(), 2u);
  const LeafOptimizer& adamw = *chain.leaves()[0];
  const LeafOptimizer& muon = *chain.leaves()[1];
  EXPECT_EQ(adamw.kind(), "adamw");
  EXPECT_EQ(muon.kind(), "muon");
  EXPECT_EQ(built->routing().size(), params.size());

  // AdamW: (1e-3, 0.01) for embed/lm_head, (1e-3, 0) for biases and norms, first-seen order.
  ASSERT_EQ(adamw.param_groups().size(), 2u);
  const auto& decay =
      static_cast<const torch::optim::AdamWOptions&>(adamw.param_groups()[0].options());
  const auto& no_decay =
      static_cast<const torch::optim::AdamWOptions&>(adamw.param_groups()[1].options());
  EXPECT_EQ(decay.lr(), 1e-3);
  EXPECT_EQ(decay.weight_decay(), 0.01);
  EXPECT_EQ(no_decay.weight_decay(), 0.0);
  EXPECT_EQ(std::get<1>(decay.betas()), 0.95);
  EXPECT_EQ(decay.eps(), 1e-6);
  EXPECT_EQ(adamw.param_groups()[0].params().size(), 2u);       // embed_tokens, lm_head
  EXPECT_EQ(adamw.param_groups()[1].params().size(), 3u + 3u);  // 3 biases, 3 norms
  ASSERT_EQ(muon.param_groups().size(), 1u);
  const auto& muon_options = static_cast<const MuonOptions&>(muon.param_groups()[0].options());
  EXPECT_EQ(muon_options.lr(), 0.02);
  EXPECT_EQ(muon_options.weight_decay(), 0.1);
  EXPECT_EQ(muon_options.ns_variant(), "legacy");
  EXPECT_EQ(muon.param_groups()[0].params().size(), 12u);
}

// fp32-main-params §2.1 with the real leaves: both groups update main params, and after every step
// each bfloat16 model param equals its main param rounded.
TEST(BuildOptimizer, RfcCase21WithRealAdamWAndMuon) {
  const NamedParams params = tiny_qwen2_moe(at::kBFloat16);
  auto built = build_optimizer(params, yaml_muon(true));
  auto& wrapper = dynamic_cast<MixedPrecisionOptimizer&>(*built);
  for (const auto& leaf : wrapper.chained().leaves()) {
    for (const auto& group : leaf->param_groups()) {
      for (const auto& p : group.params()) {
        const std::string& name = wrapper.chained().name_of(p);
        EXPECT_TRUE(p.is_same(wrapper.main_param(name))) << name;
        EXPECT_EQ(p.scalar_type(), at::kFloat) << name;
      }
    }
  }
  for (int step = 1; step <= 3; ++step) {
    std::vector<at::Tensor> before;
    for (const auto& [name, p] : params)
      before.push_back(wrapper.main_param(name).detach().clone());
    set_grads(params, step);
    built->accumulate_model_grads();
    EXPECT_TRUE(built->step());
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& [name, model] = params[i];
      SCOPED_TRACE(name + " step " + std::to_string(step));
      const at::Tensor& main = wrapper.main_param(name);
      EXPECT_FALSE(at::equal(main, before[i]));  // every param of both groups updated
      EXPECT_TRUE(at::equal(model, main.to(at::kBFloat16)));
      EXPECT_EQ(model.scalar_type(), at::kBFloat16);
    }
    built->zero_grad();
  }
  std::set<std::string> state_names;
  for (const auto& [key, tensor] : built->state_dict()) {
    state_names.insert(key.substr(key.rfind('.') + 1));
  }
  for (const char* name : {"exp_avg", "exp_avg_sq", "momentum_buffer", "step"}) {
    EXPECT_TRUE(state_names.count(name)) << name;
  }
}

TEST(BuildOptimizer, WithoutMainParamsTheLeavesHoldTheModelParams) {
  const NamedParams params = tiny_qwen2_moe(at::kFloat);
  auto built = build_optimizer(params, yaml_muon(false));
  auto* chain = dynamic_cast<ChainedOptimizer*>(built.get());
  ASSERT_NE(chain, nullptr);
  for (const auto& [name, p] : params) EXPECT_TRUE(chain->optimizer_param(name).is_same(p)) << name;
  set_grads(params, 1);
  EXPECT_TRUE(built->step());
  for (const auto& [key, tensor] : built->state_dict()) {
    EXPECT_EQ(key.find("_mixed_precision_optimizer"), std::string::npos) << key;
  }
}

TEST(BuildOptimizer, Float16NeedsMainParams) {
  const NamedParams params = tiny_qwen2_moe(at::kHalf);
  try {
    build_optimizer(params, yaml_muon(false));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("optimizer.fp32_main_params"), std::string::npos)
        << error.what();
    // Known only from the built parameters: the key travels apart, for the CLI to spell.
    EXPECT_EQ(error.key(), "optimizer.fp32_main_params");
    EXPECT_EQ(error.problem().find("optimizer."), std::string::npos) << error.problem();
  }
  auto built = build_optimizer(params, yaml_muon(true));
  EXPECT_EQ(built->loss_scale(), 65536.0);
}

TEST(BuildOptimizer, AdamWTargetHasOneLeafAndTomlDecayHasOneGroup) {
  const NamedParams params = tiny_qwen2_moe(at::kBFloat16);
  TrainerConfig config = yaml_muon(true);
  config.optimizer.target = "AdamW";
  auto built = build_optimizer(params, config);
  auto& chain = dynamic_cast<MixedPrecisionOptimizer&>(*built).chained();
  ASSERT_EQ(chain.leaves().size(), 1u);
  EXPECT_EQ(chain.leaves()[0]->kind(), "adamw");
  EXPECT_EQ(chain.leaves()[0]->param_groups().size(), 2u);  // decay / no decay

  config.optimizer.routing = "toml";  // one shared weight_decay for every AdamW param
  muon_config(config).options.weight_decay(adamw_config(config).weight_decay());
  auto toml = build_optimizer(tiny_qwen2_moe(at::kBFloat16), config);
  EXPECT_EQ(
      dynamic_cast<MixedPrecisionOptimizer&>(*toml).chained().leaves()[0]->param_groups().size(),
      1u);
}

TEST(BuildOptimizer, LrFactorReachesBothLeaves) {
  auto built = build_optimizer(tiny_qwen2_moe(at::kBFloat16), yaml_muon(true));
  built->set_lr_factor(0.25);
  const auto& chain = dynamic_cast<MixedPrecisionOptimizer&>(*built).chained();
  EXPECT_DOUBLE_EQ(chain.leaves()[0]->param_groups()[1].options().get_lr(), 0.25e-3);
  EXPECT_DOUBLE_EQ(chain.leaves()[1]->param_groups()[0].options().get_lr(), 0.005);
}

TEST(BuildOptimizer, LogsTheRoutingTable) {
  ::testing::internal::CaptureStderr();
  build_optimizer(tiny_qwen2_moe(at::kBFloat16), yaml_muon(true));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("weight_decay"), std::string::npos) << log;
  EXPECT_NE(log.find("model.layers.0.mlp.experts.down_proj"), std::string::npos) << log;
  EXPECT_NE(log.find("[4, 16, 8]"), std::string::npos) << log;
}

TEST(BuildOptimizer, BadLeafOptionsAreConfigErrors) {
  TrainerConfig config = yaml_muon(true);
  muon_config(config).options.ns_variant("bogus");
  EXPECT_THROW(build_optimizer(tiny_qwen2_moe(at::kBFloat16), config), ConfigError);
  NamedParams frozen = {{"w", at::zeros({2, 2})}};
  config = yaml_muon(false);
  config.optimizer.target = "AdamW";
  EXPECT_THROW(build_optimizer(frozen, config), std::invalid_argument);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
