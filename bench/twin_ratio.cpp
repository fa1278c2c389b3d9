// Training throughput of mixtrain against its eager PyTorch 2.x twin (bench/twin/, issue 13), in
// the same run, one thread each, at glibc's allocator defaults and with glibc told to keep freed
// memory.
//
// A plain program. For each of two configs (configs/qwen2_moe_tiny.yaml; the ~41M-parameter
// kMedium41MConfig of bench_support.h, written to the work directory) it trains, R rounds
// (default 3), in each round once per allocator setting:
//   ours: `mixtrain train --config C --set train.steps=S --set train.profile=true`, one rank,
//         OMP_NUM_THREADS=1 (docs/cli.md: the thread count comes from OMP_NUM_THREADS);
//   twin: `MIXTRAIN_PYTHON bench/twin/qwen2_moe_twin.py --config C --steps S --threads 1`
//         (OMP_NUM_THREADS=1 as well),
// alternately: within a round ours runs first for one setting and second for the other, and the
// order flips from round to round, so that a drift in the machine's load falls on both. The
// allocator settings: (a) defaults (ours: train.cpu_allocator: caching); (a') the same with ours
// on LibTorch's own allocator (train.cpu_allocator=system: what the caching allocator is worth);
// (b) MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ and
// MALLOC_TOP_PAD_ = B bytes (default 1 GiB) for both children: large blocks come from the heap
// instead of a fresh mmap, and freed memory stays mapped, so a step reuses pages instead of
// faulting them in again (what PyTorch's CPU performance guide tells its users to do about
// glibc). Figures per run: tokens/s = the median over steps 2..S (step 1 creates the optimizer
// state) of tokens per step / step wall time (ours: metrics.jsonl's tokens_per_s; the twin's
// JSON lines, measured the same way); peak RSS = ru_maxrss of the child from wait4(). Printed
// per config and setting: the median over the rounds of each side's tokens/s (and every
// round's), the ratio ours / twin of those medians against the issues' targets (>= 1.5 at the
// defaults, the tiny config >= 2.0 since issue 35, >= 5.0 where `version` says our bf16 GEMMs
// are widened (issue 46: a CPU without bf16 arithmetic, where the twin's run ATen's generic
// loop); >= 1.15 with the tuning), the fastest step of
// each side over all rounds and their ratio (on a machine others load, the step least disturbed),
// the largest peak RSS of each side, and the median split of a step into forward, backward and
// optimizer (ours: clip + optimizer) over steps 2..S of all rounds.
//
// Usage: bench_twin_ratio [MIXTRAIN_BINARY] [--rounds R] [--steps S] [--tiny-steps S]
//                         [--tiny-only] [--python PY] [--twin SCRIPT] [--malloc-bytes B]
//                         [--tiny-config FILE] [--work-dir DIR] [--keep]
// Defaults: 3 rounds, 6 steps of the 41M config, 30 of the tiny one. Exit code 0 when every run
// was measured (targets met or not), 1 when a child failed (its exit code and the end of its
// log are printed).
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench_support.h"

namespace {

using namespace mixtrain::bench;  // bench_support.h

namespace fs = std::filesystem;
using Env = std::vector<std::pair<std::string, std::string>>;

constexpr double kTargetDefaults = 1.5;      // ours / twin at glibc's defaults (issue 13)
constexpr double kTargetTinyDefaults = 2.0;  // the tiny config's, at the defaults (issue 35)
constexpr double kTargetTuned = 1.15;        // ours / twin, both with the allocator tuning
// The tiny config's where our bf16 GEMMs take the widened path (no native bf16: AVX2-only or
// plain AVX-512 CPUs, core/cpu_gemm.h), against a twin on ATen's slow bf16 loop (issue 46).
constexpr double kTargetTinyWidened = 5.0;

// The binary's "CPU GEMM: ..." line of `mixtrain version` (how bf16 GEMMs run under this
// environment), "" if it prints none.
std::string cpu_gemm_line(const std::string& binary) {
  std::string line, text;
  FILE* pipe = popen(("'" + binary + "' version 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return "";
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) text += buffer;
  pclose(pipe);
  const size_t at = text.find("CPU GEMM: ");
  if (at == std::string::npos) return "";
  return text.substr(at, text.find('\n', at) - at);
}

struct Options {
  std::string binary = MIXTRAIN_BINARY;
  std::string python = MIXTRAIN_PYTHON;
  std::string twin = std::string(MIXTRAIN_SOURCE_DIR) + "/bench/twin/qwen2_moe_twin.py";
  std::string tiny_config = std::string(MIXTRAIN_SOURCE_DIR) + "/configs/qwen2_moe_tiny.yaml";
  bool tiny_only = false;
  int rounds = 3;
  int steps = 6;
  int tiny_steps = 30;
  long long malloc_bytes = 1LL << 30;
  std::string work_dir;
  bool keep = false;
};

Options parse_options(int argc, char** argv) {
  Options options;
  parse_arguments(
      argc, argv,
      "[MIXTRAIN_BINARY] [--rounds R] [--steps S] [--tiny-steps S] [--tiny-only] [--python PY]\n"
      "          [--twin SCRIPT] [--malloc-bytes B] [--tiny-config FILE] [--work-dir DIR] "
      "[--keep]\n"
      "Trains configs/qwen2_moe_tiny.yaml (--tiny-steps, default 30) and a 41M config\n"
      "(--steps, default 6; not with --tiny-only) with mixtrain and with its eager PyTorch twin,\n"
      "one thread each,\n"
      "alternately, R rounds (default 3), at the defaults, with ours on\n"
      "train.cpu_allocator=system, and with MALLOC_{MMAP_THRESHOLD,TRIM_THRESHOLD,TOP_PAD}_=B\n"
      "(default 1 GiB) for both; prints tokens/s,\n"
      "the ratio ours/twin, peak RSS and the phase split.\n",
      &options.binary, options.work_dir, options.keep,
      [&](const std::string& arg, const auto& value) {
        if (arg == "--rounds") {
          options.rounds = int_at_least(value(), "--rounds", 1);
        } else if (arg == "--steps") {
          options.steps = int_at_least(value(), "--steps", 3);  // step 1 is not counted
        } else if (arg == "--tiny-only") {
          options.tiny_only = true;
        } else if (arg == "--tiny-steps") {
          options.tiny_steps = int_at_least(value(), "--tiny-steps", 3);
        } else if (arg == "--python") {
          options.python = value();
        } else if (arg == "--twin") {
          options.twin = value();
        } else if (arg == "--malloc-bytes") {
          options.malloc_bytes = std::atoll(value().c_str());
          if (options.malloc_bytes < 4096) fail("--malloc-bytes must be >= 4096");
        } else if (arg == "--tiny-config") {
          options.tiny_config = value();
        } else {
          return false;
        }
        return true;
      });
  return options;
}

// One step's split, in seconds.
struct Phases {
  std::vector<double> forward, backward, optimizer;
};

struct Run {
  double tokens_per_s = 0;       // median over steps 2..S
  double best_tokens_per_s = 0;  // fastest of steps 2..S
  long peak_rss_kib = 0;
};

// Runs a child with stdout+stderr to `log`, one OpenMP thread, `env` added; fail()s with the
// end of the log unless it exits 0. Returns ru_maxrss in KiB.
long run_child(const std::vector<std::string>& args, const std::string& log, const Env& env) {
  const pid_t pid = spawn_logged(args, log, 1, env);
  int status = 0;
  struct rusage usage {};
  while (wait4(pid, &status, 0, &usage) < 0) {
    if (errno != EINTR) fail(std::string("wait4: ") + std::strerror(errno));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string how = WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                              : "signal " + std::to_string(WTERMSIG(status));
    std::fprintf(stderr, "bench_twin_ratio: %s failed (%s); end of %s:\n%s", args[0].c_str(),
                 how.c_str(), log.c_str(), tail_of_file(log, 12).c_str());
    std::exit(1);
  }
  return usage.ru_maxrss;
}

// Steps 2..S of per-step JSON rows (key names as both sides write them) -> tokens/s (median and
// best) into `run`, the phases appended to `phases`. `optimizer_keys` are summed into the
// optimizer phase.
void take_steps(const std::vector<nlohmann::json>& rows, int steps, const std::string& source,
                const std::vector<const char*>& optimizer_keys, Phases& phases, Run& run) {
  if (static_cast<int>(rows.size()) != steps) {
    fail(source + " has " + std::to_string(rows.size()) + " step rows, expected " +
         std::to_string(steps));
  }
  std::vector<double> rates;
  for (size_t i = 1; i < rows.size(); ++i) {
    const nlohmann::json& r = rows[i];
    rates.push_back(r.at("tokens_per_s").get<double>());
    phases.forward.push_back(r.at("forward_s").get<double>());
    phases.backward.push_back(r.at("backward_s").get<double>());
    double optimizer = 0;
    for (const char* key : optimizer_keys) optimizer += r.at(key).get<double>();
    phases.optimizer.push_back(optimizer);
  }
  run.tokens_per_s = median(rates);
  run.best_tokens_per_s = *std::max_element(rates.begin(), rates.end());
}

Run run_ours(const Options& o, const std::string& config, int steps, const std::string& dir,
             const Env& env, const std::string& allocator, Phases& phases) {
  const std::string run_dir = dir + "-ours";
  const std::vector<std::string> args = {o.binary,    "train",
                                         "--config",  config,
                                         "--set",     "train.steps=" + std::to_string(steps),
                                         "--set",     "train.profile=true",
                                         "--set",     "train.log_every=" + std::to_string(steps),
                                         "--set",     "checkpoint.interval=0",
                                         "--set",     "train.cpu_allocator=" + allocator,
                                         "--run-dir", run_dir};
  Run run;
  run.peak_rss_kib = run_child(args, run_dir + ".log", env);
  const std::string metrics = run_dir + "/metrics.jsonl";
  take_steps(read_jsonl(metrics), steps, metrics, {"clip_s", "optimizer_s"}, phases, run);
  return run;
}

Run run_twin(const Options& o, const std::string& config, int steps, const std::string& dir,
             const Env& env, Phases& phases) {
  const std::string log = dir + "-twin.log";
  const std::vector<std::string> args = {
      o.python, o.twin, "--config", config, "--steps", std::to_string(steps), "--threads", "1"};
  Run run;
  run.peak_rss_kib = run_child(args, log, env);
  // The log has the twin's JSON lines and whatever else Python printed (warnings).
  std::vector<nlohmann::json> rows;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    nlohmann::json row = nlohmann::json::parse(line);
    if (row.contains("step")) rows.push_back(std::move(row));
  }
  take_steps(rows, steps, log, {"optimizer_s"}, phases, run);
  return run;
}

struct Cell {  // one config x allocator setting, over all rounds
  std::vector<double> ours, twin;
  double ours_best = 0, twin_best = 0;
  long ours_rss = 0, twin_rss = 0;
  Phases ours_phases, twin_phases;
};

std::string rates_text(const std::vector<double>& rates) {
  std::string text;
  char buf[32];
  for (double r : rates) {
    std::snprintf(buf, sizeof(buf), "%s%.0f", text.empty() ? "" : ", ", r);
    text += buf;
  }
  return text;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  double one = 0, five = 0, fifteen = 0;
  in >> one >> five >> fifteen;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %.2f %.2f", one, five, fifteen);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  program_name() = "bench_twin_ratio";
  const Options options = parse_options(argc, argv);
  require_executable(options.binary);
  require_executable(options.python);
  if (!fs::is_regular_file(options.twin)) fail("no twin script " + options.twin);
  if (!fs::is_regular_file(options.tiny_config)) fail("no " + options.tiny_config);
  const std::string work_dir = make_work_dir(options.work_dir, "mixtrain-twin-ratio");
  const std::string medium_config = work_dir + "/qwen2_moe_41m.yaml";
  std::ofstream(medium_config) << kMedium41MConfig;

  struct Config {
    std::string name, path;
    int steps;
    double default_target;  // ours / twin at the defaults at least this
  };
  const std::string gemm = cpu_gemm_line(options.binary);
  const bool widened = gemm.find("bf16 widened") != std::string::npos;
  std::vector<Config> configs = {{"qwen2_moe_tiny.yaml", options.tiny_config, options.tiny_steps,
                                  widened ? kTargetTinyWidened : kTargetTinyDefaults}};
  if (!options.tiny_only) {
    configs.push_back(
        {"41M (hidden 384, 6 layers)", medium_config, options.steps, kTargetDefaults});
  }
  const std::string bytes = std::to_string(options.malloc_bytes);
  // Both sides at their defaults (ours: train.cpu_allocator caching); ours with LibTorch's own
  // allocator (what the caching allocator is worth); both with glibc told to keep freed memory.
  struct Setting {
    std::string name;
    Env env;
    std::string ours_allocator;
    double target;     // ours / twin at least this (0: none), unless at_defaults
    bool at_defaults;  // the config's default_target instead
  };
  const Env tuned = {{"MALLOC_MMAP_THRESHOLD_", bytes},
                     {"MALLOC_TRIM_THRESHOLD_", bytes},
                     {"MALLOC_TOP_PAD_", bytes}};
  const std::vector<Setting> settings = {
      {"defaults", {}, "caching", 0.0, true},
      {"defaults, ours with train.cpu_allocator=system", {}, "system", 0.0, false},
      {"MALLOC_*_=" + bytes + " (both)", tuned, "caching", kTargetTuned, false}};

  std::printf("machine: %ld CPUs online, %s, %.1f GiB; load average at start: %s\n",
              sysconf(_SC_NPROCESSORS_ONLN), cpu_model().c_str(), mem_total_kib() / 1048576.0,
              load_average().c_str());
  std::printf("ours: %s\n", gemm.empty() ? "no CPU GEMM line in `version`" : gemm.c_str());
  std::printf("ours: %s; twin: %s %s; one thread each; %d rounds; runs in %s\n\n",
              options.binary.c_str(), options.python.c_str(), options.twin.c_str(), options.rounds,
              work_dir.c_str());
  std::fflush(stdout);

  std::vector<std::vector<Cell>> cells(configs.size(), std::vector<Cell>(settings.size()));
  int run_number = 0;
  for (size_t c = 0; c < configs.size(); ++c) {
    const Config& config = configs[c];
    for (int round = 0; round < options.rounds; ++round) {
      for (size_t s = 0; s < settings.size(); ++s) {
        Cell& cell = cells[c][s];
        const Env& env = settings[s].env;
        const std::string dir = work_dir + "/run" + std::to_string(run_number++);
        // ABBA: ours first when round + setting is even.
        const bool ours_first = (round + s) % 2 == 0;
        Run ours, twin;
        for (int turn = 0; turn < 2; ++turn) {
          if ((turn == 0) == ours_first) {
            ours = run_ours(options, config.path, config.steps, dir, env,
                            settings[s].ours_allocator, cell.ours_phases);
          } else {
            twin = run_twin(options, config.path, config.steps, dir, env, cell.twin_phases);
          }
        }
        cell.ours.push_back(ours.tokens_per_s);
        cell.twin.push_back(twin.tokens_per_s);
        cell.ours_best = std::max(cell.ours_best, ours.best_tokens_per_s);
        cell.twin_best = std::max(cell.twin_best, twin.best_tokens_per_s);
        cell.ours_rss = std::max(cell.ours_rss, ours.peak_rss_kib);
        cell.twin_rss = std::max(cell.twin_rss, twin.peak_rss_kib);
        std::fprintf(stderr, "  %s, %s, round %d: ours %.0f tok/s, twin %.0f tok/s\n",
                     config.name.c_str(), settings[s].name.c_str(), round + 1, ours.tokens_per_s,
                     twin.tokens_per_s);
      }
    }
  }

  std::printf(
      "| config | allocator | ours tokens/s (rounds) | twin tokens/s (rounds) | ours / twin | "
      "target | fastest step: ours, twin, ratio | ours peak RSS (MiB) | twin peak RSS (MiB) "
      "|\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (size_t c = 0; c < configs.size(); ++c) {
    for (size_t s = 0; s < settings.size(); ++s) {
      const Cell& cell = cells[c][s];
      const double ours = median(cell.ours), twin = median(cell.twin);
      const double target =
          settings[s].at_defaults ? configs[c].default_target : settings[s].target;
      char target_text[48] = "n/a";
      if (target > 0) {
        std::snprintf(target_text, sizeof(target_text), ">= %.2f: %s", target,
                      ours / twin >= target ? "met" : "NOT met");
      }
      std::printf(
          "| %s | %s | %.0f (%s) | %.0f (%s) | **%.2f** | %s | %.0f, %.0f, %.2f | %.0f | "
          "%.0f |\n",
          configs[c].name.c_str(), settings[s].name.c_str(), ours, rates_text(cell.ours).c_str(),
          twin, rates_text(cell.twin).c_str(), ours / twin, target_text, cell.ours_best,
          cell.twin_best, cell.ours_best / cell.twin_best, cell.ours_rss / 1024.0,
          cell.twin_rss / 1024.0);
    }
  }
  std::printf(
      "\n| config | allocator | side | forward (s) | backward (s) | optimizer (s; ours: clip + "
      "optimizer) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (size_t c = 0; c < configs.size(); ++c) {
    for (size_t s = 0; s < settings.size(); ++s) {
      for (int side = 0; side < 2; ++side) {
        const Cell& cell = cells[c][s];
        const Phases& p = side == 0 ? cell.ours_phases : cell.twin_phases;
        std::printf("| %s | %s | %s | %.4f | %.4f | %.4f |\n", configs[c].name.c_str(),
                    settings[s].name.c_str(), side == 0 ? "ours" : "twin", median(p.forward),
                    median(p.backward), median(p.optimizer));
      }
    }
  }
  std::printf(
      "\n(tokens/s: median over rounds of each run's median over steps 2..S; fastest step: the "
      "highest tokens/s of any step 2..S of any round, the least disturbed by other load; phases: "
      "medians over steps 2..S of all rounds; peak RSS: the largest ru_maxrss over the rounds)\n"
      "load average at end: %s\n",
      load_average().c_str());
  keep_or_remove(work_dir, options.keep, "runs kept in ");
  return 0;
}
