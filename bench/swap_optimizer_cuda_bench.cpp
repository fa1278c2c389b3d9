// Swap optimizer, GPU tier (docs/architecture.md §9, optim/swap_pinned_tier.h): how much device
// memory keeping the optimizer state in pinned host memory saves, and what it costs in optimizer
// step time, on one CUDA device.
//
// A plain program (no Google Benchmark). The model: the parameters of a ~0.5B Qwen2-MoE (names
// and shapes as model/qwen2_moe builds them: hidden 1024, 16 heads of 64 (4 KV heads), 8 experts
// of 1408, a shared expert of 2816, 9 layers, vocabulary 32000, untied head), bfloat16 on
// cuda:0, fp32 main params, Muon + AdamW (configs/qwen2_moe_tiny.yaml's optimizer). Fixed grads
// (drawn once on the device); the same steps are run twice in one process, swap off then on
// (optimizer.swap_bucket_mb / swap_merge_buckets as given), each timed with a device
// synchronisation around every step. Printed and written to --out as JSON:
//   - state_bytes: the floating optimizer state (AdamW 2 x 4 bytes, Muon 4 bytes per element,
//     counted from the state tensors' shapes);
//   - per run: device bytes allocated between steps and the allocator's peak during a step
//     (the caching allocator's statistics), the median step time over steps 3..N (step 1
//     creates the state, step 2 is the first that swaps it);
//   - swap: the peak state resident on the device in a step (StateSwap::peak_resident_bytes)
//     and the share of the state that stays off the device (1 - that / state_bytes; target
//     >= 60%); the allocator's peak saving as a share of state_bytes (the same saving seen by
//     the allocator); the step-time ratio swap / no swap (target <= 1.3); pinned host bytes;
//   - whether params and state after the last step are bitwise identical (they must be).
// A single parameter's state is never split across groups: with Qwen's 151936-token vocabulary
// (--vocab 151936) each of the two embedding matrices carries 1.2 GiB of AdamW state, which then
// bounds the saving; the default vocabulary keeps the model's bulk in its layers.
//
// Usage: bench_swap_optimizer_cuda_bench [--out PATH] [--steps N] [--layers L] [--vocab V]
//                                        [--bucket-mb M] [--merge K]
// Exit code: 0 when measured (targets met or not) and when there is no CUDA device (it prints
// "skipped: no CUDA device" and writes {"skipped": ...}); 1 when the two runs differ or a
// step fails.
#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mixtrain/model/registry.h"
#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/leaf_optimizer.h"
#include "mixtrain/optim/optimizer_table.h"
#include "mixtrain/optim/param_groups.h"
#include "mixtrain/optim/state_swap.h"
#include "mixtrain/optim/swap_pinned_tier.h"
#include "mixtrain/optim/training_optimizer.h"

namespace {

constexpr double kMinOffDeviceFraction = 0.60;
constexpr double kMaxStepTimeRatio = 1.3;

struct Options {
  std::string out;
  int steps = 8;
  int64_t layers = 9;
  int64_t vocab = 32000;
  int64_t bucket_mb = 64;
  int64_t merge = 1;
};

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "bench_swap_optimizer_cuda_bench: %s\n", message.c_str());
  std::exit(1);
}

int64_t int_option(const std::string& name, const char* value, int64_t least) {
  if (value == nullptr) fail(name + " needs a value");
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (*end != '\0' || v < least) fail(name + " must be an integer >= " + std::to_string(least));
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[++i] : nullptr;
    if (arg == "--out") {
      if (value == nullptr) fail("--out needs a path");
      o.out = value;
    } else if (arg == "--steps") {
      o.steps = static_cast<int>(int_option(arg, value, 3));
    } else if (arg == "--layers") {
      o.layers = int_option(arg, value, 1);
    } else if (arg == "--vocab") {
      o.vocab = int_option(arg, value, 1);
    } else if (arg == "--bucket-mb") {
      o.bucket_mb = int_option(arg, value, 1);
    } else if (arg == "--merge") {
      o.merge = int_option(arg, value, 1);
    } else {
      fail("unknown argument " + arg);
    }
  }
  return o;
}

void write_json(const Options& o, const nlohmann::json& j) {
  std::printf("%s\n", j.dump(2).c_str());
  if (o.out.empty()) return;
  std::ofstream out(o.out);
  out << j.dump(2) << "\n";
  if (!out) fail("cannot write " + o.out);
}

// Names and shapes of the Qwen2-MoE parameters (model/qwen2_moe.cpp), in its order.
std::vector<std::pair<std::string, std::vector<int64_t>>> model_shapes(const Options& o) {
  const int64_t hidden = 1024, heads = 16, kv_heads = 4, head_dim = 64, experts = 8,
                moe_inter = 1408, shared_inter = 2816;
  std::vector<std::pair<std::string, std::vector<int64_t>>> s;
  s.push_back({"model.embed_tokens.weight", {o.vocab, hidden}});
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s.push_back({p + "self_attn.q_proj.weight", {heads * head_dim, hidden}});
    s.push_back({p + "self_attn.q_proj.bias", {heads * head_dim}});
    s.push_back({p + "self_attn.k_proj.weight", {kv_heads * head_dim, hidden}});
    s.push_back({p + "self_attn.k_proj.bias", {kv_heads * head_dim}});
    s.push_back({p + "self_attn.v_proj.weight", {kv_heads * head_dim, hidden}});
    s.push_back({p + "self_attn.v_proj.bias", {kv_heads * head_dim}});
    s.push_back({p + "self_attn.o_proj.weight", {hidden, heads * head_dim}});
    s.push_back({p + "mlp.gate.weight", {experts, hidden}});
    s.push_back({p + "mlp.experts.gate_proj", {experts, moe_inter, hidden}});
    s.push_back({p + "mlp.experts.up_proj", {experts, moe_inter, hidden}});
    s.push_back({p + "mlp.experts.down_proj", {experts, hidden, moe_inter}});
    s.push_back({p + "mlp.shared_expert.gate_proj.weight", {shared_inter, hidden}});
    s.push_back({p + "mlp.shared_expert.up_proj.weight", {shared_inter, hidden}});
    s.push_back({p + "mlp.shared_expert.down_proj.weight", {hidden, shared_inter}});
    s.push_back({p + "mlp.shared_expert_gate.weight", {1, hidden}});
    s.push_back({p + "input_layernorm.weight", {hidden}});
    s.push_back({p + "post_attention_layernorm.weight", {hidden}});
  }
  s.push_back({"model.norm.weight", {hidden}});
  s.push_back({"lm_head.weight", {o.vocab, hidden}});
  return s;
}

const c10::Device kDevice(c10::kCUDA, 0);

int64_t allocated_now() {
  const auto stats = at::accelerator::getDeviceStats(0);
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}
int64_t allocated_peak() {
  const auto stats = at::accelerator::getDeviceStats(0);
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}

struct Run {
  int64_t state_bytes = 0;
  int64_t allocated_between_steps = 0;   // after the last step
  int64_t peak_in_step = 0;              // max over steps 3..N
  int64_t peak_resident_state = 0;       // swap only
  int64_t pinned_bytes = 0;              // swap only
  std::vector<double> step_s;            // every step
  std::vector<at::Tensor> final_values;  // params and state, on the host
  double median_s() const {
    std::vector<double> later(step_s.begin() + 2, step_s.end());
    std::sort(later.begin(), later.end());
    const size_t n = later.size();
    return n % 2 ? later[n / 2] : 0.5 * (later[n / 2 - 1] + later[n / 2]);
  }
};

Run run(const Options& o, bool swap) {
  Run r;
  mixtrain::NamedParameters params;
  std::vector<at::Tensor> grads;
  at::manual_seed(1234);  // the same values in both runs
  for (const auto& [name, shape] : model_shapes(o)) {
    const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(kDevice);
    params.emplace_back(name, at::randn(shape, bf16).mul_(0.02).requires_grad_(true));
    grads.push_back(at::randn(shape, bf16).mul_(1e-3));
  }
  mixtrain::TrainerConfig config;
  config.optimizer.target = "Muon";
  config.optimizer.fp32_main_params = true;
  config.mix_precision.reduce_dtype = "float32";
  auto optimizer = mixtrain::build_optimizer(params, config);
  mixtrain::ChainedOptimizer& chained = optimizer->chained();
  if (swap) {
    chained.enable_state_swap(
        std::make_unique<mixtrain::StateSwap>("", o.bucket_mb << 20, o.merge, kDevice));
  }
  for (int k = 1; k <= o.steps; ++k) {
    for (size_t i = 0; i < params.size(); ++i) params[i].second.mutable_grad() = grads[i];
    at::accelerator::synchronizeDevice(0);
    at::accelerator::resetPeakStats(0);
    if (swap) chained.state_swap()->reset_peak_resident_bytes();
    const auto t0 = std::chrono::steady_clock::now();
    optimizer->step();
    at::accelerator::synchronizeDevice(0);
    r.step_s.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    optimizer->zero_grad();
    if (k >= 3) {
      r.peak_in_step = std::max(r.peak_in_step, allocated_peak());
      if (swap) {
        r.peak_resident_state =
            std::max(r.peak_resident_state, chained.state_swap()->peak_resident_bytes());
      }
    }
  }
  at::accelerator::synchronizeDevice(0);
  r.allocated_between_steps = allocated_now();
  for (const auto& name : chained.names()) {
    for (const auto& [state_name, t] :
         chained.leaf_of(name).export_state(chained.optimizer_param(name))) {
      if (at::isFloatingType(t.scalar_type()) && t.dim() >= 1) {
        r.state_bytes += t.numel() * static_cast<int64_t>(t.element_size());
      }
    }
  }
  if (swap) {
    const auto* tier =
        dynamic_cast<const mixtrain::PinnedHostSwapTier*>(&chained.state_swap()->tier());
    if (tier) r.pinned_bytes = tier->pinned_bytes();
  }
  for (const auto& [name, p] : params) r.final_values.push_back(p.detach().cpu());
  for (const auto& [name, t] : optimizer->state_dict()) r.final_values.push_back(t.cpu());
  return r;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;
  return a.reshape({-1}).contiguous().view(at::kByte).equal(
      b.reshape({-1}).contiguous().view(at::kByte));
}

}  // namespace

int main(int argc, char** argv) {
  mixtrain::register_model_sections();  // before any config is read
  mixtrain::register_optimizer_sections();
  const Options o = parse(argc, argv);
  if (at::accelerator::getAccelerator() != c10::kCUDA || at::accelerator::deviceCount() == 0) {
    std::printf("skipped: no CUDA device\n");
    if (!o.out.empty())
      std::ofstream(o.out) << nlohmann::json{{"skipped", "no CUDA device"}}.dump() << "\n";
    return 0;
  }
  try {
    int64_t params = 0;
    for (const auto& [name, shape] : model_shapes(o)) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      params += n;
    }
    const Run off = run(o, false);
    const Run on = run(o, true);
    bool identical = off.final_values.size() == on.final_values.size();
    for (size_t i = 0; identical && i < off.final_values.size(); ++i) {
      identical = bitwise_equal(off.final_values[i], on.final_values[i]);
    }
    const double state = static_cast<double>(off.state_bytes);
    const double off_device = 1.0 - on.peak_resident_state / state;
    const double allocator_saving = (off.peak_in_step - on.peak_in_step) / state;
    const double ratio = on.median_s() / off.median_s();
    const nlohmann::json j = {
        {"model", {{"params", params}, {"layers", o.layers}, {"vocab", o.vocab}}},
        {"bucket_mb", o.bucket_mb},
        {"merge_buckets", o.merge},
        {"steps", o.steps},
        {"state_bytes", off.state_bytes},
        {"no_swap",
         {{"allocated_between_steps", off.allocated_between_steps},
          {"peak_allocated_in_step", off.peak_in_step},
          {"median_step_s", off.median_s()},
          {"step_s", off.step_s}}},
        {"swap",
         {{"allocated_between_steps", on.allocated_between_steps},
          {"peak_allocated_in_step", on.peak_in_step},
          {"peak_resident_state_bytes", on.peak_resident_state},
          {"pinned_host_bytes", on.pinned_bytes},
          {"median_step_s", on.median_s()},
          {"step_s", on.step_s}}},
        {"state_off_device_fraction", off_device},
        {"allocator_peak_saving_fraction_of_state", allocator_saving},
        {"step_time_ratio", ratio},
        {"bitwise_identical", identical},
        {"targets",
         {{"state_off_device_fraction_min", kMinOffDeviceFraction},
          {"step_time_ratio_max", kMaxStepTimeRatio},
          {"off_device_met", off_device >= kMinOffDeviceFraction},
          {"step_time_met", ratio <= kMaxStepTimeRatio}}}};
    write_json(o, j);
    if (!identical) {
      std::fprintf(stderr, "bench_swap_optimizer_cuda_bench: swap changed params or state\n");
      return 1;
    }
  } catch (const std::exception& e) {
    fail(std::string("a step failed: ") + e.what());
  }
  return 0;
}
