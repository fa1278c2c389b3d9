// bench_activation_checkpointing_bench: what train.activation_checkpointing saves in memory and
// costs in time. One forward + backward (cross-entropy on the logits) of a dense qwen2 decoder,
// hidden 384, 8 layers, 6 query / 2 kv heads of 64, MLP 1536, vocabulary 8192, float32 (the CPU
// flash kernel: no [S, S] scores kept), batch 4 x 512 tokens, with activation checkpointing
// none, selective (every 2nd layer) and full. Each mode runs in its own child process (a fresh
// heap), which reports its peak resident set (getrusage ru_maxrss) after the model is built and
// after 3 steps, and the median step time. The activation figure is the peak minus the resident
// set after building and one step's gradients (the parameters' size again), and is compared with
// an analytic count of what a layer keeps for backward. The machine may be shared: the load is
// printed.
//
//   build/bench_activation_checkpointing_bench [--child MODE]
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/nn/functional.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench_support.h"
#include "mixtrain/model/registry.h"

namespace {

using mixtrain::bench::fail;
using mixtrain::bench::median;

constexpr int64_t kBatch = 4, kSeq = 512, kHidden = 384, kLayers = 8, kHeads = 6, kKvHeads = 2,
                  kHeadDim = 64, kMlp = 1536, kVocab = 8192;

mixtrain::ModelConfig bench_config() {
  mixtrain::ModelConfig c;
  c.name = "qwen2";
  c.vocab_size = kVocab;
  c.hidden_size = kHidden;
  c.num_layers = kLayers;
  c.num_heads = kHeads;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kHeadDim;
  c.intermediate_size = kMlp;
  c.max_seq_len = kSeq;
  return c;
}

double max_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

int64_t every_of(const std::string& mode) {
  if (mode == "none") return 0;
  if (mode == "full") return 1;
  if (mode == "selective") return 2;
  fail("unknown mode " + mode);
}

// One mode, in this process: prints "built_mib peak_mib step_s".
int child(const std::string& mode) {
  auto model = mixtrain::build_model(bench_config(), 1);
  model->set_activation_checkpointing(every_of(mode));
  const double built = max_rss_mib();
  const auto ids = torch::randint(kVocab, {kBatch, kSeq}, torch::kInt64);
  std::vector<double> times;
  for (int step = 0; step < 3; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const auto out = model->forward(ids);
    const auto loss = torch::nn::functional::cross_entropy(
        out.logits.narrow(1, 0, kSeq - 1).reshape({-1, kVocab}),
        ids.narrow(1, 1, kSeq - 1).reshape({-1}));
    loss.backward();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::printf("%.1f %.1f %.4f\n", built, max_rss_mib(), median(times));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--child") return child(argv[2]);
  double load[1] = {-1.0};
  getloadavg(load, 1);
  const double params =
      2.0 * kVocab * kHidden +
      kLayers * (kHidden * (kHeads + 2 * kKvHeads) * kHeadDim +
                 (kHeads + 2 * kKvHeads) * kHeadDim +  // q/k/v biases
                 kHeads * kHeadDim * kHidden + 3.0 * kHidden * kMlp + 2 * kHidden) +
      kHidden;
  const double param_mib = params * 4 / (1 << 20);
  // What one layer keeps for backward, float32 (autograd's saved tensors, counted from the
  // layer's ops): the input and two RMSNorm outputs and their float32 norms (~6 x H), q, k, v
  // after rotary and the attention output ((Hq + 2 Hkv) D + Hq D), o's input (Hq D), the MLP's
  // gate, up, silu(gate), product (4 x I): per token, times 4 bytes.
  const double per_token =
      6.0 * kHidden + (2.0 * kHeads + 2 * kKvHeads) * kHeadDim + kHeads * kHeadDim + 4.0 * kMlp;
  const double layer_mib = per_token * kBatch * kSeq * 4 / (1 << 20);
  std::printf(
      "activation checkpointing: dense qwen2, %lld layers, hidden %lld, batch %lld x %lld "
      "tokens, float32; %.1f M parameters (%.0f MiB); load average %.2f\n",
      static_cast<long long>(kLayers), static_cast<long long>(kHidden),
      static_cast<long long>(kBatch), static_cast<long long>(kSeq), params / 1e6, param_mib,
      load[0]);
  std::printf(
      "analytic: a layer keeps ~%.0f MiB for backward; none keeps %lld of them, selective "
      "(every 2nd) %lld plus one layer's input each, full only their inputs (%.0f MiB "
      "each) plus one layer during its recompute\n",
      layer_mib, static_cast<long long>(kLayers), static_cast<long long>(kLayers / 2),
      kHidden * kBatch * kSeq * 4.0 / (1 << 20));
  std::printf("%-10s %10s %10s %14s %10s %10s\n", "mode", "built MiB", "peak MiB", "activations",
              "step s", "time x");
  double base_act = 0, base_time = 0;
  const std::string self = "/proc/self/exe";
  char path[4096];
  const ssize_t n = readlink(self.c_str(), path, sizeof(path) - 1);
  if (n <= 0) fail("readlink /proc/self/exe");
  path[n] = '\0';
  for (const std::string mode : {"none", "selective", "full"}) {
    const std::string log = "/tmp/bench_ac_" + std::to_string(getpid()) + "_" + mode + ".log";
    const pid_t pid = mixtrain::bench::spawn_logged({path, "--child", mode}, log, 0);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fail("the " + mode + " child failed:\n" + mixtrain::bench::tail_of_file(log, 20));
    }
    std::ifstream in(log);
    double built = 0, peak = 0, step = 0;
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    if (std::sscanf(last.c_str(), "%lf %lf %lf", &built, &peak, &step) != 3) {
      fail("cannot read the " + mode + " child's figures: " + last);
    }
    std::remove(log.c_str());
    const double activations = peak - built - param_mib;  // the gradients take param_mib
    if (mode == "none") {
      base_act = activations;
      base_time = step;
    }
    std::printf("%-10s %10.0f %10.0f %8.0f (%3.0f%%) %10.3f %10.2f\n", mode.c_str(), built, peak,
                activations, 100.0 * activations / base_act, step, step / base_time);
  }
  return 0;
}
