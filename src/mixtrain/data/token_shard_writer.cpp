#include "mixtrain/data/token_shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "mixtrain/core/error.h"
#include "mixtrain/data/token_file_dataset.h"

namespace mixtrain {

namespace {
constexpr size_t kFlushBytes = 4 << 20;
}  // namespace

int32_t TokenShardWriter::version_for(uint32_t vocab_size) {
  return vocab_size <= 65536 ? TokenFileDataset::kVersionUint16 : TokenFileDataset::kVersionUint32;
}

TokenShardWriter::TokenShardWriter(std::string dir, std::string prefix, int64_t shard_tokens,
                                   uint32_t vocab_size)
    : dir_(std::move(dir)),
      prefix_(std::move(prefix)),
      shard_tokens_(shard_tokens),
      vocab_size_(vocab_size),
      version_(version_for(vocab_size)) {
  // The header's count is an int32.
  if (shard_tokens < 1 || shard_tokens > INT32_MAX) {
    throw std::invalid_argument("TokenShardWriter: shard_tokens must be in 1..2^31-1, got " +
                                std::to_string(shard_tokens));
  }
}

void TokenShardWriter::open_next() {
  char name[64];
  std::snprintf(name, sizeof(name), "_%06zu.bin", files_.size());
  files_.push_back(prefix_ + name);
  path_ = dir_ + "/" + files_.back();
  fd_ = FileDescriptor::open(path_, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!fd_.valid()) throw UserError(path_ + ": cannot create: " + errno_text());
  buffer_.assign(static_cast<size_t>(TokenFileDataset::kHeaderBytes), 0);  // header: at close
  in_shard_ = 0;
}

void TokenShardWriter::flush() {
  write_all_or_throw(fd_.get(), buffer_.data(), buffer_.size(), path_);
  buffer_.clear();
}

void TokenShardWriter::close_current() {
  flush();
  const int32_t header[3] = {TokenFileDataset::kMagic, version_, static_cast<int32_t>(in_shard_)};
  const IoResult written = pwrite_all(fd_.get(), header, sizeof(header), 0);
  if (written.done != sizeof(header)) {
    throw UserError(path_ + ": write failed: " + errno_text(written.error));
  }
  if (fsync(fd_.get()) != 0) throw UserError(path_ + ": fsync failed: " + errno_text());
  if (fd_.close() != 0) throw UserError(path_ + ": close failed: " + errno_text());
}

void TokenShardWriter::append(const uint32_t* ids, size_t count) {
  const int width = version_ == TokenFileDataset::kVersionUint16 ? 2 : 4;
  for (size_t i = 0; i < count; ++i) {
    if (ids[i] >= vocab_size_) {
      throw std::logic_error("TokenShardWriter: id " + std::to_string(ids[i]) + " >= vocab_size " +
                             std::to_string(vocab_size_));
    }
    if (!fd_.valid()) open_next();
    for (int k = 0; k < width; ++k)
      buffer_.push_back(static_cast<unsigned char>(ids[i] >> (8 * k)));
    ++total_;
    if (++in_shard_ == shard_tokens_) {
      close_current();
    } else if (buffer_.size() >= kFlushBytes) {
      flush();
    }
  }
}

std::vector<std::string> TokenShardWriter::finish() {
  if (fd_.valid()) close_current();
  return files_;
}

}  // namespace mixtrain
