// `mixtrain eval` and train.eval_every, through the built binary: a short token-data run writes
// eval rows (steps 2 and 4) to metrics.jsonl and an eval series to loss.svg; `mixtrain eval` of
// its last checkpoint gives the last eval row's loss (the same weights, windows and batches), on
// 2 ranks too; the training losses are bitwise the same with and without periodic eval (1 and
// 2 ranks); the argument errors exit 2 and name what is wrong; `--init-from` of a Hugging Face
// Qwen2 gives the loss transformers computes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "support/python_script.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

// A learnable stream (token i+1 follows from token i) over the config's vocabulary of 512.
std::vector<uint16_t> stream(size_t count, size_t offset) {
  std::vector<uint16_t> tokens(count);
  for (size_t i = 0; i < count; ++i) tokens[i] = static_cast<uint16_t>(((i + offset) * 7) % 500);
  return tokens;
}

// The tiny AdamW config on token data, seq_len 32, micro 2 x dp x accumulation = 8.
std::string tiny(const std::string& data_dir) {
  return "--config " + source_path("configs/qwen2_moe_tiny_adamw.yaml") +
         " --set data.kind=tokens --set 'data.path=" + data_dir + "/train_*.bin'" +
         " --set data.seq_len=32 --set data.micro_batch_size=2 --set data.global_batch_size=8";
}

class EvalCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.file("data");
    std::filesystem::create_directories(data_);
    write_token_shard(data_ + "/train_000000.bin", stream(4000, 0));
    // 7 + 3 windows of 33 tokens: an odd count, uneven over 2 ranks x 2 rows.
    write_token_shard(data_ + "/val_000000.bin", stream(7 * 32 + 1, 3));
    write_token_shard(data_ + "/val_000001.bin", stream(3 * 32 + 10, 11));
  }

  // Trains 4 steps with an eval every 2 and a checkpoint at the end.
  CommandResult train_with_eval(const std::string& run, const std::string& extra = "") {
    return run_mixtrain("train " + tiny(data_) + " --set train.steps=4" +
                        " --set train.eval_every=2 --set data.eval_path=" + data_ +
                        " --set checkpoint.dir=" + dir_.file(run + "/ckpt") +
                        " --set checkpoint.interval=4 --run-dir " + dir_.file(run) + " " + extra);
  }

  TempDir dir_;
  std::string data_;
};

// A tests/python script (support/python_script.h); its stdout, without the progress bars
// transformers writes to stderr.
CommandResult run_python(const std::vector<std::string>& argv, const TempDir& dir) {
  CommandResult result;
  result.exit_code = test_support::run_python_script(argv, dir.file("python.out"), "/dev/null");
  std::ifstream in(dir.file("python.out"));
  result.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return result;
}

nlohmann::json last_json_line(const std::string& output) {
  const size_t end = output.find_last_not_of('\n');
  const size_t start = output.rfind('\n', end);
  return nlohmann::json::parse(output.substr(start == std::string::npos ? 0 : start + 1));
}

TEST_F(EvalCommand, PeriodicEvalRowsThenTheCheckpointEvaluatesToTheLastRow) {
  const CommandResult trained = train_with_eval("run");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  std::vector<nlohmann::json> evals;
  int train_rows = 0;
  for (const auto& row : read_metrics(dir_.file("run/metrics.jsonl"))) {
    if (row.contains("eval_loss")) {
      evals.push_back(row);
    } else {
      ++train_rows;
    }
  }
  EXPECT_EQ(train_rows, 4);
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(evals[0]["step"], 2);
  EXPECT_EQ(evals[1]["step"], 4);
  for (const auto& row : evals) {
    EXPECT_EQ(row["eval_tokens"], 10 * 32);  // every window of the two val files once
    EXPECT_DOUBLE_EQ(row["eval_ppl"].get<double>(), std::exp(row["eval_loss"].get<double>()));
  }
  EXPECT_LT(evals[1]["eval_loss"].get<double>(), evals[0]["eval_loss"].get<double>());
  std::ifstream svg_file(dir_.file("run/loss.svg"));
  const std::string svg((std::istreambuf_iterator<char>(svg_file)), {});
  EXPECT_NE(svg.find("stroke=\"#ff7f0e\""), std::string::npos) << "no eval series in loss.svg";
  EXPECT_NE(svg.find(">eval</text>"), std::string::npos);

  // One rank, the same micro batch and windows as the run's own eval, weights restored bitwise
  // (a float32 checkpoint): the same float operations, the same loss.
  const std::string eval_args = "eval " + tiny(data_) + " --checkpoint " + dir_.file("run/ckpt") +
                                " --data " + data_ + " --json";
  const CommandResult one = run_mixtrain(eval_args);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const nlohmann::json one_rank = last_json_line(one.output);
  EXPECT_EQ(one_rank["eval_loss"].get<double>(), evals[1]["eval_loss"].get<double>());
  EXPECT_EQ(one_rank["eval_tokens"], 10 * 32);
  EXPECT_EQ(one_rank["eval_windows"], 10);
  EXPECT_EQ(one_rank["step"], 4);

  // Two FSDP ranks: other batch rows per forward, the same sum up to float32 forward rounding
  // (~1e-7 relative per logit; 1e-5 absolute on a loss near 6 is ~30x that).
  const CommandResult two = run_mixtrain(eval_args + " --nproc 2");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const nlohmann::json two_ranks = last_json_line(two.output);
  EXPECT_NEAR(two_ranks["eval_loss"].get<double>(), one_rank["eval_loss"].get<double>(), 1e-5);
  EXPECT_EQ(two_ranks["eval_tokens"], 10 * 32);

  // The plain line, and --max-batches 1: the first 8 windows (one global batch).
  const CommandResult line =
      run_mixtrain("eval " + tiny(data_) + " --checkpoint " + dir_.file("run/ckpt") + " --data '" +
                   data_ + "/val_*.bin' --max-batches 1");
  ASSERT_EQ(line.exit_code, 0) << line.output;
  EXPECT_NE(line.output.find("eval_loss "), std::string::npos) << line.output;
  EXPECT_NE(line.output.find(" tokens 256 windows 8\n"), std::string::npos) << line.output;
}

// Evaluation reads no RNG and no training data: the training rows are bitwise the same (JSON
// numbers round-trip doubles, so equal rows are equal losses, grad norms, lrs).
TEST_F(EvalCommand, TrainingIsBitwiseTheSameWithAndWithoutEval) {
  for (const std::string nproc : {"1", "2"}) {
    const CommandResult with =
        train_with_eval("with" + nproc, "--nproc " + nproc + " --set train.eval_every=1");
    ASSERT_EQ(with.exit_code, 0) << with.output;
    const CommandResult without =
        train_with_eval("without" + nproc, "--nproc " + nproc + " --set train.eval_every=0");
    ASSERT_EQ(without.exit_code, 0) << without.output;
    std::vector<nlohmann::json> a, b;
    int eval_rows = 0;
    for (const auto& row : read_metrics(dir_.file("with" + nproc + "/metrics.jsonl"))) {
      if (row.contains("eval_loss")) {
        ++eval_rows;
      } else {
        a.push_back(without_timing(row));
      }
    }
    for (const auto& row : read_metrics(dir_.file("without" + nproc + "/metrics.jsonl"))) {
      b.push_back(without_timing(row));
    }
    EXPECT_EQ(eval_rows, 4) << nproc << " rank(s)";
    ASSERT_EQ(a.size(), 4u);
    EXPECT_EQ(a, b) << nproc << " rank(s)";
  }
}

TEST_F(EvalCommand, ArgumentErrorsExitTwo) {
  const CommandResult trained = run_mixtrain(
      "train " + tiny(data_) + " --set train.steps=1 --set checkpoint.dir=" + dir_.file("ckpt") +
      " --set checkpoint.interval=1" + " --run-dir " + dir_.file("run"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string base = "eval " + tiny(data_);
  const std::string ckpt = " --checkpoint " + dir_.file("ckpt");

  CommandResult r = run_mixtrain(base + ckpt + " --data " + dir_.file("absent"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--data: eval data: token files '" + dir_.file("absent")),
            std::string::npos)
      << r.output;

  write_token_shard(dir_.file("short.bin"), stream(32, 0));  // no window of 33 tokens
  r = run_mixtrain(base + ckpt + " --data " + dir_.file("short.bin"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no file holds 33 tokens"), std::string::npos) << r.output;

  r = run_mixtrain(base + ckpt + " --data " + data_ + " --set model.hidden_size=32");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the checkpoint is of another model: model.hidden_size: 64 in the "
                          "checkpoint, 32 now"),
            std::string::npos)
      << r.output;

  // On 2 ranks every rank finds it: the launcher exits with their code.
  r = run_mixtrain(base + ckpt + " --data " + data_ + " --set model.hidden_size=32 --nproc 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the checkpoint is of another model"), std::string::npos) << r.output;

  r = run_mixtrain(base + " --checkpoint " + dir_.file("no_such_ckpt") + " --data " + data_);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--checkpoint: "), std::string::npos) << r.output;

  r = run_mixtrain(base + " --data " + data_);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("exactly one of --checkpoint DIR"), std::string::npos) << r.output;

  r = run_mixtrain(base + ckpt + " --init-from " + dir_.file("hf") + " --data " + data_);
  EXPECT_EQ(r.exit_code, 2) << r.output;

  // --init-from is model.init_from: whatever the loader says about a missing directory, the
  // message is about that key.
  r = run_mixtrain(base + " --init-from " + dir_.file("hf") + " --data " + data_);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("init_from"), std::string::npos) << r.output;

  // train.eval_every without data.eval_path is refused before anything starts.
  r = run_mixtrain("train " + tiny(data_) + " --set train.eval_every=2 --run-dir " +
                   dir_.file("run2"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("data.eval_path: is required when train.eval_every is > 0"),
            std::string::npos)
      << r.output;
}

// transformers writes a tiny random Qwen2 (configs/qwen2_tiny.yaml's shape; q/k/v biases and
// RMSNorm scales drawn, not left at zeros and ones, and sharp attention: see
// tests/python/hf_eval_reference.py) and computes the mean cross-entropy over the same windows in
// float64; mixtrain loads the directory through model.init_from and evaluates in float32 on 1,
// 2 and 4 ranks. Float32 rounds each logit to about 1e-7 relative; transformers' own float32
// loss of this model is within 1e-7 of its float64 one (6e-8 when written), so 1e-4 absolute on
// a loss near 7.6 leaves a wide margin, and the reference fails unless putting back any drawn
// group (a bias or norm kind) moves the loss by at least 1e-3: a dropped bias or norm scale, a
// wrong weight or window fails here.
TEST_F(EvalCommand, InitFromAHuggingFaceModelGivesTransformersLoss) {
  const std::string config = "--config " + source_path("configs/qwen2_tiny.yaml");
  const CommandResult reference = run_python({"hf_eval_reference.py", dir_.file("hf"), "32",
                                              data_ + "/val_000000.bin", data_ + "/val_000001.bin"},
                                             dir_);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const double expected = std::stod(reference.output);  // its one line (stderr dropped)
  // 1 rank, 2 FSDP ranks, and 4 ranks of tensor x context parallelism (tp 2 x cp 2: the HF
  // weights read as tp boxes, the logits split over the vocabulary, each window scored as two
  // rank's chunks, every token's loss counted once).
  for (const std::string nproc : {"1", "2", "4"}) {
    const std::string layout = nproc == "4" ? " --set parallel.tp=2 --set parallel.cp=2" : "";
    const CommandResult r =
        run_mixtrain("eval " + config + " --set data.seq_len=32 --set data.micro_batch_size=2" +
                     " --set data.global_batch_size=4 --init-from " + dir_.file("hf") + " --data " +
                     data_ + " --json --nproc " + nproc + layout);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json result = last_json_line(r.output);
    EXPECT_NEAR(result["eval_loss"].get<double>(), expected, 1e-4) << nproc << " rank(s)";
    EXPECT_EQ(result["eval_tokens"], 10 * 32);
    EXPECT_TRUE(result["step"].is_null());
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
