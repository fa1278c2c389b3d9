// The local launcher and the failure behaviour of a job (issue 4 part 2): a rank killed with
// SIGKILL mid-collective, a rank that hangs, a rank that raises. In each case every other rank
// exits non-zero with a message naming its rank and the operation, within the timeout plus a
// margin, and no worker process is left (kill(pid, 0) fails with ESRCH on every recorded pid).
// And MASTER_PORT (ReservedPort): nothing else can take it between its choice and rank 0's
// store binding it (issue 29 item 4: parallel tests under ctest -j).
#include "mixtrain/distributed/launcher.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include "mixtrain/core/error.h"
#include "support/multiprocess.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::run_workers;
using testing::WorkerResult;

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool gone(pid_t pid) {
  return kill(pid, 0) != 0 && errno == ESRCH;
}

std::string env_or_unset(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "(unset)";
}

// ---- launch_local_workers: workers are this binary, told what to run through the env -------

// Sets env variables for the duration of a test (children inherit them), then restores.
class ScopedEnv {
 public:
  void set(const char* name, const std::string& value) {
    remember(name);
    setenv(name, value.c_str(), 1);
  }
  void unset(const char* name) {
    remember(name);
    unsetenv(name);
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  void remember(const char* name) {
    if (saved_.count(name) != 0) return;
    const char* value = std::getenv(name);
    saved_[name] = value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "mixtrain_launcher_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string read(const std::string& name) const {
    std::ifstream in(path_ / name);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  std::filesystem::path path_;
};

MIXTRAIN_WORKER(report_env) {
  const RankInfo info = detect_rank_info();
  std::ifstream cmdline_file("/proc/self/cmdline");
  std::string cmdline((std::istreambuf_iterator<char>(cmdline_file)), {});
  for (char& c : cmdline) c = c == '\0' ? ' ' : c;
  worker.write_text("env" + std::to_string(info.rank),
                    info.launcher + " " + std::to_string(info.rank) + "/" +
                        std::to_string(info.world_size) + " local " +
                        std::to_string(info.local_rank) + " " + info.master_addr + " " +
                        env_or_unset("MIXTRAIN_LAUNCHED") + " omp " +
                        env_or_unset("OMP_NUM_THREADS") + " argv " + cmdline);
  worker.write_text("port" + std::to_string(info.rank), std::to_string(info.master_port));
}

TEST(LauncherTest, WorkersGetTheRankVariablesAndArguments) {
  TempDir dir;
  ScopedEnv env;
  env.set("MIXTRAIN_TEST_WORKER", "report_env");
  env.set("MIXTRAIN_TEST_DIR", dir.path().string());
  env.unset("OMP_NUM_THREADS");
  const std::vector<std::string> argv = {"mixtrain", "train", "--config", "x.yaml"};
  ASSERT_EQ(launch_local_workers(2, argv, 60), 0);
  const std::string omp = std::to_string(threads_per_worker(2));
  EXPECT_EQ(dir.read("env0"), "mixtrain 0/2 local 0 127.0.0.1 1 omp " + omp +
                                  " argv mixtrain train --config x.yaml ");
  EXPECT_EQ(dir.read("env1"), "mixtrain 1/2 local 1 127.0.0.1 1 omp " + omp +
                                  " argv mixtrain train --config x.yaml ");
  EXPECT_EQ(dir.read("port0"), dir.read("port1"));
  EXPECT_GT(std::stoi(dir.read("port0")), 0);

  // An OMP_NUM_THREADS the user set is kept.
  env.set("OMP_NUM_THREADS", "3");
  ASSERT_EQ(launch_local_workers(1, argv, 60), 0);
  EXPECT_NE(dir.read("env0").find(" omp 3 "), std::string::npos) << dir.read("env0");
  EXPECT_EQ(threads_per_worker(1000000), 1);
}

// Rank 1 exits with code 3 at once; rank 0 would sleep for a minute.
MIXTRAIN_WORKER(one_exits) {
  const RankInfo info = detect_rank_info();
  worker.write_text("pid" + std::to_string(info.rank), std::to_string(getpid()));
  if (info.rank == 1) _exit(3);
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

TEST(LauncherTest, FailedWorkerStopsTheOthersAndReturnsNonZero) {
  TempDir dir;
  ScopedEnv env;
  env.set("MIXTRAIN_TEST_WORKER", "one_exits");
  env.set("MIXTRAIN_TEST_DIR", dir.path().string());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(launch_local_workers(2, {"mixtrain"}, 60), 0);
  // drain (2 s) + SIGTERM, far below rank 0's minute of sleep.
  EXPECT_LT(since(start), 20.0);
  for (int r = 0; r < 2; ++r) {
    const std::string pid = dir.read("pid" + std::to_string(r));
    ASSERT_FALSE(pid.empty());
    EXPECT_TRUE(gone(std::stoi(pid))) << "rank " << r << " pid " << pid << " still exists";
  }
}

MIXTRAIN_WORKER(sleeper) {
  worker.write_text("pid" + std::to_string(worker.rank.rank), std::to_string(getpid()));
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

TEST(LauncherTest, ForwardsSigtermToTheWorkers) {
  TempDir dir;
  ScopedEnv env;
  env.set("MIXTRAIN_TEST_WORKER", "sleeper");
  env.set("MIXTRAIN_TEST_DIR", dir.path().string());
  std::thread sender([&] {
    // Once both workers run (the launcher's handlers are installed before any worker starts).
    while (!std::filesystem::exists(dir.path() / "pid0") ||
           !std::filesystem::exists(dir.path() / "pid1")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(getpid(), SIGTERM);
  });
  const auto start = std::chrono::steady_clock::now();
  const int status = launch_local_workers(2, {"mixtrain"}, 60);
  sender.join();
  EXPECT_NE(status, 0);
  EXPECT_LT(since(start), 30.0);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(gone(std::stoi(dir.read("pid" + std::to_string(r)))));
}

// ---- faults inside a job: run_workers (the launcher's run_worker_processes) ----------------

// Every rank does a few all-reduces; the faulty rank (FAULT_RANK) misbehaves (FAULT) while the
// others are inside the next one. Survivors record how long that op took to fail, and why.
MIXTRAIN_WORKER(faulty_job) {
  const int rank = worker.rank.rank;
  worker.write_text("pid" + std::to_string(rank), std::to_string(getpid()));
  const DeviceMesh mesh = worker.make_mesh();
  const int faulty = std::stoi(worker.get("FAULT_RANK"));
  const std::string fault = worker.get("FAULT");
  for (int step = 0; step < 3; ++step) {
    at::Tensor t = at::ones({1024});
    mesh.world->all_reduce_sum(t);
  }
  if (rank == faulty) {
    // Let the others enter the collective first: they are mid-collective when this hits.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (fault == "kill") raise(SIGKILL);
    if (fault == "hang") std::this_thread::sleep_for(std::chrono::seconds(1000));
    if (fault == "raise") throw UserError("rank " + std::to_string(rank) + " gave up");
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    at::Tensor t = at::ones({1 << 20});
    mesh.world->all_reduce_sum(t);
  } catch (const UserError& error) {
    worker.write_text("failed" + std::to_string(rank),
                      std::to_string(since(start)) + "\n" + error.what());
    throw;
  }
}

struct FaultRun {
  WorkerResult result;
  std::vector<double> detect_s;  // per survivor: seconds from entering the op to the error
};

FaultRun run_fault(const std::string& fault, int nproc, int faulty, double timeout_s) {
  ParallelConfig parallel;
  parallel.dp_shard = nproc;
  FaultRun run;
  run.result = run_workers("faulty_job", nproc, parallel,
                           {{"FAULT", fault}, {"FAULT_RANK", std::to_string(faulty)}}, timeout_s);
  const WorkerResult& result = run.result;
  EXPECT_EQ(result.ranks.size(), static_cast<size_t>(nproc));
  for (int r = 0; r < nproc; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_FALSE(result.ranks[r].ok()) << result.summary();
    EXPECT_TRUE(gone(result.ranks[r].pid));
    EXPECT_EQ(result.read_text("pid" + std::to_string(r)), std::to_string(result.ranks[r].pid));
    if (r == faulty) continue;
    // A survivor: its own UserError (exit code 1), naming the group, op and its rank.
    EXPECT_EQ(result.ranks[r].signal, 0) << result.summary();
    EXPECT_EQ(result.ranks[r].exit_code, 1) << result.summary();
    const std::string failed = result.read_text("failed" + std::to_string(r));
    const std::string message = failed.substr(failed.find('\n') + 1);
    EXPECT_EQ(message.rfind("world: all_reduce_sum failed on rank " + std::to_string(r) + ": ", 0),
              0u)
        << failed;
    EXPECT_NE(result.outputs[r].find("ERROR: " + message), std::string::npos) << result.summary();
    run.detect_s.push_back(std::stod(failed));
  }
  std::cout << "[ fault " << fault << " ] detection (s):";
  for (double s : run.detect_s) std::cout << " " << s;
  std::cout << "; whole run " << result.seconds << " s\n";
  for (int r = 0; r < nproc; ++r) {
    if (r != faulty) std::cout << "  " << result.read_text("failed" + std::to_string(r)) << "\n";
  }
  return run;
}

TEST(LauncherTest, RankKilledMidCollectiveFailsEveryOtherRank) {
  const FaultRun run = run_fault("kill", 3, 1, 20);
  EXPECT_EQ(run.result.ranks[1].signal, SIGKILL);
  EXPECT_FALSE(run.result.ranks[1].stopped_by_launcher);
  // A closed connection is noticed at once, long before the 20 s timeout.
  for (double s : run.detect_s) EXPECT_LT(s, 5.0);
  EXPECT_LT(run.result.seconds, 20.0 + 15.0);
}

TEST(LauncherTest, HungRankTimesOutTheOthersAndIsKilled) {
  const double timeout = 3;
  const FaultRun run = run_fault("hang", 2, 1, timeout);
  // The hanger never exits by itself: the launcher stops it after the survivor failed.
  EXPECT_TRUE(run.result.ranks[1].stopped_by_launcher) << run.result.summary();
  EXPECT_EQ(run.result.ranks[1].signal, SIGTERM);
  ASSERT_EQ(run.detect_s.size(), 1u);
  EXPECT_GE(run.detect_s[0], timeout - 0.5);
  EXPECT_LT(run.detect_s[0], timeout + 3.0);
  EXPECT_NE(run.result.read_text("failed0").find("Timed out"), std::string::npos)
      << run.result.read_text("failed0");
  // start-up + timeout + drain (2 s) + SIGTERM, with a margin for a loaded machine.
  EXPECT_LT(run.result.seconds, timeout + 20.0);
}

TEST(LauncherTest, RaisingRankFailsTheOthers) {
  const FaultRun run = run_fault("raise", 2, 1, 20);
  EXPECT_EQ(run.result.ranks[1].exit_code, 1);
  EXPECT_NE(run.result.outputs[1].find("ERROR: rank 1 gave up"), std::string::npos);
  for (double s : run.detect_s) EXPECT_LT(s, 5.0);
}

// ---- MASTER_PORT: reserved from its choice until the ranks are done -------------------------

// What another program holds when it got the port: a plain server socket on 127.0.0.1:port (no
// SO_REUSEADDR), listening. Returns its fd, or -errno when the bind failed.
int take_port(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(fd, 16) != 0) {
    const int error = errno;
    close(fd);
    return -error;
  }
  return fd;
}

// Rank 0's store as device_mesh.cpp's connect_store hosts it (libuv server), or the legacy
// server: both set SO_REUSEADDR, which is what lets them share the port with the reservation.
c10::intrusive_ptr<c10d::TCPStore> host_store(int port, bool libuv) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = true;
  options.numWorkers = 1;
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(10);
  options.useLibUV = libuv;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// The collision itself, in one process: a thief that takes a chosen port before rank 0's store
// binds it makes the store fail ("address already in use", what a launch saw when a parallel
// test got its port); while the port is reserved the same thief is refused, and the store
// still binds it. After the reservation is gone the thief gets the port: it is the reservation
// that refuses it, not something else about the port.
TEST(ReservedPortTest, RefusesAThiefAndLetsRankZerosStoreBindThePort) {
  int released_port = 0;
  {
    const ReservedPort reserved;
    released_port = reserved.port();
  }
  const int early_thief = take_port(released_port);
  ASSERT_GE(early_thief, 0) << std::strerror(-early_thief);
  try {
    host_store(released_port, /*libuv=*/true);
    ADD_FAILURE() << "rank 0's store bound a port a thief holds";
  } catch (const std::exception& error) {
    EXPECT_NE(lower(error.what()).find("address already in use"), std::string::npos)
        << error.what();
  }
  close(early_thief);

  for (const bool libuv : {true, false}) {
    SCOPED_TRACE(libuv ? "libuv store" : "legacy store");
    auto reserved = std::make_unique<ReservedPort>();
    const int port = reserved->port();
    EXPECT_GT(port, 0);
    EXPECT_EQ(take_port(port), -EADDRINUSE);
    {
      const auto store = host_store(port, libuv);
      store->set("key", std::vector<uint8_t>{7});
      EXPECT_EQ(store->get("key"), std::vector<uint8_t>{7});
      EXPECT_EQ(take_port(port), -EADDRINUSE);  // the store and the reservation hold it
    }
    reserved.reset();
    const int late_thief = take_port(port);
    EXPECT_GE(late_thief, 0) << std::strerror(-late_thief);
    if (late_thief >= 0) close(late_thief);
  }
}

// Rank 0 tries to take MASTER_PORT the way another program would, at the last moment before
// its store binds it; a thief that gets it keeps it. Then every rank joins the mesh and
// all-reduces.
MIXTRAIN_WORKER(thief_then_rendezvous) {
  if (worker.rank.rank == 0) {
    const int thief = take_port(worker.rank.master_port);
    worker.write_text("thief", thief >= 0 ? "took the port" : std::strerror(-thief));
  }
  const DeviceMesh mesh = worker.make_mesh();
  at::Tensor t = at::ones({1});
  mesh.world->all_reduce_sum(t);
  worker.write_text("sum" + std::to_string(worker.rank.rank), std::to_string(t.item<double>()));
}

// Both ways of starting ranks, the test harness (run_workers) and `mixtrain --nproc`
// (launch_local_workers), keep MASTER_PORT reserved until the ranks are reaped: the thief is
// refused and the job runs. With the port released before the ranks start (the old
// pick_free_port), the thief takes it and rank 0 fails.
TEST(LauncherTest, AThiefCannotTakeMasterPortBeforeRankZerosStoreBindsIt) {
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  const WorkerResult result = run_workers("thief_then_rendezvous", 2, parallel, {}, 20);
  EXPECT_EQ(result.read_text("thief"), std::strerror(EADDRINUSE));
  ASSERT_TRUE(result.all_ok()) << result.summary();
  EXPECT_EQ(result.read_text("sum0"), std::to_string(2.0));
  EXPECT_EQ(result.read_text("sum1"), std::to_string(2.0));

  TempDir dir;
  ScopedEnv env;
  env.set("MIXTRAIN_TEST_WORKER", "thief_then_rendezvous");
  env.set("MIXTRAIN_TEST_DIR", dir.path().string());
  EXPECT_EQ(launch_local_workers(2, {"mixtrain"}, 20), 0);
  EXPECT_EQ(dir.read("thief"), std::strerror(EADDRINUSE));
  EXPECT_EQ(dir.read("sum1"), std::to_string(2.0));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
