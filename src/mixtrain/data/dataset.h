// Token streams for training: the interface, the factory and the batch layout.
//
// Every dataset is a sequence of windows of seq_len + 1 tokens, window w starting seq_len
// tokens after window w - 1 (the last label of one window is the first input of the next).
// Data-parallel rank r of d reads windows r, r + d, r + 2d, ... one per batch row, so ranks
// are disjoint and, batch for batch, d ranks with micro batch b read exactly the windows one
// rank with micro batch b * d would (parallel layouts see the same data as the
// single-process run). position() counts windows consumed by all ranks together, so a
// checkpoint position stays valid when the number of ranks changes (if it divides it).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

struct Batch {
  at::Tensor input_ids;  // int64 [batch, seq_len]
  at::Tensor labels;     // int64 [batch, seq_len]: input_ids shifted left by one token
};

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  virtual Batch next_batch(int64_t batch_size, int64_t seq_len) = 0;
  virtual int64_t position() const = 0;  // opaque cursor, for checkpoint resume
  virtual void seek(int64_t position) = 0;
  virtual std::string describe() const = 0;  // one line for the log
};

// data.kind "synthetic" or "tokens". Errors carry the key they are about (core/error.h
// ConfigKey): ConfigError on data.kind for another kind and on data.path for tokens without a
// path; DataError on data.path for a pattern matching no file or a bad token file. dp_rank/dp_size:
// each data-parallel rank reads a disjoint part of the stream (std::invalid_argument unless 0 <=
// dp_rank < dp_size).
std::unique_ptr<TokenDataset> make_dataset(const DataConfig& config, int64_t vocab_size,
                                           uint64_t seed, int64_t dp_rank, int64_t dp_size);

// Builds a Batch from batch_size windows of seq_len + 1 tokens stored row after row.
Batch batch_from_windows(const std::vector<int64_t>& windows, int64_t batch_size, int64_t seq_len);

}  // namespace mixtrain
