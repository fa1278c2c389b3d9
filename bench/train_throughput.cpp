// Training throughput and where the step time goes (train.profile), on 1 and 2 local ranks.
//
// A plain program (no Google Benchmark). It runs `mixtrain train` (the binary built alongside,
// or the one given) as a child process for each of two configs, on 1 rank and on 2 ranks
// (`--nproc 2`: FSDP over dp_shard = 2), with `train.profile=true` and `train.steps=S`
// (default 8), and reads the run's metrics.jsonl:
//   - tokens/s: the median over steps 2..S of the rows' tokens_per_s (global batch x seq_len
//     over the training step's wall time);
//   - the median over steps 2..S of each phase of the split (forward_s, backward_s, reduce_s,
//     clip_s, optimizer_s, step_s; other = step_s minus the phases and the checkpoint; see
//     src/mixtrain/trainer/step_profile.h). Step 1 is skipped: it creates the optimizer state.
// The medians are taken per column, so the phases of a row need not add up to its step time.
// Rank 0's clock: on 2 ranks a phase that ends in a collective includes the wait for rank 1.
//
// Configs: configs/qwen2_moe_tiny.yaml (the fp32-main-params §1 config: bfloat16 model, fp32 main
// params, Muon + AdamW, 0.24M parameters) and a ~41M-parameter one written to the work directory
// (kMedium41MConfig of bench_support.h: the same optimizer and precision sections; vocab 16000,
// hidden 384, 6 layers, 8 experts of 384, shared expert 768, 128-token sequences). Both keep their
// global batch on 1 and 2 ranks (gradient accumulation on 1 rank), so tokens per step are equal
// and tokens/s compare.
// A synchronous checkpoint is saved every S/2 steps (so twice in steps 2..S, at S/2 and at S);
// the medians are hardly moved by those two steps; two more columns give the time per save
// (checkpoint_s) and the share of all step time the saves took. OMP_NUM_THREADS, when set, applies
// to every run. Unset, each config runs three times: 1 rank using every core (the trainer's
// default), 1 rank with one thread, and 2 ranks taking cores / 2 threads each (the launcher's
// default): on a machine whose cores are busy with other work, intra-op threads that wait for each
// other at every operator can cost far more than they bring, and the second row shows it.
//
// Usage: bench_train_throughput [MIXTRAIN_BINARY] [--steps S] [--tiny-config FILE]
//                               [--work-dir DIR] [--keep]
// Exit code 0 when every run trained and was measured, 1 otherwise (the end of the failed
// run's log is printed).
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

struct Options {
  std::string binary = MIXTRAIN_BINARY;
  int steps = 8;
  std::string tiny_config;
  std::string work_dir;
  bool keep = false;
};

Options parse_options(int argc, char** argv) {
  Options options;
  // The source tree this program was built from (__FILE__ is relative with Ninja).
  options.tiny_config = std::string(MIXTRAIN_SOURCE_DIR) + "/configs/qwen2_moe_tiny.yaml";
  parse_arguments(
      argc, argv,
      "[MIXTRAIN_BINARY] [--steps S] [--tiny-config FILE] [--work-dir DIR] [--keep]\n"
      "Trains configs/qwen2_moe_tiny.yaml and a ~41M-parameter config S steps (default 8)\n"
      "on 1 and 2 ranks with train.profile=true; prints tokens/s and the median phase\n"
      "split of steps 2..S.\n",
      &options.binary, options.work_dir, options.keep,
      [&](const std::string& arg, const auto& value) {
        if (arg == "--steps") {
          options.steps = int_at_least(value(), "--steps", 3, "step 1 is not counted");
        } else if (arg == "--tiny-config") {
          options.tiny_config = value();
        } else {
          return false;
        }
        return true;
      });
  return options;
}

// Runs the binary with `args`, stdout+stderr to `log_path`, OMP_NUM_THREADS=`threads` unless 0;
// the exit code (-signal if killed).
int run_child(const std::vector<std::string>& args, const std::string& log_path, int threads) {
  const pid_t pid = spawn_logged(args, log_path, threads);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) fail(std::string("waitpid: ") + std::strerror(errno));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? -WTERMSIG(status) : -1;
}

struct Row {
  std::string config;
  std::string layout;  // "ranks x threads per rank"
  double tokens_per_s = 0, step = 0, forward = 0, backward = 0, reduce = 0, clip = 0, optimizer = 0,
         other = 0;
  double checkpoint_per_save = 0;  // mean checkpoint_s of the steps that saved
  double checkpoint_share = 0;     // all checkpoint_s over all step_s of steps 2..S
  int saves = 0;
};

// Medians of steps 2..S of one run's metrics.jsonl.
Row summarize(const std::string& metrics_path, const std::string& config, const std::string& layout,
              int steps) {
  const std::vector<nlohmann::json> rows = read_jsonl(metrics_path);
  if (static_cast<int>(rows.size()) != steps) {
    fail(metrics_path + " has " + std::to_string(rows.size()) + " rows, expected " +
         std::to_string(steps));
  }
  std::vector<double> tokens, step, forward, backward, reduce, clip, optimizer, other;
  double checkpoint_total = 0, step_total = 0;
  int saves = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    const nlohmann::json& r = rows[i];
    if (!r.contains("step_s")) fail(metrics_path + " has no profile fields (train.profile?)");
    auto get = [&](const char* key) { return r.at(key).get<double>(); };
    tokens.push_back(get("tokens_per_s"));
    step.push_back(get("step_s"));
    forward.push_back(get("forward_s"));
    backward.push_back(get("backward_s"));
    reduce.push_back(get("reduce_s"));
    clip.push_back(get("clip_s"));
    optimizer.push_back(get("optimizer_s"));
    other.push_back(std::max(0.0, get("step_s") - get("forward_s") - get("backward_s") -
                                      get("clip_s") - get("optimizer_s") - get("checkpoint_s")));
    checkpoint_total += get("checkpoint_s");
    step_total += get("step_s");
    if (get("checkpoint_s") > 0) ++saves;
  }
  Row row;
  row.config = config;
  row.layout = layout;
  row.tokens_per_s = median(tokens);
  row.step = median(step);
  row.forward = median(forward);
  row.backward = median(backward);
  row.reduce = median(reduce);
  row.clip = median(clip);
  row.optimizer = median(optimizer);
  row.other = median(other);
  row.saves = saves;
  row.checkpoint_per_save = saves > 0 ? checkpoint_total / saves : 0.0;
  row.checkpoint_share = step_total > 0 ? checkpoint_total / step_total : 0.0;
  return row;
}

std::string cell(double seconds, double step) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.3f (%.0f%%)", seconds, 100.0 * seconds / step);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  program_name() = "bench_train_throughput";
  const Options options = parse_options(argc, argv);
  require_executable(options.binary);
  if (!fs::is_regular_file(options.tiny_config)) {
    fail("no " + options.tiny_config + " (pass --tiny-config configs/qwen2_moe_tiny.yaml)");
  }
  const std::string work_dir = make_work_dir(options.work_dir, "mixtrain-throughput");
  const std::string medium_config = work_dir + "/qwen2_moe_41m.yaml";
  std::ofstream(medium_config) << kMedium41MConfig;

  const char* threads = std::getenv("OMP_NUM_THREADS");
  std::printf("machine: %ld CPUs online, %s; OMP_NUM_THREADS=%s\n", sysconf(_SC_NPROCESSORS_ONLN),
              cpu_model().c_str(), threads != nullptr ? threads : "(unset)");
  std::printf("%d steps per run, medians of steps 2..%d; runs in %s\n\n", options.steps,
              options.steps, work_dir.c_str());
  std::fflush(stdout);

  struct Config {
    std::string name, path;
  };
  const std::vector<Config> configs = {{"qwen2_moe_tiny.yaml", options.tiny_config},
                                       {"41M (hidden 384, 6 layers)", medium_config}};
  // (ranks, OMP_NUM_THREADS for the child; 0: as inherited / the defaults).
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  std::vector<std::pair<int, int>> layouts = {{1, 0}, {2, 0}};
  if (threads == nullptr && cores > 1) layouts.insert(layouts.begin() + 1, {1, 1});
  auto layout_name = [&](int ranks, int child_threads) {
    long per_rank = threads != nullptr ? std::atol(threads) : std::max(1L, cores / ranks);
    if (child_threads > 0) per_rank = child_threads;
    return std::to_string(ranks) + " x " + std::to_string(per_rank);
  };
  // Two synchronous saves in steps 2..S (at S/2 and at S, the last step always saves), into
  // <run-dir>/checkpoints under the work directory.
  const int checkpoint_interval = std::max(1, options.steps / 2);
  std::vector<Row> rows;
  for (const Config& config : configs) {
    for (const auto& [ranks, child_threads] : layouts) {
      const std::string name = "run" + std::to_string(rows.size());
      const std::string run_dir = work_dir + "/" + name;
      const std::string log = work_dir + "/" + name + ".log";
      std::vector<std::string> args = {
          options.binary, "train",
          "--config",     config.path,
          "--set",        "train.steps=" + std::to_string(options.steps),
          "--set",        "train.profile=true",
          "--set",        "train.log_every=" + std::to_string(options.steps),
          "--set",        "checkpoint.interval=" + std::to_string(checkpoint_interval),
          "--run-dir",    run_dir};
      if (ranks > 1) {
        args.insert(args.begin() + 2, {"--nproc", std::to_string(ranks)});
      }
      const auto start = std::chrono::steady_clock::now();
      const std::string layout = layout_name(ranks, child_threads);
      const int code = run_child(args, log, child_threads);
      std::fprintf(stderr, "  %s, %s (ranks x threads): exit %d after %.0f s\n",
                   config.name.c_str(), layout.c_str(), code,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (code != 0) {
        std::fprintf(stderr, "bench_train_throughput: the run failed; end of %s:\n%s", log.c_str(),
                     tail_of_file(log, 8).c_str());
        std::fprintf(stderr, "runs kept in %s\n", work_dir.c_str());
        return 1;
      }
      rows.push_back(summarize(run_dir + "/metrics.jsonl", config.name, layout, options.steps));
    }
  }

  std::printf(
      "| config | ranks x threads | tokens/s | step (s) | forward | backward | of which gradient "
      "reduce "
      "| clip | optimizer | other | checkpoint: per save (saves) | checkpoint: share of all "
      "step time |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %.0f | %.3f | %s | %s | %s | %s | %s | %s | %.3f (%d) | %.0f%% |\n",
                r.config.c_str(), r.layout.c_str(), r.tokens_per_s, r.step,
                cell(r.forward, r.step).c_str(), cell(r.backward, r.step).c_str(),
                cell(r.reduce, r.step).c_str(), cell(r.clip, r.step).c_str(),
                cell(r.optimizer, r.step).c_str(), cell(r.other, r.step).c_str(),
                r.checkpoint_per_save, r.saves, 100.0 * r.checkpoint_share);
  }
  std::printf(
      "\n(seconds: medians per column over steps 2..%d of rank 0; %% of the median step; a "
      "synchronous checkpoint every %d steps: its time per save and its share of the total)\n",
      options.steps, checkpoint_interval);

  keep_or_remove(work_dir, options.keep, "runs kept in ");
  return 0;
}
