// Swap optimizer (docs/architecture.md §9): how much resident memory keeping the optimizer state in
// a file saves, and what it costs in step time.
//
// A plain program (no Google Benchmark): it writes a ~85M-parameter Qwen2-MoE config (the
// fp32-main-params §1 optimizer setup: bfloat16 model, fp32 main params, Muon + AdamW), trains it
// for a few steps with the `mixtrain` binary twice, optimizer.swap_optimizer false then true,
// everything else equal, and prints:
//   - peak resident memory of each child process: ru_maxrss from wait4() over the whole run, and
//     the peak over steps 2..N alone (the kernel's high-water mark is reset through
//     /proc/<pid>/clear_refs once step 1, which creates the state, has been logged);
//   - the drop, and the drop as a fraction of the optimizer-state size (target >= 60%);
//   - the median step time over steps 2..N (elapsed_s differences in metrics.jsonl) and the
//     swap / no-swap ratio (target <= 1.5);
//   - whether the two runs' losses are bit-identical (they must be);
//   - the machine: CPUs, CPU model, memory, the filesystem the swap files went to.
// The optimizer-state size is computed through the library: the model is built from the same
// config, its parameters routed (optim/routing.h), and every AdamW element counted 2 x 4 bytes
// (exp_avg, exp_avg_sq) and every Muon element 4 bytes (momentum_buffer); the state is float32
// because it lives on the fp32 main params, which themselves are not swapped.
//
// Usage: bench_swap_optimizer [MIXTRAIN_BINARY] [--steps N] [--work-dir DIR] [--keep]
//   The binary defaults to the one built alongside. Runs go to a fresh directory under
//   --work-dir (default $TMPDIR or /tmp); the swap files go to <run-dir>/swap, so --work-dir
//   chooses the filesystem they are written to. --keep leaves the runs behind.
//   OMP_NUM_THREADS, when set, applies to both runs (unset: the trainer uses every core).
// Exit code: 0 when both runs trained and were measured (whether or not the targets were met);
// 1 when a run failed (the trainer's exit code and the end of its log are printed) or the
// losses differ.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench_support.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/optimizer_table.h"
#include "routed_params.h"

namespace {

using namespace mixtrain::bench;  // bench_support.h

// The benchmark model: 6 layers of the tiny Qwen2-MoE scaled up to hidden 512, 8 experts
// and a 32000-token vocabulary (~85M parameters), one 128-token sample per step so that a step
// takes seconds on two cores. The optimizer and precision sections are
// configs/qwen2_moe_tiny.yaml's (kMuonAdamWSections).
const std::string kConfig =
    std::string("# Written by bench_swap_optimizer (bench/swap_optimizer.cpp).\n") +
    kMuonAdamWSections + R"(
model:
  name: qwen2_moe
  vocab_size: 32000
  hidden_size: 512
  num_layers: 6
  num_heads: 8
  num_kv_heads: 4
  head_dim: 64
  moe_intermediate_size: 512
  num_experts: 8
  num_experts_per_tok: 2
  shared_expert_intermediate_size: 1024
  max_seq_len: 128
  rope_theta: 10000.0
  rms_norm_eps: 1.0e-6
  router_aux_loss_coef: 0.001

data:
  kind: synthetic
  seq_len: 128
  micro_batch_size: 1
  global_batch_size: 1

train:
  steps: 6
  seed: 1234
  max_grad_norm: 1.0
  log_every: 1
  lr_scheduler:
    warmup_steps: 1
    decay: cosine
    min_lr_ratio: 0.1

checkpoint:
  interval: 0
)";

constexpr double kMinRssDropFraction = 0.60;  // of the optimizer-state size
constexpr double kMaxStepTimeRatio = 1.5;     // swap / no swap

struct Options {
  std::string binary = MIXTRAIN_BINARY;
  int steps = 6;
  std::string work_dir;
  bool keep = false;
};

struct RunResult {
  std::string name;
  std::string run_dir;
  std::string log_path;
  int exit_code = -1;  // -1: killed by a signal
  int signal = 0;
  long peak_rss_kib = 0;         // wait4: ru_maxrss over the whole run
  long later_peak_rss_kib = -1;  // steps 2..N (after the high-water mark reset); -1: unknown
  std::vector<double> losses;    // per step
  std::vector<double> step_s;    // steps 2..N
};

Options parse_options(int argc, char** argv) {
  Options options;
  parse_arguments(argc, argv,
                  "[MIXTRAIN_BINARY] [--steps N] [--work-dir DIR] [--keep]\n"
                  "Trains a ~85M-parameter model N steps (default 6) without and with\n"
                  "optimizer.swap_optimizer and compares peak RSS and step time.\n",
                  &options.binary, options.work_dir, options.keep,
                  [&](const std::string& arg, const auto& value) {
                    if (arg != "--steps") return false;
                    options.steps = int_at_least(value(), "--steps", 3, "step 1 is not timed");
                    return true;
                  });
  return options;
}

// "VmHWM:\t  123456 kB" -> 123456; -1 when the process or the field is gone.
long read_status_kib(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::atol(line.c_str() + prefix.size());
  }
  return -1;
}

bool reset_peak_rss(pid_t pid) {
  std::ofstream out("/proc/" + std::to_string(pid) + "/clear_refs");
  out << "5";  // proc(5): reset the peak resident set size to the current one
  out.flush();
  return static_cast<bool>(out);
}

RunResult run_training(const Options& options, const std::string& config_path,
                       const std::string& work_dir, bool swap) {
  RunResult result;
  result.name = swap ? "swap" : "no-swap";
  result.run_dir = work_dir + "/" + result.name;
  result.log_path = work_dir + "/" + result.name + ".log";
  const std::vector<std::string> args = {
      options.binary, "train",
      "--config",     config_path,
      "--set",        "train.steps=" + std::to_string(options.steps),
      "--set",        std::string("optimizer.swap_optimizer=") + (swap ? "true" : "false"),
      "--run-dir",    result.run_dir};
  const pid_t pid = spawn_logged(args, result.log_path);

  // Wait, and once step 1 (which creates the optimizer state) is in metrics.jsonl reset the
  // kernel's high-water mark: from then on ru_maxrss is the peak of steps 2..N.
  const std::string metrics_path = result.run_dir + "/metrics.jsonl";
  long early_peak_kib = -1;
  bool reset_done = false, reset_ok = false;
  int status = 0;
  struct rusage usage {};
  for (;;) {
    const pid_t done = wait4(pid, &status, WNOHANG, &usage);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) fail(std::string("wait4: ") + std::strerror(errno));
    if (!reset_done) {
      struct stat st {};
      if (stat(metrics_path.c_str(), &st) == 0 && st.st_size > 0) {
        early_peak_kib = read_status_kib(pid, "VmHWM");
        reset_ok = early_peak_kib > 0 && reset_peak_rss(pid);
        reset_done = true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  result.peak_rss_kib = usage.ru_maxrss;
  if (reset_ok) {
    result.later_peak_rss_kib = usage.ru_maxrss;
    result.peak_rss_kib = std::max(early_peak_kib, static_cast<long>(usage.ru_maxrss));
  }

  if (result.exit_code == 0) {
    const std::vector<nlohmann::json> rows = read_jsonl(metrics_path);
    for (size_t i = 0; i < rows.size(); ++i) {
      result.losses.push_back(rows[i].at("loss").is_null() ? NAN
                                                           : rows[i].at("loss").get<double>());
      if (i > 0) {
        result.step_s.push_back(rows[i].at("elapsed_s").get<double>() -
                                rows[i - 1].at("elapsed_s").get<double>());
      }
    }
  }
  return result;
}

double mib(double kib) {
  return kib / 1024.0;
}

void report_failure(const RunResult& run) {
  if (run.signal != 0) {
    std::fprintf(stderr, "bench_swap_optimizer: the %s run was killed by signal %d (%s)\n",
                 run.name.c_str(), run.signal, strsignal(run.signal));
  } else if (run.exit_code == 2) {
    std::fprintf(stderr,
                 "bench_swap_optimizer: the trainer refused the %s run (exit 2: a config it "
                 "does not support%s)\n",
                 run.name.c_str(),
                 run.name == "swap" ? "; is the swap optimizer built into this binary?" : "");
  } else {
    std::fprintf(stderr, "bench_swap_optimizer: the %s run failed with exit code %d\n",
                 run.name.c_str(), run.exit_code);
  }
  std::fprintf(stderr, "  end of %s:\n%s", run.log_path.c_str(),
               tail_of_file(run.log_path, 8).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  mixtrain::register_model_sections();  // before any config is read
  mixtrain::register_optimizer_sections();
  program_name() = "bench_swap_optimizer";
  const Options options = parse_options(argc, argv);
  require_executable(options.binary);
  const std::string work_dir = make_work_dir(options.work_dir, "mixtrain-swap-bench");
  const std::string config_path = work_dir + "/swap_bench.yaml";
  std::ofstream(config_path) << kConfig;

  const char* threads = std::getenv("OMP_NUM_THREADS");
  std::printf("machine: %ld CPUs online, %s, %.1f GiB memory; OMP_NUM_THREADS=%s\n",
              sysconf(_SC_NPROCESSORS_ONLN), cpu_model().c_str(), mem_total_kib() / 1048576.0,
              threads != nullptr ? threads : "(unset: every core)");
  std::printf("runs and swap files in %s (%s)\n", work_dir.c_str(),
              filesystem_of(work_dir).c_str());
  std::printf("training %d steps twice with %s ...\n", options.steps, options.binary.c_str());
  std::fflush(stdout);

  std::vector<RunResult> runs;
  for (bool swap : {false, true}) {
    const auto start = std::chrono::steady_clock::now();
    runs.push_back(run_training(options, config_path, work_dir, swap));
    const RunResult& run = runs.back();
    std::printf("  %s: exit %d after %.0f s\n", run.name.c_str(), run.exit_code,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fflush(stdout);
    if (run.exit_code != 0) {
      report_failure(run);
      std::fprintf(stderr, "bench_swap_optimizer: no result; runs kept in %s\n", work_dir.c_str());
      return 1;
    }
    if (static_cast<int>(run.losses.size()) != options.steps) {
      fail("the " + run.name + " run logged " + std::to_string(run.losses.size()) + " steps in " +
           run.run_dir + "/metrics.jsonl, expected " + std::to_string(options.steps));
    }
  }
  const RunResult& base_run = runs[0];
  const RunResult& swap_run = runs[1];

  // Only now, after the runs: a child's ru_maxrss includes what its parent had resident when
  // it forked, so the model built here must not exist before them.
  RoutedParams state;
  try {
    state = routed_params(config_path);
  } catch (const std::exception& e) {
    fail(std::string("cannot size the optimizer state: ") + e.what());
  }
  std::printf(
      "model: %.1fM parameters (%.1fM AdamW, %.1fM Muon), bfloat16, fp32 main params; "
      "optimizer state %.1f MiB\n",
      state.total / 1e6, state.adamw / 1e6, state.muon / 1e6, state.state_bytes() / 1048576.0);

  const double drop_kib = static_cast<double>(base_run.peak_rss_kib - swap_run.peak_rss_kib);
  const double drop_fraction = drop_kib * 1024.0 / state.state_bytes();
  const double t_base = median(base_run.step_s), t_swap = median(swap_run.step_s);
  const double ratio = t_swap / t_base;
  const bool later_known = base_run.later_peak_rss_kib > 0 && swap_run.later_peak_rss_kib > 0;
  const double later_drop_kib =
      later_known ? static_cast<double>(base_run.later_peak_rss_kib - swap_run.later_peak_rss_kib)
                  : NAN;
  int first_difference = 0;
  for (int i = 0; i < options.steps; ++i) {
    // Bitwise: NaN == NaN counts as equal here.
    if (std::memcmp(&base_run.losses[i], &swap_run.losses[i], sizeof(double)) != 0) {
      first_difference = i + 1;
      break;
    }
  }

  std::printf("\n| measure | no swap | swap | change | target |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  std::printf(
      "| peak RSS, whole run (MiB) | %.0f | %.0f | -%.0f MiB = %.0f%% of the %.0f MiB "
      "optimizer state | >= %.0f%%: %s |\n",
      mib(base_run.peak_rss_kib), mib(swap_run.peak_rss_kib), mib(drop_kib), 100 * drop_fraction,
      state.state_bytes() / 1048576.0, 100 * kMinRssDropFraction,
      drop_fraction >= kMinRssDropFraction ? "met" : "NOT met");
  if (later_known) {
    std::printf(
        "| peak RSS, steps 2..%d (MiB) | %.0f | %.0f | -%.0f MiB = %.0f%% of the state "
        "| |\n",
        options.steps, mib(base_run.later_peak_rss_kib), mib(swap_run.later_peak_rss_kib),
        mib(later_drop_kib), 100 * later_drop_kib * 1024.0 / state.state_bytes());
  } else {
    std::printf(
        "| peak RSS, steps 2..%d (MiB) | n/a | n/a | (could not reset the high-water "
        "mark) | |\n",
        options.steps);
  }
  std::printf("| median step time, steps 2..%d (s) | %.3f | %.3f | x%.2f | <= x%.1f: %s |\n",
              options.steps, t_base, t_swap, ratio, kMaxStepTimeRatio,
              ratio <= kMaxStepTimeRatio ? "met" : "NOT met");
  // A busy machine shows as a wide spread between the fastest and the median step.
  const double min_base = *std::min_element(base_run.step_s.begin(), base_run.step_s.end());
  const double min_swap = *std::min_element(swap_run.step_s.begin(), swap_run.step_s.end());
  std::printf("| fastest step, steps 2..%d (s) | %.3f | %.3f | x%.2f | |\n", options.steps,
              min_base, min_swap, min_swap / min_base);
  std::printf("| losses | | | %s | bit-identical |\n",
              first_difference == 0
                  ? "bit-identical"
                  : ("DIFFER from step " + std::to_string(first_difference)).c_str());

  keep_or_remove(work_dir, options.keep, "\nruns kept in ");
  if (first_difference != 0) {
    std::fprintf(stderr, "bench_swap_optimizer: the swap run's loss differs from step %d on\n",
                 first_difference);
    return 1;
  }
  return 0;
}
