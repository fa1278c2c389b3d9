#include "mixtrain/data/synthetic_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

// SplitMix64 finalizer: turns (seed, index) into well-spread, independent RNG seeds.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform integer in [0, n) from 64 random bits (multiply-shift; std::uniform_int_distribution
// is implementation-defined, which would make streams differ between standard libraries).
int64_t bounded(uint64_t bits, int64_t n) {
  return static_cast<int64_t>((static_cast<unsigned __int128>(bits) * static_cast<uint64_t>(n)) >>
                              64);
}

// Uniform double in [0, 1) from the top 53 bits.
double unit(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

constexpr uint64_t kTableSalt = 0x5eed7ab1e0000001ULL;

}  // namespace

SyntheticDataset::SyntheticDataset(int64_t vocab_size, uint64_t seed, int64_t dp_rank,
                                   int64_t dp_size)
    : vocab_size_(vocab_size), seed_(seed), dp_rank_(dp_rank), dp_size_(dp_size) {
  if (vocab_size < 2) {
    throw std::invalid_argument("SyntheticDataset: vocab_size must be >= 2, got " +
                                std::to_string(vocab_size));
  }
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    throw std::invalid_argument("SyntheticDataset: bad dp_rank " + std::to_string(dp_rank) +
                                " of " + std::to_string(dp_size));
  }
  successors_per_token_ = std::min<int64_t>(kSuccessors, vocab_size);
  successors_.resize(static_cast<size_t>(vocab_size * successors_per_token_));
  // Successors follow a Zipf(1) law over token ids (token t drawn with weight 1 / (t + 1)), as
  // word frequencies do: the token distribution is skewed, so a model first gains by learning
  // the frequent tokens (loss falls within a few steps) and then by learning the transitions.
  std::vector<double> zipf_cumulative(static_cast<size_t>(vocab_size));
  double zipf_total = 0.0;
  for (int64_t t = 0; t < vocab_size; ++t) {
    zipf_total += 1.0 / static_cast<double>(t + 1);
    zipf_cumulative[static_cast<size_t>(t)] = zipf_total;
  }
  auto zipf = [&](uint64_t bits) {
    const double target = unit(bits) * zipf_total;
    const auto it = std::upper_bound(zipf_cumulative.begin(), zipf_cumulative.end(), target);
    return std::min<int64_t>(it - zipf_cumulative.begin(), vocab_size - 1);
  };
  std::mt19937_64 rng(mix64(seed ^ kTableSalt));
  for (int64_t token = 0; token < vocab_size; ++token) {
    int64_t* row = &successors_[static_cast<size_t>(token * successors_per_token_)];
    for (int64_t k = 0; k < successors_per_token_; ++k) {
      bool fresh;
      do {  // distinct successors, so each keeps its own probability
        row[k] = zipf(rng());
        fresh = true;
        for (int64_t j = 0; j < k; ++j) fresh = fresh && row[j] != row[k];
      } while (!fresh);
    }
  }
}

std::vector<int64_t> SyntheticDataset::window(int64_t index, int64_t seq_len) const {
  // Cumulative probabilities of the successors, renormalised when a tiny vocabulary has fewer.
  double total = 0.0;
  for (int64_t k = 0; k < successors_per_token_; ++k) total += kSuccessorProbabilities[k];
  std::vector<double> cumulative(static_cast<size_t>(successors_per_token_));
  double running = 0.0;
  for (int64_t k = 0; k < successors_per_token_; ++k) {
    running += kSuccessorProbabilities[k] / total;
    cumulative[static_cast<size_t>(k)] = running;
  }

  std::mt19937_64 rng(mix64(seed_ ^ mix64(static_cast<uint64_t>(index))));
  std::vector<int64_t> tokens(static_cast<size_t>(seq_len + 1));
  int64_t token = bounded(rng(), vocab_size_);
  tokens[0] = token;
  for (int64_t i = 1; i <= seq_len; ++i) {
    const double u = unit(rng());
    int64_t k = 0;
    while (k + 1 < successors_per_token_ && u >= cumulative[static_cast<size_t>(k)]) ++k;
    token = successors_[static_cast<size_t>(token * successors_per_token_ + k)];
    tokens[static_cast<size_t>(i)] = token;
  }
  return tokens;
}

Batch SyntheticDataset::next_batch(int64_t batch_size, int64_t seq_len) {
  if (batch_size < 1 || seq_len < 1) {
    throw std::invalid_argument(
        "SyntheticDataset::next_batch: batch_size and seq_len must be >= 1");
  }
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(batch_size * (seq_len + 1)));
  for (int64_t b = 0; b < batch_size; ++b) {
    const auto w = window(windows_consumed_ + b * dp_size_ + dp_rank_, seq_len);
    rows.insert(rows.end(), w.begin(), w.end());
  }
  windows_consumed_ += batch_size * dp_size_;
  return batch_from_windows(rows, batch_size, seq_len);
}

void SyntheticDataset::seek(int64_t position) {
  if (position < 0 || position % dp_size_ != 0) {
    throw DataError("synthetic data: cannot resume at position " + std::to_string(position) +
                    " with " + std::to_string(dp_size_) +
                    " data-parallel ranks (it must be a non-negative multiple of the rank count)");
  }
  windows_consumed_ = position;
}

double SyntheticDataset::entropy_rate() const {
  double total = 0.0;
  for (int64_t k = 0; k < successors_per_token_; ++k) total += kSuccessorProbabilities[k];
  double entropy = 0.0;
  for (int64_t k = 0; k < successors_per_token_; ++k) {
    const double p = kSuccessorProbabilities[k] / total;
    entropy -= p * std::log(p);
  }
  return entropy;
}

std::string SyntheticDataset::describe() const {
  char line[256];
  std::snprintf(line, sizeof(line),
                "synthetic Markov stream: vocab %lld, %lld successors per token, entropy %.2f "
                "nats (uniform: %.2f), seed %llu, dp rank %lld of %lld",
                static_cast<long long>(vocab_size_), static_cast<long long>(successors_per_token_),
                entropy_rate(), std::log(static_cast<double>(vocab_size_)),
                static_cast<unsigned long long>(seed_), static_cast<long long>(dp_rank_),
                static_cast<long long>(dp_size_));
  return line;
}

}  // namespace mixtrain
