// SGD through the command line (optimizer._target_: SGD on the tiny Qwen2-MoE, bfloat16 with
// fp32 main params): every trainable parameter goes to SGD, the start-up log shows the sgd
// section, and `train.steps=4` in one run equals `train.steps=2`, a checkpoint, and a second
// run restoring it: metrics of steps 3-4 identical except timing, and every tensor of the two
// step-4 checkpoints bitwise equal.
#include <gtest/gtest.h>

#include <string>

#include "support/train_then_resume.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

std::string sgd_command(const std::string& run_dir) {
  return "train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
         " --set optimizer._target_=SGD --set optimizer.sgd_config.sgd_lr=0.05" +
         " --set optimizer.sgd_config.sgd_momentum=0.9" +
         " --set optimizer.sgd_config.sgd_nesterov=true" +
         " --set optimizer.sgd_config.sgd_weight_decay=0.01" +
         " --set train.lr_scheduler.warmup_steps=0 --set train.lr_scheduler.decay=constant" +
         " --set data.seq_len=32 --set checkpoint.interval=2 --run-dir " + run_dir;
}

TEST(SgdTrainResume, SecondRunContinuesBitwise) {
  TrainThenResume runs;
  ASSERT_NO_FATAL_FAILURE(train_then_resume(sgd_command, "", runs));
  const CommandResult& one = runs.one;
  EXPECT_NE(one.output.find("Effective sgd config:"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("Optimizer routing (SGD"), std::string::npos) << one.output;
  // The routing table (up to the next log line): every row names sgd, none another leaf.
  const size_t table = one.output.find("Optimizer routing (SGD");
  ASSERT_NE(table, std::string::npos) << one.output;
  const std::string rows = one.output.substr(table, one.output.find("\n20", table) - table);
  EXPECT_NE(rows.find(" sgd "), std::string::npos) << rows;
  EXPECT_EQ(rows.find(" adamw "), std::string::npos) << rows;
  EXPECT_EQ(rows.find(" muon "), std::string::npos) << rows;

  // Every tensor (model, main params, momentum buffers, steps) bitwise equal: ckpt diff reports
  // only the two state fields that name the restore, the config (restore_from) and its hash.
  const CommandResult diff =
      run_mixtrain("ckpt diff " + runs.continuous.file("checkpoints/step-00000004") + " " +
                   runs.split.file("checkpoints/step-00000004"));
  EXPECT_NE(diff.output.find("\ndifferent: 2 step/state fields with differences\n"),
            std::string::npos)
      << diff.output;
  EXPECT_NE(diff.output.find("\nstate.config: "), std::string::npos) << diff.output;
  EXPECT_NE(diff.output.find("\nstate.config_hash: "), std::string::npos) << diff.output;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
