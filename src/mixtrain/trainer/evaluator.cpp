#include "mixtrain/trainer/evaluator.h"

#include <torch/types.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/data/token_file_dataset.h"
#include "mixtrain/distributed/context_parallel.h"
#include "mixtrain/model/causal_lm.h"

namespace mixtrain {

double EvalResult::perplexity() const {
  return std::exp(loss());
}

std::string format_eval_result(const EvalResult& result) {
  char text[160];
  std::snprintf(text, sizeof(text), "eval_loss %.6f perplexity %.4f tokens %lld windows %lld",
                result.loss(), result.perplexity(), static_cast<long long>(result.tokens),
                static_cast<long long>(result.windows));
  return text;
}

std::string eval_data_pattern(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return (std::filesystem::path(path) / "val_*.bin").string();
  }
  return path;
}

Evaluator::Evaluator(const std::string& path, int64_t vocab_size, int64_t seq_len,
                     int64_t micro_batch_size, int64_t max_windows)
    : pattern_(eval_data_pattern(path)), seq_len_(seq_len), micro_batch_size_(micro_batch_size) {
  if (seq_len < 1 || micro_batch_size < 1 || max_windows < 0) {
    throw std::invalid_argument("Evaluator: seq_len and micro_batch_size must be >= 1");
  }
  try {
    // dp rank and size do not matter: windows are read by index.
    data_ = std::make_unique<TokenFileDataset>(pattern_, vocab_size, 0, 1);
    windows_ = data_->epoch_windows(seq_len);
  } catch (const DataError& error) {
    throw DataError("eval data: " + error.problem());
  }
  if (max_windows > 0 && max_windows < windows_) windows_ = max_windows;
}

Evaluator::~Evaluator() = default;

std::string Evaluator::describe() const {
  return "eval data '" + pattern_ + "': " + std::to_string(data_->files().size()) + " file(s), " +
         std::to_string(data_->total_tokens()) + " tokens; " + std::to_string(windows_) +
         " windows of " + std::to_string(seq_len_) + " predicted tokens";
}

EvalResult Evaluator::evaluate(CausalLM& model, const DeviceMesh& mesh) {
  // Windows are dealt to the data ranks; the cp and tp ranks of one data rank share its windows.
  const int64_t ranks = mesh.dp_size();
  const int64_t rank = mesh.data_rank();
  // Windows per forward over all ranks; every rank runs `forwards` forwards.
  const int64_t per_forward = ranks * micro_batch_size_;
  const int64_t forwards = (windows_ + per_forward - 1) / per_forward;
  c10::NoGradGuard no_grad;
  const auto on_device = torch::TensorOptions().dtype(torch::kDouble).device(mesh.device);
  torch::Tensor loss_sum = torch::zeros({}, on_device);  // read once at the end
  int64_t my_windows = 0;
  for (int64_t f = 0; f < forwards; ++f) {
    std::vector<int64_t> indices;
    std::vector<double> counted;  // 1 for a window of the set, 0 for padding
    for (int64_t row = 0; row < micro_batch_size_; ++row) {
      const int64_t window = f * per_forward + row * ranks + rank;
      const bool inside = window < windows_;
      indices.push_back(inside ? window : 0);
      counted.push_back(inside ? 1.0 : 0.0);
      my_windows += inside ? 1 : 0;
    }
    const Batch batch = data_->windows_batch(indices, seq_len_);
    // With context parallelism each rank scores its two chunks of every window.
    const CausalLMOutput out =
        model.forward(context_parallel_local(batch.input_ids, mesh).to(mesh.device));
    // Per token, as the trainer's loss: float32 logits, then the row sums in float64.
    const torch::Tensor token_loss = causal_lm_cross_entropy(
        model, out.logits, context_parallel_local(batch.labels, mesh).to(mesh.device),
        /*per_token=*/true);
    const torch::Tensor row_sums =
        token_loss.to(torch::kDouble).view({micro_batch_size_, -1}).sum(1);
    loss_sum += (row_sums * torch::tensor(counted, on_device)).sum();
  }
  // Counted once per data rank: the tp ranks hold the same token losses (tp rank 0 reports
  // them), the cp ranks each their own tokens' (all report), the window count once (cp rank 0).
  const bool report_losses = mesh.tp_index() == 0;
  const bool report_windows = report_losses && mesh.cp_index() == 0;
  torch::Tensor totals = torch::stack(
      {report_losses ? loss_sum.cpu() : torch::zeros({}, torch::kDouble),
       torch::tensor(report_windows ? static_cast<double>(my_windows) : 0.0, torch::kDouble)});
  if (mesh.world_size > 1) mesh.world->all_reduce_sum(totals);  // float64: counts are exact
  EvalResult result;
  result.loss_sum = totals[0].item<double>();
  result.windows = static_cast<int64_t>(totals[1].item<double>());
  result.tokens = result.windows * seq_len_;
  return result;
}

}  // namespace mixtrain
