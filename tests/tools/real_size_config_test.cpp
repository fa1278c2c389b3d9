// A real model's shapes through `mixtrain train`: Qwen3-0.6B's config.json as transformers
// writes it from its own Qwen3Config (vocabulary 151,936, hidden 1024, 16 query / 8 kv heads of
// 128, MLP 3072, tied embeddings), its 28 layers cut to 2 so that CI can run it, trained 2 steps
// on 2 FSDP ranks in bfloat16 with fp32 main params and Muon + AdamW, from a version-2 (uint32)
// token shard with ids above 65,535. Nothing at real head / kv / vocabulary sizes may break: the
// run exits 0, reads the shapes from the file, and its first loss is the untrained model's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

constexpr int64_t kVocab = 151936;

// An llm.c shard, version 2 (uint32 tokens, docs/data.md): ids drawn over the whole vocabulary.
void write_uint32_shard(const std::string& path, int64_t count) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 2;
  header[2] = static_cast<int32_t>(count);
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> id(0, kVocab - 1);
  std::vector<uint32_t> tokens(count);
  for (auto& t : tokens) t = id(rng);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
}

TEST(RealSizeConfig, Qwen3Of0p6BShapesTrainOnTwoRanks) {
  TempDir dir;
  const std::string json = dir.file("config.json");
  const int status = std::system(
      (std::string(MIXTRAIN_PYTHON) +
       " -c \"import transformers; transformers.Qwen3Config(vocab_size=151936, "
       "hidden_size=1024, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=16, "
       "num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, "
       "rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True).to_json_file('" +
       json + "')\"")
          .c_str());
  ASSERT_EQ(status, 0) << "transformers could not write " << json;
  write_uint32_shard(dir.file("train.bin"), 4096);
  std::ofstream(dir.file("run.yaml"))
      << "model_init_dtype: bfloat16\n"
      << "optimizer:\n  _target_: Muon\n  fp32_main_params: true\n"
      << "  muon_config:\n    muon_lr: 0.02\n  adamw_config:\n    adamw_lr: 0.001\n"
      << "fsdp_config:\n  mix_precision:\n    param_dtype: bfloat16\n    reduce_dtype: float32\n"
      << "model:\n  hf_config: " << json << "\n"
      << "data:\n  kind: tokens\n  path: " << dir.file("train.bin")
      << "\n  seq_len: 32\n  micro_batch_size: 1\n  global_batch_size: 2\n"
      << "train:\n  steps: 2\n  log_every: 1\n";
  const CommandResult r = run_mixtrain("train --config " + dir.file("run.yaml") + " --run-dir " +
                                       dir.file("run") + " --nproc 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("vocab_size: 151936"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tie_word_embeddings: true"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("num_kv_heads: 8"), std::string::npos) << r.output;
  const auto rows = read_metrics(dir.file("run/metrics.jsonl"));
  ASSERT_EQ(rows.size(), 2u);
  // Untrained: RMSNorm'd hidden states (entries of RMS 1) against N(0, 0.02^2) embedding rows
  // give logits of std s = 0.02 sqrt(1024) = 0.64, so the cross-entropy of random targets is
  // ln V + s^2 / 2 = 11.93 + 0.20 in expectation, and a single target's logit spreads it by s:
  // over the 62 predictions of the step, 0.08 per standard deviation. Bounds: ln V (uniform
  // logits) to ln V + 0.6 (five deviations above the expectation). A head over a cut vocabulary
  // or one that did not share the embedding's rows lands outside.
  const double log_vocab = std::log(static_cast<double>(kVocab));
  const double first = rows[0]["loss"].get<double>();
  EXPECT_GT(first, log_vocab);
  EXPECT_LT(first, log_vocab + 0.6);
  std::printf("real-size qwen3 (2 layers, 2 ranks): step 1 loss %.4f (ln V = %.4f)\n", first,
              log_vocab);
  for (const auto& row : rows) EXPECT_TRUE(std::isfinite(row["grad_norm"].get<double>()));
}

// configs/moonlight_16b_a3b_2layer.yaml (Moonlight-16B-A3B's dimensions, 2 layers) resolves
// and passes every check with its real shapes: deepseek_v3, MLA without query compression, 64
// experts top 6, MuonClip at tau 100, the swap optimizer (without it training needs about 21.4
// GB before activations; bench_real_size_bench trains it: 17.5 GiB of live tensors with it).
TEST(RealSizeConfig, MoonlightShapedConfigResolves) {
  const CommandResult r =
      run_mixtrain("config show " + source_path("configs/moonlight_16b_a3b_2layer.yaml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* row :
       {"model.name", "deepseek_v3", "model.vocab_size", "163840", "model.kv_lora_rank", "512",
        "model.num_experts", "64", "optimizer.muon_config.muon_qk_clip_tau", "100"}) {
    EXPECT_NE(r.output.find(row), std::string::npos) << row;
  }
  const size_t swap = r.output.find("optimizer.swap_optimizer ");
  ASSERT_NE(swap, std::string::npos) << r.output;
  const std::string swap_row = r.output.substr(swap, r.output.find('\n', swap) - swap);
  EXPECT_NE(swap_row.find("true"), std::string::npos) << swap_row;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
