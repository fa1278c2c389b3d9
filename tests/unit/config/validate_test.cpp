// Every validation rule, through load_config, in both dialects. Messages are compared without
// the temp-file prefix: "<key as the user wrote it>: <rule>".
#include "mixtrain/config/validate.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mixtrain/config/load.h"
#include "mixtrain/optim/muon_config.h"
#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::config_error_of;
using testing::TempDir;

std::string error_in(const std::string& name, const std::string& text,
                     const std::vector<std::string>& overrides = {}) {
  TempDir dir;
  const std::string path = dir.write(name, text);
  const std::string message = config_error_of([&] { load_config(path, overrides); });
  const std::string prefix = path + ": ";
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}
std::string yaml_error(const std::string& text) {
  return error_in("c.yaml", text);
}
std::string toml_error(const std::string& text) {
  return error_in("c.toml", text);
}

void expect_valid(const std::string& name, const std::string& text) {
  TempDir dir;
  const std::string path = dir.write(name, text);
  EXPECT_NO_THROW(load_config(path, {})) << text;
}

// A config load_config refuses: the file name (its ending picks the dialect), the text, and the
// error without the temp-file prefix.
struct Refused {
  std::string name;
  std::string text;
  std::string error;
};
void expect_refused(const std::vector<Refused>& cases) {
  for (const Refused& c : cases) EXPECT_EQ(error_in(c.name, c.text), c.error) << c.text;
}

TEST(ValidateTest, Fp32MainParamsRequiresFloat32ReduceNamingBothKeys) {
  const std::string missing = yaml_error("optimizer:\n  fp32_main_params: true\n");
  EXPECT_EQ(missing,
            "optimizer.fp32_main_params: true requires fsdp_config.mix_precision.reduce_dtype: "
            "float32 (it is not set); set it explicitly, it is never changed automatically");
  const std::string bf16 = yaml_error(
      "optimizer:\n  fp32_main_params: true\nfsdp_config:\n  mix_precision:\n"
      "    reduce_dtype: bfloat16\n");
  EXPECT_NE(bf16.find("optimizer.fp32_main_params"), std::string::npos);
  EXPECT_NE(bf16.find("fsdp_config.mix_precision.reduce_dtype"), std::string::npos);
  EXPECT_NE(bf16.find("(it is bfloat16)"), std::string::npos);
  expect_valid("c.yaml",
               "optimizer:\n  fp32_main_params: true\nfsdp_config:\n  mix_precision:\n"
               "    reduce_dtype: float32\n");
  // Without fp32 main params a missing or low-precision reduce dtype is fine.
  expect_valid("c.yaml", "fsdp_config:\n  mix_precision:\n    reduce_dtype: bfloat16\n");
}

TEST(ValidateTest, DtypeNames) {
  expect_refused({
      {"c.yaml", "model_init_dtype: fp8\n",
       "model_init_dtype: must be one of float16, bfloat16, float32, got 'fp8'"},
      {"c.yaml", "fsdp_config:\n  mix_precision:\n    param_dtype: bf16\n",
       "fsdp_config.mix_precision.param_dtype: must be one of float16, bfloat16, float32, "
       "got 'bf16'"},
      {"c.toml", "[training]\nmixed_precision_reduce = \"float64\"\n",
       "training.mixed_precision_reduce: must be one of float16, bfloat16, float32, got "
       "'float64'"},
      {"c.toml", "[training]\nmixed_precision_param = \"half\"\n",
       "training.mixed_precision_param: must be one of float16, bfloat16, float32, got "
       "'half'"},
  });
  expect_valid("c.yaml", "model_init_dtype: null\n");
  expect_valid("c.yaml", "model_init_dtype: float16\n");
}

TEST(ValidateTest, ModelShape) {
  expect_refused({
      {"c.yaml", "model:\n  vocab_size: 0\n", "model.vocab_size: must be > 0, got 0"},
      {"c.toml", "[model]\nhidden_size = -4\n", "model.hidden_size: must be > 0, got -4"},
      {"c.yaml", "model:\n  num_heads: 6\n  num_kv_heads: 4\n",
       "model.num_kv_heads: must divide model.num_heads (6) for grouped-query attention, "
       "got 4"},
      {"c.toml", "[model]\nnum_heads = 5\n",  // num_kv_heads stays 2
       "model.num_kv_heads: must divide model.num_heads (5) for grouped-query attention, "
       "got 2"},
      {"c.yaml", "model:\n  num_experts_per_tok: 5\n",
       "model.num_experts_per_tok: must be <= model.num_experts (4), got 5"},
      {"c.yaml", "model:\n  head_dim: 15\n",
       "model.head_dim: must be even (rotary embeddings), got 15"},
      {"c.yaml", "model:\n  rms_norm_eps: 0\n", "model.rms_norm_eps: must be > 0, got 0"},
      {"c.yaml", "model:\n  name: mixtral\n",
       "model.name: must be one of qwen2_moe, qwen3_moe, qwen2, llama, qwen3, mistral, "
       "deepseek_v3, got 'mixtral'"},
  });
}

TEST(ValidateTest, DataAndBatch) {
  expect_refused({
      {"c.yaml", "data:\n  kind: web\n", "data.kind: must be one of synthetic, tokens, got 'web'"},
      {"c.yaml", "data:\n  kind: tokens\n",
       "data.path: is required when data.kind is tokens (a file or a glob of shards)"},
      {"c.toml", "[training]\ndataset = \"tokens\"\n",
       "training.dataset_path: is required when training.dataset is tokens (a file or a glob "
       "of shards)"},
      {"c.yaml", "data:\n  seq_len: 512\n",
       "data.seq_len: must be <= model.max_seq_len (256), got 512"},
      {"c.toml", "[training]\nseq_len = 300\n",
       "training.seq_len: must be <= model.max_seq_len (256), got 300"},
      {"c.yaml", "data:\n  micro_batch_size: 0\n", "data.micro_batch_size: must be > 0, got 0"},
      {"c.yaml", "data:\n  micro_batch_size: 4\n  global_batch_size: 10\n",
       "data.global_batch_size: must be a multiple of data.micro_batch_size x "
       "parallel.dp_replicate x parallel.dp_shard = 4 (global = micro x accumulation x dp), "
       "got 10"},
      {"c.toml",
       "[training]\nlocal_batch_size = 4\nglobal_batch_size = 12\n"
       "[parallelism]\ndata_parallel_shard_degree = 2\n",
       "training.global_batch_size: must be a multiple of training.local_batch_size x "
       "parallelism.data_parallel_replicate_degree x "
       "parallelism.data_parallel_shard_degree = 8 (global = micro x accumulation x dp), "
       "got 12"},
  });
  // micro 4 x accumulation 2 x dp 2 = 16.
  expect_valid("c.yaml",
               "data:\n  micro_batch_size: 4\n  global_batch_size: 16\nparallel:\n  dp_shard: 2\n");
}

TEST(ValidateTest, Parallel) {
  expect_refused({
      {"c.yaml", "parallel:\n  dp_shard: 0\n", "parallel.dp_shard: must be > 0, got 0"},
      {"c.toml", "[parallelism]\ndata_parallel_shard_degree = -1\n",
       "parallelism.data_parallel_shard_degree: must be > 0, got -1"},
      {"c.yaml", "parallel:\n  ep: 3\n  dp_shard: 3\ndata:\n  global_batch_size: 24\n",
       "parallel.ep: must divide model.num_experts (4), got 3"},
      {"c.toml", "[parallelism]\nexpert_parallel_degree = 2\n",
       "parallelism.expert_parallel_degree: must divide "
       "parallelism.data_parallel_shard_degree (1), got 2"},
  });
  // ep groups live inside a dp_shard row: dp_replicate does not count.
  EXPECT_EQ(yaml_error("parallel:\n  ep: 2\n  dp_replicate: 2\ndata:\n  global_batch_size: 16\n"),
            "parallel.ep: must divide parallel.dp_shard (1), got 2");
  expect_valid(
      "c.yaml",
      "parallel:\n  ep: 2\n  dp_shard: 2\n  dp_replicate: 2\ndata:\n  global_batch_size: 32\n");
}

// Tensor and context parallelism: degrees, what tp must divide (heads, kv heads, vocabulary,
// the model's MLP width), the sequence's 2 x cp chunks, the rotate method.
TEST(ValidateTest, TensorAndContextParallel) {
  EXPECT_EQ(yaml_error("parallel:\n  tp: 0\n"), "parallel.tp: must be > 0, got 0");
  EXPECT_EQ(toml_error("[parallelism]\ncontext_parallel_degree = 0\n"),
            "parallelism.context_parallel_degree: must be > 0, got 0");
  // Defaults: 4 heads, 2 kv heads, vocab 512, shared expert 128, seq_len 64.
  expect_refused({
      {"c.yaml", "parallel:\n  tp: 4\n",
       "parallel.tp: must divide model.num_kv_heads (2): tensor parallelism splits it "
       "evenly, got 4"},
      {"c.yaml", "parallel:\n  tp: 2\nmodel:\n  vocab_size: 513\n",
       "parallel.tp: must divide model.vocab_size (513): tensor parallelism splits it "
       "evenly, got 2"},
      {"c.yaml", "parallel:\n  tp: 2\nmodel:\n  shared_expert_intermediate_size: 33\n",
       "parallel.tp: must divide model.shared_expert_intermediate_size (33): tensor "
       "parallelism splits it evenly, got 2"},
      {"c.yaml", "parallel:\n  tp: 2\nmodel:\n  name: qwen2\n  intermediate_size: 33\n",
       "parallel.tp: must divide model.intermediate_size (33): tensor parallelism splits it "
       "evenly, got 2"},
      {"c.toml", "[parallelism]\ncontext_parallel_degree = 3\n",
       "training.seq_len: must be a multiple of 2 x parallelism.context_parallel_degree = 6 "
       "(each context-parallel rank holds two chunks), got 64"},
      {"c.yaml", "parallel:\n  cp_rotate_method: ring\n",
       "parallel.cp_rotate_method: must be one of alltoall, allgather, got 'ring'"},
  });
  expect_valid("c.yaml",
               "parallel:\n  tp: 2\n  cp: 2\n  dp_shard: 2\n  ep: 2\n  cp_rotate_method: "
               "allgather\ndata:\n  global_batch_size: 16\n");
  expect_valid("c.toml",
               "[parallelism]\ntensor_parallel_degree = 2\ncontext_parallel_degree = 4\n"
               "context_parallel_rotate_method = \"alltoall\"\n");
}

// Each model reads its own section (config/model_sections.h): another model's keys are
// refused when given, ignored at their defaults.
TEST(ValidateTest, DenseQwen2Section) {
  expect_valid("c.yaml", "model:\n  name: qwen2\n  intermediate_size: 96\n");
  expect_valid("c.toml", "[model]\nname = \"qwen2\"\nintermediate_size = 96\n");
  expect_refused({
      {"c.yaml", "model:\n  name: qwen2\n  intermediate_size: 0\n",
       "model.intermediate_size: must be > 0, got 0"},
      {"c.yaml", "model:\n  name: qwen2\n  num_experts: 8\n",
       "model.num_experts: is not a key of model qwen2 (it belongs to qwen2_moe); remove it "
       "or set model.name: qwen2_moe"},
      {"c.toml", "[model]\nname = \"qwen2\"\nrouter_aux_loss_coef = 0.01\n",
       "model.router_aux_loss_coef: is not a key of model qwen2 (it belongs to qwen2_moe); "
       "remove it or set model.name: qwen2_moe"},
      {"c.yaml", "model:\n  intermediate_size: 96\n",
       "model.intermediate_size: is not a key of model qwen2_moe (it belongs to qwen2); "
       "remove it or set model.name: qwen2"},
  });
  EXPECT_EQ(error_in("c.yaml", "model:\n  name: qwen2\n", {"model.num_experts_per_tok=1"}),
            "--set: model.num_experts_per_tok: is not a key of model qwen2 (it belongs to "
            "qwen2_moe); remove it or set model.name: qwen2_moe");
  // No routed experts: nothing for expert parallelism to split.
  EXPECT_EQ(yaml_error("model:\n  name: qwen2\nparallel:\n  ep: 2\n  dp_shard: 2\n"
                       "data:\n  global_batch_size: 16\n"),
            "parallel.ep: must be 1 for model qwen2 (it has no routed experts), got 2");
}

// qwen3_moe and llama share their families' sections; attention_bias and norm_topk_prob are
// keys of the models that honour them, and qwen2 refuses bias-free attention.
TEST(ValidateTest, Qwen3MoeLlamaAndAttentionKeys) {
  expect_valid("c.yaml",
               "model:\n  name: qwen3_moe\n  attention_bias: false\n  norm_topk_prob: true\n");
  expect_valid("c.toml", "[model]\nname = \"qwen3_moe\"\nnum_experts = 8\nnorm_topk_prob = true\n");
  expect_valid("c.yaml", "model:\n  norm_topk_prob: true\n  attention_bias: false\n");
  expect_valid("c.yaml",
               "model:\n  name: llama\n  attention_bias: false\n  intermediate_size: 96\n");
  expect_valid("c.yaml", "model:\n  name: qwen2\n  attention_bias: true\n");
  expect_refused({
      {"c.yaml", "model:\n  name: qwen2\n  attention_bias: false\n",
       "model.attention_bias: must be true for model qwen2 (its q/k/v projections always "
       "have biases); model llama has bias-free attention, got false"},
      {"c.yaml", "model:\n  name: qwen3_moe\n  shared_expert_intermediate_size: 8\n",
       "model.shared_expert_intermediate_size: is not a key of model qwen3_moe (it belongs "
       "to qwen2_moe); remove it or set model.name: qwen2_moe"},
      {"c.yaml", "model:\n  name: llama\n  norm_topk_prob: true\n",
       "model.norm_topk_prob: is not a key of model llama (it belongs to qwen2_moe); "
       "remove it or set model.name: qwen2_moe"},
      {"c.yaml", "model:\n  name: qwen3_moe\n  num_experts_per_tok: 5\n",
       "model.num_experts_per_tok: must be <= model.num_experts (4), got 5"},
      {"c.yaml",
       "model:\n  name: llama\nparallel:\n  ep: 2\n  dp_shard: 2\n"
       "data:\n  global_batch_size: 16\n",
       "parallel.ep: must be 1 for model llama (it has no routed experts), got 2"},
  });
  expect_valid("c.yaml",
               "model:\n  name: qwen3_moe\nparallel:\n  ep: 2\n  dp_shard: 2\n"
               "data:\n  global_batch_size: 16\n");
}

// Every model reads the rope keys; the four llama3 parameters mean nothing without the scaling.
TEST(ValidateTest, RopeScaling) {
  expect_valid("c.yaml",
               "model:\n  name: llama\n  rope_scaling: llama3\n  rope_scaling_factor: 32\n"
               "  rope_original_max_seq_len: 64\n");
  expect_valid("c.toml",
               "[model]\nname = \"qwen2\"\nrope_scaling = \"llama3\"\n"
               "rope_low_freq_factor = 2.0\n");
  EXPECT_EQ(yaml_error("model:\n  rope_scaling: longrope\n"),
            "model.rope_scaling: must be one of none, llama3, yarn, got 'longrope'");
  EXPECT_EQ(yaml_error("model:\n  rope_scaling_factor: 4\n"),
            "model.rope_scaling_factor: applies only with model.rope_scaling: llama3 or yarn (it "
            "is none); remove it or set the scaling");
  EXPECT_EQ(error_in("c.yaml", "model:\n  name: qwen2\n", {"model.rope_original_max_seq_len=128"}),
            "--set: model.rope_original_max_seq_len: applies only with model.rope_scaling: llama3 "
            "or yarn (it is none); remove it or set the scaling");
  // Each scheme's own keys only with it.
  EXPECT_EQ(yaml_error("model:\n  rope_scaling: yarn\n  rope_low_freq_factor: 2\n"),
            "model.rope_low_freq_factor: applies only with model.rope_scaling: llama3 (it is "
            "yarn); remove it or set the scaling");
  EXPECT_EQ(yaml_error("model:\n  rope_scaling: llama3\n  rope_yarn_mscale: 1\n"),
            "model.rope_yarn_mscale: applies only with model.rope_scaling: yarn (it is llama3); "
            "remove it or set the scaling");
  expect_valid("c.yaml",
               "model:\n  rope_scaling: yarn\n  rope_scaling_factor: 4\n"
               "  rope_yarn_beta_fast: 16\n  rope_yarn_mscale_all_dim: 1\n");
  expect_refused({
      {"c.yaml", "model:\n  rope_scaling: llama3\n  rope_scaling_factor: 0\n",
       "model.rope_scaling_factor: must be > 0, got 0"},
      {"c.yaml", "model:\n  rope_scaling: llama3\n  rope_high_freq_factor: 1\n",
       "model.rope_high_freq_factor: must be > model.rope_low_freq_factor (1.000000), got 1"},
      {"c.yaml", "model:\n  rope_scaling: llama3\n  rope_original_max_seq_len: -1\n",
       "model.rope_original_max_seq_len: must be > 0, got -1"},
  });
}

TEST(ValidateTest, ActivationCheckpointing) {
  expect_refused({
      {"c.yaml", "train:\n  activation_checkpointing: some\n",
       "train.activation_checkpointing: must be one of none, full, selective, got 'some'"},
      {"c.yaml",
       "train:\n  activation_checkpointing: selective\n  activation_checkpointing_every: 0\n",
       "train.activation_checkpointing_every: must be > 0, got 0"},
      {"c.yaml", "train:\n  activation_checkpointing: full\n  activation_checkpointing_every: 3\n",
       "train.activation_checkpointing_every: applies only with train.activation_checkpointing: "
       "selective (it is full); remove it or select layers"},
  });
}

TEST(ValidateTest, DistributedTimeout) {
  EXPECT_EQ(yaml_error("distributed:\n  timeout_s: 0\n"),
            "distributed.timeout_s: must be > 0, got 0");
  EXPECT_EQ(toml_error("[comm]\ntrain_timeout_seconds = -1.5\n"),
            "comm.train_timeout_seconds: must be > 0, got -1.5");
  expect_valid("c.yaml", "distributed:\n  timeout_s: 2.5\n");
}

TEST(ValidateTest, PeriodicEval) {
  expect_refused({
      {"c.yaml", "train:\n  eval_every: -1\n", "train.eval_every: must be >= 0, got -1"},
      {"c.yaml", "data:\n  eval_batches: -2\n", "data.eval_batches: must be >= 0, got -2"},
      {"c.yaml", "train:\n  eval_every: 5\n",
       "data.eval_path: is required when train.eval_every is > 0 (a file, a glob, or a "
       "directory of val_*.bin)"},
      {"c.toml", "[validation]\nfreq = 5\n",
       "validation.dataset_path: is required when validation.freq is > 0 (a file, a glob, "
       "or a directory of val_*.bin)"},
  });
  expect_valid("c.yaml", "train:\n  eval_every: 5\ndata:\n  eval_path: d/val_*.bin\n");
  expect_valid("c.toml", "[validation]\nfreq = 5\ndataset_path = \"d\"\nsteps = 2\n");
  expect_valid("c.yaml", "data:\n  eval_path: d\n");  // kept for `mixtrain eval`, eval off
}

TEST(ValidateTest, TrainScheduleCheckpoint) {
  expect_refused({
      {"c.yaml", "train:\n  steps: 0\n", "train.steps: must be > 0, got 0"},
      {"c.toml", "[training]\nsteps = -5\n", "training.steps: must be > 0, got -5"},
      {"c.yaml", "train:\n  log_every: 0\n", "train.log_every: must be > 0, got 0"},
      {"c.toml", "[metrics]\nlog_freq = 0\n", "metrics.log_freq: must be > 0, got 0"},
      {"c.yaml", "train:\n  lr_scheduler:\n    warmup_steps: -1\n",
       "train.lr_scheduler.warmup_steps: must be >= 0, got -1"},
      {"c.yaml", "train:\n  lr_scheduler:\n    decay: step\n",
       "train.lr_scheduler.decay: must be one of constant, linear, cosine, got 'step'"},
      {"c.toml", "[lr_scheduler]\ndecay_type = \"sqrt\"\n",
       "lr_scheduler.decay_type: must be one of constant, linear, cosine, got 'sqrt'"},
      {"c.yaml", "train:\n  device: gpu\n", "train.device: must be one of cpu, cuda, got 'gpu'"},
      {"c.toml", "[training]\ndevice = \"cuda:0\"\n",
       "training.device: must be one of cpu, cuda, got 'cuda:0'"},
      {"c.toml", "[lr_scheduler]\nmin_lr_factor = 1.5\n",
       "lr_scheduler.min_lr_factor: must be in [0, 1], got 1.5"},
      {"c.yaml", "checkpoint:\n  keep_last: -1\n", "checkpoint.keep_last: must be >= 0, got -1"},
      {"c.toml", "[checkpoint]\ninterval = -2\n", "checkpoint.interval: must be >= 0, got -2"},
  });
}

TEST(ValidateTest, AdamWRanges) {
  expect_refused({
      {"c.yaml", "optimizer:\n  adamw_config:\n    adamw_lr: -0.1\n",
       "optimizer.adamw_config.adamw_lr: must be >= 0, got -0.1"},
      {"c.toml", "[optimizer]\nlr = -1\n", "optimizer.lr: must be >= 0, got -1"},
      {"c.yaml", "optimizer:\n  adamw_config:\n    adamw_betas: [0.9, 1.0]\n",
       "optimizer.adamw_config.adamw_betas: must be in [0, 1), got [0.9, 1]"},
      {"c.toml", "[optimizer]\nbeta1 = -0.1\n",
       "optimizer.beta1, optimizer.beta2: must be in [0, 1), got [-0.1, 0.95]"},
      {"c.yaml", "optimizer:\n  adamw_config:\n    adamw_eps: 0\n",
       "optimizer.adamw_config.adamw_eps: must be > 0, got 0"},
      {"c.toml", "[optimizer]\neps = 0.0\n", "optimizer.eps: must be > 0, got 0"},
      {"c.yaml", "optimizer:\n  adamw_config:\n    adamw_weight_decay: -0.01\n",
       "optimizer.adamw_config.adamw_weight_decay: must be >= 0, got -0.01"},
      {"c.toml", "[optimizer]\nweight_decay = -0.1\n",
       "optimizer.weight_decay: must be >= 0, got -0.1"},
      {"c.yaml", "optimizer:\n  _target_: Lion\n",
       "optimizer._target_: must be one of AdamW, Muon, SGD, got 'Lion'"},
      {"c.toml", "[optimizer]\nname = \"muon\"\n",
       "optimizer.name: must be one of AdamW, Muon, got 'muon'"},
  });
}

TEST(ValidateTest, SgdRangesAsTorchOptimSgd) {
  const std::string s = "optimizer:\n  _target_: SGD\n  sgd_config:\n";
  expect_valid("c.yaml", s + "    sgd_momentum: 0.9\n    sgd_nesterov: true\n");
  expect_refused({
      {"c.yaml", s + "    sgd_lr: -1\n", "optimizer.sgd_config.sgd_lr: must be >= 0, got -1"},
      {"c.yaml", s + "    sgd_momentum: -0.5\n",
       "optimizer.sgd_config.sgd_momentum: must be >= 0, got -0.5"},
      {"c.yaml", s + "    sgd_weight_decay: -1\n",
       "optimizer.sgd_config.sgd_weight_decay: must be >= 0, got -1"},
  });
  const std::string nesterov =
      "optimizer.sgd_config.sgd_nesterov: requires sgd_momentum > 0 "
      "and sgd_dampening 0 (as torch.optim.SGD)";
  EXPECT_NE(yaml_error(s + "    sgd_nesterov: true\n").find(nesterov), std::string::npos);
  EXPECT_NE(yaml_error(s + "    sgd_nesterov: true\n    sgd_momentum: 0.9\n"
                           "    sgd_dampening: 0.1\n")
                .find(nesterov),
            std::string::npos);
  // TOML has no keys for SGD's options: refused, naming the key and the way out.
  const std::string toml = toml_error("[optimizer]\nname = \"SGD\"\n");
  EXPECT_NE(toml.find("optimizer.name"), std::string::npos) << toml;
  EXPECT_NE(toml.find("not available in the TOML dialect"), std::string::npos) << toml;
}

TEST(ValidateTest, MuonRanges) {
  const std::string m = "optimizer:\n  _target_: Muon\n  muon_config:\n";
  expect_refused({
      {"c.yaml", m + "    muon_lr: -1\n", "optimizer.muon_config.muon_lr: must be >= 0, got -1"},
      {"c.yaml", m + "    muon_momentum: 1.0\n",
       "optimizer.muon_config.muon_momentum: must be in [0, 1), got 1"},
      {"c.toml", "[optimizer]\nmuon_momentum = 1.2\n",
       "optimizer.muon_momentum: must be in [0, 1), got 1.2"},
      {"c.yaml", m + "    muon_weight_decay: -1\n",
       "optimizer.muon_config.muon_weight_decay: must be >= 0, got -1"},
      {"c.yaml", m + "    muon_ns_steps: 0\n",
       "optimizer.muon_config.muon_ns_steps: must be > 0, got 0"},
      {"c.toml", "[optimizer]\nmuon_ns_steps = 0\n", "optimizer.muon_ns_steps: must be > 0, got 0"},
      {"c.yaml", m + "    muon_ns_variant: cubic\n",
       "optimizer.muon_config.muon_ns_variant: must be one of legacy, asym5, quintic, "
       "hybrid, polar_express, custom, got 'cubic'"},
      {"c.yaml", m + "    muon_ns_epsilon: 0\n",
       "optimizer.muon_config.muon_ns_epsilon: must be > 0, got 0"},
      {"c.yaml", m + "    muon_ns_dtype: float16\n",
       "optimizer.muon_config.muon_ns_dtype: must be one of bfloat16, float32, got "
       "'float16'"},
      {"c.toml", "[optimizer]\nmuon_ns_dtype = \"float16\"\n",
       "optimizer.muon_ns_dtype: must be one of bfloat16, float32, got 'float16'"},
      {"c.yaml", m + "    muon_matched_adamw_rms: 0\n",
       "optimizer.muon_config.muon_matched_adamw_rms: must be > 0, got 0"},
      {"c.yaml", m + "    muon_adjust_lr_fn: moonshot\n",
       "optimizer.muon_config.muon_adjust_lr_fn: must be one of original, match_rms_adamw, "
       "got 'moonshot'"},
      {"c.toml", "[optimizer]\nmuon_adjust_lr_fn = \"keller\"\n",
       "optimizer.muon_adjust_lr_fn: must be one of original, match_rms_adamw, got 'keller'"},
      {"c.yaml", m + "    muon_momentum_style: nesterov\n",
       "optimizer.muon_config.muon_momentum_style: must be one of sum, ema, ema_add, got "
       "'nesterov'"},
      {"c.yaml", m + "    muon_communication_dtype: float16\n",
       "optimizer.muon_config.muon_communication_dtype: must be one of bfloat16, float32, "
       "got 'float16'"},
      {"c.toml", "[optimizer]\nmuon_communication_dtype = \"fp8\"\n",
       "optimizer.muon_communication_dtype: must be one of bfloat16, float32, got 'fp8'"},
      {"c.yaml", m + "    muon_normuon_beta2: 1.0\n",
       "optimizer.muon_config.muon_normuon_beta2: must be in [0, 1), got 1"},
      {"c.yaml", m + "    muon_normuon_beta2: -0.5\n",
       "optimizer.muon_config.muon_normuon_beta2: must be in [0, 1), got -0.5"},
      {"c.toml", "[optimizer]\nmuon_normuon_beta2 = 1.5\n",
       "optimizer.muon_normuon_beta2: must be in [0, 1), got 1.5"},
      {"c.yaml", m + "    muon_normuon_epsilon: 0\n",
       "optimizer.muon_config.muon_normuon_epsilon: must be > 0, got 0"},
      {"c.toml", "[optimizer]\nmuon_normuon_epsilon = -1e-8\n",
       "optimizer.muon_normuon_epsilon: must be > 0, got -1e-08"},
      {"c.yaml", m + "    muon_qk_clip_tau: -1\n",
       "optimizer.muon_config.muon_qk_clip_tau: must be a finite number >= 0 (0: QK-clip "
       "off), got -1"},
      {"c.toml", "[optimizer]\nmuon_qk_clip_tau = -0.5\n",
       "optimizer.muon_qk_clip_tau: must be a finite number >= 0 (0: QK-clip off), got -0.5"},
      {"c.yaml", "model:\n  name: qwen3_moe\n" + m + "    muon_qk_clip_tau: 100\n",
       "optimizer.muon_config.muon_qk_clip_tau: must be 0 with model.name qwen3_moe: its "
       "per-head q/k RMSNorm makes the attention logits independent of the q/k projections' "
       "scale, which QK-clip rescales, got 100"},
      {"c.yaml", m + "    muon_adamw_keywords: ['']\n",
       "optimizer.muon_config.muon_adamw_keywords: must not contain empty names"},
      {"c.yaml", "optimizer:\n  swap_merge_buckets: 0\n",
       "optimizer.swap_merge_buckets: must be > 0, got 0"},
      {"c.toml", "[optimizer]\nswap_merge_buckets = 0\n",
       "optimizer.swap_merge_buckets: must be > 0, got 0"},
      {"c.yaml", "optimizer:\n  swap_bucket_mb: 0\n",
       "optimizer.swap_bucket_mb: must be > 0, got 0"},
      {"c.toml", "[optimizer]\nswap_bucket_mb = -8\n",
       "optimizer.swap_bucket_mb: must be > 0, got -8"},
  });
  expect_valid("c.yaml", "optimizer:\n  swap_bucket_mb: 1\n  swap_dir: /tmp/swap\n");
}

TEST(ValidateTest, NewtonSchulzSchedules) {
  const std::string m = "optimizer:\n  _target_: Muon\n  muon_config:\n";
  // asym5 is exactly five steps: more is an error, never a silent cut.
  EXPECT_EQ(yaml_error(m + "    muon_ns_steps: 6\n"),
            "optimizer.muon_config.muon_ns_steps: must be <= 5 with muon_ns_variant asym5 (a "
            "five-step schedule), got 6");
  expect_valid("c.yaml", m + "    muon_ns_steps: 3\n");
  expect_refused({
      {"c.yaml", m + "    muon_ns_variant: custom\n",
       "optimizer.muon_config.muon_ns_coefficients: is required when muon_ns_variant is "
       "custom"},
      {"c.yaml",
       m + "    muon_ns_variant: custom\n    muon_ns_steps: 3\n"
           "    muon_ns_coefficients: [[3, -4, 2], [2, -1.5, 0.5]]\n",
       "optimizer.muon_config.muon_ns_coefficients: has 2 [a, b, c] triples but "
       "muon_ns_steps is 3; give one triple per step"},
      {"c.yaml", m + "    muon_ns_variant: legacy\n    muon_ns_coefficients: [[3, -4, 2]]\n",
       "optimizer.muon_config.muon_ns_coefficients: is only used with muon_ns_variant: "
       "custom (variant is 'legacy')"},
  });
  EXPECT_NE(yaml_error(m + "    muon_ns_variant: custom\n    muon_ns_steps: 1\n"
                           "    muon_ns_coefficients: [[3, -4]]\n")
                .find("item 0 to be a list of 3 numbers"),
            std::string::npos);
  expect_valid("c.yaml", m + "    muon_ns_variant: custom\n    muon_ns_steps: 2\n"
                             "    muon_ns_coefficients: [[3, -4, 2], [2, -1.5, 0.5]]\n");
  expect_valid("c.yaml", m + "    muon_ns_variant: hybrid\n    muon_ns_steps: 10\n");
  // quintic is asym5 under another name: the same five-step limit, named as given.
  EXPECT_EQ(yaml_error(m + "    muon_ns_variant: quintic\n    muon_ns_steps: 6\n"),
            "optimizer.muon_config.muon_ns_steps: must be <= 5 with muon_ns_variant quintic (a "
            "five-step schedule), got 6");
  expect_valid("c.yaml", m + "    muon_ns_variant: quintic\n    muon_ns_steps: 5\n");
  // polar_express: the published 5-step and 8-step sets only.
  for (const int steps : {1, 4, 6, 7, 9}) {
    EXPECT_EQ(yaml_error(m + "    muon_ns_variant: polar_express\n    muon_ns_steps: " +
                         std::to_string(steps) + "\n"),
              "optimizer.muon_config.muon_ns_steps: must be 5 or 8 with muon_ns_variant "
              "polar_express (its published 5-step and 8-step sets), got " +
                  std::to_string(steps));
  }
  expect_valid("c.yaml", m + "    muon_ns_variant: polar_express\n    muon_ns_steps: 5\n");
  expect_valid("c.yaml", m + "    muon_ns_variant: polar_express\n    muon_ns_steps: 8\n");
  expect_valid("c.toml",
               "[optimizer]\nname = \"Muon\"\nmuon_ns_steps = 10\nmuon_hybrid_ns = true\n");
  // The TOML spelling is named in the TOML dialect's errors.
  EXPECT_EQ(toml_error("[optimizer]\nname = \"Muon\"\nmuon_ns_variant = \"cubic\"\n").substr(0, 58),
            "optimizer.muon_ns_variant: must be one of legacy, asym5, q");
  expect_valid("c.toml", "[optimizer]\nname = \"Muon\"\nmuon_ns_variant = \"polar_express\"\n");
}

// A config built in code gets the same rules; errors name the canonical key and where the
// config came from.
TEST(ValidateTest, ConfigBuiltInCodeIsValidatedToo) {
  TrainerConfig config;
  EXPECT_NO_THROW(validate_config(config));  // the defaults are a valid config
  config.optimizer.fp32_main_params = true;
  EXPECT_EQ(config_error_of([&] { validate_config(config); }),
            "TrainerConfig (built in code): optimizer.fp32_main_params: true requires "
            "fsdp_config.mix_precision.reduce_dtype: float32 (it is not set); set it explicitly, "
            "it is never changed automatically");
  EXPECT_FALSE(config.mix_precision.reduce_dtype.has_value());  // nothing filled in
  config.mix_precision.reduce_dtype = "float32";
  EXPECT_NO_THROW(validate_config(config));
  config.source_file = "run.yaml";
  config.data.seq_len = 0;
  EXPECT_EQ(config_error_of([&] { validate_config(config); }),
            "run.yaml: data.seq_len: must be > 0, got 0");
}

// The Trainer and optim-replay validate the ResolvedConfig they are given: a loaded one, even
// changed in code since, keeps the user's spelling; one built in code names canonical keys.
TEST(ValidateTest, ResolvedConfigKeepsTheUsersSpelling) {
  TempDir dir;
  const std::string path = dir.write("c.toml", "[training]\nsteps = 5\n");
  ResolvedConfig loaded = load_config(path, {});
  EXPECT_NO_THROW(validate_config(loaded));
  loaded.config.train.lr_scheduler.warmup_steps = -1;
  EXPECT_EQ(config_error_of([&] { validate_config(loaded); }),
            path + ": lr_scheduler.warmup_steps: must be >= 0, got -1");
  ResolvedConfig built;
  built.config.train.lr_scheduler.warmup_steps = -1;
  EXPECT_EQ(config_error_of([&] { validate_config(built); }),
            "TrainerConfig (built in code): train.lr_scheduler.warmup_steps: must be >= 0, got -1");
}

// hybrid runs the legacy coefficients for its first 8 steps: with muon_ns_steps <= 8 it is plain
// legacy, which is legal but worth one warning naming both keys in the config's dialect.
TEST(ValidateTest, HybridWithEightStepsOrFewerWarns) {
  TempDir dir;
  const std::string toml = "[optimizer]\nname = \"Muon\"\nmuon_hybrid_ns = true\n";
  const auto toml_warnings = [&](int steps) {
    return config_warnings(
        load_config(dir.write("h.toml", toml), {"optimizer.muon_ns_steps=" + std::to_string(steps)})
            .config);
  };
  const std::vector<std::string> five = toml_warnings(5);
  ASSERT_EQ(five.size(), 1u);
  EXPECT_EQ(five[0],
            "optimizer.muon_hybrid_ns = true with optimizer.muon_ns_steps = 5 runs plain legacy "
            "Newton-Schulz: hybrid uses the legacy coefficients (3.4445, -4.7750, 2.0315) for its "
            "first 8 steps and (2.0, -1.5, 0.5) only after them, so all 5 steps are legacy; set "
            "muon_ns_steps > 8 for the hybrid tail");
  EXPECT_EQ(toml_warnings(8).size(), 1u);  // the boundary: step 8 is the last legacy one
  EXPECT_TRUE(toml_warnings(9).empty());
  // Not hybrid, or no Muon at all: nothing to say.
  EXPECT_TRUE(
      config_warnings(load_config(dir.write("l.toml", "[optimizer]\nname = \"Muon\"\n"), {}).config)
          .empty());

  const std::string yaml =
      "optimizer:\n  _target_: Muon\n  muon_config:\n    muon_ns_variant: hybrid\n"
      "    muon_ns_steps: 3\n";
  const std::vector<std::string> three =
      config_warnings(load_config(dir.write("h.yaml", yaml), {}).config);
  ASSERT_EQ(three.size(), 1u);
  EXPECT_EQ(three[0].rfind("optimizer.muon_config.muon_ns_variant: hybrid with "
                           "optimizer.muon_config.muon_ns_steps: 3 runs plain legacy",
                           0),
            0u)
      << three[0];
  TrainerConfig adamw = load_config(dir.write("h.yaml", yaml), {}).config;
  adamw.optimizer.target = "AdamW";
  EXPECT_TRUE(config_warnings(adamw).empty());
}

// Telemetry asked for without Muon would silently show nothing: refused. muon_per_head without
// Muon changes nothing: one warning.
TEST(ValidateTest, MuonTelemetryNeedsMuonAndPerHeadWithoutMuonWarns) {
  EXPECT_EQ(yaml_error("optimizer:\n  _target_: AdamW\n  muon_telemetry: true\n"),
            "optimizer.muon_telemetry: needs optimizer._target_ Muon (it watches Muon's "
            "Newton-Schulz; the target is AdamW)");
  EXPECT_EQ(toml_error("[optimizer]\nname = \"AdamW\"\nmuon_telemetry = true\n"),
            "optimizer.muon_telemetry: needs optimizer._target_ Muon (it watches Muon's "
            "Newton-Schulz; the target is AdamW)");
  TempDir dir;
  const auto muon =
      load_config(dir.write("m.yaml",
                            "optimizer:\n  _target_: Muon\n  muon_telemetry: true\n  muon_config:\n"
                            "    muon_per_head: true\n"),
                  {});
  EXPECT_TRUE(muon_config(muon.config).telemetry);
  EXPECT_TRUE(muon_config(muon.config).per_head);
  EXPECT_TRUE(config_warnings(muon.config).empty());
  TrainerConfig adamw = muon.config;
  adamw.optimizer.target = "AdamW";
  muon_config(adamw).telemetry = false;
  const std::vector<std::string> warnings = config_warnings(adamw);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "optimizer.muon_config.muon_per_head has no effect: optimizer._target_ is AdamW, not "
            "Muon");
}

// Checks that lived in the layers below config/ (LrSchedule, SyntheticDataset, DeviceMesh,
// the models, the trainer) until issue 14.3: here they name the key as the user wrote it.
TEST(ValidateTest, ChecksMovedFromTheBuildersSpeakTheUsersDialect) {
  // LrSchedule's warmup (the TOML key has the same name: [lr_scheduler] warmup_steps).
  EXPECT_EQ(toml_error("[lr_scheduler]\nwarmup_steps = -3\n"),
            "lr_scheduler.warmup_steps: must be >= 0, got -3");
  // SyntheticDataset draws successors from the other tokens: it needs two.
  EXPECT_EQ(toml_error("[model]\nvocab_size = 1\n"),
            "model.vocab_size: must be >= 2 for synthetic data, got 1");
  EXPECT_EQ(yaml_error("model:\n  vocab_size: 1\n"),
            "model.vocab_size: must be >= 2 for synthetic data, got 1");
  expect_valid("c.yaml", "model:\n  vocab_size: 1\ndata:\n  kind: tokens\n  path: a.bin\n");
  // DeviceMesh's degree and timeout rules, and the models' shape rules, in TOML keys.
  expect_refused({
      {"c.toml", "[parallelism]\ndata_parallel_replicate_degree = 0\n",
       "parallelism.data_parallel_replicate_degree: must be > 0, got 0"},
      {"c.toml", "[parallelism]\nexpert_parallel_degree = 0\n",
       "parallelism.expert_parallel_degree: must be > 0, got 0"},
      {"c.toml", "[model]\nnum_experts_per_tok = 5\n",
       "model.num_experts_per_tok: must be <= model.num_experts (4), got 5"},
      {"c.toml", "[model]\nname = \"mixtral\"\n",
       "model.name: must be one of qwen2_moe, qwen3_moe, qwen2, llama, qwen3, mistral, "
       "deepseek_v3, got 'mixtral'"},
      {"c.toml", "[training]\ndataset = \"web\"\n",
       "training.dataset: must be one of synthetic, tokens, got 'web'"},
  });
}

TEST(ValidateTest, OverriddenValuesAreReportedAsSet) {
  EXPECT_EQ(error_in("c.yaml", "", {"train.steps=0"}), "--set: train.steps: must be > 0, got 0");
  EXPECT_EQ(error_in("c.toml", "", {"optimizer.eps=-1"}),
            "--set: optimizer.eps: must be > 0, got -1");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
