// data.kind = synthetic: a deterministic token stream with structure a small model can learn.
//
// The stream is a sparse random Markov chain over the vocabulary: every token has
// kSuccessors distinct successors (drawn from the seed, Zipf-distributed over token ids so
// frequent tokens exist) taken with fixed probabilities kSuccessorProbabilities, so the
// next-token entropy is about 1.2 nats against ln(vocab) for uniform tokens. Measured with a
// bigram model (embedding 64 + linear head, vocab 512, AdamW lr 1e-3, batch 8 x 64): loss
// 6.35 -> 5.29 in 30 steps (8.7% less without the Zipf skew). Window w (dataset.h) starts at a
// random token and follows the chain, its RNG (std::mt19937_64, never torch's global generator)
// seeded from (seed, w): any window is reproducible on its own, so seek() is O(1) and the stream is
// identical across runs, platforms and data-parallel layouts.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/data/dataset.h"

namespace mixtrain {

class SyntheticDataset : public TokenDataset {
 public:
  static constexpr int kSuccessors = 4;
  static constexpr std::array<double, kSuccessors> kSuccessorProbabilities = {0.5, 0.25, 0.15,
                                                                              0.10};

  // vocab_size >= 2 (std::invalid_argument otherwise; validate_config refuses it first).
  SyntheticDataset(int64_t vocab_size, uint64_t seed, int64_t dp_rank, int64_t dp_size);

  Batch next_batch(int64_t batch_size, int64_t seq_len) override;
  int64_t position() const override { return windows_consumed_; }
  void seek(int64_t position) override;
  std::string describe() const override;

  // Window `index` of the global stream: seq_len + 1 tokens.
  std::vector<int64_t> window(int64_t index, int64_t seq_len) const;
  // Entropy of the chain's next-token distribution in nats (the loss a perfect model reaches,
  // apart from the first token of each window).
  double entropy_rate() const;

 private:
  int64_t vocab_size_;
  uint64_t seed_;
  int64_t dp_rank_;
  int64_t dp_size_;
  int64_t successors_per_token_;     // kSuccessors, or fewer for a tiny vocabulary
  std::vector<int64_t> successors_;  // [vocab_size, successors_per_token_]
  int64_t windows_consumed_ = 0;     // by all ranks together
};

}  // namespace mixtrain
