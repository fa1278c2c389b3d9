// bench_qk_clip_bench: what QK-clip's recording costs the forward. With
// optimizer.muon_config.muon_qk_clip_tau > 0 the trainer installs a MaxLogitRecorder and every
// attention layer also computes causal_max_logits (model/attention.h: one float32 Q K^T, no
// autograd); without it nothing extra runs. Measured on the ~41M-parameter config of
// bench_support.h (bfloat16 model, hidden 384, 6 layers, 6 heads / 2 kv heads of 64, one
// micro-batch: 2 x 128 tokens), one process, one intra-op thread:
//   model fwd      CausalLM::forward (grad mode on, as in training), recorder off vs on;
//   model fwd+bwd  the same plus cross_entropy(logits in float32) and backward;
//   attention fwd  causal_attention (the kernel the model picks for bfloat16) alone vs followed
//                  by causal_max_logits, on the layer's q [2, 6, 128, 64], k, v [2, 2, 128, 64].
// Off and on alternate within each round (the order flips every round, so a drift in the
// machine's load hits both alike); the figures are the medians over the rounds, and the ratio
// on / off is the median of the per-round ratios. The machine may be shared: the 1-minute load
// average is printed before and after.
//
//   build/bench_qk_clip_bench [--rounds R (21)] [--attention-calls N (50, per sample)]
#include <ATen/Parallel.h>
#include <torch/nn/functional.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_support.h"
#include "mixtrain/config/load.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/model/attention.h"
#include "mixtrain/model/init_dtype.h"
#include "mixtrain/model/max_logit_recorder.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/optimizer_table.h"

namespace {

using mixtrain::bench::fail;
using mixtrain::bench::median;

double seconds_of(const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double load_average() {
  double load[1] = {-1.0};
  getloadavg(load, 1);
  return load[0];
}

struct Pair {
  std::vector<double> off, on, ratio;
};

// `rounds` rounds of one `run(false)` and one `run(true)` sample, the order flipping each round.
Pair alternate(int rounds, const std::function<double(bool)>& run) {
  Pair pair;
  for (int r = 0; r < rounds; ++r) {
    double off = 0, on = 0;
    if (r % 2 == 0) {
      off = run(false);
      on = run(true);
    } else {
      on = run(true);
      off = run(false);
    }
    pair.off.push_back(off);
    pair.on.push_back(on);
    pair.ratio.push_back(on / off);
  }
  return pair;
}

void report(const char* what, const Pair& pair) {
  std::printf("%-22s %10.3f %10.3f %10.3f   (per-round ratios %.3f .. %.3f)\n", what,
              1e3 * median(pair.off), 1e3 * median(pair.on), median(pair.ratio),
              *std::min_element(pair.ratio.begin(), pair.ratio.end()),
              *std::max_element(pair.ratio.begin(), pair.ratio.end()));
}

}  // namespace

int main(int argc, char** argv) {
  mixtrain::register_model_sections();  // before any config is read
  mixtrain::register_optimizer_sections();
  mixtrain::bench::program_name() = "bench_qk_clip_bench";
  int rounds = 21, attention_calls = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--rounds") {
      rounds = std::atoi(mixtrain::bench::option_value(argc, argv, i).c_str());
    } else if (arg == "--attention-calls") {
      attention_calls = std::atoi(mixtrain::bench::option_value(argc, argv, i).c_str());
    } else {
      fail("unknown argument " + arg + " (--rounds R, --attention-calls N)");
    }
  }
  if (rounds < 1 || attention_calls < 1) fail("--rounds and --attention-calls must be >= 1");
  at::set_num_threads(1);

  // The 41M config, through load_config as the trainer reads it.
  const std::string work_dir = mixtrain::bench::make_work_dir("", "qk_clip_bench");
  const std::string config_path = work_dir + "/qwen2_moe_41m.yaml";
  std::ofstream(config_path) << mixtrain::bench::kMedium41MConfig;
  const mixtrain::TrainerConfig config = mixtrain::load_config(config_path, {}).config;
  mixtrain::bench::keep_or_remove(work_dir, false, "");
  const mixtrain::ModelConfig& model_config = config.model;
  const c10::ScalarType dtype = *mixtrain::parse_float_dtype(*config.model_init_dtype);
  auto model = mixtrain::build_model(model_config, config.train.seed);
  mixtrain::apply_model_init_dtype(*model, dtype);
  const int64_t batch = config.data.micro_batch_size, seq = config.data.seq_len;

  const double load_before = load_average();
  std::printf("bench_qk_clip_bench: %s, 1 thread, %d rounds; load average (1 min) %.2f\n",
              mixtrain::bench::cpu_model().c_str(), rounds, load_before);
  std::printf(
      "model %s: hidden %lld, %lld layers, %lld heads / %lld kv heads of %lld, %s; "
      "micro-batch %lld x %lld\n",
      model_config.name.c_str(), static_cast<long long>(model_config.hidden_size),
      static_cast<long long>(model_config.num_layers),
      static_cast<long long>(model_config.num_heads),
      static_cast<long long>(model_config.num_kv_heads),
      static_cast<long long>(model_config.head_dim), c10::toString(dtype),
      static_cast<long long>(batch), static_cast<long long>(seq));

  torch::manual_seed(0);
  const torch::Tensor ids = torch::randint(model_config.vocab_size, {batch, seq}, torch::kLong);
  const torch::Tensor labels = torch::randint(model_config.vocab_size, {batch * seq}, torch::kLong);
  auto recorder = std::make_shared<mixtrain::MaxLogitRecorder>();
  auto model_step = [&](bool on, bool backward) {
    model->set_max_logit_recorder(on ? recorder : nullptr);
    recorder->clear();
    model->zero_grad(/*set_to_none=*/true);
    return seconds_of([&] {
      const mixtrain::CausalLMOutput out = model->forward(ids);
      if (backward) {
        torch::nn::functional::cross_entropy(
            out.logits.reshape({batch * seq, -1}).to(torch::kFloat), labels)
            .backward();
      }
    });
  };
  // One untimed call of each, recorder on and off (allocations, first touch).
  model_step(true, true);
  if (recorder->layers().size() != static_cast<size_t>(model_config.num_layers)) {
    fail("the recorder saw " + std::to_string(recorder->layers().size()) + " layers, not " +
         std::to_string(model_config.num_layers));
  }
  model_step(false, true);

  // One attention layer's inputs, laid out as the model passes them (transposed views).
  const int64_t heads = model_config.num_heads, kv_heads = model_config.num_kv_heads,
                head_dim = model_config.head_dim;
  auto draw = [&](int64_t h) {
    return torch::randn({batch, seq, h, head_dim}).to(dtype).transpose(1, 2);
  };
  const torch::Tensor q = draw(heads), k = draw(kv_heads), v = draw(kv_heads);
  const mixtrain::AttentionKernel kernel = mixtrain::attention_kernel_for(dtype);
  auto attention = [&](bool on) {
    torch::NoGradGuard no_grad;
    return seconds_of([&] {
             for (int c = 0; c < attention_calls; ++c) {
               (void)mixtrain::causal_attention(q, k, v, kernel);
               if (on) (void)mixtrain::causal_max_logits(q, k);
             }
           }) /
           attention_calls;
  };
  attention(true);

  const Pair fwd = alternate(rounds, [&](bool on) { return model_step(on, false); });
  const Pair fwd_bwd = alternate(rounds, [&](bool on) { return model_step(on, true); });
  const Pair attn = alternate(rounds, attention);

  std::printf("\n%-22s %10s %10s %10s\n", "median ms", "off", "on", "on / off");
  report("model fwd", fwd);
  report("model fwd+bwd", fwd_bwd);
  report(("attention fwd (" + std::string(mixtrain::attention_kernel_name(kernel)) + ")").c_str(),
         attn);
  std::printf("load average (1 min) after: %.2f\n", load_average());
  return 0;
}
