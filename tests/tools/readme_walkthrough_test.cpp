// The README's "Fine-tune a Hugging Face model on your text" walkthrough, run as written: the
// shell block after the "walkthrough:" marker is executed by bash (-e: any failing command fails
// the test) in a fresh directory that looks like the repository root to it (build/ = the
// built binary's directory, .venv = the project's Python environment, README.md, docs/ and
// configs/ from the source tree). Then its results are checked: mixtrain's and transformers'
// held-out losses agree, training wrote eval rows, and the export is a complete HF directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "support/child_process.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

// The first ```sh block after the marker line.
std::string walkthrough_block(const std::string& readme) {
  const auto marker = readme.find("<!-- walkthrough:");
  if (marker == std::string::npos) return "";
  const auto open = readme.find("```sh\n", marker);
  if (open == std::string::npos) return "";
  const auto begin = open + 6;
  const auto close = readme.find("\n```", begin);
  if (close == std::string::npos) return "";
  return readme.substr(begin, close - begin + 1);
}

// The number after `label` on the line that starts with `prefix`; NaN when there is none.
double number_after(const std::string& output, const std::string& prefix,
                    const std::string& label) {
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    const auto at = line.find(label);
    if (at == std::string::npos) continue;
    return std::stod(line.substr(at + label.size()));
  }
  return std::nan("");
}

TEST(ReadmeWalkthrough, RunsAsWrittenAndAgreesWithTransformers) {
  const std::string block = walkthrough_block(read_text(source_path("README.md")));
  ASSERT_FALSE(block.empty()) << "no ```sh block after the walkthrough marker in README.md";

  TempDir root;
  fs::create_directory_symlink(fs::path(MIXTRAIN_BINARY).parent_path(), root.file("build"));
  fs::create_directory_symlink(fs::path(MIXTRAIN_PYTHON).parent_path().parent_path(),
                               root.file(".venv"));
  for (const char* entry : {"docs", "configs"}) {
    fs::create_directory_symlink(source_path(entry), root.file(entry));
  }
  fs::create_symlink(source_path("README.md"), root.file("README.md"));
  {
    std::ofstream script(root.file("walkthrough.sh"));
    script << "set -euo pipefail\n" << block;
  }

  ChildOptions options;
  options.capture_output = true;
  ChildProcess child({"/bin/sh", "-c", "cd '" + root.path() + "' && exec bash walkthrough.sh"},
                     options);
  const std::string output = child.read_output();
  ASSERT_EQ(exit_code_of(child.wait()), 0) << output;

  // Both evaluate the same float32 weights (the export is the fp32 main params, written as
  // float32) on the same windows; they differ only in float32 summation order inside the
  // forward (flash attention vs eager, GEMM blocking): ~1e-7 relative per logit, which moves a
  // mean cross-entropy near 7 by ~1e-6. 1e-4 absolute leaves room and still catches a wrong
  // window, a shifted label or a wrong weight (each moves the loss by far more than 1e-3).
  const double ours = number_after(output, "eval_loss ", "eval_loss ");
  const double theirs = number_after(output, "transformers eval_loss ", "eval_loss ");
  ASSERT_FALSE(std::isnan(ours)) << output;
  ASSERT_FALSE(std::isnan(theirs)) << output;
  EXPECT_NEAR(ours, theirs, 1e-4) << output;

  // Training logged eval rows (every 20 steps of 40: steps 20 and 40) and they are finite.
  int eval_rows = 0;
  for (const auto& row : read_metrics(root.file("runs/hf-demo/run/metrics.jsonl"))) {
    if (!row.contains("eval_loss")) continue;
    ++eval_rows;
    EXPECT_TRUE(std::isfinite(row["eval_loss"].get<double>())) << row.dump();
  }
  EXPECT_EQ(eval_rows, 2);
  for (const char* file : {"config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_TRUE(fs::exists(root.file(std::string("runs/hf-demo/export/") + file))) << file;
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
