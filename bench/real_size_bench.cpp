// Real model shapes, measured: what `mixtrain train` holds in memory and how fast it trains at the
// sizes people fine-tune, with random weights (no download).
//
// A plain program (no Google Benchmark). Three configs, written to the work directory, each with
// the fp32-main-params §1 precision (bfloat16 model, float32 main params, FSDP reducing in
// float32, bfloat16 logits):
//   - qwen3-0.6b: Qwen3-0.6B's config.json dims (vocabulary 151,936, hidden 1024, 28 layers,
//     16 query / 8 kv heads of 128, MLP 3072, tied embeddings), whole;
//   - qwen2.5-1.5b/14: Qwen2.5-1.5B's dims (hidden 1536, 12 / 2 heads of 128, MLP 8960, q/k/v
//     biases, tied) with 14 of its 28 layers: the whole model's weights, float32 main params,
//     gradients and Muon/AdamW state (~16 bytes per parameter, 1.54e9 parameters) exceed this
//     machine's 24 GiB;
//   - qwen3-30b-a3b/1L-32E: one layer of Qwen3-30B-A3B (hidden 2048, 32 / 4 heads of 128, q/k
//     norms, routed experts of 768, top 8, normalized; untied embedding and head) with 32 of its
//     128 experts: its untied embedding and head alone (6.2e8 parameters) take ~11 GiB with
//     AdamW at 18 bytes each, and 128 experts add 6.0e8 more;
//   - moonlight-16b-a3b/2L and qwen3-30b-a3b/4L-32E, the pair issue 34 compares at about the
//     same parameters per token (0.837e9 / 0.849e9 active, 1.339e9 / 1.302e9 in all):
//     configs/moonlight_16b_a3b_2layer.yaml's model (DeepSeek-V3 architecture, Moonlight's dims,
//     a dense and a MoE layer of 64 experts) and Qwen3-30B-A3B's dims with 4 layers of 32
//     experts. These two train only with Muon on 1 rank (AdamW alone, or a second process on
//     this machine, does not fit in 24 GiB), with the swap optimizer; the Moonlight cut with
//     QK-clip at tau 100 as the shipped config (Qwen3-MoE's q/k norms rule QK-clip out).
// Each is trained for S steps (default 3) of 2 x 512 tokens (global batch 2; one 512-token
// micro-batch per rank and step on 2 ranks, two accumulated on 1 rank) under every setting
// (except the pair above): optimizer Muon (+ AdamW for embedding, norms, biases, router: the
// Moonlight routing) or AdamW alone; activation checkpointing none or full; 1 rank (both cores)
// or 2 ranks (FSDP over dp_shard 2, one thread each). Per run it reports:
//   - peak RSS: ru_maxrss of the run (wait4; on 2 ranks the larger rank's), minus the RSS of the
//     same binary doing no training (`config show`: libraries, the config), and the caching CPU
//     allocator's own peak of live buffers (its log line; the larger rank's), which is what the
//     analytic count is compared with (the RSS adds the blocks the allocator keeps cached);
//   - the analytic bytes per rank for the same run: bf16 weights 2P/N, float32 main params 4P/N,
//     optimizer state (8 bytes per AdamW element, 4 per Muon element) / N (with the swap
//     optimizer: two groups, each a 64 MiB bucket or one larger parameter's state), gradients,
//     and the
//     activations of one micro-batch of T tokens. Gradients: the float32 main_grad (4P/N) lives
//     from the first micro-batch's backward to the step; on 1 rank each param's bf16 .grad is
//     folded into it as autograd produces it (2 bytes x the largest parameter at a time); on N
//     ranks FSDP's working copy of the largest parameter (its gathered bf16 copy and full bf16
//     gradient, 4 bytes per element, plus one 64 MiB float32 block of the reduce-scatter and its
//     receive buffer) comes on top. Not counted: the optimizer step's temporaries (Newton-Schulz
//     on the largest matrix; the bf16 copy-back). Activations, bytes per token,
//     counted from the ops' saved tensors (model/layers.cpp, model/attention.cpp): per layer
//     16H (two RMSNorms: float32 input, bf16 normed, bf16 scaled output) + 8 hq D (q, repeated
//     k and v, attention output) + 6 hq T (bf16 attention's float32 softmax and its bf16 copy,
//     one row of T keys per query) + 8 I (SwiGLU: gate, up, silu, product) + with q/k norms
//     6 (hq + hkv) D; a routed-experts layer has instead of 8 I: 6 E (router logits, float32
//     probabilities) + k (4 H + 8 I_e) (each token's k expert rows in and out, SwiGLU of I_e).
//     MLA (model/deepseek_v3.cpp) has instead of 8 hq D: 8 (kv_lora_rank + q_lora_rank) (the
//     latent norms) + 6 hq D' (q, k, v zero-padded to D' = max(dn + dr, dv)) + 2 hq dv (o_proj's
//     input); its MoE layers 4 H + 6 E (the float32 router input, logits and sigmoid scores) +
//     the routed experts as above + 8 n_shared I_e (the shared experts' SwiGLU). After the layers
//     8H (final norm) + 10 V (bf16 logits, float32 log-probabilities and their gradient). With full
//     checkpointing a layer keeps only its input (2H) plus one layer's set during its recompute;
//   - tokens/s (the median over steps 2..S of metrics.jsonl's tokens_per_s: step 1 creates the
//     optimizer state), the tokens of a step over its time outside the optimizer step (the
//     medians of step_s minus optimizer_s: forward, backward, clipping; what the architecture
//     costs per token) and the median optimizer time (train.profile).
// The table is Markdown, for bench/README.md. A run the machine cannot hold (killed, or the
// trainer's out-of-memory error) is reported as such, not skipped.
//
// Usage: bench_real_size_bench [MIXTRAIN_BINARY] [--steps S] [--only NAME[,NAME...]]
//                              [--work-dir DIR] [--keep]
// It takes about 70 minutes on 2 cores (Muon's Newton-Schulz at these sizes dominates).
// Exit code 0 when every run trained and was measured, 1 otherwise.
#include <sys/resource.h>
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
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "bench_support.h"
#include "mixtrain/model/deepseek_v3_config.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/optimizer_table.h"
#include "routed_params.h"

namespace {

using namespace mixtrain::bench;  // bench_support.h

constexpr int kSeq = 512, kGlobalBatch = 2;

struct Setting {
  bool muon;
  bool full_ac;
  int ranks;
  std::string label() const {
    return std::string(muon ? "Muon" : "AdamW") + ", AC " + (full_ac ? "full" : "none") + ", " +
           std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks");
  }
};

// Every setting: Muon and AdamW, activation checkpointing none and full, 1 and 2 ranks.
std::vector<Setting> every_setting() {
  std::vector<Setting> all;
  for (const bool muon : {true, false}) {
    for (const bool full_ac : {false, true}) {
      for (const int ranks : {1, 2}) all.push_back({muon, full_ac, ranks});
    }
  }
  return all;
}

const std::vector<Setting> kMoeComparisonSettings = {{true, false, 1}, {true, true, 1}};
// Both with the swap optimizer; the Moonlight cut with QK-clip at tau 100 as the shipped config
// trains (Qwen3-MoE refuses QK-clip: its q/k norms make the logits independent of the
// projections' scale).
const std::vector<std::string> kSwapOverrides = {"optimizer.swap_optimizer=true"};
const std::vector<std::string> kSwapClipOverrides = {"optimizer.swap_optimizer=true",
                                                     "optimizer.muon_config.muon_qk_clip_tau=100"};

struct ModelSpec {
  std::string name;
  std::string model_yaml;  // the model section
  std::vector<Setting> settings = every_setting();
  std::vector<std::string> overrides = {};  // --set for every run
  std::string note = "";                    // the overrides, in the setting column
};

// Qwen3-30B-A3B's model section (dims and vocabulary) with `layers` layers of 32 of its 128
// experts.
std::string qwen3_30b_a3b_32_experts(int layers) {
  return R"(model:
  name: qwen3_moe
  vocab_size: 151936
  hidden_size: 2048
  num_layers: )" +
         std::to_string(layers) + R"(
  num_heads: 32
  num_kv_heads: 4
  head_dim: 128
  moe_intermediate_size: 768
  num_experts: 32
  num_experts_per_tok: 8
  norm_topk_prob: true
  router_aux_loss_coef: 0.001
  rope_theta: 1000000.0
  rms_norm_eps: 1.0e-6
  tie_word_embeddings: false
)";
}

std::vector<ModelSpec> model_specs() {
  return {
      {"qwen3-0.6b",
       R"(model:
  name: qwen3
  vocab_size: 151936
  hidden_size: 1024
  intermediate_size: 3072
  num_layers: 28
  num_heads: 16
  num_kv_heads: 8
  head_dim: 128
  rope_theta: 1000000.0
  rms_norm_eps: 1.0e-6
  tie_word_embeddings: true
)"},
      {"qwen2.5-1.5b/14",
       R"(model:
  name: qwen2
  vocab_size: 151936
  hidden_size: 1536
  intermediate_size: 8960
  num_layers: 14
  num_heads: 12
  num_kv_heads: 2
  head_dim: 128
  rope_theta: 1000000.0
  rms_norm_eps: 1.0e-6
  tie_word_embeddings: true
)"},
      {"qwen3-30b-a3b/1L-32E", qwen3_30b_a3b_32_experts(1)},
      // The pair issue 34 compares: DeepSeek-V3's architecture (MLA, sigmoid routing with the
      // balancing bias, shared experts, a dense first layer) against Qwen3-MoE's (GQA with q/k
      // norms, softmax routing) at about the same parameters per token (active 0.837e9 and
      // 0.849e9; 1.339e9 and 1.302e9 in all). Muon, on 1 rank (2 ranks on one machine hold
      // the same bytes plus a second process), with the swap optimizer: the 0.67e9 AdamW
      // elements of the untied embedding and head make ~20 GiB of weights, main params,
      // gradients and optimizer state, which with activations exceed this machine's 24 GiB.
      {"moonlight-16b-a3b/2L",
       R"(model:
  name: deepseek_v3
  vocab_size: 163840
  hidden_size: 2048
  num_layers: 2
  num_heads: 16
  num_kv_heads: 16
  head_dim: 64
  intermediate_size: 11264
  q_lora_rank: 0
  kv_lora_rank: 512
  qk_nope_head_dim: 128
  qk_rope_head_dim: 64
  v_head_dim: 128
  moe_intermediate_size: 1408
  num_experts: 64
  num_experts_per_tok: 6
  n_shared_experts: 2
  n_group: 1
  topk_group: 1
  routed_scaling_factor: 2.446
  first_k_dense_replace: 1
  norm_topk_prob: true
  bias_update_speed: 0.001
  router_aux_loss_coef: 0.001
  rope_theta: 50000.0
  rms_norm_eps: 1.0e-5
  rope_interleave: true
  tie_word_embeddings: false
)",
       kMoeComparisonSettings, kSwapClipOverrides, ", swap optimizer, QK-clip"},
      {"qwen3-30b-a3b/4L-32E", qwen3_30b_a3b_32_experts(4), kMoeComparisonSettings, kSwapOverrides,
       ", swap optimizer"},
  };
}

std::string config_text(const ModelSpec& spec) {
  return std::string("# Written by bench_real_size_bench (bench/real_size_bench.cpp).\n") +
         kMuonAdamWSections + spec.model_yaml + "  max_seq_len: " + std::to_string(kSeq) +
         "\ndata:\n  kind: synthetic\n  seq_len: " + std::to_string(kSeq) +
         "\n  micro_batch_size: 1\n  global_batch_size: " + std::to_string(kGlobalBatch) +
         R"(
train:
  seed: 1234
  max_grad_norm: 1.0
  log_every: 1
  profile: true
checkpoint:
  interval: 0
)";
}

// Whether the config's model normalizes each head's q and k (its registry section says).
bool qk_norm(const mixtrain::ModelConfig& m) {
  for (const mixtrain::ModelEntry& entry : mixtrain::model_registry()) {
    if (entry.name == m.name) return entry.section.qk_norm;
  }
  fail("no registered model " + m.name);
}

// Activation bytes per token of decoder layer `index` of the model `p` describes, for sequences of
// `tokens` tokens (the header's count).
double layer_bytes(const RoutedParams& p, int64_t tokens, int64_t index) {
  const mixtrain::ModelConfig& m = p.model;
  const double h = m.hidden_size, heads = m.num_heads;
  const mixtrain::MoeConfig& moe = mixtrain::moe_config(m);
  const double experts = moe.num_experts, k = moe.num_experts_per_tok;
  const double routed = k * (4 * h + 8.0 * moe.moe_intermediate_size);
  double layer = 16 * h + 6 * heads * tokens;  // two RMSNorms; the softmax
  if (m.name == "deepseek_v3") {
    // MLA: the latent norms (8 per element, as any RMSNorm); q, k and v zero-padded to one head
    // dim D = max(dn + dr, dv) (6 heads D); o_proj's input (2 heads dv).
    const mixtrain::DeepseekV3Config& d = mixtrain::deepseek_v3_config(m);
    const double dim = std::max(d.qk_nope_head_dim + d.qk_rope_head_dim, d.v_head_dim);
    layer += 8.0 * (d.kv_lora_rank + d.q_lora_rank) + 6 * heads * dim + 2 * heads * d.v_head_dim;
    // A dense first layer's SwiGLU, or the float32 router input (4 h), its logits and sigmoid
    // scores (6 E), the routed experts and the shared experts' SwiGLU.
    layer +=
        index < d.first_k_dense_replace
            ? 8.0 * m.intermediate_size
            : 4 * h + 6 * experts + routed + 8.0 * d.n_shared_experts * moe.moe_intermediate_size;
    return layer;
  }
  layer += 8 * heads * m.head_dim;
  if (qk_norm(m)) layer += 6.0 * (m.num_heads + m.num_kv_heads) * m.head_dim;
  layer += p.experts ? 6 * experts + routed : 8.0 * m.intermediate_size;
  return layer;
}

// Activation bytes of one micro-batch of `tokens` tokens (the header's count).
double activation_bytes(const RoutedParams& p, int64_t tokens, bool full_checkpointing) {
  const mixtrain::ModelConfig& m = p.model;
  const double h = m.hidden_size;
  double layers = 0, largest = 0;
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const double layer = layer_bytes(p, tokens, i);
    layers += layer;
    largest = std::max(largest, layer);
  }
  const double kept = full_checkpointing ? m.num_layers * 2 * h + largest : layers;
  return tokens * (kept + 8 * h + 10.0 * m.vocab_size);
}

struct Analytic {
  double weights, main, state, grads, activations, working, total;
};

// `swap`: the swap optimizer holds at most two groups of state at a time (the rest in its file),
// a group a bucket of 64 MiB (its default size) or one larger parameter's state whole: at most
// the two largest parameters' state, each at least 64 MiB.
Analytic analytic(const RoutedParams& p, const Setting& s, bool swap) {
  const double n = s.ranks, bucket = 64 << 20;
  Analytic a{};
  a.weights = 2.0 * p.total / n;
  a.main = 4.0 * p.total / n;
  a.state = swap ? (std::max(bucket, p.largest_state) + std::max(bucket, p.second_state)) / n
                 : p.state_bytes() / n;
  a.activations = activation_bytes(p, kSeq, s.full_ac);
  a.grads = 4.0 * p.total / n;
  a.working = s.ranks == 1 ? 2.0 * p.largest : 4.0 * p.largest + 2.0 * (64 << 20);
  a.total = a.weights + a.main + a.state + a.grads + a.activations + a.working;
  return a;
}

struct RunResult {
  int exit_code = -1;  // -signal when killed
  double peak_rss_mib = 0, allocator_peak_mib = 0, tokens_per_s = 0, optimizer_s = 0, step_s = 0;
  std::string log;
};

// Waits for `pid`; its exit code (-signal when killed) and ru_maxrss in MiB (descendants
// included: on 2 ranks the launcher waits for both).
int wait_child(pid_t pid, double* max_rss_mib) {
  int status = 0;
  struct rusage usage {};
  while (wait4(pid, &status, 0, &usage) < 0) {
    if (errno != EINTR) fail(std::string("wait4: ") + std::strerror(errno));
  }
  *max_rss_mib = usage.ru_maxrss / 1024.0;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? -WTERMSIG(status) : -1;
}

// The largest "its peak of live buffers (X MiB)" in the log (one line per rank); 0 when none.
double allocator_peak_mib(const std::string& log_path) {
  std::ifstream in(log_path);
  const std::regex pattern(R"(its peak of live buffers \(([0-9.]+) MiB\))");
  std::string line;
  double peak = 0;
  std::smatch match;
  while (std::getline(in, line)) {
    if (std::regex_search(line, match, pattern)) peak = std::max(peak, std::stod(match[1]));
  }
  return peak;
}

RunResult run(const std::string& binary, const std::string& config, const std::string& dir,
              const Setting& s, const std::vector<std::string>& overrides, int steps) {
  RunResult r;
  r.log = dir + ".log";
  std::vector<std::string> args = {
      binary,      "train",
      "--config",  config,
      "--run-dir", dir,
      "--set",     "train.steps=" + std::to_string(steps),
      "--set",     std::string("train.activation_checkpointing=") + (s.full_ac ? "full" : "none")};
  if (!s.muon) args.insert(args.end(), {"--set", "optimizer._target_=AdamW"});
  for (const std::string& o : overrides) args.insert(args.end(), {"--set", o});
  if (s.ranks > 1) args.insert(args.begin() + 2, {"--nproc", std::to_string(s.ranks)});
  r.exit_code = wait_child(spawn_logged(args, r.log), &r.peak_rss_mib);
  if (r.exit_code != 0) return r;
  r.allocator_peak_mib = allocator_peak_mib(r.log);
  const std::vector<nlohmann::json> rows = read_jsonl(dir + "/metrics.jsonl");
  std::vector<double> tokens, optimizer, step;
  for (size_t i = 1; i < rows.size(); ++i) {
    tokens.push_back(rows[i].at("tokens_per_s").get<double>());
    optimizer.push_back(rows[i].at("optimizer_s").get<double>());
    step.push_back(rows[i].at("step_s").get<double>());
  }
  r.tokens_per_s = median(tokens);
  r.optimizer_s = median(optimizer);
  r.step_s = median(step);
  return r;
}

double gib(double bytes) {
  return bytes / (1024.0 * 1024.0 * 1024.0);
}

}  // namespace

int main(int argc, char** argv) {
  mixtrain::register_model_sections();  // before any config is read
  mixtrain::register_optimizer_sections();
  program_name() = "bench_real_size_bench";
  std::string binary = MIXTRAIN_BINARY, work_dir, only;
  bool keep = false;
  int steps = 3;
  parse_arguments(argc, argv,
                  "[MIXTRAIN_BINARY] [--steps S] [--only NAME,...] [--work-dir DIR] [--keep]\n"
                  "Trains real-size configs (random weights) S steps (default 3) under Muon or\n"
                  "AdamW, activation checkpointing none or full, on 1 and 2 ranks; prints peak\n"
                  "RSS against the analytic bytes, and tokens/s.\n",
                  &binary, work_dir, keep, [&](const std::string& arg, const auto& value) {
                    if (arg == "--steps") {
                      steps = int_at_least(value(), "--steps", 2, "step 1 is not counted");
                    } else if (arg == "--only") {
                      only = value();
                    } else {
                      return false;
                    }
                    return true;
                  });
  require_executable(binary);
  const std::string dir = make_work_dir(work_dir, "mixtrain-real-size");
  double load[1] = {-1};
  getloadavg(load, 1);
  std::printf(
      "machine: %ld CPUs, %s, %.1f GiB memory; load average %.2f; %d steps of %d x %d "
      "tokens per run\n",
      sysconf(_SC_NPROCESSORS_ONLN), cpu_model().c_str(), mem_total_kib() / 1048576.0, load[0],
      steps, kGlobalBatch, kSeq);

  // Every run first, the parameter counts (which build the models here) after all of them: a
  // child's ru_maxrss counts what its parent had resident when it forked, and glibc keeps part of
  // a freed model resident.
  struct ConfigRuns {
    const ModelSpec* spec;
    std::string config;
    std::vector<std::pair<Setting, RunResult>> runs;
  };
  const std::vector<ModelSpec> specs = model_specs();
  std::vector<ConfigRuns> done;
  double base_mib = -1;
  bool all_ok = true;
  for (const ModelSpec& spec : specs) {
    if (!only.empty() && ("," + only + ",").find("," + spec.name + ",") == std::string::npos) {
      continue;
    }
    std::string file = spec.name;
    std::replace(file.begin(), file.end(), '/', '_');
    ConfigRuns c{&spec, dir + "/" + file + ".yaml", {}};
    std::ofstream(c.config) << config_text(spec);
    if (base_mib < 0 &&
        wait_child(spawn_logged({binary, "config", "show", c.config}, dir + "/base.log"),
                   &base_mib) != 0) {
      fail("config show " + c.config + " failed:\n" + tail_of_file(dir + "/base.log", 8));
    }
    for (const Setting& s : spec.settings) {
      const auto start = std::chrono::steady_clock::now();
      std::printf("%s, %s ...", spec.name.c_str(), s.label().c_str());
      std::fflush(stdout);
      const std::string run_dir = dir + "/" + file + "_" + std::to_string(c.runs.size());
      c.runs.emplace_back(s, run(binary, c.config, run_dir, s, spec.overrides, steps));
      const RunResult& r = c.runs.back().second;
      std::printf(" exit %d after %.0f s\n", r.exit_code,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (r.exit_code != 0) {
        all_ok = false;
        std::printf("  end of %s:\n%s", r.log.c_str(), tail_of_file(r.log, 6).c_str());
      }
      std::fflush(stdout);
    }
    done.push_back(std::move(c));
  }
  if (done.empty()) fail("--only " + only + " names no config");
  std::printf("process base (the binary's `config show`): %.0f MiB\n", base_mib);

  std::vector<std::string> table;
  for (const ConfigRuns& c : done) {
    for (const bool muon : {true, false}) {
      const RoutedParams p =
          routed_params(c.config, muon ? std::vector<std::string>{}
                                       : std::vector<std::string>{"optimizer._target_=AdamW"});
      for (const auto& [s, r] : c.runs) {
        if (s.muon != muon) continue;
        const bool swap = std::find(c.spec->overrides.begin(), c.spec->overrides.end(),
                                    "optimizer.swap_optimizer=true") != c.spec->overrides.end();
        const Analytic a = analytic(p, s, swap);
        const std::string setting = s.label() + c.spec->note;
        char row[640];
        if (r.exit_code != 0) {
          std::snprintf(row, sizeof(row),
                        "| %s | %.3f / %.3f | %s | %.2f | failed (exit %d) | | | | | |",
                        c.spec->name.c_str(), p.total / 1e9, p.active() / 1e9, setting.c_str(),
                        gib(a.total), r.exit_code);
        } else {
          const double rss = (r.peak_rss_mib - base_mib) / 1024.0;
          std::snprintf(
              row, sizeof(row),
              "| %s | %.3f / %.3f | %s | %.2f (%.2f + %.2f + %.2f + %.2f + %.2f + %.2f) | %.2f | "
              "%.2f | %.2f | %.1f | %.1f | %.1f |",
              c.spec->name.c_str(), p.total / 1e9, p.active() / 1e9, setting.c_str(), gib(a.total),
              gib(a.weights), gib(a.main), gib(a.state), gib(a.grads), gib(a.activations),
              gib(a.working), rss, r.allocator_peak_mib / 1024.0,
              r.allocator_peak_mib / 1024.0 / gib(a.total), r.tokens_per_s,
              kGlobalBatch * kSeq / (r.step_s - r.optimizer_s), r.optimizer_s);
        }
        table.push_back(row);
      }
    }
  }
  std::printf(
      "\n| config | params (1e9): all / active | setting | analytic GiB per rank (weights + main "
      "+ state + grads + activations + working gradient) | peak RSS - base, GiB | allocator "
      "peak live, GiB | allocator peak / analytic | tokens/s | tokens/s outside the optimizer "
      "step | optimizer s/step |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const std::string& row : table) std::printf("%s\n", row.c_str());
  keep_or_remove(dir, keep, "\nruns kept in ");
  return all_ok ? 0 : 1;
}
