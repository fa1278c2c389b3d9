// What one training step dispatches, by phase, next to what it costs in time (issue 35): for
// configs/qwen2_moe_tiny.yaml (0.24M parameters, 512 tokens a step) and the ~41M Qwen2-MoE of
// bench_train_throughput (bench_support.h kMedium41MConfig), one rank, one thread
// (OMP_NUM_THREADS=1), the caching CPU allocator. Per config, two runs of `mixtrain train`:
//   - counting (train.count_ops=true): metrics.jsonl's ops_<phase>, allocations_<phase> and
//     collectives (core/op_counter.h: every ATen dispatcher call, nested ones included; every
//     buffer allocated) over steps 2..S (step 1 creates the optimizer state): the median, and
//     the range where routing makes steps differ;
//   - timing (train.profile=true, no counting: its callback slows every op): the median seconds
//     of each phase over steps 2..S, the step-time spread (max / median of step_s over steps
//     3..min(S, 12), issue 35's measure) and tokens/s.
// The table's last column, microseconds per op (phase seconds / phase ops), is what a phase
// pays per dispatched op all in: where it is a few microseconds the phase is per-op overhead,
// where it is far above the phase is arithmetic.
//
// Usage: bench_op_count [MIXTRAIN_BINARY] [--steps S (12)] [--work-dir DIR] [--keep]
// About a minute on 2 cores. Exit code 0 when every run trained, 1 otherwise.
#include <sys/wait.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_support.h"

namespace {

// Issue 35's bound on the step-time spread (max / median of step_s over steps 3..12).
constexpr double kMaxSpread = 1.3;

using namespace mixtrain::bench;  // bench_support.h

struct BenchConfig {
  std::string name;
  std::string path;  // the config file
  int steps;
};

// Runs `mixtrain train` on one thread; its metrics.jsonl rows (fail()s when the run fails).
std::vector<nlohmann::json> train(const std::string& binary, const BenchConfig& c,
                                  const std::string& run_dir, const std::string& mode) {
  const std::string log = run_dir + ".log";
  const pid_t pid = spawn_logged({binary, "train", "--config", c.path, "--run-dir", run_dir,
                                  "--set", "train.steps=" + std::to_string(c.steps), "--set",
                                  "train.log_every=" + std::to_string(c.steps), "--set",
                                  "checkpoint.interval=0", "--set", mode + "=true"},
                                 log, /*omp_threads=*/1);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fail(c.name + " (" + mode + ") failed:\n" + tail_of_file(log, 8));
  }
  return read_jsonl(run_dir + "/metrics.jsonl");
}

struct Range {
  double median = 0, min = 0, max = 0;
};

Range range_of(const std::vector<nlohmann::json>& rows, const std::string& key, size_t first) {
  std::vector<double> values;
  for (size_t i = first; i < rows.size(); ++i) values.push_back(rows[i].at(key).get<double>());
  if (values.empty()) fail("no rows of " + key);
  return {median(values), *std::min_element(values.begin(), values.end()),
          *std::max_element(values.begin(), values.end())};
}

std::string count_cell(const Range& r) {
  char buf[96];
  if (r.min == r.max) {
    std::snprintf(buf, sizeof(buf), "%.0f", r.median);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f (%.0f-%.0f)", r.median, r.min, r.max);
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  program_name() = "bench_op_count";
  std::string binary = MIXTRAIN_BINARY, work_dir;
  bool keep = false;
  int steps = 12;
  parse_arguments(argc, argv,
                  "[MIXTRAIN_BINARY] [--steps S] [--work-dir DIR] [--keep]\n"
                  "Counts the ATen ops and allocations of a training step by phase (tiny and 41M\n"
                  "configs, one thread) and times the same phases in a run without counting.\n",
                  &binary, work_dir, keep, [&](const std::string& arg, const auto& value) {
                    if (arg != "--steps") return false;
                    steps = int_at_least(value(), "--steps", 4, "steps 3.. give the spread");
                    return true;
                  });
  require_executable(binary);
  const std::string dir = make_work_dir(work_dir, "mixtrain-op-count");
  std::ofstream(dir + "/medium_41m.yaml") << kMedium41MConfig;
  const std::vector<BenchConfig> configs = {
      {"qwen2_moe_tiny.yaml", std::string(MIXTRAIN_SOURCE_DIR) + "/configs/qwen2_moe_tiny.yaml",
       steps},
      {"41M (hidden 384, 6 layers)", dir + "/medium_41m.yaml", std::max(4, steps / 2)},
  };
  double load[1] = {-1};
  getloadavg(load, 1);
  std::printf("machine: %ld CPUs, %s; load average %.2f; one thread per run\n",
              sysconf(_SC_NPROCESSORS_ONLN), cpu_model().c_str(), load[0]);

  std::printf(
      "\n| config | phase | ATen ops per step | allocations per step | seconds per step | "
      "us per op |\n| --- | --- | --- | --- | --- | --- |\n");
  std::vector<std::string> summary;
  for (size_t i = 0; i < configs.size(); ++i) {
    const BenchConfig& c = configs[i];
    const std::string run = dir + "/run" + std::to_string(i);
    const std::vector<nlohmann::json> counted = train(binary, c, run + "_count", "train.count_ops");
    const std::vector<nlohmann::json> timed = train(binary, c, run + "_time", "train.profile");
    for (const char* phase : {"forward", "backward", "clip", "optimizer", "other", "step"}) {
      const Range ops = range_of(counted, std::string("ops_") + phase, 1);
      const Range allocations = range_of(counted, std::string("allocations_") + phase, 1);
      const std::string time_key = std::string(phase) == "other" ? "" : std::string(phase) + "_s";
      double seconds = 0;
      if (time_key.empty()) {  // other: the step less its phases
        std::vector<double> rest;
        for (size_t r = 1; r < timed.size(); ++r) {
          const nlohmann::json& row = timed[r];
          rest.push_back(row.at("step_s").get<double>() - row.at("forward_s").get<double>() -
                         row.at("backward_s").get<double>() - row.at("clip_s").get<double>() -
                         row.at("optimizer_s").get<double>() -
                         row.at("checkpoint_s").get<double>());
        }
        seconds = median(rest);
      } else {
        seconds = range_of(timed, time_key, 1).median;
      }
      std::printf("| %s | %s | %s | %s | %.4f | %.2f |\n", c.name.c_str(), phase,
                  count_cell(ops).c_str(), count_cell(allocations).c_str(), seconds,
                  ops.median > 0 ? 1e6 * seconds / ops.median : 0.0);
    }
    std::vector<double> step_s;
    for (size_t r = 2; r < timed.size() && r < 12; ++r) {
      step_s.push_back(timed[r].at("step_s").get<double>());
    }
    const double spread = *std::max_element(step_s.begin(), step_s.end()) / median(step_s);
    char line[256];
    std::snprintf(line, sizeof(line),
                  "%s: %.0f tokens/s (median of steps 2..%d), step-time spread max/median over "
                  "steps 3..%zu = %.2f (issue 35: <= %.1f, %s), collectives per step %s",
                  c.name.c_str(), range_of(timed, "tokens_per_s", 1).median, c.steps,
                  step_s.size() + 2, spread, kMaxSpread, spread <= kMaxSpread ? "met" : "NOT met",
                  count_cell(range_of(counted, "collectives", 1)).c_str());
    summary.push_back(line);
  }
  std::printf("\n");
  for (const std::string& line : summary) std::printf("%s\n", line.c_str());
  keep_or_remove(dir, keep, "\nruns kept in ");
  return 0;
}
