// MetricsWriter: lines parse back as JSON with the written values, non-finite values become
// null, each line is on disk before write() returns, directories are created, and failures
// name the path.
#include "mixtrain/trainer/metrics_writer.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

class MetricsWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "mixtrain_metrics_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  fs::path dir_;
};

TEST_F(MetricsWriterTest, LinesParseBackWithTheWrittenValues) {
  MetricsWriter writer(dir_.string());
  EXPECT_EQ(writer.path(), (dir_ / "metrics.jsonl").string());
  writer.write({1, 6.25, 1.5, 3e-4, 12345.0, 0.75, 0.0125});
  writer.write({2, 5.5, 0.875, 6e-4, 20000.0, 1.5, 0.01});

  auto lines = read_lines(writer.path());
  ASSERT_EQ(lines.size(), 2u);
  auto first = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(first.size(), 9u);
  EXPECT_DOUBLE_EQ(first["loss_scale"].get<double>(), 1.0);  // the default: no float16 scaling
  EXPECT_EQ(first["skipped_steps"].get<int64_t>(), 0);
  EXPECT_EQ(first["step"].get<int64_t>(), 1);
  EXPECT_DOUBLE_EQ(first["loss"].get<double>(), 6.25);
  EXPECT_DOUBLE_EQ(first["grad_norm"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(first["lr"].get<double>(), 3e-4);
  EXPECT_DOUBLE_EQ(first["tokens_per_s"].get<double>(), 12345.0);
  EXPECT_DOUBLE_EQ(first["elapsed_s"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(first["aux_loss"].get<double>(), 0.0125);
  auto second = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(second["step"].get<int64_t>(), 2);
  EXPECT_DOUBLE_EQ(second["loss"].get<double>(), 5.5);
  EXPECT_DOUBLE_EQ(second["lr"].get<double>(), 6e-4);
}

TEST_F(MetricsWriterTest, KeysKeepTheDocumentedOrder) {
  // 0.5, 0.25, ... are exact in binary, so the text of each number is known in advance.
  EXPECT_EQ(metrics_json_line({3, 0.5, 0.25, 0.125, 1000.0, 2.0, 0.0, 32768.0, 2}),
            "{\"step\":3,\"loss\":0.5,\"grad_norm\":0.25,\"lr\":0.125,\"tokens_per_s\":1000.0,"
            "\"elapsed_s\":2.0,\"aux_loss\":0.0,\"loss_scale\":32768.0,\"skipped_steps\":2}");
}

TEST_F(MetricsWriterTest, MuonTelemetryKeysPerGroupOnlyWhenGiven) {
  StepMetrics row{3, 0.5, 0.25, 0.125, 1000.0, 2.0, 0.0, 1.0, 0};
  const std::string plain = metrics_json_line(row);
  EXPECT_EQ(plain.find("muon_"), std::string::npos) << plain;
  MuonGroupTelemetry g0;
  g0.group = 0;
  g0.sampled = 8;
  g0.ortho_error_mean = 0.25;
  g0.ortho_error_max = 0.5;
  g0.update_rms = 0.0078125;
  MuonGroupTelemetry g1;  // nothing stepped: NaN figures become null
  g1.group = 1;
  row.muon = {g0, g1};
  EXPECT_EQ(metrics_json_line(row),
            plain.substr(0, plain.size() - 1) +
                ",\"muon_g0_ortho_error_mean\":0.25,\"muon_g0_ortho_error_max\":0.5,"
                "\"muon_g0_ortho_sampled\":8,\"muon_g0_update_rms\":0.0078125,"
                "\"muon_g1_ortho_error_mean\":null,\"muon_g1_ortho_error_max\":null,"
                "\"muon_g1_ortho_sampled\":0,\"muon_g1_update_rms\":null}");
}
TEST_F(MetricsWriterTest, QkClipKeysFollowSkippedStepsWhenOn) {
  StepMetrics m{3, 0.5, 0.25, 0.125, 1000.0, 2.0, 0.0, 1.0, 0};
  m.qk_clip = QkClipMetrics{5, 112.5};
  EXPECT_EQ(metrics_json_line(m),
            "{\"step\":3,\"loss\":0.5,\"grad_norm\":0.25,\"lr\":0.125,\"tokens_per_s\":1000.0,"
            "\"elapsed_s\":2.0,\"aux_loss\":0.0,\"loss_scale\":1.0,\"skipped_steps\":0,"
            "\"qk_clip_heads\":5,\"qk_max_logit\":112.5}");
}

TEST_F(MetricsWriterTest, OpCountKeysFollowWhenCounting) {
  StepMetrics m{3, 0.5, 0.25, 0.125, 1000.0, 2.0, 0.0, 1.0, 0};
  StepOps ops;
  ops.forward = {10, 1};
  ops.backward = {20, 2};
  ops.clip = {3, 0};
  ops.optimizer = {4, 1};
  ops.step = {40, 5};
  ops.collectives = 2;
  m.ops = ops;
  EXPECT_EQ(metrics_json_line(m),
            "{\"step\":3,\"loss\":0.5,\"grad_norm\":0.25,\"lr\":0.125,\"tokens_per_s\":1000.0,"
            "\"elapsed_s\":2.0,\"aux_loss\":0.0,\"loss_scale\":1.0,\"skipped_steps\":0,"
            "\"ops_forward\":10,\"ops_backward\":20,\"ops_clip\":3,\"ops_optimizer\":4,"
            "\"ops_checkpoint\":0,\"ops_other\":3,\"ops_step\":40,\"allocations_forward\":1,"
            "\"allocations_backward\":2,\"allocations_clip\":0,\"allocations_optimizer\":1,"
            "\"allocations_checkpoint\":0,\"allocations_other\":1,\"allocations_step\":5,"
            "\"collectives\":2}");
}

TEST_F(MetricsWriterTest, EvalRowsHaveTheirOwnKeysInOrder) {
  EXPECT_EQ(metrics_json_line(EvalMetrics{4, 2.5, 12.25, 320}),
            "{\"step\":4,\"eval_loss\":2.5,\"eval_ppl\":12.25,\"eval_tokens\":320}");
  EXPECT_EQ(metrics_json_line(EvalMetrics{4, std::numeric_limits<double>::quiet_NaN(),
                                          std::numeric_limits<double>::infinity(), 0}),
            "{\"step\":4,\"eval_loss\":null,\"eval_ppl\":null,\"eval_tokens\":0}");
}

TEST_F(MetricsWriterTest, NonFiniteValuesAreWrittenAsNull) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  MetricsWriter writer(dir_.string());
  writer.write({7, nan, inf, 1e-3, -inf, 3.0, nan});

  auto lines = read_lines(writer.path());
  ASSERT_EQ(lines.size(), 1u);
  auto j = nlohmann::json::parse(lines[0]);  // throws if NaN leaked as invalid JSON
  EXPECT_EQ(j["step"].get<int64_t>(), 7);
  EXPECT_TRUE(j["loss"].is_null());
  EXPECT_TRUE(j["grad_norm"].is_null());
  EXPECT_DOUBLE_EQ(j["lr"].get<double>(), 1e-3);
  EXPECT_TRUE(j["tokens_per_s"].is_null());
  EXPECT_DOUBLE_EQ(j["elapsed_s"].get<double>(), 3.0);
  EXPECT_TRUE(j["aux_loss"].is_null());
}

TEST_F(MetricsWriterTest, EachLineIsReadableWhileTheWriterIsStillOpen) {
  MetricsWriter writer(dir_.string());
  for (int64_t step = 1; step <= 3; ++step) {
    writer.write({step, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0});
    auto lines = read_lines(writer.path());
    ASSERT_EQ(lines.size(), static_cast<size_t>(step));
    EXPECT_EQ(nlohmann::json::parse(lines.back())["step"].get<int64_t>(), step);
  }
}

TEST_F(MetricsWriterTest, CreatesMissingParentDirectories) {
  fs::path run_dir = dir_ / "a" / "b" / "run";
  MetricsWriter writer(run_dir.string());
  EXPECT_TRUE(fs::is_directory(run_dir));
  writer.write({1, 2.0, 0.5, 1e-3, 100.0, 0.5, 0.0});
  EXPECT_EQ(read_lines((run_dir / "metrics.jsonl").string()).size(), 1u);
}

TEST_F(MetricsWriterTest, TruncatesTheFileOfAnEarlierRun) {
  {
    MetricsWriter old_run(dir_.string());
    old_run.write({1, 9.0, 1.0, 1.0, 1.0, 1.0, 0.0});
    old_run.write({2, 8.0, 1.0, 1.0, 1.0, 1.0, 0.0});
  }
  MetricsWriter writer(dir_.string());
  EXPECT_TRUE(read_lines(writer.path()).empty());
  writer.write({1, 4.0, 1.0, 1.0, 1.0, 1.0, 0.0});
  auto lines = read_lines(writer.path());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(lines[0])["loss"].get<double>(), 4.0);
}

TEST_F(MetricsWriterTest, UncreatableRunDirectoryNamesThePath) {
  // A regular file where a directory is needed: fails even for root, unlike chmod tricks.
  fs::path blocker = dir_ / "blocker";
  std::ofstream(blocker) << "x";
  std::string run_dir = (blocker / "run").string();
  try {
    MetricsWriter writer(run_dir);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(run_dir), std::string::npos) << e.what();
  }
}

TEST_F(MetricsWriterTest, UnopenableMetricsFileNamesThePath) {
  fs::create_directory(dir_ / "metrics.jsonl");  // a directory cannot be opened for writing
  std::string path = (dir_ / "metrics.jsonl").string();
  try {
    MetricsWriter writer(dir_.string());
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST_F(MetricsWriterTest, FailedWriteNamesThePath) {
  // /dev/full accepts open() but fails every write with ENOSPC: a full disk on demand.
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "/dev/full not available";
  fs::create_symlink("/dev/full", dir_ / "metrics.jsonl");
  MetricsWriter writer(dir_.string());
  try {
    writer.write({1, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0});
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(writer.path()), std::string::npos) << e.what();
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
