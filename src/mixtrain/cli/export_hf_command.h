// `mixtrain export-hf CKPT_DIR OUT_DIR [--dtype bf16|f32] [--max-shard-size SIZE]` (docs/cli.md):
// a training checkpoint (any layout it was saved in: CheckpointReader reassembles the global
// tensors) as a Hugging Face model directory that transformers' from_pretrained loads.
//
// The model config comes from the checkpoint's recorded config (its model.* leaves); config.json
// is model/hf_config.h's hf_config_json of it. Each parameter's values are its fp32 main param
// when the checkpoint has one (a low-precision model trained with fp32 main params: the exact
// values the optimizer holds), else its model param; then converted to --dtype (f32 default;
// bf16 rounds to nearest even). Routed experts are written in the per-expert layout
// save_pretrained writes (<prefix>.mlp.experts.<e>.{gate,up,down}_proj.weight), keys in natural
// order. Files: model.safetensors, or, when the tensors exceed --max-shard-size (default 5GB;
// a shard holds at least one tensor), model-0000k-of-0000n.safetensors and
// model.safetensors.index.json (metadata.total_size, weight_map).
//
// OUT_DIR must not exist or be an empty directory. Everything is written into a temporary
// sibling directory, fsynced, and renamed to OUT_DIR at the end: an error leaves no OUT_DIR
// (or the empty one) and no temporary directory. Errors are UserError (exit 1; 2 for a bad
// option value).
#pragma once

#include <cstdint>
#include <string>

namespace mixtrain {

// "5GB" (10^9), "500MB", "2GiB" (2^30), "1KiB", "123" or "123B" (bytes) -> bytes; ConfigError
// naming --max-shard-size otherwise.
uint64_t parse_shard_size(const std::string& text);

int export_hf_command(const std::string& checkpoint, const std::string& out_dir,
                      const std::string& dtype, const std::string& max_shard_size);

}  // namespace mixtrain
