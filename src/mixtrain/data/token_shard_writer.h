// Writes the token shards data/token_file_dataset.h reads: `<dir>/<prefix>_000000.bin`,
// `_000001.bin`, ... of at most `shard_tokens` tokens each (the last one shorter), version 1
// (uint16 tokens) when every id fits (vocab_size <= 65536), else version 2 (uint32). Each file
// is streamed (header placeholder, tokens, then the header's count) and fsynced when closed.
// The caller makes the set atomic: `mixtrain data prepare` writes into a staging directory and
// renames the finished files into place (cli/data_command.cpp). UserError on I/O failures,
// naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/core/posix_file.h"

namespace mixtrain {

class TokenShardWriter {
 public:
  TokenShardWriter(std::string dir, std::string prefix, int64_t shard_tokens, uint32_t vocab_size);

  // Appends ids (each < vocab_size; std::logic_error otherwise: a tokenizer bug).
  void append(const uint32_t* ids, size_t count);
  // Closes the last shard. Returns the file names written (no directory), in order.
  std::vector<std::string> finish();

  int32_t version() const { return version_; }
  int64_t tokens() const { return total_; }

  // Shard format version for a vocabulary: 1 when every id fits in uint16, else 2.
  static int32_t version_for(uint32_t vocab_size);

 private:
  void open_next();
  void flush();
  void close_current();

  std::string dir_;
  std::string prefix_;
  int64_t shard_tokens_;
  uint32_t vocab_size_;
  int32_t version_;
  FileDescriptor fd_;
  std::string path_;
  int64_t in_shard_ = 0;
  int64_t total_ = 0;
  std::vector<unsigned char> buffer_;
  std::vector<std::string> files_;
};

}  // namespace mixtrain
