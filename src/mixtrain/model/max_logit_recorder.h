// What QK-clip (optim/qk_clip.h) reads from the forward: per attention layer, the running max over
// the forwards since clear() of each query head's scaled logit (attention.h causal_max_logits).
// The model records only while a recorder is installed (CausalLM::set_max_logit_recorder), so
// the default forward computes nothing extra. Layers are keyed by their attention module's
// parameter prefix ("model.layers.3.self_attn."); each holds float32 [num_heads] over the
// model's (global) head indices on the forward's device, -inf for heads not seen on this rank
// (other tensor-parallel ranks' heads): a max all-reduce over the ranks completes it.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace mixtrain {

class MaxLogitRecorder {
 public:
  // local_max float32 [h]: heads [head_offset, head_offset + h) of a layer with num_heads.
  void record(const std::string& layer, int64_t num_heads, int64_t head_offset,
              const torch::Tensor& local_max);
  void clear() { layers_.clear(); }
  const std::map<std::string, torch::Tensor>& layers() const { return layers_; }
  std::map<std::string, torch::Tensor>& layers() { return layers_; }

 private:
  std::map<std::string, torch::Tensor> layers_;
};

}  // namespace mixtrain
