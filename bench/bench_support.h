// What the bench programs share (the plain ones, without Google Benchmark, most of it; a Google
// Benchmark program may use the figures): what machine a benchmark ran on, for the figures it
// prints (the CPU model, the memory, the filesystem of a directory: a checkpoint or swap file on
// tmpfs never reaches a disk); and the plumbing around a measurement (failing with the program's
// name, the command line, an option's value, a fresh work directory, a child process logging to
// a file, the end of that log, a JSON-lines file, a median); and the configs they write: the
// optimizer and precision sections they share, and the ~41M-parameter config two of them train.
// Header-only.
#pragma once

#include <fcntl.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace mixtrain::bench {

// --- the machine ----------------------------------------------------------------------------

// The "model name" of the first CPU in /proc/cpuinfo; "unknown" when it says none.
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

// MemTotal in KiB; -1 when /proc/meminfo does not say.
inline long mem_total_kib() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long value = 0;
  while (in >> key >> value) {
    if (key == "MemTotal:") return value;
    in.ignore(1 << 10, '\n');
  }
  return -1;
}

// The filesystem `path` is on, by statfs's f_type ("tmpfs (RAM: nothing reaches a disk)");
// "f_type 0x..." for one not listed, "unknown" when statfs fails.
inline std::string filesystem_of(const std::string& path) {
  struct statfs st {};
  if (statfs(path.c_str(), &st) != 0) return "unknown";
  struct Known {
    unsigned long magic;
    const char* name;
  };
  const Known known[] = {
      {0xEF53, "ext4 (ext2/3/4)"},
      {0x01021994, "tmpfs (RAM: nothing reaches a disk)"},
      {0x58465342, "xfs"},
      {0x9123683E, "btrfs"},
      {0x794C7630, "overlay"},
      {0x6969, "nfs"},
      {0x2FC12FC1, "zfs"},
      {0x65735546, "fuse"},
      {0x858458F6, "ramfs (RAM: nothing reaches a disk)"},
  };
  for (const Known& k : known) {
    if (static_cast<unsigned long>(st.f_type) == k.magic) return k.name;
  }
  char hex[32];
  std::snprintf(hex, sizeof(hex), "f_type 0x%lx", static_cast<unsigned long>(st.f_type));
  return hex;
}

// --- the program ----------------------------------------------------------------------------

// The name fail() puts before its message ("bench_swap_optimizer"); a program sets it first
// thing in main: program_name() = "bench_...".
inline std::string& program_name() {
  static std::string name = "bench";
  return name;
}

// Prints "<program_name()>: <message>" to stderr and exits with code 1.
[[noreturn]] inline void fail(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", program_name().c_str(), message.c_str());
  std::exit(1);
}

// The value of the option argv[i] (that is, argv[i + 1]), advancing i past it; fail()s with
// "<option> needs a value" when argv ends at the option.
inline std::string option_value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) fail(std::string(argv[i]) + " needs a value");
  return argv[++i];
}

// The whole number `text` (an option's value, by atoi); fail()s with "<option> must be >=
// <minimum>", followed by " (<why>)" when `why` is given, when it is smaller.
inline int int_at_least(const std::string& text, const char* option, int minimum,
                        const char* why = nullptr) {
  const int value = std::atoi(text.c_str());
  if (value < minimum) {
    fail(std::string(option) + " must be >= " + std::to_string(minimum) +
         (why != nullptr ? std::string(" (") + why + ")" : ""));
  }
  return value;
}

// Parses the command line of a program whose own options `own` takes: own(arg, value) handles
// the option `arg` (value() is its value, through option_value) and returns true, or returns
// false for one it does not know. The programs' common arguments are handled here: -h/--help
// prints "usage: <argv[0]> <usage>" (the rest of the usage line and the help text) and exits 0;
// --work-dir DIR sets `work_dir`, --keep sets `keep`; where `binary` is not null, an argument
// not starting with '-' sets *binary (the mixtrain binary to run). Any other argument fail()s
// with "unknown argument <arg> (see --help)".
inline void parse_arguments(
    int argc, char** argv, const char* usage, std::string* binary, std::string& work_dir,
    bool& keep,
    const std::function<bool(const std::string&, const std::function<std::string()>&)>& own) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::function<std::string()> value = [&] { return option_value(argc, argv, i); };
    if (own(arg, value)) continue;
    if (arg == "--work-dir") {
      work_dir = value();
    } else if (arg == "--keep") {
      keep = true;
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: %s %s", argv[0], usage);
      std::exit(0);
    } else if (binary != nullptr && !arg.empty() && arg[0] != '-') {
      *binary = arg;
    } else {
      fail("unknown argument " + arg + " (see --help)");
    }
  }
}

// fail()s with "cannot run <path> (build the mixtrain target, or pass its path)" unless `path`
// is executable (the `mixtrain` binary a program runs as a child).
inline void require_executable(const std::string& path) {
  if (access(path.c_str(), X_OK) != 0) {
    fail("cannot run " + path + " (build the mixtrain target, or pass its path)");
  }
}

// --- configs ------------------------------------------------------------------------------

// configs/qwen2_moe_tiny.yaml's optimizer and precision sections (fp32-main-params §1: bfloat16
// model, fp32 main params, Muon + AdamW, FSDP reducing in float32), for the configs the
// programs write: a comment line first, these sections, then the model and what follows it.
inline constexpr const char* kMuonAdamWSections = R"(model_init_dtype: bfloat16
optimizer:
  _target_: Muon
  fp32_main_params: true
  muon_config:
    muon_lr: 0.02
    muon_weight_decay: 0.0
    muon_momentum: 0.95
    muon_nesterov: true
    muon_ns_steps: 5
    muon_ns_variant: asym5
  adamw_config:
    adamw_lr: 0.001
    adamw_weight_decay: 0.01
fsdp_config:
  mix_precision:
    param_dtype: bfloat16
    reduce_dtype: float32
    output_dtype: bfloat16
    cast_forward_inputs: true
)";

// A ~41M-parameter Qwen2-MoE with kMuonAdamWSections: vocab 16000, hidden 384, 6 layers, 8
// experts of 384 (top 2), shared expert 768, 128-token sequences, global batch 4 in micro-batches
// of 2. bench_train_throughput and bench_twin_ratio train it.
inline const std::string kMedium41MConfig =
    std::string("# Written by a mixtrain bench program (bench/bench_support.h).\n") +
    kMuonAdamWSections + R"(model:
  name: qwen2_moe
  vocab_size: 16000
  hidden_size: 384
  num_layers: 6
  num_heads: 6
  num_kv_heads: 2
  head_dim: 64
  moe_intermediate_size: 384
  num_experts: 8
  num_experts_per_tok: 2
  shared_expert_intermediate_size: 768
  max_seq_len: 128
data:
  kind: synthetic
  seq_len: 128
  micro_batch_size: 2
  global_batch_size: 4
train:
  seed: 1234
  max_grad_norm: 1.0
  lr_scheduler:
    warmup_steps: 2
checkpoint:
  interval: 0
)";

// --- the work directory ---------------------------------------------------------------------

// Creates a fresh directory "<base>/<prefix>-XXXXXX" (mkdtemp) and returns its path; an empty
// `base` means $TMPDIR, or /tmp where that is unset. fail()s when it cannot.
inline std::string make_work_dir(std::string base, const std::string& prefix) {
  if (base.empty()) base = std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp";
  std::string pattern = base + "/" + prefix + "-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    fail("cannot create a directory under " + base + ": " + std::strerror(errno));
  }
  return pattern;
}

// The end of a run: with `keep`, prints "<kept_message><dir>\n" on stdout and leaves `dir`;
// otherwise removes `dir` and everything in it, errors ignored.
inline void keep_or_remove(const std::string& dir, bool keep, const char* kept_message) {
  if (keep) {
    std::printf("%s%s\n", kept_message, dir.c_str());
  } else {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
}

// --- child processes and their files --------------------------------------------------------

// Starts the program args[0] (a path: no PATH search) with arguments `args`, its stdout and
// stderr going to `log_path` (created or truncated), with OMP_NUM_THREADS=`omp_threads` in its
// environment unless that is 0 (then it inherits ours) and the (name, value) pairs of `env` set
// too; returns its pid, for the caller to wait for. Flushes every stdio stream first, so that
// the child writes nothing buffered twice. fail()s when fork fails; the child exits 126 when it
// cannot open the log, 127 when it cannot exec (saying why in the log).
inline pid_t spawn_logged(const std::vector<std::string>& args, const std::string& log_path,
                          int omp_threads = 0,
                          const std::vector<std::pair<std::string, std::string>>& env = {}) {
  std::vector<std::string> owned = args;
  std::vector<char*> argv;
  for (std::string& arg : owned) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) fail(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(126);
    if (omp_threads > 0) setenv("OMP_NUM_THREADS", std::to_string(omp_threads).c_str(), 1);
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "exec %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

// The last `lines` lines of the file at `path` (a child's log), each indented by four spaces
// and ended by a newline; "" when the file cannot be read.
inline std::string tail_of_file(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line)) all.push_back(line);
  std::string text;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    text += "    " + all[i] + "\n";
  }
  return text;
}

// The rows of a JSON-lines file (a run's metrics.jsonl): one JSON value per non-empty line; none
// when the file cannot be read. Throws nlohmann::json::parse_error on a malformed line.
inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

// --- figures --------------------------------------------------------------------------------

// The median of `values` (the mean of the middle two for an even count); NaN when empty.
inline double median(std::vector<double> values) {
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// CPU seconds so far of `clock`: CLOCK_PROCESS_CPUTIME_ID (every thread of this process) or
// CLOCK_THREAD_CPUTIME_ID (the calling thread).
inline double cpu_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace mixtrain::bench
