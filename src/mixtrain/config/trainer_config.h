// The one internal configuration tree. Both front ends (YAML: hyper-parallel dialect,
// TOML: torchtitan-npu dialect) fill it; nothing below config/ reads a config file.
//
// Field names follow the canonical YAML keys (docs/architecture.md §4). Defaults here are the
// defaults a user gets when a key is absent; docs/config.md documents every key.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/config/section_values.h"

namespace mixtrain {

// model.name of a config that names none: the model registered as the default
// (model_sections.h); "" before any is registered.
std::string default_model_name();

// The keys every decoder model has (model_sections.h says which keys each model reads; a key
// set for a model that does not read it is refused), and the values of the keys a model family
// owns in `family`, one struct per family kind (its header in model/, e.g. the routed experts'
// keys), which that family registers as a config section.
struct ModelConfig {
  std::string name = default_model_name();  // a registered model (model/registry.h)
  // A Hugging Face config.json the architecture keys are read from ("" = the keys themselves).
  std::string hf_config;
  // A Hugging Face model directory whose weights initialise the model (model.safetensors or
  // shards with model.safetensors.index.json); implies hf_config = <dir>/config.json.
  std::string init_from;
  int64_t vocab_size = 512;
  int64_t hidden_size = 64;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 16;
  int64_t intermediate_size = 128;  // a dense SwiGLU MLP's width
  int64_t max_seq_len = 256;
  double rope_theta = 10000.0;
  // Rotary frequency scaling (model/layers.h rotary_inv_freq): "none", or a scheme the models
  // offer (docs/config.md). The four keys below parameterise it; their defaults are the
  // scheme's published values.
  std::string rope_scaling = "none";
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_seq_len = 8192;  // HF original_max_position_embeddings
  // YaRN (rope_scaling yarn): the correction range's rotations and the attention factors'
  // mscale / mscale_all_dim (0: not given; HF's None).
  double rope_yarn_beta_fast = 32.0;
  double rope_yarn_beta_slow = 1.0;
  double rope_yarn_mscale = 0.0;
  double rope_yarn_mscale_all_dim = 0.0;
  double rms_norm_eps = 1e-6;
  // One matrix for the input embedding and the output head (HF tie_word_embeddings): the model
  // has no lm_head.weight; the head multiplies by model.embed_tokens.weight.
  bool tie_word_embeddings = false;
  bool attention_bias = true;  // q/k/v projections carry a bias (HF qkv_bias / attention_bias)
  SectionValues family;        // the family's own keys (model/moe_config.h, ...)
};

struct DataConfig {
  std::string kind = "synthetic";  // synthetic | tokens
  std::string path;                // tokens: a file or a glob of llm.c shards
  int64_t seq_len = 64;
  int64_t micro_batch_size = 8;
  int64_t global_batch_size = 8;  // = micro_batch_size x accumulation steps x dp size
  // Held-out token shards train.eval_every evaluates (trainer/evaluator.h): a file, a glob, or a
  // directory (its val_*.bin).
  std::string eval_path;
  int64_t eval_batches = 0;  // evaluate the first N x global_batch_size windows; 0: all of them
};

struct LrSchedulerConfig {
  int64_t warmup_steps = 10;
  std::string decay = "cosine";  // constant | linear | cosine
  double min_lr_ratio = 0.1;
};

struct TrainConfig {
  // Where each rank computes: "cpu", or "cuda" (rank -> cuda:<LOCAL_RANK>, NCCL collectives).
  std::string device = "cpu";
  int64_t steps = 100;
  int64_t seed = 1234;
  double max_grad_norm = 1.0;  // <= 0 disables clipping
  int64_t log_every = 10;
  int64_t eval_every = 0;  // evaluate data.eval_path every N steps and at the last; 0: never
  // Every log_every steps rank 0 logs where the step time went (forward, backward, gradient
  // reduce, clipping, optimizer, checkpoint, other) and metrics.jsonl gets the split per step.
  bool profile = false;
  // Count each step's ATen ops and allocations by phase (core/op_counter.h): metrics.jsonl
  // columns and a log line every log_every steps. Slows every op a little while on.
  bool count_ops = false;
  // Where CPU tensor buffers come from: "caching" keeps freed buffers for reuse
  // (core/caching_cpu_allocator.h), "system" is LibTorch's default (glibc malloc).
  std::string cpu_allocator = "caching";
  // Recompute decoder layers in backward instead of keeping their activations: "none", "full"
  // (every layer) or "selective" (every activation_checkpointing_every-th layer, counted from 1
  // as torchtitan does). Loss and gradients are bitwise the same as "none".
  std::string activation_checkpointing = "none";
  int64_t activation_checkpointing_every = 2;
  LrSchedulerConfig lr_scheduler;
};

// The mesh is dp_replicate x dp_shard x cp x tp (world = the product), experts over ep inside
// dp_shard (distributed/device_mesh.h).
struct ParallelConfig {
  int64_t dp_shard = 1;
  int64_t dp_replicate = 1;
  int64_t ep = 1;
  int64_t cp = 1;  // context parallelism: the sequence split over cp ranks
  int64_t tp = 1;  // tensor parallelism (Megatron layout)
  // How context-parallel attention moves keys and values (torchtitan's
  // context_parallel_rotate_method): "alltoall" passes each rank's chunk around the cp ring, one
  // neighbour exchange per step; "allgather" gathers every chunk at once.
  std::string cp_rotate_method = "alltoall";

  int64_t dp_size() const { return dp_replicate * dp_shard; }  // data-parallel batches
  int64_t world_size() const { return dp_replicate * dp_shard * cp * tp; }
};

struct DistributedConfig {
  // A collective or store read waiting longer than this fails the rank with a message (a dead
  // or hung peer); TOML: [comm] train_timeout_seconds.
  double timeout_s = 60.0;
};

struct CheckpointConfig {
  std::string dir;  // empty: checkpoints off
  int64_t interval = 0;
  int64_t keep_last = 0;  // 0 keeps all
  bool async = false;
  bool save_optimizer = true;
  std::string restore_from;
  bool restore_optimizer = true;
};

// optimizer._target_ of a config that names none: the section registered as the default
// (section.h); "" before any is registered.
std::string default_optimizer_target();

// The optimizer stack's generic keys; each optimizer's own options are a section it registers
// (optim/optimizer_table.h), held in `options` (optimizer.options.get<ItsConfig>()).
struct OptimizerConfig {
  // An optimizer's name (dotted seed paths are normalised); the registered default.
  std::string target = default_optimizer_target();
  bool fp32_main_params = false;
  SectionValues options;
  std::string routing = "yaml";  // yaml | toml: which dialect's routing rule applies
  bool swap_optimizer = false;
  int64_t swap_merge_buckets = 1;
  std::string swap_dir;         // where the per-rank swap files go; empty: <run-dir>/swap
  int64_t swap_bucket_mb = 64;  // size of one bucket of optimizer state moved at a time
};

struct MixPrecisionConfig {
  std::string param_dtype = "float32";
  std::optional<std::string> reduce_dtype;  // absent unless configured (fp32-main-params §2.5)
  std::string output_dtype = "float32";
  bool cast_forward_inputs = true;
};

struct FsdpConfig {
  // Free each gathered full parameter after its module's forward and gather it again for the
  // backward (torch FSDP2's default); false keeps it until the backward (more memory, fewer
  // all-gathers).
  bool reshard_after_forward = true;
};

struct TrainerConfig {
  std::string dialect = "yaml";  // yaml | toml: the front end that produced this tree
  std::string source_file;
  std::optional<std::string> model_init_dtype;  // null: keep the dtype the model was built in
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  ParallelConfig parallel;
  DistributedConfig distributed;
  CheckpointConfig checkpoint;
  OptimizerConfig optimizer;
  MixPrecisionConfig mix_precision;  // fsdp_config.mix_precision
  FsdpConfig fsdp;                   // fsdp_config (other than mix_precision)
};

}  // namespace mixtrain
