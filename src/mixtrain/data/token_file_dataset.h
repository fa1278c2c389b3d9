// data.kind = tokens: llm.c binary token shards.
//
// Shard format: a header of 256 little-endian int32 (magic 20240520, version, token count,
// the rest unused), then `count` little-endian tokens; nothing else. Version 1 (llm.c's):
// uint16 tokens; version 2 (ours, for vocabularies past 65536): uint32 tokens. `mixtrain data
// prepare` writes them (data/token_shard_writer.h). data.path is a file or a glob (matches
// sorted by name); files of both versions may be mixed. Every file is validated when the
// dataset is opened (memory-mapped read-only): bad magic, bad version, size != 1024 + width *
// count (truncated or trailing bytes) and any token >= vocab_size are DataErrors naming the
// file (and the token index); an empty glob is a DataError naming the pattern.
//
// Windows (dataset.h) never straddle two files: a file of n tokens holds (n - 1) / seq_len
// windows, the tail after the last one is skipped, and after the last file the stream wraps
// to the first (next epoch).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/data/dataset.h"

namespace mixtrain {

class TokenFileDataset : public TokenDataset {
 public:
  static constexpr int32_t kMagic = 20240520;
  static constexpr int32_t kVersionUint16 = 1;
  static constexpr int32_t kVersionUint32 = 2;
  static constexpr int64_t kHeaderBytes = 256 * 4;

  TokenFileDataset(const std::string& path, int64_t vocab_size, int64_t dp_rank, int64_t dp_size);
  ~TokenFileDataset() override;

  Batch next_batch(int64_t batch_size, int64_t seq_len) override;
  int64_t position() const override { return windows_consumed_; }
  void seek(int64_t position) override;
  std::string describe() const override;

  // Evaluation reads the windows of one epoch by index, without wrapping (trainer/evaluator.h).
  // The number of windows in one epoch at seq_len; DataError when no file holds one.
  int64_t epoch_windows(int64_t seq_len);
  // The windows with these indices (each in [0, epoch_windows(seq_len))), one batch row each.
  Batch windows_batch(const std::vector<int64_t>& indices, int64_t seq_len);

  // The files read, in stream order.
  std::vector<std::string> files() const;
  int64_t total_tokens() const;

 private:
  struct Shard;
  static std::unique_ptr<Shard> open_shard(const std::string& path, int64_t vocab_size);
  // Window `index` of the global stream (wrapping over epochs): seq_len + 1 tokens.
  void append_window(int64_t index, int64_t seq_len, std::vector<int64_t>& out);

  std::string path_;
  int64_t dp_rank_;
  int64_t dp_size_;
  std::vector<std::unique_ptr<Shard>> shards_;
  int64_t windows_consumed_ = 0;  // by all ranks together
  // Window layout for the last seq_len seen: first window index of each shard, and the total.
  int64_t layout_seq_len_ = -1;
  std::vector<int64_t> first_window_;
  int64_t windows_per_epoch_ = 0;
};

}  // namespace mixtrain
