// Training throughput and MFU of mixtrain against its eager PyTorch twin (bench/twin/) on one
// CUDA device, in the same run (issue 15: ~0.5B Qwen2-MoE, bf16 model + fp32 main params + Muon;
// target ours >= 1.2x the twin).
//
// A plain program. First bench/cuda_probe.py (MIXTRAIN_PYTHON) says whether torch sees a CUDA
// device (none: prints "skipped: no CUDA device" and exits 0) and measures the device's bf16
// GEMM rate (torch.matmul of [N, N] x [N, N], N = 8192: at::matmul -> cuBLAS). Then R rounds
// (default 2), alternately, ours first in even rounds:
//   ours: `mixtrain train --config C --set train.device=cuda --set train.profile=true
//         --set train.steps=S` (one rank; metrics.jsonl rows: tokens_per_s, phases synchronised
//         with the device, peak_device_bytes);
//   twin: `qwen2_moe_twin.py --config C --device cuda --steps S` (JSON lines alike);
// both with OMP_NUM_THREADS=T (the twin: --threads T; the CPU side of a GPU step).
// Per run: tokens/s = the median over steps 2..S (step 1 creates the optimizer state and warms
// cuBLAS); per side: the median over rounds, the largest peak device memory, the median phase
// split. MFU = tokens/s x FLOPs per token / peak, with PaLM's definition (Chowdhery et al. 2022,
// "PaLM", appendix B): FLOPs per token = 6 N + 12 L S (heads x head_dim), N the active params
// (all but the input embedding and the unpicked experts; the twin counts them on its model),
// L layers, S the sequence length; the peak is the datasheet's dense bf16 figure (NVIDIA H200
// SXM: 1979 TFLOP/s with 2:4 sparsity = 989 dense; --peak-tflops for another device) and, for
// reference, the measured GEMM rate.
//
// Usage: bench_train_cuda_bench [MIXTRAIN_BINARY] [--config FILE] [--rounds R] [--steps S]
//          [--threads T] [--gemm N] [--peak-tflops F] [--twin-attention eager|sdpa]
//          [--twin-adamw default|foreach|fused] [--device cuda|cpu] [--child-timeout-s T]
//          [--out PATH] [--python PY] [--twin SCRIPT] [--work-dir DIR] [--keep]
// --device cpu rehearses the whole logic without a GPU (no probe, no GEMM; MFU against
// --peak-tflops is then meaningless). Exit 0 when both sides were measured (target met or not)
// or the device is missing; 1 when a child failed or ran past --child-timeout-s (the other
// side is still measured and reported; the failing side is not run again; the work directory
// with every log is kept).
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_support.h"

namespace {

using namespace mixtrain::bench;  // bench_support.h

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kTarget = 1.2;  // ours / twin tokens/s (issue 15)

struct Options {
  std::string binary = MIXTRAIN_BINARY;
  std::string python = MIXTRAIN_PYTHON;
  std::string twin = std::string(MIXTRAIN_SOURCE_DIR) + "/bench/twin/qwen2_moe_twin.py";
  std::string probe = std::string(MIXTRAIN_SOURCE_DIR) + "/bench/cuda_probe.py";
  std::string config = std::string(MIXTRAIN_SOURCE_DIR) + "/configs/qwen2_moe_0p5b.yaml";
  std::string device = "cuda";
  int rounds = 2;
  int steps = 10;
  int threads = 4;
  int gemm = 8192;
  double peak_tflops = 989.0;            // NVIDIA H200 SXM datasheet, dense bf16 tensor core
  std::string twin_attention = "eager";  // ours keeps the hand-written kernel in bf16
  std::string twin_adamw = "fused";      // torch's fastest AdamW: the ratio is not flattered
  int child_timeout_s = 150;
  std::string out;
  std::string work_dir;
  bool keep = false;
};

int at_least(const std::string& text, const char* option, int minimum) {
  const int value = std::atoi(text.c_str());
  if (value < minimum) fail(std::string(option) + " must be >= " + std::to_string(minimum));
  return value;
}

std::string one_of(const std::string& text, const char* option,
                   const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), text) == allowed.end()) {
    fail(std::string(option) + ": unknown value " + text);
  }
  return text;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] { return option_value(argc, argv, i); };
    if (arg == "--config") {
      o.config = value();
    } else if (arg == "--rounds") {
      o.rounds = at_least(value(), "--rounds", 1);
    } else if (arg == "--steps") {
      o.steps = at_least(value(), "--steps", 3);  // step 1 is not counted
    } else if (arg == "--threads") {
      o.threads = at_least(value(), "--threads", 1);
    } else if (arg == "--gemm") {
      o.gemm = at_least(value(), "--gemm", 0);
    } else if (arg == "--peak-tflops") {
      o.peak_tflops = std::atof(value().c_str());
      if (!(o.peak_tflops > 0)) fail("--peak-tflops must be > 0");
    } else if (arg == "--twin-attention") {
      o.twin_attention = one_of(value(), "--twin-attention", {"eager", "sdpa"});
    } else if (arg == "--twin-adamw") {
      o.twin_adamw = one_of(value(), "--twin-adamw", {"default", "foreach", "fused"});
    } else if (arg == "--device") {
      o.device = one_of(value(), "--device", {"cuda", "cpu"});
    } else if (arg == "--child-timeout-s") {
      o.child_timeout_s = at_least(value(), "--child-timeout-s", 1);
    } else if (arg == "--out") {
      o.out = value();
    } else if (arg == "--python") {
      o.python = value();
    } else if (arg == "--twin") {
      o.twin = value();
    } else if (arg == "--work-dir") {
      o.work_dir = value();
    } else if (arg == "--keep") {
      o.keep = true;
    } else if (arg == "-h" || arg == "--help") {
      std::printf(
          "usage: %s [MIXTRAIN_BINARY] [--config FILE] [--rounds R] [--steps S] [--threads T]\n"
          "          [--gemm N] [--peak-tflops F] [--twin-attention eager|sdpa]\n"
          "          [--twin-adamw default|foreach|fused] [--device cuda|cpu]\n"
          "          [--child-timeout-s T] [--out PATH] [--python PY] [--twin SCRIPT]\n"
          "          [--work-dir DIR] [--keep]\n"
          "Trains configs/qwen2_moe_0p5b.yaml on one CUDA device with mixtrain and with its\n"
          "eager PyTorch twin, alternately, R rounds (default 2) of S steps (default 10);\n"
          "prints tokens/s (median of steps 2..S), ours / twin (target >= %.1f), MFU against\n"
          "the dense bf16 peak (default 989 TFLOP/s, H200) and the measured N^3 bf16 GEMM rate\n"
          "(default N 8192; 0: not measured), peak device memory; JSON to --out.\n"
          "Without a CUDA device: prints \"skipped: no CUDA device\", exit 0.\n",
          argv[0], kTarget);
      std::exit(0);
    } else if (!arg.empty() && arg[0] != '-') {
      o.binary = arg;
    } else {
      fail("unknown argument " + arg + " (see --help)");
    }
  }
  return o;
}

// Runs a child (stdout + stderr to `log`, OMP_NUM_THREADS=threads); kills it (SIGKILL) after
// `timeout_s`. Returns "" when it exits 0, otherwise why not, with the end of its log.
std::string run_child(const std::vector<std::string>& args, const std::string& log, int threads,
                      int timeout_s) {
  const pid_t pid = spawn_logged(args, log, threads);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  bool killed = false;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) fail(std::string("waitpid: ") + std::strerror(errno));
    if (!killed && std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  std::string how = killed              ? "killed after " + std::to_string(timeout_s) + " s"
                    : WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                        : "signal " + std::to_string(WTERMSIG(status));
  return args[0] + " " + args[1] + ": " + how + "; end of " + log + ":\n" + tail_of_file(log, 12);
}

// The JSON lines of a log that also holds other output (Python warnings, progress lines).
std::vector<json> json_lines(const std::string& path) {
  std::vector<json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_discarded()) rows.push_back(std::move(row));
  }
  return rows;
}

double number_or(const json& row, const char* key, double fallback) {
  const auto it = row.find(key);
  return it != row.end() && it->is_number() ? it->get<double>() : fallback;
}

// One side over all rounds.
struct Side {
  std::string name;
  std::vector<double> run_rates;                     // each run's median tokens/s over steps 2..S
  std::vector<double> forward, backward, optimizer;  // per counted step
  double peak_device_bytes = 0;                      // the largest over every step and run
  std::string error;                                 // the first failure; the side stops
};

// Steps 2..S of `rows` into `side`; "" or why the rows do not fit. `on_device`: every row must
// have peak_device_bytes (ours writes it only when it computed on a device, so a run that fell
// back to the CPU is not taken for a GPU figure).
std::string take_steps(const std::vector<json>& rows, int steps, const std::string& source,
                       bool ours, bool on_device, Side& side) {
  std::vector<const json*> step_rows;
  for (const json& r : rows) {
    if (r.contains("step") && r.contains("tokens_per_s")) step_rows.push_back(&r);
  }
  if (static_cast<int>(step_rows.size()) != steps) {
    return source + " has " + std::to_string(step_rows.size()) + " step rows, expected " +
           std::to_string(steps);
  }
  std::vector<double> rates;
  for (size_t i = 0; i < step_rows.size(); ++i) {
    const json& r = *step_rows[i];
    if (on_device && !r.contains("peak_device_bytes")) {
      return source + ": step " + std::to_string(i + 1) +
             " has no peak_device_bytes: the run did not compute on the device";
    }
    side.peak_device_bytes = std::max(side.peak_device_bytes, number_or(r, "peak_device_bytes", 0));
    if (i == 0) continue;
    rates.push_back(number_or(r, "tokens_per_s", NAN));
    side.forward.push_back(number_or(r, "forward_s", NAN));
    side.backward.push_back(number_or(r, "backward_s", NAN));
    // Ours splits clipping from the update; the twin's optimizer_s includes its clip.
    side.optimizer.push_back(number_or(r, "optimizer_s", NAN) +
                             (ours ? number_or(r, "clip_s", 0) : 0));
  }
  side.run_rates.push_back(median(rates));
  return "";
}

void run_ours(const Options& o, const std::string& dir, Side& side) {
  const std::string run_dir = dir + "-ours";
  const std::vector<std::string> args = {o.binary,    "train",
                                         "--config",  o.config,
                                         "--set",     "train.device=" + o.device,
                                         "--set",     "train.profile=true",
                                         "--set",     "train.steps=" + std::to_string(o.steps),
                                         "--set",     "train.log_every=" + std::to_string(o.steps),
                                         "--set",     "checkpoint.interval=0",
                                         "--run-dir", run_dir};
  side.error = run_child(args, run_dir + ".log", o.threads, o.child_timeout_s);
  if (!side.error.empty()) return;
  const std::string metrics = run_dir + "/metrics.jsonl";
  side.error = take_steps(read_jsonl(metrics), o.steps, metrics, true, o.device == "cuda", side);
}

// Returns the twin's summary line ({} when it failed).
json run_twin(const Options& o, const std::string& dir, Side& side) {
  const std::string log = dir + "-twin.log";
  const std::vector<std::string> args = {o.python,       o.twin,
                                         "--config",     o.config,
                                         "--device",     o.device,
                                         "--steps",      std::to_string(o.steps),
                                         "--threads",    std::to_string(o.threads),
                                         "--attention",  o.twin_attention,
                                         "--adamw-impl", o.twin_adamw};
  side.error = run_child(args, log, o.threads, o.child_timeout_s);
  if (!side.error.empty()) return {};
  const std::vector<json> rows = json_lines(log);
  side.error = take_steps(rows, o.steps, log, false, o.device == "cuda", side);
  for (const json& r : rows) {
    if (r.contains("summary")) return r.at("summary");
  }
  if (side.error.empty()) side.error = log + " has no summary line";
  return {};
}

// The probe's JSON line; fail()s when the probe itself fails.
json probe_device(const Options& o, const std::string& work_dir) {
  const std::string log = work_dir + "/probe.log";
  const std::string error = run_child({o.python, o.probe, "--gemm", std::to_string(o.gemm)}, log,
                                      o.threads, o.child_timeout_s);
  if (!error.empty()) fail(error);
  for (const json& row : json_lines(log)) {
    if (row.contains("cuda")) return row;
  }
  fail(log + " has no JSON line");
}

void write_out(const std::string& path, const json& result) {
  if (path.empty()) return;
  std::ofstream out(path);
  out << result.dump(2) << "\n";
  if (!out) fail("cannot write " + path);
}

json side_json(const Side& s, double flops_per_token, double peak_tflops,
               std::optional<double> gemm_tflops) {
  if (s.run_rates.empty()) return {{"error", s.error}};
  const double rate = median(s.run_rates);
  json j = {{"tokens_per_s", rate},
            {"tokens_per_s_rounds", s.run_rates},
            {"model_tflops", rate * flops_per_token / 1e12},
            {"mfu_of_peak", rate * flops_per_token / (peak_tflops * 1e12)},
            {"peak_device_bytes", s.peak_device_bytes},
            {"forward_s", median(s.forward)},
            {"backward_s", median(s.backward)},
            {"optimizer_s", median(s.optimizer)}};
  if (gemm_tflops) j["mfu_of_gemm"] = rate * flops_per_token / (*gemm_tflops * 1e12);
  if (!s.error.empty()) j["error"] = s.error;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  program_name() = "bench_train_cuda_bench";
  const Options o = parse_options(argc, argv);
  require_executable(o.binary);
  require_executable(o.python);
  for (const std::string& file : {o.twin, o.probe, o.config}) {
    if (!fs::is_regular_file(file)) fail("no " + file);
  }
  const std::string work_dir = make_work_dir(o.work_dir, "mixtrain-train-cuda");
  json result = {{"config", o.config},
                 {"device", o.device},
                 {"rounds", o.rounds},
                 {"steps", o.steps},
                 {"counted", "2.." + std::to_string(o.steps)},
                 {"threads", o.threads},
                 {"target_ratio", kTarget},
                 {"peak_tflops", o.peak_tflops},
                 {"twin_attention", o.twin_attention},
                 {"twin_adamw", o.twin_adamw}};

  std::optional<double> gemm_tflops;
  if (o.device == "cuda") {
    const json probe = probe_device(o, work_dir);
    if (!probe.value("cuda", false)) {
      std::printf("skipped: no CUDA device\n");
      result["skipped"] = "no CUDA device";
      write_out(o.out, result);
      keep_or_remove(work_dir, o.keep, "probe log kept in ");
      return 0;
    }
    result["device_name"] = probe.value("device_name", "unknown");
    result["device_memory_bytes"] = probe.value("total_memory_bytes", 0.0);
    if (probe.contains("gemm")) {
      gemm_tflops = probe.at("gemm").at("tflops").get<double>();
      result["gemm"] = probe.at("gemm");
    }
    char gemm_text[32] = "not measured";
    if (gemm_tflops) std::snprintf(gemm_text, sizeof(gemm_text), "%.0f", *gemm_tflops);
    std::printf(
        "device: %s, %.0f GiB; bf16 GEMM %d^3: %s TFLOP/s; peak (datasheet, dense "
        "bf16): %.0f TFLOP/s\n",
        result["device_name"].get<std::string>().c_str(),
        result["device_memory_bytes"].get<double>() / (1 << 30), o.gemm, gemm_text, o.peak_tflops);
  } else {
    std::printf("device: cpu (rehearsal: MFU against %.0f TFLOP/s means nothing here)\n",
                o.peak_tflops);
  }
  std::printf("config %s, %d rounds x %d steps, %d threads; runs in %s\n\n", o.config.c_str(),
              o.rounds, o.steps, o.threads, work_dir.c_str());
  std::fflush(stdout);

  Side ours, twin;
  ours.name = "ours";
  twin.name = "twin";
  json summary;  // the twin's: params, active params, FLOPs per token
  for (int round = 0; round < o.rounds; ++round) {
    const std::string dir = work_dir + "/round" + std::to_string(round);
    for (int turn = 0; turn < 2; ++turn) {
      const bool ours_turn = (turn == 0) == (round % 2 == 0);
      if (ours_turn && ours.error.empty()) run_ours(o, dir, ours);
      if (!ours_turn && twin.error.empty()) {
        const json s = run_twin(o, dir, twin);
        if (!s.is_null()) summary = s;
      }
    }
    std::fprintf(stderr, "  round %d: ours %.0f tok/s, twin %.0f tok/s (NaN: failed)\n", round + 1,
                 ours.error.empty() ? ours.run_rates.back() : NAN,
                 twin.error.empty() ? twin.run_rates.back() : NAN);
  }
  for (const Side* s : {&ours, &twin}) {
    if (!s->error.empty())
      std::fprintf(stderr, "%s failed: %s\n", s->name.c_str(), s->error.c_str());
  }

  // FLOPs per token from the twin's model (the same shapes as ours: tests/python/twin_oracle.py).
  const double flops_per_token = summary.is_null() ? NAN : summary.value("flops_per_token", NAN);
  if (!summary.is_null()) {
    result["params"] = summary.value("params", 0.0);
    result["active_params"] = summary.value("active_params", 0.0);
    result["flops_per_token"] = flops_per_token;
    result["mfu_formula"] =
        "6 * active_params + 12 * layers * seq_len * heads * head_dim (PaLM, appendix B)";
  }
  result["ours"] = side_json(ours, flops_per_token, o.peak_tflops, gemm_tflops);
  result["twin"] = side_json(twin, flops_per_token, o.peak_tflops, gemm_tflops);
  const bool both = !ours.run_rates.empty() && !twin.run_rates.empty();
  if (both) {
    const double ratio = median(ours.run_rates) / median(twin.run_rates);
    result["ratio"] = ratio;
    result["target_met"] = ratio >= kTarget;
  }

  if (!summary.is_null()) {
    std::printf("model: %.1fM params, %.1fM active; %.3f GFLOP per token (6N + 12 L S H)\n",
                result["params"].get<double>() / 1e6, result["active_params"].get<double>() / 1e6,
                flops_per_token / 1e9);
  }
  std::printf(
      "| side | tokens/s (rounds) | model TFLOP/s | MFU of %.0f TFLOP/s | MFU of GEMM rate | peak "
      "device memory (GiB) | forward / backward / optimizer (s) |\n",
      o.peak_tflops);
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Side* s : {&ours, &twin}) {
    if (s->run_rates.empty()) {
      std::printf("| %s | failed | | | | | |\n", s->name.c_str());
      continue;
    }
    const double rate = median(s->run_rates);
    std::string rounds;
    for (double r : s->run_rates) rounds += (rounds.empty() ? "" : ", ") + std::to_string(long(r));
    char gemm_text[32] = "n/a";
    if (gemm_tflops) {
      std::snprintf(gemm_text, sizeof(gemm_text), "%.1f%%",
                    100 * rate * flops_per_token / (*gemm_tflops * 1e12));
    }
    std::printf("| %s | %.0f (%s) | %.1f | %.1f%% | %s | %.1f | %.3f / %.3f / %.3f |\n",
                s->name.c_str(), rate, rounds.c_str(), rate * flops_per_token / 1e12,
                100 * rate * flops_per_token / (o.peak_tflops * 1e12), gemm_text,
                s->peak_device_bytes / (1 << 30), median(s->forward), median(s->backward),
                median(s->optimizer));
  }
  if (both) {
    std::printf("\nours / twin: **%.2f** (target >= %.1f: %s)\n", result["ratio"].get<double>(),
                kTarget, result["target_met"].get<bool>() ? "met" : "NOT met");
  }
  std::printf(
      "(tokens/s: median over rounds of each run's median over steps 2..%d; phases: medians over "
      "those steps of all rounds, ours' optimizer = clip + optimizer; peak device memory: "
      "allocated bytes, the largest of any step)\n",
      o.steps);
  write_out(o.out, result);
  const bool failed = !ours.error.empty() || !twin.error.empty();
  keep_or_remove(work_dir, o.keep || failed, failed ? "logs kept in " : "runs kept in ");
  return failed ? 1 : 0;
}
