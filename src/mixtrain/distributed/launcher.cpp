#include "mixtrain/distributed/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/distributed/rendezvous.h"

extern char** environ;

namespace mixtrain {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string format_seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", seconds);
  return text;
}

// The last SIGINT/SIGTERM received while workers run (0: none); forwarded by the wait loop.
volatile std::sig_atomic_t g_received_signal = 0;

void remember_signal(int signal_number) {
  g_received_signal = signal_number;
}

// Installs the forwarding handlers for the lifetime of a launch and restores the old ones.
class SignalForwarding {
 public:
  explicit SignalForwarding(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    g_received_signal = 0;
    struct sigaction action {};
    action.sa_handler = remember_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~SignalForwarding() {
    if (!enabled_) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  bool enabled_;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// argv/envp for execve, built before fork: the child of a multi-threaded process may only make
// async-signal-safe calls, so no allocation after fork.
struct ExecImage {
  std::vector<std::string> argv_storage;
  std::vector<std::string> env_storage;
  std::vector<char*> argv;
  std::vector<char*> envp;
  std::string output_path;

  explicit ExecImage(const WorkerSpec& spec)
      : argv_storage(spec.argv), output_path(spec.output_path) {
    if (argv_storage.empty()) argv_storage.push_back("mixtrain");
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      const std::string item = *entry;
      const std::string key = item.substr(0, item.find('='));
      if (spec.env.count(key) == 0) env_storage.push_back(item);
    }
    for (const auto& [key, value] : spec.env) env_storage.push_back(key + "=" + value);
    for (std::string& arg : argv_storage) argv.push_back(arg.data());
    argv.push_back(nullptr);
    for (std::string& item : env_storage) envp.push_back(item.data());
    envp.push_back(nullptr);
  }
};

[[noreturn]] void exec_child(ExecImage& image, pid_t parent) {
  // Die with the launcher, even if it is SIGKILLed; if it died before this line, quit now.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (!image.output_path.empty()) {
    const int fd = open(image.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) _exit(127);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
  }
  execve("/proc/self/exe", image.argv.data(), image.envp.data());
  const char message[] = "mixtrain launcher: execve(/proc/self/exe) failed\n";
  ssize_t ignored = write(STDERR_FILENO, message, sizeof(message) - 1);
  (void)ignored;
  _exit(127);
}

void signal_all(const std::vector<WorkerOutcome>& outcomes, const std::vector<bool>& running,
                int signal_number) {
  for (size_t i = 0; i < outcomes.size(); ++i) {
    if (running[i]) kill(outcomes[i].pid, signal_number);
  }
}

}  // namespace

std::string WorkerOutcome::describe() const {
  if (signal != 0) {
    const char* name = sigabbrev_np(signal);
    return "killed by signal " + std::to_string(signal) +
           (name != nullptr ? " (SIG" + std::string(name) + ")" : std::string()) +
           (stopped_by_launcher ? " from the launcher" : "");
  }
  return "exited with code " + std::to_string(exit_code);
}

std::vector<WorkerOutcome> run_worker_processes(const std::vector<WorkerSpec>& workers,
                                                const LaunchOptions& options) {
  std::vector<ExecImage> images;
  images.reserve(workers.size());
  for (const WorkerSpec& spec : workers) images.emplace_back(spec);

  SignalForwarding forwarding(options.forward_signals);
  const Clock::time_point start = Clock::now();
  std::vector<WorkerOutcome> outcomes(workers.size());
  std::vector<bool> running(workers.size(), false);
  const pid_t self = getpid();
  for (size_t rank = 0; rank < workers.size(); ++rank) {
    const pid_t pid = fork();
    if (pid == 0) exec_child(images[rank], self);
    if (pid < 0) {
      const std::string reason = std::strerror(errno);
      signal_all(outcomes, running, SIGKILL);
      for (size_t i = 0; i < rank; ++i) waitpid(outcomes[i].pid, nullptr, 0);
      throw UserError("launcher: cannot start worker " + std::to_string(rank) + ": " + reason);
    }
    outcomes[rank].pid = pid;
    running[rank] = true;
  }

  size_t live = workers.size();
  bool failed = false;
  Clock::time_point failure_time;
  bool terminated = false;
  Clock::time_point term_time;
  bool killed = false;
  auto stop_all = [&](int signal_number) {
    for (size_t i = 0; i < outcomes.size(); ++i) {
      if (running[i]) outcomes[i].stopped_by_launcher = true;
    }
    signal_all(outcomes, running, signal_number);
  };

  while (live > 0) {
    bool reaped_any = false;
    for (size_t rank = 0; rank < outcomes.size(); ++rank) {
      if (!running[rank]) continue;
      int status = 0;
      const pid_t result = waitpid(outcomes[rank].pid, &status, WNOHANG);
      if (result == 0 || (result < 0 && errno == EINTR)) continue;
      running[rank] = false;
      --live;
      reaped_any = true;
      WorkerOutcome& outcome = outcomes[rank];
      outcome.seconds = seconds_since(start);
      if (result > 0 && WIFSIGNALED(status)) {
        outcome.signal = WTERMSIG(status);
      } else if (result > 0 && WIFEXITED(status)) {
        outcome.exit_code = WEXITSTATUS(status);
      }
      if (!outcome.ok()) {
        if (options.log_failures && !outcome.stopped_by_launcher) {
          log_error("launcher: rank " + std::to_string(rank) + " (pid " +
                    std::to_string(outcome.pid) + ") " + outcome.describe() + " after " +
                    format_seconds(outcome.seconds) + " s");
        }
        if (!failed) {
          failed = true;
          failure_time = Clock::now();
        }
      }
    }
    if (live == 0) break;

    if (const int received = g_received_signal) {
      g_received_signal = 0;
      log_warn("launcher: received signal " + std::to_string(received) +
               ", forwarding it to the workers");
      signal_all(outcomes, running, received);
      failed = true;
      if (!terminated) {  // the forwarded signal stands in for SIGTERM; SIGKILL after the grace
        terminated = true;
        term_time = Clock::now();
      }
    }
    if (!terminated && options.deadline_s > 0 && seconds_since(start) > options.deadline_s) {
      if (options.log_failures) {
        log_error("launcher: stopping workers still running after the " +
                  format_seconds(options.deadline_s) + " s deadline (SIGTERM)");
      }
      failed = true;
      stop_all(SIGTERM);
      terminated = true;
      term_time = Clock::now();
    }
    if (failed && !terminated && seconds_since(failure_time) >= options.drain_s) {
      std::string ranks;
      for (size_t i = 0; i < outcomes.size(); ++i) {
        if (running[i]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(i);
      }
      if (options.log_failures) {
        log_error("launcher: stopping ranks still running after a failure (SIGTERM): " + ranks);
      }
      stop_all(SIGTERM);
      terminated = true;
      term_time = Clock::now();
    }
    if (terminated && !killed && seconds_since(term_time) >= options.kill_grace_s) {
      stop_all(SIGKILL);
      killed = true;
    }
    if (!reaped_any) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return outcomes;
}

ReservedPort::ReservedPort() {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw UserError(std::string("launcher: socket() failed: ") + std::strerror(errno));
  const int on = 1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
      bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string reason = std::strerror(errno);
    close(fd_);
    throw UserError("launcher: cannot find a free port on 127.0.0.1: " + reason);
  }
  port_ = ntohs(address.sin_port);
}

ReservedPort::~ReservedPort() {
  close(fd_);
}

int threads_per_worker(int nproc) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, nproc));
}

int launch_local_workers(int nproc, const std::vector<std::string>& argv, double timeout_s) {
  if (nproc < 1) throw ConfigError("--nproc: must be >= 1, got " + std::to_string(nproc));
  const auto reserved = std::make_shared<const ReservedPort>();
  const int port = reserved->port();
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::vector<WorkerSpec> workers(nproc);
  for (int rank = 0; rank < nproc; ++rank) {
    WorkerSpec& spec = workers[rank];
    spec.argv = argv;
    spec.env = {{"RANK", std::to_string(rank)},
                {"WORLD_SIZE", std::to_string(nproc)},
                {"LOCAL_RANK", std::to_string(rank)},
                {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", std::to_string(port)},
                {kLaunchedEnv, "1"}};
    spec.reserved_port = reserved;
    if (omp == nullptr || *omp == '\0') {
      spec.env["OMP_NUM_THREADS"] = std::to_string(threads_per_worker(nproc));
    }
  }
  LaunchOptions options;
  options.drain_s = std::min(timeout_s, 2.0);
  log_info("launcher: starting " + std::to_string(nproc) + " workers (MASTER_PORT " +
           std::to_string(port) + ")");
  const std::vector<WorkerOutcome> outcomes = run_worker_processes(workers, options);
  int failures = 0;
  // The exit code every failed worker chose itself (e.g. 2 for an error all ranks agreed on),
  // or 0 when they differ or one was ended by a signal.
  int common_code = -1;
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    if (outcomes[rank].ok()) continue;
    ++failures;
    const int code = outcomes[rank].signal == 0 ? outcomes[rank].exit_code : 0;
    common_code = common_code == -1 || common_code == code ? code : 0;
    if (outcomes[rank].stopped_by_launcher) {
      log_error("launcher: rank " + std::to_string(rank) + " " + outcomes[rank].describe() +
                " (still running after another rank failed)");
    }
  }
  if (failures == 0) return 0;
  log_error("launcher: " + std::to_string(failures) + " of " + std::to_string(nproc) +
            " workers failed");
  return common_code > 0 ? common_code : 1;
}

}  // namespace mixtrain
