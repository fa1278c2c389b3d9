#include "mixtrain/data/dataset.h"

#include <ATen/ATen.h>

#include <cstring>
#include <stdexcept>

#include "mixtrain/core/error.h"
#include "mixtrain/data/synthetic_dataset.h"
#include "mixtrain/data/token_file_dataset.h"

namespace mixtrain {

std::unique_ptr<TokenDataset> make_dataset(const DataConfig& config, int64_t vocab_size,
                                           uint64_t seed, int64_t dp_rank, int64_t dp_size) {
  if (config.kind == "synthetic") {
    return std::make_unique<SyntheticDataset>(vocab_size, seed, dp_rank, dp_size);
  }
  if (config.kind == "tokens") {
    if (config.path.empty()) {
      throw ConfigError(ConfigKey{"data.path"},
                        "is required for token data (a file or a glob of shards)");
    }
    try {
      return std::make_unique<TokenFileDataset>(config.path, vocab_size, dp_rank, dp_size);
    } catch (const DataError& error) {
      // No file, or a bad one: the user fixes the key that named them.
      if (!error.key().empty()) throw;
      throw DataError(ConfigKey{"data.path"}, error.what());
    }
  }
  throw ConfigError(ConfigKey{"data.kind"},
                    "'" + config.kind + "' is not one of synthetic, tokens");
}

Batch batch_from_windows(const std::vector<int64_t>& windows, int64_t batch_size, int64_t seq_len) {
  if (static_cast<int64_t>(windows.size()) != batch_size * (seq_len + 1)) {
    throw std::invalid_argument("batch_from_windows: expected batch_size * (seq_len + 1) tokens");
  }
  const at::Tensor all = at::empty({batch_size, seq_len + 1}, at::TensorOptions().dtype(at::kLong));
  std::memcpy(all.data_ptr<int64_t>(), windows.data(), windows.size() * sizeof(int64_t));
  return Batch{all.narrow(1, 0, seq_len).contiguous(), all.narrow(1, 1, seq_len).contiguous()};
}

}  // namespace mixtrain
