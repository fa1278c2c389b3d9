// `mixtrain optim-replay --nproc N`: the FSDP layout (every tensor split on dim 0 over N ranks,
// Muon through the owner-per-bucket path) gives the one-process result.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "mixtrain/core/safetensors.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

std::map<std::string, at::Tensor> read_map(const std::string& path) {
  NamedTensors tensors = read_safetensors(path).tensors;
  return {tensors.begin(), tensors.end()};
}

class OptimReplayDistributed : public ::testing::Test {
 protected:
  void SetUp() override {
    at::manual_seed(7);
    // Shapes chosen so that 2 and 4 ranks get uneven chunks (37 rows: 19/18 and 10/10/10/7),
    // a rank with no rows (3 rows over 4 ranks), and no two Muon matrices share a shape whose
    // short side is <= 16: LibTorch 1.13 picks another bf16 GEMM kernel for such batches, which
    // would change the rounding between layouts (see optim/distributed_muon.h).
    NamedTensors params = {
        {"model.embed_tokens.weight", at::randn({37, 24}).to(at::kBFloat16)},  // AdamW
        {"layers.0.attn.weight", at::randn({37, 24}).to(at::kBFloat16)},       // Muon
        {"layers.0.mlp.weight", at::randn({20, 33}).to(at::kBFloat16)},        // Muon
        {"layers.0.gate.weight", at::randn({3, 40})},                          // Muon, float32
        {"layers.0.attn.bias", at::randn({37})},                               // AdamW, float32
    };
    write_safetensors(dir_.file("p.safetensors"), params);
    NamedTensors grads;
    for (int64_t k = 1; k <= 3; ++k) {
      for (const auto& [name, p] : params) {
        grads.emplace_back("step." + std::to_string(k) + "." + name, at::randn(p.sizes()));
      }
    }
    write_safetensors(dir_.file("g.safetensors"), grads);
  }

  void write_config(double max_grad_norm) {
    std::ofstream(dir_.file("c.yaml"))
        << "model_init_dtype: bfloat16\n"
           "optimizer:\n  _target_: Muon\n  fp32_main_params: true\n"
           "fsdp_config:\n  mix_precision:\n    param_dtype: bfloat16\n    reduce_dtype: float32\n"
           "train:\n  max_grad_norm: "
        << max_grad_norm << "\n";
  }

  std::map<std::string, at::Tensor> replay(int nproc) {
    const std::string out = dir_.file("o" + std::to_string(nproc) + ".safetensors");
    CommandResult r =
        run_mixtrain("optim-replay --config " + dir_.file("c.yaml") + " --params " +
                     dir_.file("p.safetensors") + " --grads " + dir_.file("g.safetensors") +
                     " --out " + out + " --nproc " + std::to_string(nproc));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.exit_code == 0 ? read_map(out) : std::map<std::string, at::Tensor>{};
  }

  TempDir dir_;
};

// Without clipping every operation sees the same numbers in every layout: AdamW is
// elementwise, Muon's owner runs Newton–Schulz on the assembled full matrix, and u travels in
// bfloat16, the dtype Newton–Schulz casts to first. So the result is bitwise equal.
TEST_F(OptimReplayDistributed, TwoAndFourRanksAreBitwiseTheOneProcessResult) {
  write_config(0.0);
  auto one = replay(1);
  ASSERT_FALSE(one.empty());
  EXPECT_TRUE(one.count("optimizer.state.layers.0.attn.weight.momentum_buffer"));
  EXPECT_TRUE(
      one.count("optimizer._mixed_precision_optimizer.fp32_from_fp16_params.layers.0.mlp.weight"));
  for (int nproc : {2, 4}) {
    auto many = replay(nproc);
    ASSERT_EQ(many.size(), one.size()) << nproc << " ranks";
    for (const auto& [key, tensor] : one) {
      ASSERT_TRUE(many.count(key)) << key;
      EXPECT_EQ(many.at(key).sizes(), tensor.sizes()) << key;
      EXPECT_TRUE(at::equal(many.at(key), tensor)) << key << " differs on " << nproc << " ranks";
    }
  }
}

// With clipping, the global norm is summed over shards in another order: the clip
// coefficient differs in the last float bits (relative ~1e-7), which moves the results by
// that relative amount per step; 1e-5 leaves margin for 3 steps and Newton–Schulz's bf16.
TEST_F(OptimReplayDistributed, ClippingAgreesWithinFloatRounding) {
  write_config(0.5);
  auto one = replay(1);
  auto two = replay(2);
  ASSERT_FALSE(one.empty());
  ASSERT_EQ(two.size(), one.size());
  for (const auto& [key, tensor] : one) {
    if (tensor.scalar_type() != at::kFloat) continue;
    EXPECT_TRUE(at::allclose(two.at(key), tensor, 1e-5, 1e-6)) << key;
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
