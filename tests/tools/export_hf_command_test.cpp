// Hugging Face in and out through the binary: `mixtrain train` with model.init_from (one rank,
// two FSDP ranks, expert parallelism) starts from exactly transformers' weights; `mixtrain
// export-hf` writes a directory transformers' from_pretrained loads with the logits our model
// gives on the exported weights (bf16 and f32, one file or shards); its refusals leave nothing
// behind. References: tests/python/hf_models.py (tiny random models, no hub).
#include <ATen/ATen.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "mixtrain/checkpoint/hf_import.h"
#include "mixtrain/config/load.h"
#include "mixtrain/core/posix_file.h"
#include "mixtrain/core/safetensors.h"
#include "mixtrain/model/registry.h"
#include "support/python_script.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

using test_support::python_script_succeeds;

void save_hf(const std::string& family, const std::string& dir, const std::string& options = "") {
  std::vector<std::string> argv = {"hf_models.py", "save", family, dir,
                                   dir + ".reference.safetensors"};
  std::istringstream words(options);
  for (std::string word; words >> word;) argv.push_back(word);
  ASSERT_TRUE(python_script_succeeds(argv));
}

// Every tensor of an HF directory (one file or shards), by name.
std::map<std::string, at::Tensor> hf_tensors(const std::string& dir) {
  std::map<std::string, at::Tensor> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    for (auto& [name, tensor] : read_safetensors(entry.path().string()).tensors) {
      out[name] = tensor;
    }
  }
  return out;
}

// A run config starting from `init_from`: synthetic data (the tiny vocabulary), AdamW at `lr`,
// a checkpoint at the last step.
std::string write_config(const TempDir& tmp, const std::string& init_from, double lr,
                         const std::string& extra = "") {
  const std::string path = tmp.file("run.yaml");
  std::ofstream(path) << "model:\n  init_from: " << init_from << "\n"
                      << "data:\n  seq_len: 16\n  micro_batch_size: 2\n  global_batch_size: 4\n"
                      << "train:\n  steps: 2\n  log_every: 1\n"
                      << "  lr_scheduler:\n    warmup_steps: 0\n    decay: constant\n"
                      << "checkpoint:\n  interval: 2\n"
                      << "optimizer:\n  _target_: AdamW\n  adamw_config:\n    adamw_lr: " << lr
                      << "\n"
                      << extra;
  return path;
}

CommandResult train(const TempDir& tmp, const std::string& config, const std::string& flags = "") {
  return run_mixtrain("train --config " + config + " --run-dir " + tmp.file("run") + " " + flags);
}

// A bfloat16 model trained with fp32 main params (fp32-main-params §2.5's reduce dtype).
const char* kBf16Model =
    "model_init_dtype: bfloat16\nfsdp_config:\n  mix_precision:\n    param_dtype: bfloat16\n"
    "    reduce_dtype: float32\n";
const char* kMainParams = "--set optimizer.fp32_main_params=true";

// lr 0 (AdamW's decoupled decay is lr x weight_decay: 0 too): the checkpoint holds the loaded
// weights, and exporting it must give transformers' tensors back bit for bit, under the same
// names. So the load, the checkpoint layout and the export's names are all exact.
void expect_identity_round_trip(const std::string& family, const std::string& save_options,
                                const std::string& flags, const std::string& extra = "") {
  TempDir tmp;
  ASSERT_NO_FATAL_FAILURE(save_hf(family, tmp.file("hf"), save_options));
  const CommandResult r = train(tmp, write_config(tmp, tmp.file("hf"), 0.0, extra), flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("init_from: "), std::string::npos) << r.output;
  const std::string dtype = save_options.find("bfloat16") != std::string::npos ? "bf16" : "f32";
  const CommandResult e = run_mixtrain("export-hf " + tmp.file("run/checkpoints") + " " +
                                       tmp.file("out") + " --dtype " + dtype);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const auto want = hf_tensors(tmp.file("hf"));
  const auto got = hf_tensors(tmp.file("out"));
  // Rank 0 logs the bytes of weights it read: all of them alone, its pieces' on two ranks.
  uint64_t total = 0;
  for (const auto& [name, tensor] : want) total += tensor.numel() * tensor.element_size();
  std::smatch read;
  ASSERT_TRUE(std::regex_search(r.output, read, std::regex("this rank read ([0-9]+) bytes")));
  const uint64_t bytes = std::stoull(read[1].str());
  if (flags.find("--nproc 2") == std::string::npos) {
    EXPECT_EQ(bytes, total);
  } else {
    EXPECT_LT(bytes, total * 3 / 4) << "rank 0 read more than its pieces";
    EXPECT_GT(bytes, total / 4);
  }
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, tensor] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    EXPECT_TRUE(at::equal(got.at(name), tensor)) << name;
  }
}

TEST(ExportHf, InitFromThenExportGivesTransformersTensorsBack) {
  expect_identity_round_trip("qwen2_moe", "", "");
  // Shards with an index; a float32 file into a bfloat16 model with fp32 main params: the main
  // params hold the file's values exactly, and the export takes them.
  expect_identity_round_trip("qwen2", "--max-shard-size 4000", kMainParams, kBf16Model);
  // A bfloat16 file, exported as bf16.
  expect_identity_round_trip("llama", "--dtype bfloat16", "", "");
}

TEST(ExportHf, TwoRanksLoadOnlyTheirPiecesAndExportTheWhole) {
  expect_identity_round_trip("qwen2_moe", "--max-shard-size 6000", "--nproc 2",
                             "parallel:\n  dp_shard: 2\n");
  expect_identity_round_trip("qwen3_moe", "", "--nproc 2", "parallel:\n  dp_shard: 2\n  ep: 2\n");
}

// Our model's float32 logits on `ids` with the weights of HF directory `dir` (loaded by
// import_hf_weights into the model the config describes).
at::Tensor our_logits(const std::string& config, const std::string& dir, const at::Tensor& ids) {
  const ResolvedConfig resolved = load_config(config, {"model.init_from=" + dir});
  auto model = build_model(resolved.config.model, 1);
  std::vector<HfImportTarget> targets;
  for (const auto& item : model->named_parameters()) {
    targets.push_back(
        {item.key(), item.value(), whole_placement(item.key(), item.value().sizes().vec())});
  }
  for (const auto& [name, tensor] : model->model_state()) {  // deepseek_v3's selection biases
    targets.push_back({name, tensor, whole_placement(name, tensor.sizes().vec())});
  }
  import_hf_weights(dir, targets);
  c10::NoGradGuard no_grad;
  return model->forward(ids).logits.to(at::kFloat);
}

// Train, export, and from_pretrained: transformers' logits on the export are ours.
void expect_logits_round_trip(const std::string& family, const std::string& flags,
                              const std::string& extra, const std::string& export_options) {
  TempDir tmp;
  ASSERT_NO_FATAL_FAILURE(save_hf(family, tmp.file("hf")));
  const std::string config = write_config(tmp, tmp.file("hf"), 0.01, extra);
  const CommandResult r = train(tmp, config, flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const CommandResult e = run_mixtrain("export-hf " + tmp.file("run/checkpoints") + " " +
                                       tmp.file("out") + " " + export_options);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  std::printf("%s\n", e.output.c_str());

  const at::Tensor ids = at::randint(61, {2, 12}, at::TensorOptions().dtype(at::kLong));
  write_safetensors(tmp.file("ids.safetensors"), {{"input_ids", ids}});
  ASSERT_TRUE(
      python_script_succeeds({"hf_models.py", "logits", tmp.file("out"),
                              tmp.file("ids.safetensors"), tmp.file("logits.safetensors")}));
  const at::Tensor theirs = read_safetensors(tmp.file("logits.safetensors")).tensors.at(0).second;
  const at::Tensor ours = our_logits(config, tmp.file("out"), ids);
  // Training moved the weights: the exported model is not the initial one.
  const at::Tensor initial = our_logits(config, tmp.file("hf"), ids);
  ASSERT_EQ(theirs.sizes(), ours.sizes());
  const double scale = theirs.abs().max().item<double>();
  const double error = (ours - theirs).abs().max().item<double>();
  const double moved = (initial - theirs).abs().max().item<double>();
  // Both float32 on the same weights; they differ by float32 rounding in a different order of
  // operations (eager attention vs LibTorch's kernel, HF's expert loop vs ours): a few 1e-7 of
  // the scale (tests/unit/model/qwen2_test.cpp measured 3.6e-7 relative); 1e-5 leaves ~30x. Two
  // AdamW steps at lr 0.01 move every weight by ~0.02, changing logits by O(0.1) of the scale.
  EXPECT_LE(error, 1e-5 * scale) << "max |ours - HF| " << error << ", max |HF| " << scale;
  EXPECT_GT(moved, 1e-2 * scale) << "training did not move the logits";
  std::printf("%s %s: max |ours - HF| = %.3g, max |HF| = %.3g, moved by training %.3g\n",
              family.c_str(), export_options.c_str(), error, scale, moved);
}

TEST(ExportHf, TransformersLoadsTheExportWithOurLogits) {
  expect_logits_round_trip("qwen2_moe", "", "", "--dtype f32");
  expect_logits_round_trip("qwen2", "", "", "--dtype bf16 --max-shard-size 4000");
  // bf16 model with fp32 main params: the export takes the main params.
  expect_logits_round_trip("qwen3_moe", kMainParams, kBf16Model, "--max-shard-size 5KB");
  expect_logits_round_trip("llama", "", "", "--dtype bf16");
  // Llama 3 rope scaling survives the export: on hf_models.py's llama3, dropping the scaling
  // moves transformers' logits of 12 positions by 1.9 of max 4.3 (measured when written), far
  // over the 1e-5 bound.
  expect_logits_round_trip("llama3", "", "", "--dtype f32");
  // Mistral's sliding window (5 of 12 positions) survives the export: transformers applies it
  // from the exported config.json, or the later positions' logits would differ by O(1).
  expect_logits_round_trip("mistral", "", "", "--dtype f32");
}

// DeepSeek-V3: the selection biases (model state beside the weights) come in with model.init_from
// and go out with export-hf, in float32 with the router weights (transformers keeps both in
// float32) while the other tensors are bf16; bias_update_speed 0 keeps them at the file's values,
// so the round trip is exact. Trained with bias_update_speed 0.05 on two ranks (FSDP + expert
// parallelism), the export carries the moved biases: transformers' logits are ours.
TEST(ExportHf, DeepseekV3WeightsAndBalancingBiasesInAndOut) {
  expect_identity_round_trip("deepseek_v3", "", "--set model.bias_update_speed=0");
  {
    TempDir tmp;
    ASSERT_NO_FATAL_FAILURE(save_hf("deepseek_v3", tmp.file("hf")));
    const CommandResult r =
        train(tmp, write_config(tmp, tmp.file("hf"), 0.0), "--set model.bias_update_speed=0");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const CommandResult e = run_mixtrain("export-hf " + tmp.file("run/checkpoints") + " " +
                                         tmp.file("out") + " --dtype bf16");
    ASSERT_EQ(e.exit_code, 0) << e.output;
    const auto got = hf_tensors(tmp.file("out"));
    const auto want = hf_tensors(tmp.file("hf"));
    for (const auto& [name, tensor] : got) {
      const bool float32 = name.find(".mlp.gate.") != std::string::npos;
      EXPECT_EQ(tensor.scalar_type(), float32 ? at::kFloat : at::kBFloat16) << name;
      if (float32) {
        EXPECT_TRUE(at::equal(tensor, want.at(name))) << name;
      }
    }
    EXPECT_EQ(got.count("model.layers.1.mlp.gate.e_score_correction_bias"), 1u);
  }
  expect_logits_round_trip("deepseek_v3", "--nproc 2 --set model.bias_update_speed=0.05",
                           "parallel:\n  dp_shard: 2\n  ep: 2\n", "--dtype f32");
}

TEST(ExportHf, TwoRankInitFromTrainExportReload) {
  expect_logits_round_trip("qwen2_moe", "--nproc 2", "parallel:\n  dp_shard: 2\n  ep: 2\n", "");
}

// Tied embeddings (model.tie_word_embeddings from config.json): save_pretrained's layout (no
// lm_head.weight) loads and exports back bit for bit, without lm_head.weight and with
// tie_word_embeddings: true; the state-dict layout (lm_head.weight equal to the embedding) loads;
// a checkpoint whose lm_head.weight differs is refused naming both keys; and transformers loads
// the export of a trained tied model with our logits, on one rank and on two FSDP ranks.
TEST(ExportHf, TiedEmbeddingsInAndOut) {
  expect_identity_round_trip("qwen2_tied", "", "");
  expect_identity_round_trip("llama_tied", "", "--nproc 2", "parallel:\n  dp_shard: 2\n");
  TempDir tmp;
  ASSERT_NO_FATAL_FAILURE(save_hf("qwen2_tied", tmp.file("hf")));
  ASSERT_EQ(hf_tensors(tmp.file("hf")).count("lm_head.weight"), 0u)
      << "save_pretrained writes a tied model without lm_head.weight";
  ASSERT_EQ(train(tmp, write_config(tmp, tmp.file("hf"), 0.0)).exit_code, 0);
  const CommandResult e =
      run_mixtrain("export-hf " + tmp.file("run/checkpoints") + " " + tmp.file("out"));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  std::ifstream config(tmp.file("out/config.json"));
  const std::string text((std::istreambuf_iterator<char>(config)), {});
  EXPECT_NE(text.find("\"tie_word_embeddings\": true"), std::string::npos) << text;
  EXPECT_EQ(hf_tensors(tmp.file("out")).count("lm_head.weight"), 0u);

  // The state dict's layout: lm_head.weight beside the embedding, equal to it.
  TempDir fused;
  ASSERT_NO_FATAL_FAILURE(save_hf("qwen2_tied", fused.file("hf"), "--layout fused"));
  auto tensors = hf_tensors(fused.file("hf"));
  ASSERT_EQ(tensors.count("lm_head.weight"), 1u);
  ASSERT_TRUE(at::equal(tensors.at("lm_head.weight"), tensors.at("model.embed_tokens.weight")));
  CommandResult r = train(fused, write_config(fused, fused.file("hf"), 0.0));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Not the embedding: refused, naming both keys.
  NamedTensors changed;
  for (auto& [name, tensor] : tensors) {
    changed.emplace_back(name, name == "lm_head.weight" ? tensor + 1 : tensor);
  }
  write_safetensors(fused.file("hf/model.safetensors"), changed, {{"format", "pt"}});
  fs::remove_all(fused.file("run"));
  r = train(fused, write_config(fused, fused.file("hf"), 0.0));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("lm_head.weight: differs from model.embed_tokens.weight, but the model "
                          "ties them"),
            std::string::npos)
      << r.output;

  expect_logits_round_trip("qwen2_tied", "", "", "--dtype f32");
  expect_logits_round_trip("llama_tied", "--nproc 2", "parallel:\n  dp_shard: 2\n", "");
}

TEST(ExportHf, RefusalsLeaveNothingBehind) {
  TempDir tmp;
  ASSERT_NO_FATAL_FAILURE(save_hf("qwen2", tmp.file("hf")));
  ASSERT_EQ(train(tmp, write_config(tmp, tmp.file("hf"), 0.01)).exit_code, 0);
  const std::string ckpt = tmp.file("run/checkpoints");

  fs::create_directories(tmp.file("full"));
  std::ofstream(tmp.file("full/keep")) << "x";
  CommandResult r = run_mixtrain("export-hf " + ckpt + " " + tmp.file("full"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(tmp.file("full") + ": is not empty"), std::string::npos) << r.output;

  r = run_mixtrain("export-hf " + ckpt + " " + tmp.file("o") + " --dtype f16");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--dtype: must be bf16 or f32"), std::string::npos) << r.output;
  r = run_mixtrain("export-hf " + ckpt + " " + tmp.file("o") + " --max-shard-size 5XB");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--max-shard-size: '5XB' is not a size"), std::string::npos) << r.output;

  // A corrupt chunk is found while the shards are written: no OUT_DIR, no temporary directory.
  const std::string rank_file = ckpt + "/step-00000002/__0_0.safetensors";
  {
    const FileDescriptor fd = FileDescriptor::open(rank_file, O_RDWR);
    ASSERT_TRUE(fd.valid());
    const SafetensorsHeader header = read_safetensors_header(fd.get(), rank_file);
    bool flipped = false;
    for (const SafetensorsEntry& entry : header.entries) {
      if (entry.name != "model.model.norm.weight") continue;
      char byte = 0;
      ASSERT_EQ(pread(fd.get(), &byte, 1, header.data_start + entry.begin), 1);
      byte = static_cast<char>(byte ^ 0x55);
      ASSERT_EQ(pwrite(fd.get(), &byte, 1, header.data_start + entry.begin), 1);
      flipped = true;
    }
    ASSERT_TRUE(flipped);
  }
  fs::create_directories(tmp.file("empty"));
  r = run_mixtrain("export-hf " + ckpt + " " + tmp.file("empty"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("checksum"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_empty(tmp.file("empty")));
  for (const auto& entry : fs::directory_iterator(tmp.path())) {
    EXPECT_EQ(entry.path().filename().string().find(".empty.tmp-export"), std::string::npos);
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
