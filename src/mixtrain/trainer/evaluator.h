// Evaluation (docs/cli.md `mixtrain eval`, train.eval_every): mean token cross-entropy and
// perplexity of a model over held-out llm.c token shards (data/token_file_dataset.h).
//
// The eval set is every window (dataset.h: seq_len + 1 tokens) of one pass over the files, in
// stream order, never wrapping; max_windows > 0 keeps only the first max_windows. Rank r of the
// n ranks of mesh.world evaluates windows r, r + n, r + 2n, ... (disjoint, together all of them),
// micro_batch_size rows per forward. Every rank runs the same number of forwards, because FSDP
// all-gathers and expert parallelism exchanges tokens inside forward: rows past the end of the
// set repeat window 0 and are not counted. Each token's loss is the float32 cross-entropy of its
// logits (as the trainer's loss); a rank sums them in float64, the sums and token counts are
// all-reduced in float64, and
//   loss = sum over the set / tokens,  perplexity = exp(loss).
// n ranks therefore give one rank's answer up to float32 forward rounding (batch composition
// changes BLAS blocking). The router aux loss is a training regulariser: not in the eval loss.
// The model runs forward only (no autograd graph); the RNG and the training data are untouched.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mixtrain/distributed/device_mesh.h"

namespace mixtrain {

class CausalLM;
class TokenFileDataset;

struct EvalResult {
  double loss_sum = 0.0;  // summed token cross-entropy over the whole set (all ranks)
  int64_t tokens = 0;     // predicted tokens: windows x seq_len
  int64_t windows = 0;
  double loss() const { return loss_sum / static_cast<double>(tokens); }
  double perplexity() const;
};

// "eval_loss 3.141593 perplexity 23.1407 tokens 4096 windows 64": one line, as `mixtrain eval`
// prints it and the trainer logs it.
std::string format_eval_result(const EvalResult& result);

// The token files `path` names: a directory means its val_*.bin shards (data prepare's
// held-out split), anything else is a file or a glob as data.path.
std::string eval_data_pattern(const std::string& path);

class Evaluator {
 public:
  // Opens and checks every file (tokens < vocab_size). DataError for a path that names no file,
  // a bad shard, or an eval set without one window of seq_len + 1 tokens.
  Evaluator(const std::string& path, int64_t vocab_size, int64_t seq_len, int64_t micro_batch_size,
            int64_t max_windows);
  ~Evaluator();

  int64_t windows() const { return windows_; }
  std::string describe() const;  // one line for the log

  // The loss of `model` over the set; collective over mesh.world (the same on every rank).
  EvalResult evaluate(CausalLM& model, const DeviceMesh& mesh);

 private:
  std::string pattern_;
  std::unique_ptr<TokenFileDataset> data_;
  int64_t seq_len_;
  int64_t micro_batch_size_;
  int64_t windows_ = 0;
};

}  // namespace mixtrain
