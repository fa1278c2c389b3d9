// A process a test starts, stopped and reaped however the test ends (RAII): a failed ASSERT_*,
// an exception or a normal return all run the destructor, which SIGKILLs the child's whole
// process group and reaps the child. So no test leaves a trainer run (or its ranks) behind.
//
//   ChildOptions options;
//   options.stderr_path = "/dev/null";
//   ChildProcess run({MIXTRAIN_BINARY, "train", ...}, options);
//   ASSERT_TRUE(...);               // on failure: ~ChildProcess kills and reaps the run
//   run.signal(SIGINT);
//   const int status = run.wait();  // raw waitpid status
//
// How: fork + execve (nothing but async-signal-safe calls between them; every string is
// prepared before the fork). The child
//   - leads a new process group (setpgid), so stop() reaches what it started too (the
//     launcher's ranks, the shell's command), and
//   - dies with the test process (PR_SET_PDEATHSIG SIGKILL), so even a test killed by ctest's
//     timeout leaves nothing behind. The death signal follows the thread that forked: start
//     children from the test's own thread, not from a thread that exits before them.
// stdout/stderr go to a file, to /dev/null, to a pipe the test reads (capture_output), or stay
// the test's own; stdin is the test's own or a pipe the test writes (pipe_input).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace mixtrain::testing {

struct ChildOptions {
  std::string stdout_path;                 // "": the test's own stdout (unless capture_output)
  std::string stderr_path;                 // "": the test's own stderr (unless capture_output)
  bool capture_output = false;             // stdout and stderr together into a pipe: read_output()
  bool pipe_input = false;                 // stdin from a pipe: write_input()
  std::map<std::string, std::string> env;  // added to (overriding) the test's environment
};

class ChildProcess {
 public:
  // Starts argv[0] (a path; no PATH search) with argv. Throws std::runtime_error when the fork
  // fails; an execve that fails makes the child exit with 127.
  explicit ChildProcess(std::vector<std::string> argv, ChildOptions options = {}) {
    if (argv.empty()) throw std::invalid_argument("ChildProcess: empty argv");
    std::vector<char*> args;
    for (std::string& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    std::vector<std::string> env_storage;
    for (char** item = environ; *item != nullptr; ++item) {
      const std::string entry = *item;
      if (options.env.count(entry.substr(0, entry.find('='))) == 0) env_storage.push_back(entry);
    }
    for (const auto& [key, value] : options.env) env_storage.push_back(key + "=" + value);
    std::vector<char*> envp;
    for (std::string& item : env_storage) envp.push_back(item.data());
    envp.push_back(nullptr);
    int pipe_fds[2] = {-1, -1};
    if (options.capture_output && pipe2(pipe_fds, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("ChildProcess: pipe: ") + std::strerror(errno));
    }
    int input_fds[2] = {-1, -1};
    if (options.pipe_input && pipe2(input_fds, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("ChildProcess: pipe: ") + std::strerror(errno));
    }
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) {
      throw std::runtime_error(std::string("ChildProcess: fork: ") + std::strerror(errno));
    }
    if (pid_ == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the test died before the line above
      if (options.capture_output) {
        dup2(pipe_fds[1], STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copies
        dup2(pipe_fds[1], STDERR_FILENO);
      }
      if (options.pipe_input) dup2(input_fds[0], STDIN_FILENO);
      redirect(options.stdout_path, STDOUT_FILENO);
      redirect(options.stderr_path, STDERR_FILENO);
      execve(args[0], args.data(), envp.data());
      _exit(127);
    }
    setpgid(pid_, pid_);  // also here: no window where stop() would miss the group
    if (options.capture_output) {
      close(pipe_fds[1]);
      output_fd_ = pipe_fds[0];
    }
    if (options.pipe_input) {
      close(input_fds[0]);
      input_fd_ = input_fds[1];
    }
  }
  ~ChildProcess() {
    stop();
    if (output_fd_ >= 0) close(output_fd_);
    if (input_fd_ >= 0) close(input_fd_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool reaped() const { return status_.has_value(); }

  // Sends `signal_number` to the child only (not its group); nothing once it is reaped.
  void signal(int signal_number) const {
    if (!reaped()) kill(pid_, signal_number);
  }

  // Everything the child writes to stdout/stderr until it closes them (capture_output).
  std::string read_output() {
    std::string text;
    if (output_fd_ < 0) return text;
    char buffer[4096];
    for (;;) {
      const ssize_t n = read(output_fd_, buffer, sizeof(buffer));
      if (n > 0) {
        text.append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        break;
      }
    }
    return text;
  }

  // The next line the child writes (without its newline); nullopt once it closes its output
  // (capture_output).
  std::optional<std::string> read_line() {
    std::string line;
    char c;
    for (;;) {
      const ssize_t n = read(output_fd_, &c, 1);
      if (n == 1) {
        if (c == '\n') return line;
        line += c;
      } else if (n == 0 || errno != EINTR) {
        return std::nullopt;
      }
    }
  }

  // Writes `text` to the child's stdin (pipe_input); false when the child no longer reads it. A
  // closed pipe's SIGPIPE is blocked and taken back here, so it cannot end the test.
  bool write_input(const std::string& text) {
    sigset_t pipe_signal, old;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, &old);
    size_t done = 0;
    bool ok = input_fd_ >= 0;
    while (ok && done < text.size()) {
      const ssize_t n = write(input_fd_, text.data() + done, text.size() - done);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && errno != EINTR) {
        ok = false;
      }
    }
    const timespec now{0, 0};
    while (sigtimedwait(&pipe_signal, nullptr, &now) == SIGPIPE) {
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return ok;
  }

  // Waits for the child to end; returns its raw waitpid status (WIFEXITED, ...).
  int wait() {
    while (!reaped()) {
      int status = 0;
      const pid_t result = waitpid(pid_, &status, 0);
      if (result == pid_) {
        status_ = status;
      } else if (result < 0 && errno != EINTR) {
        throw std::runtime_error(std::string("ChildProcess: waitpid: ") + std::strerror(errno));
      }
    }
    return *status_;
  }

  // Like wait(), but gives up after `seconds` (nullopt: still running).
  std::optional<int> wait_for(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!reaped()) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return status_;
  }

  // SIGKILL to the child's process group, then reap the child. Nothing once it is reaped.
  void stop() {
    if (reaped()) return;
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);  // in case it left its group
    wait();
  }

 private:
  static void redirect(const std::string& path, int fd) {
    if (path.empty()) return;
    const int file = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (file < 0) _exit(127);
    dup2(file, fd);
  }

  pid_t pid_ = -1;
  int output_fd_ = -1;
  int input_fd_ = -1;
  std::optional<int> status_;
};

// Exit code of a raw waitpid status; -1 when a signal ended the process.
inline int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The running children of `pid` (all its threads'), from /proc.
inline std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  const std::string task_dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* dir = opendir(task_dir.c_str());
  if (dir == nullptr) return out;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream in(task_dir + "/" + entry->d_name + "/children");
    pid_t child;
    while (in >> child) out.push_back(child);
  }
  closedir(dir);
  return out;
}

// True when `pid` no longer runs: gone, or a zombie waiting for its parent to reap it.
inline bool process_ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');  // "pid (comm) S ...": comm may hold spaces
  return close == std::string::npos || line.compare(close + 2, 1, "Z") == 0 ||
         line.compare(close + 2, 1, "X") == 0;
}

}  // namespace mixtrain::testing
