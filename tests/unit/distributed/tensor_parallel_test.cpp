// Tensor parallelism (distributed/tensor_parallel.h, the models' Megatron layout, FSDP's tp
// slices), multi-process on real Gloo groups (tests/support/multiprocess.h):
//   vocab_parallel_cross_entropy against torch's cross_entropy on the full logits (tp 2, 4);
//   whole models through parallelize in float32 (llama with o_proj bias, qwen2, qwen2_moe with
//   its shared expert, qwen3_moe with q/k norms) on tp 2 and tp 2 x dp_shard 2 against one
//   unsharded process: the loss and every parameter's gradient (this rank's piece of it, per
//   its placement).
// Expectations come from the plain single-process model and torch's cross_entropy; only float32
// summation order differs (the tolerances below say where).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/functional.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/distributed/parallelize.h"
#include "mixtrain/distributed/tensor_parallel.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/qwen2.h"
#include "mixtrain/model/qwen2_moe.h"
#include "mixtrain/model/registry.h"
#include "support/multiprocess.h"
#include "support/tiny_model_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::run_workers;
using testing::WorkerEnv;
using testing::WorkerResult;

// The mesh with the tp degree run_with_tp passed (multiprocess.h carries dp/ep degrees only).
DeviceMesh tp_mesh(const WorkerEnv& worker) {
  ParallelConfig parallel = worker.parallel;
  parallel.tp = std::stoi(worker.get("TP_DEGREE", "1"));
  return make_device_mesh(worker.rank, parallel, worker.timeout_s);
}

WorkerResult run_with_tp(const std::string& name, const ParallelConfig& parallel,
                         std::map<std::string, std::string> env = {}) {
  env["TP_DEGREE"] = std::to_string(parallel.tp);
  return run_workers(name, static_cast<int>(parallel.world_size()), parallel, env);
}

// max |a - b| / max |b| (0 when both are zero).
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  const double diff = (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
  return scale == 0 ? diff : diff / scale;
}

// ---- vocab_parallel_cross_entropy ----

// Per-token losses: the same global max, then the log of a sum of 12 float32 exps, summed per
// rank and then over tp instead of in one pass: float32 ulps of losses of size 1..30. Measured
// 4.8e-7 on every rank for tp 2 and 4: bound 2e-6. Gradients softmax - onehot in [-1, 1]:
// measured 2.4e-7, bound 1e-6 (8 ulps of 1).
constexpr double kCeLossTol = 2e-6, kCeGradTol = 1e-6;

MIXTRAIN_WORKER(tp_vocab_cross_entropy) {
  DeviceMesh mesh = tp_mesh(worker);
  auto tp = std::make_shared<TensorParallel>(mesh.tp_group);
  const int64_t tokens = 9, vocab = 12, local = vocab / mesh.tp;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  // Logits spread wide (x 8) and one token shifted by +60: the max must be the global one.
  at::Tensor full = torch::randn({tokens, vocab}, gen) * 8;
  full[3] += 60;
  // Every rank owns some labels; token 3's label at the last column.
  at::Tensor labels = torch::randint(vocab, {tokens}, gen, torch::kInt64);
  labels[3] = vocab - 1;
  const at::Tensor upstream = torch::rand({tokens}, gen) + 0.5;  // d(objective)/d(loss_i)

  at::Tensor ref_logits = full.clone().requires_grad_(true);
  const at::Tensor ref_loss = torch::nn::functional::cross_entropy(
      ref_logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  (ref_loss * upstream).sum().backward();

  at::Tensor mine = full.narrow(1, mesh.tp_group->rank() * local, local).clone();
  mine.requires_grad_(true);
  const at::Tensor loss = tp->vocab_parallel_cross_entropy(mine, labels);
  (loss * upstream).sum().backward();
  const double loss_diff = (loss - ref_loss).abs().max().item<double>();
  const double grad_diff =
      (mine.grad() - ref_logits.grad().narrow(1, mesh.tp_group->rank() * local, local))
          .abs()
          .max()
          .item<double>();
  EXPECT_LE(loss_diff, kCeLossTol);
  EXPECT_LE(grad_diff, kCeGradTol);
  EXPECT_TRUE(std::isfinite(loss[3].item<double>()));
  std::ostringstream text;
  text << loss_diff << " " << grad_diff;
  worker.write_text("ce_" + std::to_string(mesh.rank), text.str());
}

void expect_ce(int tp) {
  ParallelConfig parallel;
  parallel.tp = tp;
  WorkerResult result = run_with_tp("tp_vocab_cross_entropy", parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  for (int r = 0; r < tp; ++r) {
    std::cout << "tp " << tp << " rank " << r
              << " |loss diff| |grad diff|: " << result.read_text("ce_" + std::to_string(r))
              << "\n";
  }
}

TEST(TensorParallel, VocabParallelCrossEntropyTp2) {
  expect_ce(2);
}
TEST(TensorParallel, VocabParallelCrossEntropyTp4) {
  expect_ce(4);
}

// ---- whole models ----

ModelConfig tp_model_config(const std::string& name = "") {
  ModelConfig c = test_support::tiny_config();
  if (name == "deepseek_v3") {
    // 4 heads (2 per tp rank), biased latent and o projections, a dense first layer of 20 and
    // shared experts of 10: every split even; the balance loss on.
    c = test_support::tiny_deepseek_v3();
    c.num_heads = 4;
    c.num_kv_heads = 4;
    moe_config(c).router_aux_loss_coef = 0.05;
  }
  c.vocab_size = 38;  // even: split over tp 2 (37 is not)
  c.intermediate_size = 20;
  c.attention_bias = true;  // llama: q/k/v and the row-parallel o_proj biased
  return c;
}

std::shared_ptr<CausalLM> make_model(const std::string& name, uint64_t seed) {
  const ModelConfig c = tp_model_config(name);
  std::shared_ptr<CausalLM> model;
  if (name == "deepseek_v3") {
    model = build_model(c, seed);
    auto bias_gen = at::make_generator<at::CPUGeneratorImpl>(seed + 2);
    for (const auto& [state, bias] : model->model_state()) {
      model->set_model_state(state, at::randn(bias.sizes(), bias_gen) * 0.1);
    }
  }
  if (name == "llama") model = qwen2::make_llama(c, seed);
  if (name == "qwen2") model = qwen2::make_qwen2(c, seed);
  if (name == "qwen2_moe") model = qwen2_moe::make_qwen2_moe(c, seed);
  if (name == "qwen3_moe") model = qwen2_moe::make_qwen3_moe(c, seed);
  // HF init zeroes the biases and sets the norms to one, where a bias added on every tp rank
  // instead of once, or a norm scale applied to the wrong heads, would change nothing: draw them.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::string& key = item.key();
    if (key.size() >= 4 && key.compare(key.size() - 4, 4, "bias") == 0) {
      item.value().normal_(0.0, 0.1, gen);
    } else if (key.find("norm.weight") != std::string::npos) {
      item.value().normal_(1.0, 0.1, gen);
    }
  }
  return model;
}

constexpr int64_t kGlobalBatch = 4, kSeq = 8;

at::Tensor global_ids(const ModelConfig& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2024);
  return torch::randint(c.vocab_size, {kGlobalBatch, kSeq}, gen, torch::kInt64);
}

// Cross-entropy (the model's: vocabulary-parallel under tp) plus the weighted router loss.
at::Tensor training_loss(const CausalLM& model, const CausalLMOutput& out, const at::Tensor& ids) {
  return causal_lm_cross_entropy(model, out.logits, ids.roll(-1, 1)) +
         moe_config(model.config()).router_aux_loss_coef * out.aux_loss;
}

// Tolerances. Loss, relative: the tp ranks sum the row-parallel partial products, the
// embedding rows and the logsumexp in another float32 order than one process; the loss (a mean
// of 16 token losses) moves by float32 ulps (1.2e-7): bound 1e-6.
// Gradients, against a float64 run of the same model (relative to the tensor's max |element|):
// within kGradFactor times the error of one float32 process on the same tensor, plus kGradFloor.
// Both float32 runs round the same sums, only in another order (tp partial sums, the
// copy_to_tp gradient sums, FSDP's dp_shard mean), so their errors are of one size; the layer-1
// q/k gradients are small differences of large terms (softmax backward), where one float32
// process itself is off by up to 1e-5 of the tensor's scale. The two errors are independent
// draws of one size, so their ratio scatters: measured up to 5.0 (qwen3_moe, tp 2 x dp_shard 2,
// layer 1 q_proj.bias: 1.5e-5 against 3.0e-6), 2.1 or less elsewhere. Factor 8 and floor 1e-6
// (8 ulps) leave room for the order, not for a wrong slice or a missing reduction (O(1)).
constexpr double kLossTol = 1e-6, kGradFactor = 8, kGradFloor = 1e-6;

MIXTRAIN_WORKER(tp_model_grads) {
  DeviceMesh mesh = tp_mesh(worker);
  const std::string name = worker.get("MODEL");
  const ModelConfig c = tp_model_config(name);
  const at::Tensor ids = global_ids(c);
  const int64_t dp = mesh.dp_size(), rows = kGlobalBatch / dp;

  // The references: one unsharded process in float32 (the loss) and in float64 (the
  // gradients), the global batch as dp micro-batches, loss / dp each.
  double ref_loss = 0;
  std::map<std::string, at::Tensor> ref32, ref64;
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    auto ref = make_model(name, 5);
    ref->to(dtype);
    for (int64_t r = 0; r < dp; ++r) {
      const at::Tensor micro = ids.narrow(0, r * rows, rows);
      const at::Tensor loss = training_loss(*ref, ref->forward(micro), micro);
      if (r == mesh.data_rank() && dtype == torch::kFloat) ref_loss = loss.item<double>();
      (loss / static_cast<double>(dp)).backward();
    }
    for (const auto& item : ref->named_parameters()) {
      (dtype == torch::kFloat ? ref32 : ref64)[item.key()] = item.value().grad();
    }
  }

  auto model = make_model(name, 5);
  MixPrecisionConfig fp32;
  fp32.reduce_dtype = "float32";
  auto fsdp = parallelize(*model, mesh, FsdpOptions{fp32, false, true});
  ASSERT_NE(fsdp->tensor_parallel(), nullptr);
  EXPECT_EQ(fsdp->tensor_parallel()->tp_size(), mesh.tp);
  const at::Tensor micro = ids.narrow(0, mesh.data_rank() * rows, rows);
  const CausalLMOutput out = model->forward(micro);
  EXPECT_EQ(out.logits.size(-1), c.vocab_size / mesh.tp) << "no rank holds the full logits";
  const at::Tensor loss = training_loss(*model, out, micro);
  loss.backward();
  const double loss_diff = std::abs(loss.item<double>() - ref_loss) / std::abs(ref_loss);
  EXPECT_LE(loss_diff, kLossTol);

  double worst_ratio = 0;
  std::string worst;
  int split = 0;
  for (const auto& item : model->named_parameters()) {
    const ParamPlacement& placement = fsdp->placement(item.key());
    EXPECT_EQ(placement.tp_dim, model->tp_dim(item.key())) << item.key();
    EXPECT_EQ(placement.global_shape, ref64.at(item.key()).sizes().vec()) << item.key();
    if (placement.tp_split()) ++split;
    const std::vector<int64_t> offsets = placement.global_offsets();
    const std::vector<int64_t> sizes = placement.local_sizes();
    ASSERT_EQ(item.value().sizes().vec(), sizes) << item.key();
    if (item.value().numel() == 0) continue;  // FSDP's trailing ranks may hold no rows
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    const auto piece = [&](at::Tensor t) {
      for (size_t d = 0; d < sizes.size(); ++d) {
        t = t.narrow(static_cast<int64_t>(d), offsets[d], sizes[d]);
      }
      return t;
    };
    const at::Tensor exact = piece(ref64.at(item.key()));
    const double tp_error = rel_diff(item.value().grad(), exact);
    const double one_process_error = rel_diff(piece(ref32.at(item.key())), exact);
    EXPECT_LE(tp_error, kGradFactor * one_process_error + kGradFloor)
        << item.key() << ": one float32 process is off by " << one_process_error;
    const double ratio = tp_error / (one_process_error + kGradFloor);
    if (ratio > worst_ratio) worst = item.key();
    worst_ratio = std::max(worst_ratio, ratio);
  }
  // embed_tokens and lm_head; per layer q/k/v weights and biases, o_proj's weight (its bias is
  // whole), and the dense MLP's / shared expert's three (none in qwen3_moe); deepseek_v3: per
  // layer q_b_proj, kv_b_proj and o_proj weights and the dense MLP's or shared experts' three.
  const int mlp = name == "qwen3_moe" ? 0 : 3;
  EXPECT_EQ(split, name == "deepseek_v3" ? 2 + 6 * c.num_layers : 2 + (6 + 1 + mlp) * c.num_layers);
  std::ostringstream text;
  text << loss_diff << " " << worst_ratio << " (" << worst << ")";
  worker.write_text("model_" + std::to_string(mesh.rank), text.str());
}

void expect_model(const std::string& model, int64_t dp_shard) {
  ParallelConfig parallel;
  parallel.tp = 2;
  parallel.dp_shard = dp_shard;
  const int world = static_cast<int>(parallel.world_size());
  WorkerResult result = run_with_tp("tp_model_grads", parallel, {{"MODEL", model}});
  ASSERT_TRUE(result.all_ok()) << result.summary();
  for (int r = 0; r < world; ++r) {
    std::cout << model << " tp 2 x dp_shard " << dp_shard << " rank " << r
              << " loss rel diff, max grad error ratio: "
              << result.read_text("model_" + std::to_string(r)) << "\n";
  }
}

TEST(TensorParallel, LlamaWithOutputBiasTp2) {
  expect_model("llama", 1);
}
TEST(TensorParallel, LlamaWithOutputBiasTp2Dp2) {
  expect_model("llama", 2);
}
TEST(TensorParallel, Qwen2Tp2) {
  expect_model("qwen2", 1);
}
TEST(TensorParallel, Qwen2Tp2Dp2) {
  expect_model("qwen2", 2);
}
TEST(TensorParallel, Qwen2MoeTp2) {
  expect_model("qwen2_moe", 1);
}
TEST(TensorParallel, Qwen2MoeTp2Dp2) {
  expect_model("qwen2_moe", 2);
}
TEST(TensorParallel, Qwen3MoeTp2) {
  expect_model("qwen3_moe", 1);
}
TEST(TensorParallel, Qwen3MoeTp2Dp2) {
  expect_model("qwen3_moe", 2);
}
TEST(TensorParallel, DeepseekV3Tp2) {
  expect_model("deepseek_v3", 1);
}
TEST(TensorParallel, DeepseekV3Tp2Dp2) {
  expect_model("deepseek_v3", 2);
}

// ---- communication volume ----

// One forward + backward of llama on tp 2 (one data rank, so FSDP moves nothing) sends exactly
// what the layout implies (core/collectives.h counts each call's payload as a bandwidth-optimal
// algorithm sends it: all_reduce 2 (n-1)/n x bytes, all_gather (n-1) x bytes), with
// A = B x S x H float32 activations and N = B x S tokens:
//   all_reduce: forward  the embedding's rows, then per layer o_proj and down_proj
//   (reduce_from_tp),
//                        and the cross-entropy's [sum exp, target logit] per token (2 N);
//               backward per layer one copy_to_tp for q/k/v and one for gate/up, and lm_head's
//                        input (copy_to_tp's backward);
//   all_gather: the cross-entropy's per-token maxes (N).
// So all_reduce = 2 (n-1)/n x 4 x ((4 L + 2) A + 2 N) bytes, all_gather = (n-1) x 4 N bytes, and
// nothing else moves. A copy_to_tp per column layer instead of per block (3 for q/k/v, 2 for
// gate/up) would add 3 L A all-reduced bytes.
MIXTRAIN_WORKER(tp_traffic) {
  DeviceMesh mesh = tp_mesh(worker);
  const ModelConfig c = tp_model_config();
  const at::Tensor ids = global_ids(c);
  auto model = make_model("llama", 5);
  MixPrecisionConfig fp32;
  fp32.reduce_dtype = "float32";
  auto fsdp = parallelize(*model, mesh, FsdpOptions{fp32, false, true});
  const CollectiveStats before = thread_collective_stats();
  training_loss(*model, model->forward(ids), ids).backward();
  const CollectiveStats sent = thread_collective_stats() - before;

  const int64_t n = mesh.tp, tokens = ids.numel(), layers = c.num_layers;
  const int64_t activation = tokens * c.hidden_size;
  const int64_t all_reduce_bytes =
      2 * (n - 1) * 4 * ((4 * layers + 2) * activation + 2 * tokens) / n;
  EXPECT_EQ(sent[CollectiveOp::kAllReduce].bytes, all_reduce_bytes);
  EXPECT_EQ(sent[CollectiveOp::kAllGather].bytes, (n - 1) * 4 * tokens);
  EXPECT_EQ(sent.total().bytes,
            sent[CollectiveOp::kAllReduce].bytes + sent[CollectiveOp::kAllGather].bytes);
  worker.write_text("traffic_" + std::to_string(mesh.rank),
                    std::to_string(sent[CollectiveOp::kAllReduce].bytes) + " all_reduce bytes, " +
                        std::to_string(sent[CollectiveOp::kAllGather].bytes) + " all_gather bytes");
}

TEST(TensorParallel, TrafficPerStepIsTheAnalyticVolume) {
  ParallelConfig parallel;
  parallel.tp = 2;
  WorkerResult result = run_with_tp("tp_traffic", parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  std::cout << "tp 2 rank 0: " << result.read_text("traffic_0") << "\n";
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
