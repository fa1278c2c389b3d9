// detect_rank_info for each launcher's variables, its defaults, and malformed values.
#include "mixtrain/distributed/rendezvous.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <string>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

const char* const kVariables[] = {"RANK",
                                  "WORLD_SIZE",
                                  "LOCAL_RANK",
                                  "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR",
                                  "MASTER_PORT",
                                  "MIXTRAIN_LAUNCHED",
                                  "OMPI_COMM_WORLD_RANK",
                                  "OMPI_COMM_WORLD_SIZE",
                                  "SLURM_PROCID",
                                  "OMPI_COMM_WORLD_LOCAL_RANK",
                                  "OMPI_COMM_WORLD_LOCAL_SIZE",
                                  "SLURM_NTASKS",
                                  "SLURM_LOCALID"};

class RendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* name : kVariables) unsetenv(name);
  }
  static RankInfo detect(const std::map<std::string, std::string>& env) {
    clear();
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
    return detect_rank_info();
  }
  static std::string error_of(const std::map<std::string, std::string>& env) {
    try {
      detect(env);
    } catch (const ConfigError& error) {
      return error.what();
    }
    return "(no error)";
  }
};

TEST_F(RendezvousTest, NoLauncherIsOneProcess) {
  const RankInfo info = detect({});
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_world_size, 1);
  EXPECT_EQ(info.master_addr, "127.0.0.1");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_EQ(info.launcher, "single");
}

TEST_F(RendezvousTest, Torchrun) {
  const RankInfo info = detect({{"RANK", "5"},
                                {"WORLD_SIZE", "8"},
                                {"LOCAL_RANK", "1"},
                                {"MASTER_ADDR", "10.0.0.7"},
                                {"MASTER_PORT", "23456"}});
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_addr, "10.0.0.7");
  EXPECT_EQ(info.master_port, 23456);
  EXPECT_EQ(info.launcher, "torchrun");
}

TEST_F(RendezvousTest, MixtrainLauncherMarksItself) {
  const RankInfo info =
      detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MIXTRAIN_LAUNCHED", "1"}});
  EXPECT_EQ(info.launcher, "mixtrain");
  EXPECT_EQ(info.rank, 1);
}

TEST_F(RendezvousTest, LocalRankDefaultsToZero) {
  EXPECT_EQ(detect({{"RANK", "3"}, {"WORLD_SIZE", "4"}}).local_rank, 0);
}

TEST_F(RendezvousTest, LocalWorldSizeFromTheLauncherElseTheLocalRanksSeen) {
  EXPECT_EQ(
      detect({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}})
          .local_world_size,
      4);
  EXPECT_EQ(detect({{"OMPI_COMM_WORLD_RANK", "2"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .local_world_size,
            2);
  // Slurm says no local size: local rank 2 means at least 3 ranks on this node.
  EXPECT_EQ(detect({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "2"}})
                .local_world_size,
            3);
  EXPECT_EQ(detect({{"RANK", "3"}, {"WORLD_SIZE", "4"}}).local_world_size, 1);
}

TEST_F(RendezvousTest, OpenMpi) {
  const RankInfo info = detect({{"OMPI_COMM_WORLD_RANK", "2"},
                                {"OMPI_COMM_WORLD_SIZE", "4"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                {"MASTER_ADDR", "node0"}});
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.master_addr, "node0");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_EQ(info.launcher, "openmpi");
}

TEST_F(RendezvousTest, Slurm) {
  const RankInfo info = detect(
      {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"MASTER_PORT", "1"}});
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_port, 1);
  EXPECT_EQ(info.launcher, "slurm");
}

TEST_F(RendezvousTest, TorchrunVariablesWinOverTheJobScheduler) {
  // torchrun inside a Slurm allocation: the per-process RANK is the one that counts.
  const RankInfo info =
      detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 1);
}

TEST_F(RendezvousTest, MalformedValuesNameTheVariable) {
  EXPECT_EQ(error_of({{"RANK", "one"}, {"WORLD_SIZE", "2"}}),
            "RANK: expected an integer, got 'one'");
  EXPECT_EQ(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2x"}}),
            "WORLD_SIZE: expected an integer, got '2x'");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
            "WORLD_SIZE: must be in [1, 2147483647], got 0");
  EXPECT_EQ(error_of({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}),
            "RANK: must be in [0, 2147483647], got -1");
  EXPECT_EQ(error_of({{"RANK", "99999999999"}, {"WORLD_SIZE", "2"}}),
            "RANK: must be in [0, 2147483647], got 99999999999");
  EXPECT_EQ(error_of({{"MASTER_PORT", "70000"}}), "MASTER_PORT: must be in [1, 65535], got 70000");
  EXPECT_EQ(error_of({{"MASTER_PORT", "http"}}), "MASTER_PORT: expected an integer, got 'http'");
}

TEST_F(RendezvousTest, InconsistentValuesNameTheVariable) {
  EXPECT_EQ(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
            "RANK: rank 2 is not below WORLD_SIZE = 2");
  EXPECT_EQ(error_of({{"RANK", "1"}}), "WORLD_SIZE: not set, but RANK is (torchrun launch)");
  EXPECT_EQ(error_of({{"OMPI_COMM_WORLD_SIZE", "4"}}),
            "OMPI_COMM_WORLD_RANK: not set, but OMPI_COMM_WORLD_SIZE is (openmpi launch)");
  EXPECT_EQ(error_of({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
            "SLURM_PROCID: rank 4 is not below SLURM_NTASKS = 4");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}),
            "LOCAL_RANK: must be in [0, 1], got 2");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}}),
            "LOCAL_WORLD_SIZE: must be in [1, 2], got 3");
  EXPECT_EQ(
      error_of(
          {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
      "LOCAL_RANK: local rank 2 is not below LOCAL_WORLD_SIZE = 2");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
