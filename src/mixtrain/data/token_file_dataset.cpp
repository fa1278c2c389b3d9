#include "mixtrain/data/token_file_dataset.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "mixtrain/core/error.h"
#include "mixtrain/core/posix_file.h"

namespace mixtrain {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token shards are little-endian and read in place");

// One validated, memory-mapped shard.
struct TokenFileDataset::Shard {
  std::string path;
  void* map = MAP_FAILED;
  size_t map_bytes = 0;
  const char* tokens = nullptr;  // `count` tokens of `width` bytes
  int64_t width = 2;
  int64_t count = 0;

  int64_t token(int64_t i) const {
    if (width == 2) return reinterpret_cast<const uint16_t*>(tokens)[i];
    return reinterpret_cast<const uint32_t*>(tokens)[i];
  }

  ~Shard() {
    if (map != MAP_FAILED) munmap(map, map_bytes);
  }
};

namespace {

std::vector<std::string> expand(const std::string& pattern) {
  glob_t matches{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> files;
  if (rc == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) files.emplace_back(matches.gl_pathv[i]);
  }
  globfree(&matches);
  if (rc != 0 && rc != GLOB_NOMATCH) {
    throw DataError("token files '" + pattern + "': cannot expand the pattern");
  }
  if (files.empty()) throw DataError("token files '" + pattern + "': the pattern matches no file");
  // Byte order, not the locale's collation: the same order on every machine.
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::unique_ptr<TokenFileDataset::Shard> TokenFileDataset::open_shard(const std::string& path,
                                                                      int64_t vocab_size) {
  const FileDescriptor fd = FileDescriptor::open(path, O_RDONLY);
  if (!fd.valid()) throw DataError(path + ": cannot open: " + errno_text());
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) throw DataError(path + ": cannot stat: " + errno_text());
  const int64_t size = st.st_size;
  if (size < TokenFileDataset::kHeaderBytes) {
    throw DataError(path + ": truncated header: " + std::to_string(size) +
                    " bytes, an llm.c token shard starts with 1024");
  }
  auto shard = std::make_unique<TokenFileDataset::Shard>();
  shard->path = path;
  shard->map_bytes = static_cast<size_t>(size);
  // The mapping keeps the file alive once fd closes.
  shard->map = mmap(nullptr, shard->map_bytes, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (shard->map == MAP_FAILED) throw DataError(path + ": cannot map: " + errno_text());

  int32_t header[3];
  std::memcpy(header, shard->map, sizeof(header));
  if (header[0] != TokenFileDataset::kMagic) {
    throw DataError(path + ": bad magic " + std::to_string(header[0]) + " (expected " +
                    std::to_string(TokenFileDataset::kMagic) + ": not an llm.c token shard)");
  }
  if (header[1] != TokenFileDataset::kVersionUint16 &&
      header[1] != TokenFileDataset::kVersionUint32) {
    throw DataError(path + ": unsupported version " + std::to_string(header[1]) + " (expected " +
                    std::to_string(TokenFileDataset::kVersionUint16) + ": uint16 tokens, or " +
                    std::to_string(TokenFileDataset::kVersionUint32) + ": uint32 tokens)");
  }
  shard->width = header[1] == TokenFileDataset::kVersionUint16 ? 2 : 4;
  const int64_t count = header[2];
  if (count < 0) throw DataError(path + ": negative token count " + std::to_string(count));
  const int64_t expected = TokenFileDataset::kHeaderBytes + shard->width * count;
  if (size < expected) {
    throw DataError(path + ": truncated: the header declares " + std::to_string(count) +
                    " tokens (" + std::to_string(expected) + " bytes) but the file has " +
                    std::to_string(size) + " bytes");
  }
  if (size > expected) {
    throw DataError(path + ": " + std::to_string(size - expected) + " trailing bytes after the " +
                    std::to_string(count) + " tokens the header declares");
  }
  shard->count = count;
  shard->tokens = static_cast<const char*>(shard->map) + TokenFileDataset::kHeaderBytes;
  for (int64_t i = 0; i < count; ++i) {
    if (shard->token(i) >= vocab_size) {
      throw DataError(path + ": token " + std::to_string(shard->token(i)) + " at index " +
                      std::to_string(i) + " is >= the vocabulary size " +
                      std::to_string(vocab_size));
    }
  }
  return shard;
}

TokenFileDataset::TokenFileDataset(const std::string& path, int64_t vocab_size, int64_t dp_rank,
                                   int64_t dp_size)
    : path_(path), dp_rank_(dp_rank), dp_size_(dp_size) {
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    throw std::invalid_argument("TokenFileDataset: bad dp_rank " + std::to_string(dp_rank) +
                                " of " + std::to_string(dp_size));
  }
  for (const auto& file : expand(path)) shards_.push_back(open_shard(file, vocab_size));
}

TokenFileDataset::~TokenFileDataset() = default;

int64_t TokenFileDataset::epoch_windows(int64_t seq_len) {
  if (layout_seq_len_ != seq_len) {
    first_window_.clear();
    windows_per_epoch_ = 0;
    for (const auto& shard : shards_) {
      first_window_.push_back(windows_per_epoch_);
      windows_per_epoch_ += shard->count > seq_len ? (shard->count - 1) / seq_len : 0;
    }
    layout_seq_len_ = seq_len;
  }
  if (windows_per_epoch_ == 0) {
    throw DataError("token files '" + path_ + "': no file holds " + std::to_string(seq_len + 1) +
                    " tokens (one window of seq_len + 1)");
  }
  return windows_per_epoch_;
}

void TokenFileDataset::append_window(int64_t index, int64_t seq_len, std::vector<int64_t>& out) {
  epoch_windows(seq_len);  // the layout for this seq_len
  const int64_t in_epoch = index % windows_per_epoch_;
  // The last shard whose first window is <= in_epoch (empty shards share their successor's).
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), in_epoch) - 1;
  const Shard& shard = *shards_[static_cast<size_t>(it - first_window_.begin())];
  const int64_t start = (in_epoch - *it) * seq_len;
  for (int64_t i = start; i <= start + seq_len; ++i) out.push_back(shard.token(i));
}

Batch TokenFileDataset::next_batch(int64_t batch_size, int64_t seq_len) {
  if (batch_size < 1 || seq_len < 1) {
    throw std::invalid_argument(
        "TokenFileDataset::next_batch: batch_size and seq_len must be >= 1");
  }
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(batch_size * (seq_len + 1)));
  for (int64_t b = 0; b < batch_size; ++b) {
    append_window(windows_consumed_ + b * dp_size_ + dp_rank_, seq_len, rows);
  }
  windows_consumed_ += batch_size * dp_size_;
  return batch_from_windows(rows, batch_size, seq_len);
}

Batch TokenFileDataset::windows_batch(const std::vector<int64_t>& indices, int64_t seq_len) {
  const int64_t count = epoch_windows(seq_len);
  std::vector<int64_t> rows;
  rows.reserve(indices.size() * static_cast<size_t>(seq_len + 1));
  for (const int64_t index : indices) {
    if (index < 0 || index >= count) {
      throw std::out_of_range("TokenFileDataset::windows_batch: window " + std::to_string(index) +
                              " of " + std::to_string(count));
    }
    append_window(index, seq_len, rows);
  }
  return batch_from_windows(rows, static_cast<int64_t>(indices.size()), seq_len);
}

void TokenFileDataset::seek(int64_t position) {
  if (position < 0 || position % dp_size_ != 0) {
    throw DataError("token files '" + path_ + "': cannot resume at position " +
                    std::to_string(position) + " with " + std::to_string(dp_size_) +
                    " data-parallel ranks (it must be a non-negative multiple of the rank count)");
  }
  windows_consumed_ = position;
}

std::vector<std::string> TokenFileDataset::files() const {
  std::vector<std::string> names;
  for (const auto& shard : shards_) names.push_back(shard->path);
  return names;
}

int64_t TokenFileDataset::total_tokens() const {
  int64_t total = 0;
  for (const auto& shard : shards_) total += shard->count;
  return total;
}

std::string TokenFileDataset::describe() const {
  return "llm.c token shards '" + path_ + "': " + std::to_string(shards_.size()) + " file(s), " +
         std::to_string(total_tokens()) + " tokens, dp rank " + std::to_string(dp_rank_) + " of " +
         std::to_string(dp_size_);
}

}  // namespace mixtrain
