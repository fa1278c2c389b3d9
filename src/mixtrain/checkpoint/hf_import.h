// model.init_from: loads a Hugging Face model directory's weights into this rank's parameter
// pieces (docs/checkpoint.md, "Hugging Face weights").
//
// DIR holds model.safetensors, or shards named by model.safetensors.index.json ("weight_map":
// key -> file). Every rank reads every file's header, checks the whole key set against the
// model (every parameter present once, nothing extra, each shape exact, a dtype of F32, BF16,
// F16 or F64) and then reads, with pread, only the bytes of the rows its pieces hold: a piece
// is rows [offset, offset + rows) of dim 0 (ParamPlacement: FSDP chunk, expert-parallel slice,
// or the whole), which are contiguous in the file. A tensor-parallel piece (tp_split()) is the
// box global_offsets() / local_sizes(): with tp_dim 0 its rows are contiguous as above; with a
// tp_dim > 0 its rows are read whole (tp times the piece's bytes) and narrowed to its box.
// Values are converted to the piece's dtype (rounded to nearest even when narrowing) and copied
// to its device. Routed experts are never tp-split (std::invalid_argument).
//
// Names are HF's (the models use them), except the routed experts, which we hold as 3-D
// tensors <prefix>.mlp.experts.{gate_proj,up_proj} [E, I, H] and .down_proj [E, H, I]. Per
// layer, three file layouts are accepted:
//   per-expert  <prefix>.mlp.experts.<e>.{gate,up,down}_proj.weight  [I, H] / [H, I]
//               (what transformers' save_pretrained writes)
//   fused       <prefix>.mlp.experts.gate_up_proj [E, 2I, H] (gate = rows [0, I) of each
//               expert, up = rows [I, 2I): transformers' in-memory Qwen2MoeExperts, which
//               chunks the projection in that order) and .down_proj [E, H, I]
//   ours        <prefix>.mlp.experts.{gate_proj,up_proj,down_proj} as held
// A model with tied embeddings (model.tie_word_embeddings: no lm_head.weight) accepts a file
// without lm_head.weight (what save_pretrained writes for a tied model) or with one equal to
// model.embed_tokens.weight (each rank compares the rows it reads; a difference is a DataError).
// Any problem (a shard named by the index missing, a missing, extra or mis-shaped tensor, an
// unconvertible dtype, a bad header) is one DataError listing each as "<file>: <key>: <what>".
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/core/param_placement.h"

namespace mixtrain {

struct HfImportTarget {
  std::string name;          // the parameter's name (HF's, 3-D experts as above)
  at::Tensor local;          // this rank's piece, filled in place (any dtype, any device)
  ParamPlacement placement;  // global_shape and the piece's box (dim-0 rows, tp split)
};

struct HfImportStats {
  uint64_t data_bytes_read = 0;  // tensor bytes read (headers not counted)
  int64_t files = 0;             // safetensors files whose header was read
};

// Targets: every parameter of the model (a rank with no rows of one still lists it).
HfImportStats import_hf_weights(const std::string& dir, const std::vector<HfImportTarget>& targets);

}  // namespace mixtrain
