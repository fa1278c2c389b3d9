// Saves that fail: the previous step directory and `latest` stay intact and `ckpt verify`
// passes on them, and the failure is an error, never a hang or a half-published step.
// - a rank killed (SIGKILL) in the middle of a 2-rank save, at two points of the protocol
//   (worker processes of this binary, real Gloo; the kill is placed by counting the rank's
//   collective calls, so it lands in the same phase every run);
// - disk full: the trainer resumed under RLIMIT_FSIZE (SIGXFSZ ignored, so writes fail with
//   EFBIG as they would with ENOSPC) below the size of a rank file;
// - an unwritable checkpoint directory (mode 0555; when the test runs as root, for whom
//   permission bits do not apply, the run drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from
//   its bounding set, so root obeys permission bits but stays the owner of its files: the
//   binary, .venv and a clone under a 0700 directory stay reachable, and the 0555 directory
//   refuses writes. A new user namespace did the same, but a chroot (fresh-debian.sh) refuses
//   CLONE_NEWUSER);
// - an asynchronous save whose writer fails: the error reaches the training loop at the next
//   save (step 6 joins the failed save of step 4), which stops with exit 1: no step 7.
// Runs of the binary use the tiny fp32-main-params config (§1) (bfloat16, Muon + AdamW), ~1 s of
// training each.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "mixtrain/checkpoint/distributed_checkpoint.h"
#include "support/multiprocess.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

// The previous checkpoint is what `latest` names, complete and verifiable, and `step` was
// never published.
void expect_previous_intact(const std::string& checkpoints, const std::string& previous,
                            int64_t failed_step) {
  EXPECT_EQ(read_text(checkpoints + "/latest"), previous + "\n");
  EXPECT_FALSE(fs::exists(checkpoints + "/" + step_dir_name(failed_step)));
  const CommandResult verify = run_mixtrain("ckpt verify " + checkpoints);
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_TRUE(contains(verify.output, "ok: ")) << verify.output;
  // verify resolved `latest` to the previous step (inspect names the directory it read).
  const CommandResult inspect = run_mixtrain("ckpt inspect " + checkpoints);
  EXPECT_TRUE(contains(inspect.output, "checkpoint: " + checkpoints + "/" + previous + "\n"))
      << inspect.output;
}

// --- a rank killed mid-save ------------------------------------------------------------------

// Delegates to `inner` and SIGKILLs this process at the start of its kill_at-th call (1-based):
// a rank dying in the middle of a collective protocol, at a chosen point.
class KillAtCall final : public Collectives {
 public:
  KillAtCall(std::shared_ptr<Collectives> inner, int kill_at)
      : inner_(std::move(inner)), kill_at_(kill_at) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  void all_reduce(at::Tensor& t, ReduceOp op) override { tick(), inner_->all_reduce(t, op); }
  at::Tensor all_gather(const at::Tensor& t) override { return tick(), inner_->all_gather(t); }
  at::Tensor reduce_scatter_sum(const at::Tensor& t) override {
    return tick(), inner_->reduce_scatter_sum(t);
  }
  at::Tensor all_to_all(const at::Tensor& t, const std::vector<int64_t>& send,
                        const std::vector<int64_t>& recv) override {
    return tick(), inner_->all_to_all(t, send, recv);
  }
  void broadcast(at::Tensor& t, int root) override { tick(), inner_->broadcast(t, root); }
  void barrier() override { tick(), inner_->barrier(); }

 private:
  void tick() {
    if (++calls_ == kill_at_) ::raise(SIGKILL);
  }
  std::shared_ptr<Collectives> inner_;
  int kill_at_;
  int calls_ = 0;
};

// model.w [4, 3] float32, rows [2r, 2r + 2) on rank r, every value `step`.
SaveRequest request(int rank, int64_t step) {
  SaveRequest r;
  r.step = step;
  r.mesh = CheckpointMesh{1, 2, 1};
  r.chunks.push_back(LocalChunk{"model.w",
                                at::full({2, 3}, static_cast<float>(step)),
                                {4, 3},
                                {2 * static_cast<int64_t>(rank), 0}});
  r.state = {{"train", {{"step", step}}}};
  r.rank_state = nlohmann::json::object();
  return r;
}

// Saves step 1 on both ranks, then step 2 with rank 1 killed at its KILL_AT-th collective call
// of that save. Rank 0 records what its save did.
MIXTRAIN_WORKER(killed_mid_save) {
  DeviceMesh mesh = worker.make_mesh();
  const std::string dir = (worker.dir / "ckpt").string();
  const int rank = worker.rank.rank;
  CheckpointSaver(dir, 0, false, mesh.world).save(request(rank, 1));
  std::shared_ptr<Collectives> group = mesh.world;
  if (rank == 1) group = std::make_shared<KillAtCall>(mesh.world, std::stoi(worker.get("KILL_AT")));
  try {
    CheckpointSaver(dir, 0, false, group).save(request(rank, 2));
    worker.write_text("rank0", "saved");
  } catch (const std::exception& error) {
    worker.write_text("rank0", error.what());
  }
}

// all_gather_strings makes 2 calls (lengths, then bytes); a save's phases are (distributed_
// checkpoint.cpp): the plans (calls 1-2), agreeing on them (3-4), "creating the temporary
// directory" (5-6), the written chunks (7-8), publishing (9-10). Call 5: rank 1 dies after rank
// 0 created the temporary directory, before writing its file; call 7: after writing it, while
// rank 0 waits for its chunk list (so the metadata is never written).
TEST(CheckpointSaveFailure, ARankKilledMidSaveLeavesThePreviousStep) {
  for (const int kill_at : {5, 7}) {
    SCOPED_TRACE("rank 1 killed at collective call " + std::to_string(kill_at));
    ParallelConfig parallel;
    parallel.dp_shard = 2;
    const WorkerResult result =
        run_workers("killed_mid_save", 2, parallel, {{"KILL_AT", std::to_string(kill_at)}}, 20);
    ASSERT_EQ(result.ranks.size(), 2u);
    EXPECT_EQ(result.ranks[1].signal, SIGKILL) << result.summary();
    // Rank 0's collective fails at once (Gloo sees the closed connection): it either records
    // the failed save or is stopped by the launcher after the drain period; it never publishes.
    const std::string rank0 = result.read_text("rank0");
    EXPECT_NE(rank0, "saved") << result.summary();
    if (!rank0.empty()) {
      EXPECT_EQ(rank0.rfind("checkpoint: saving step 2 failed (a rank stopped during the save; "
                            "latest names the newest complete step): world: ",
                            0),
                0u)
          << rank0;
    }
    const std::string checkpoints = (result.dir() / "ckpt").string();
    // Where rank 1 died: the step's temporary directory (never published) holds its file only
    // if it died after writing it.
    const std::string tmp = checkpoints + "/.tmp-step-00000002";
    EXPECT_TRUE(fs::is_directory(tmp));
    EXPECT_EQ(fs::exists(tmp + "/__1_0.safetensors"), kill_at == 7);
    EXPECT_FALSE(fs::exists(tmp + "/.metadata.json"));
    expect_previous_intact(checkpoints, "step-00000001", 2);
    std::cout << "kill at call " << kill_at << ": rank 0 " << result.ranks[0].describe() << ": "
              << rank0 << "\n";
    CheckpointReader reader(checkpoints + "/step-00000001");
    EXPECT_TRUE(reader.read_full("model.w").equal(at::full({4, 3}, 1.0f)));
  }
}

// --- the trainer's saves ---------------------------------------------------------------------

struct Limits {
  rlim_t file_size = RLIM_INFINITY;  // RLIMIT_FSIZE in bytes
  bool unprivileged = false;         // without root's capabilities when running as root
};

// `mixtrain <arguments>` in a child process with `limits`, its output in `log`.
CommandResult run_limited(const std::string& arguments, const Limits& limits,
                          const std::string& log) {
  const std::string command =
      std::string(MIXTRAIN_BINARY) + " " + arguments + " > " + log + " 2>&1";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // inherited across exec: write() fails with EFBIG instead
    if (limits.file_size != RLIM_INFINITY) {
      const rlimit limit{limits.file_size, limits.file_size};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(126);
    }
    // Root without the two capabilities that bypass permission bits, for this child and what it
    // execs: out of the bounding set, root's capabilities cannot come back at execve.
    if (limits.unprivileged && ::geteuid() == 0 &&
        (::prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0 ||
         ::prctl(PR_CAPBSET_DROP, CAP_DAC_READ_SEARCH, 0, 0, 0) != 0)) {
      ::_exit(126);
    }
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  CommandResult result;
  int status = 0;
  if (pid > 0 && ::waitpid(pid, &status, 0) == pid) {
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  result.output = read_text(log);
  return result;
}

class TrainerSaveFailure : public ::testing::Test {
 protected:
  // Run 1: 2 steps, saving step 2 (synchronously) into checkpoints_.
  void SetUp() override {
    fs::permissions(dir_.path(), fs::perms::all);  // the unprivileged run may enter and write
    const CommandResult first = run_mixtrain(command(dir_.file("run1")) +
                                             " --set train.steps=2 --set checkpoint.interval=2");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    ASSERT_EQ(read_text(checkpoints_ + "/latest"), "step-00000002\n");
    for (const auto& entry : fs::directory_iterator(checkpoints_ + "/step-00000002")) {
      rank_file_bytes_ = std::max<uintmax_t>(rank_file_bytes_, fs::file_size(entry.path()));
    }
  }
  std::string command(const std::string& run_dir) const {
    return "train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
           " --set train.lr_scheduler.warmup_steps=0 --set train.lr_scheduler.decay=constant" +
           " --set data.seq_len=32 --set checkpoint.dir=" + checkpoints_ + " --run-dir " + run_dir;
  }
  // Run 2: resumes from step 2 in a fresh run directory (writable by anyone) and saves every 2
  // steps up to `steps`.
  CommandResult resume(const Limits& limits, int steps, bool async) {
    const std::string run2 = dir_.file("run2");
    fs::create_directories(run2);
    fs::permissions(run2, fs::perms::all);
    return run_limited(command(run2) + " --set train.steps=" + std::to_string(steps) +
                           " --set checkpoint.interval=2 --set checkpoint.restore_from=" +
                           checkpoints_ + " --set checkpoint.async=" + (async ? "true" : "false"),
                       limits, run2 + "/output.log");
  }
  TempDir dir_;
  std::string checkpoints_ = dir_.file("checkpoints");
  uintmax_t rank_file_bytes_ = 0;
};

TEST_F(TrainerSaveFailure, DiskFull) {
  // Above every other file the run writes (metrics, log: a few KiB), below the rank file.
  ASSERT_GT(rank_file_bytes_, 256u << 10) << "the rank file must be larger than the limit";
  const CommandResult r = resume(Limits{128 << 10, false}, 4, false);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "mixtrain: error: checkpoint: saving step 4 failed while "
                       "writing the rank files (the previous checkpoint is untouched)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "untouched): rank 0: " + checkpoints_ + "/.tmp-step-00000004/"))
      << r.output;  // the failing rank named once
  EXPECT_TRUE(contains(r.output, "File too large")) << r.output;
  expect_previous_intact(checkpoints_, "step-00000002", 4);
}

TEST_F(TrainerSaveFailure, UnwritableDirectory) {
  fs::permissions(checkpoints_, fs::perms::owner_read | fs::perms::owner_exec |
                                    fs::perms::group_read | fs::perms::group_exec |
                                    fs::perms::others_read | fs::perms::others_exec);
  const CommandResult r = resume(Limits{RLIM_INFINITY, true}, 4, false);
  fs::permissions(checkpoints_, fs::perms::owner_all);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "restored step 2")) << r.output;  // reading needs no write
  EXPECT_TRUE(contains(r.output,
                       "mixtrain: error: checkpoint: saving step 4 failed while "
                       "creating the temporary directory"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "Permission denied")) << r.output;
  expect_previous_intact(checkpoints_, "step-00000002", 4);
}

TEST_F(TrainerSaveFailure, AsyncWriterFailureStopsTheTrainingLoop) {
  // The save of step 4 fails in the background; the save of step 6 joins it and rethrows, so
  // the run stops after step 6 with exit 1: steps 7 and 8 never run.
  const CommandResult r = resume(Limits{128 << 10, false}, 8, true);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "mixtrain: error: checkpoint: saving step 4 failed while "
                       "writing the rank files"))
      << r.output;
  // A step's metrics row is written after its save: rows for steps 3-5 only.
  std::vector<int64_t> steps;
  for (const auto& row : read_metrics(dir_.file("run2/metrics.jsonl")))
    steps.push_back(row["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 4, 5})) << r.output;
  expect_previous_intact(checkpoints_, "step-00000002", 4);
  EXPECT_FALSE(fs::exists(checkpoints_ + "/step-00000006"));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
