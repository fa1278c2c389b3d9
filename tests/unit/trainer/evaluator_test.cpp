// trainer/evaluator: the eval loss is the mean token cross-entropy of the model's logits over
// every window of the held-out files exactly once (checked against log_softmax computed here
// with plain torch ops over windows cut from the tokens the test wrote), max_windows keeps the
// first windows, a directory means its val_*.bin, a missing or empty eval set is a DataError,
// and 2 ranks (FSDP, and expert parallelism) give the 1-rank answer.
#include "mixtrain/trainer/evaluator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <torch/types.h>
#include <torch/utils.h>

#include "mixtrain/core/error.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/trainer/trainer.h"
#include "support/multiprocess.h"
#include "support/tiny_model_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

constexpr int64_t kSeqLen = 8;

// An llm.c shard: 256 int32 header (magic, version 1, count), then uint16 tokens.
void write_shard(const fs::path& path, const std::vector<uint16_t>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(2 * tokens.size()));
}

std::vector<uint16_t> random_tokens(int64_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> token(0, 36);  // tiny_config's vocab is 37
  std::vector<uint16_t> out(static_cast<size_t>(count));
  for (auto& t : out) t = static_cast<uint16_t>(token(gen));
  return out;
}

// The eval set's files: 3 windows + a 5-token tail, 2 windows exactly (17 = 2 x 8 + 1), and
// one file too short for any window: 5 windows in all, an odd count that leaves ranks uneven.
std::vector<std::vector<uint16_t>> write_eval_set(const fs::path& dir) {
  const std::vector<std::vector<uint16_t>> files = {random_tokens(3 * kSeqLen + 1 + 5, 1),
                                                    random_tokens(2 * kSeqLen + 1, 2),
                                                    random_tokens(kSeqLen, 3)};
  fs::create_directories(dir);
  for (size_t i = 0; i < files.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "val_%06zu.bin", i);
    write_shard(dir / name, files[i]);
  }
  // Not part of the eval set when the directory is given.
  write_shard(dir / "train_000000.bin", random_tokens(10 * kSeqLen, 4));
  return files;
}

// Window w of a file starts at w * seq_len and has seq_len + 1 tokens (dataset.h), stream order.
std::vector<std::vector<int64_t>> windows_of(const std::vector<std::vector<uint16_t>>& files) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& tokens : files) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    for (int64_t start = 0; start + kSeqLen + 1 <= n; start += kSeqLen) {
      out.emplace_back(tokens.begin() + start, tokens.begin() + start + kSeqLen + 1);
    }
  }
  return out;
}

// Mean of -log softmax(logits)[label] over the first `count` windows, all in one forward.
double reference_loss(CausalLM& model, const std::vector<std::vector<int64_t>>& windows,
                      size_t count) {
  std::vector<int64_t> flat;
  for (size_t w = 0; w < count; ++w) flat.insert(flat.end(), windows[w].begin(), windows[w].end());
  const torch::Tensor all =
      torch::tensor(flat, torch::kLong).view({static_cast<int64_t>(count), -1});
  torch::NoGradGuard no_grad;
  const torch::Tensor logits = model.forward(all.narrow(1, 0, kSeqLen)).logits.to(torch::kDouble);
  const torch::Tensor log_probs = torch::log_softmax(logits, -1);
  const torch::Tensor picked = log_probs.gather(-1, all.narrow(1, 1, kSeqLen).unsqueeze(-1));
  return -picked.mean().item<double>();
}

TrainerConfig tiny_trainer_config() {
  TrainerConfig c;
  c.model = test_support::tiny_config();
  c.data.seq_len = kSeqLen;
  c.data.micro_batch_size = 2;
  c.data.global_batch_size = 4;
  return c;
}

class EvaluatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mixtrain_evaluator_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    files_ = write_eval_set(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::vector<std::vector<uint16_t>> files_;
  DeviceMesh mesh_ = make_single_process_mesh();
};

// The reference runs all windows in one float32 forward, the evaluator 2 per forward; their
// logits differ by BLAS blocking only (~1e-7 relative each), and in float64 the mean of ~40
// token losses near log(37) = 3.6 keeps that: 1e-5 absolute is 30x the rounding observed.
constexpr double kForwardTolerance = 1e-5;

TEST_F(EvaluatorTest, MeanLossIsTheCrossEntropyOfEveryWindowOnce) {
  const BuiltModel built = build_training_model(tiny_trainer_config(), mesh_);
  Evaluator evaluator(dir_.string(), 37, kSeqLen, /*micro_batch_size=*/2, /*max_windows=*/0);
  const auto windows = windows_of(files_);
  ASSERT_EQ(windows.size(), 5u);  // 3 + 2 + 0, independent of the dataset's arithmetic
  EXPECT_EQ(evaluator.windows(), 5);
  const EvalResult result = evaluator.evaluate(*built.model, mesh_);
  EXPECT_EQ(result.windows, 5);
  EXPECT_EQ(result.tokens, 5 * kSeqLen);
  const double expected = reference_loss(*built.model, windows, windows.size());
  EXPECT_NEAR(result.loss(), expected, kForwardTolerance);
  EXPECT_NEAR(result.perplexity(), std::exp(expected), std::exp(expected) * kForwardTolerance);
}

TEST_F(EvaluatorTest, MaxWindowsKeepsTheFirstWindows) {
  const BuiltModel built = build_training_model(tiny_trainer_config(), mesh_);
  // A glob naming the files, micro batch 3 (one padded row in the second forward).
  Evaluator evaluator((dir_ / "val_*.bin").string(), 37, kSeqLen, 3, /*max_windows=*/4);
  EXPECT_EQ(evaluator.windows(), 4);
  const EvalResult result = evaluator.evaluate(*built.model, mesh_);
  EXPECT_EQ(result.windows, 4);
  EXPECT_NEAR(result.loss(), reference_loss(*built.model, windows_of(files_), 4),
              kForwardTolerance);
}

TEST_F(EvaluatorTest, MissingOrEmptyEvalSetIsADataError) {
  const fs::path empty_dir = dir_ / "nothing";
  fs::create_directories(empty_dir);
  write_shard(empty_dir / "val_000000.bin", random_tokens(kSeqLen, 5));  // no window of 9
  try {
    Evaluator evaluator(empty_dir.string(), 37, kSeqLen, 2, 0);
    ADD_FAILURE() << "an eval set without a window was accepted";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("no file holds 9 tokens"), std::string::npos)
        << error.what();
  }
  try {
    Evaluator evaluator((dir_ / "absent").string(), 37, kSeqLen, 2, 0);
    ADD_FAILURE() << "a missing file was accepted";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("matches no file"), std::string::npos) << error.what();
  }
  EXPECT_EQ(eval_data_pattern(dir_.string()), (dir_ / "val_*.bin").string());
  EXPECT_EQ(eval_data_pattern("a/val_000000.bin"), "a/val_000000.bin");
}

// Each rank builds the model as the trainer does (the same seed: the same weights, then
// sharded), evaluates the set written by the test and reports the result.
MIXTRAIN_WORKER(evaluate_on_two_ranks) {
  DeviceMesh mesh = worker.make_mesh();
  TrainerConfig config = tiny_trainer_config();
  config.parallel = worker.parallel;
  config.mix_precision.reduce_dtype = "float32";
  const BuiltModel built = build_training_model(config, mesh);
  Evaluator evaluator(worker.get("EVAL_DIR"), 37, kSeqLen, 2, 0);
  const EvalResult result = evaluator.evaluate(*built.model, mesh);
  char text[96];
  std::snprintf(text, sizeof(text), "%.17g %lld %lld", result.loss(),
                static_cast<long long>(result.tokens), static_cast<long long>(result.windows));
  worker.write_text("result_" + std::to_string(worker.rank.rank), text);
}

// 5 windows over 2 ranks x 2 rows: rank 0 evaluates windows 0, 2, 4 and rank 1 windows 1, 3
// and a padding row, in 2 forwards each (the FSDP gathers and expert exchanges line up).
void expect_two_ranks_match_one(const fs::path& dir,
                                const std::vector<std::vector<uint16_t>>& files,
                                const ParallelConfig& parallel) {
  DeviceMesh single = make_single_process_mesh();
  const BuiltModel built = build_training_model(tiny_trainer_config(), single);
  const double one_rank = reference_loss(*built.model, windows_of(files), 5);
  const testing::WorkerResult result =
      testing::run_workers("evaluate_on_two_ranks", 2, parallel, {{"EVAL_DIR", dir.string()}});
  ASSERT_TRUE(result.all_ok()) << result.summary();
  const std::string rank0 = result.read_text("result_0");
  EXPECT_EQ(rank0, result.read_text("result_1"));  // every rank has the all-reduced answer
  double loss = 0;
  long long tokens = 0, windows = 0;
  ASSERT_EQ(std::sscanf(rank0.c_str(), "%lf %lld %lld", &loss, &tokens, &windows), 3) << rank0;
  EXPECT_EQ(windows, 5);
  EXPECT_EQ(tokens, 5 * kSeqLen);
  EXPECT_NEAR(loss, one_rank, kForwardTolerance);
}

TEST_F(EvaluatorTest, TwoFsdpRanksGiveTheOneRankAnswer) {
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  expect_two_ranks_match_one(dir_, files_, parallel);
}

TEST_F(EvaluatorTest, TwoExpertParallelRanksGiveTheOneRankAnswer) {
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  parallel.ep = 2;
  expect_two_ranks_match_one(dir_, files_, parallel);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
