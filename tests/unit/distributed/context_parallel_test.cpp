// Context parallelism (distributed/context_parallel.h) on real Gloo groups of 2 and 4 cp ranks:
// the chunk layout, the cp sum, attention (ring and all-gather) against model/attention.h's
// causal_attention of the whole sequence in one process (forward and the q/k/v gradients), and
// the tiny Qwen2-MoE through parallelize with cp = 2 against the unsharded model.
//
// Every rank computes the single-process reference itself from the same seeded inputs and
// compares its own slice (context_parallel_slice of the reference) with what CP gave it.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

#include "mixtrain/distributed/context_parallel.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/distributed/parallelize.h"
#include "mixtrain/model/attention.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/qwen2_moe.h"
#include "mixtrain/model/registry.h"
#include "support/multiprocess.h"
#include "support/tiny_model_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// dp_shard 1 x cp = world size.
DeviceMesh cp_mesh(const testing::WorkerEnv& worker) {
  ParallelConfig parallel = worker.parallel;
  parallel.dp_shard = 1;
  parallel.cp = worker.rank.world_size;
  return make_device_mesh(worker.rank, parallel, worker.timeout_s);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

std::vector<int64_t> as_vector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TEST(ContextParallelSlice, TwoChunksPerRankInLoadBalancedOrder) {
  // 8 tokens over cp = 2: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  const at::Tensor ids = at::arange(16, at::kLong).view({2, 8});
  EXPECT_EQ(as_vector(context_parallel_slice(ids, 0, 2)),
            (std::vector<int64_t>{0, 1, 6, 7, 8, 9, 14, 15}));
  EXPECT_EQ(as_vector(context_parallel_slice(ids, 1, 2)),
            (std::vector<int64_t>{2, 3, 4, 5, 10, 11, 12, 13}));
  EXPECT_EQ(as_vector(context_parallel_slice(at::arange(8, at::kLong), 1, 2, 0)),
            (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_THROW(context_parallel_slice(ids, 0, 3), c10::Error);  // 8 is not a multiple of 6
  EXPECT_THROW(parse_cp_rotate_method("ring"), std::invalid_argument);
}

// positions and all_reduce_sum on every rank; the expected lists written out by hand.
MIXTRAIN_WORKER(cp_positions_and_sum) {
  const DeviceMesh mesh = cp_mesh(worker);
  ContextParallel cp(mesh.cp_group, CpRotateMethod::kAllToAll);
  const int64_t n = cp.cp_size(), r = cp.cp_rank();
  ASSERT_EQ(r, mesh.cp_index());
  const std::map<int64_t, std::vector<std::vector<int64_t>>> expected = {
      {2, {{0, 1, 2, 3, 12, 13, 14, 15}, {4, 5, 6, 7, 8, 9, 10, 11}}},
      {4, {{0, 1, 14, 15}, {2, 3, 12, 13}, {4, 5, 10, 11}, {6, 7, 8, 9}}}};
  const auto& mine = expected.at(n)[r];
  EXPECT_EQ(as_vector(cp.positions(int64_t(mine.size()))), mine);

  // y = sum_r (r + 1); loss_r = (r + 1) y, so d(sum of losses)/dx_r = sum_r (r + 1) as well.
  const at::Tensor x = at::full({}, double(r + 1), at::kDouble).requires_grad_();
  const at::Tensor y = cp.all_reduce_sum(x);
  const double total = double(n * (n + 1) / 2);
  EXPECT_EQ(y.item<double>(), total);
  (y * double(r + 1)).backward();
  EXPECT_EQ(x.grad().item<double>(), total);
}

struct AttentionCase {
  at::ScalarType dtype;
  AttentionKernel kernel;
  double out_tol, grad_tol;
};

// q/k/v/dout of the whole sequence (B 2, Hq 4, Hkv 2, S = 8 per rank, D 8), the same on every
// rank (seeded), in `dtype`.
std::vector<at::Tensor> attention_inputs(int64_t seq, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  std::vector<at::Tensor> t;
  for (int64_t heads : {4, 2, 2, 4}) t.push_back(at::randn({2, heads, seq, 8}, gen).to(dtype));
  return t;
}

void check_attention(ContextParallel& cp, const AttentionCase& c, const std::string& label) {
  const int64_t n = cp.cp_size(), r = cp.cp_rank(), seq = 8 * n;
  const auto in = attention_inputs(seq, c.dtype);
  std::vector<at::Tensor> whole, local;
  for (int i = 0; i < 3; ++i) {
    whole.push_back(in[i].clone().requires_grad_());
    local.push_back(context_parallel_slice(in[i], r, n, 2).requires_grad_());
  }
  const at::Tensor ref = causal_attention(whole[0], whole[1], whole[2], c.kernel);
  ref.backward(in[3]);
  const at::Tensor out = cp.attention(local[0], local[1], local[2], c.kernel);
  out.backward(context_parallel_slice(in[3], r, n, 2));
  EXPECT_EQ(out.scalar_type(), c.dtype) << label;
  const double out_err = max_abs_diff(out, context_parallel_slice(ref, r, n, 2));
  EXPECT_LE(out_err, c.out_tol) << label << " output";
  double grad_err = 0;
  for (int i = 0; i < 3; ++i) {
    grad_err = std::max(
        grad_err, max_abs_diff(local[i].grad(), context_parallel_slice(whole[i].grad(), r, n, 2)));
  }
  EXPECT_LE(grad_err, c.grad_tol) << label << " q/k/v gradients";
  std::printf("%s: max |out - ref| %.3g, max |grad - ref| %.3g\n", label.c_str(), out_err,
              grad_err);
}

// Tolerances. float32: the same float32 math as causal_attention in another summation order
// (blocked softmax merged through exp/log); inputs ~N(0,1), outputs and gradients O(1), so a
// few float32 ulps times the ~sqrt of the 16-32 summed terms: 2e-5, 20x the measured maxima
// (3e-7 output, 1e-6 gradients). A wrong mask or chunk order is off by O(0.1). bfloat16 (kMath,
// the model's bf16 kernel, and kFlash): the reference rounds P and the output to bfloat16 once
// each (kMath also the scores); CP rounds P (kFlash: each pair's output) per block, merges
// partials in float32 and (kMath ring) sums the K/V gradients in bfloat16 along the way, so
// results differ by bf16 ulps (2^-8 relative; 0.0156 at |x| in [2, 4)): measured 0.0039
// output, 0.031 gradients (cp 4); allowed 0.02 and 0.0625.
const std::vector<AttentionCase> kCases = {
    {at::kFloat, AttentionKernel::kFlash, 2e-5, 2e-5},
    {at::kFloat, AttentionKernel::kMath, 2e-5, 2e-5},
    {at::kBFloat16, AttentionKernel::kMath, 0.02, 0.0625},
    {at::kBFloat16, AttentionKernel::kFlash, 0.02, 0.0625},
};

MIXTRAIN_WORKER(cp_attention) {
  const DeviceMesh mesh = cp_mesh(worker);
  for (const auto method : {CpRotateMethod::kAllToAll, CpRotateMethod::kAllGather}) {
    ContextParallel cp(mesh.cp_group, method);
    for (const auto& c : kCases) {
      const std::string label =
          std::string(method == CpRotateMethod::kAllToAll ? "ring" : "allgather") + " " +
          c10::toString(c.dtype) + " " + attention_kernel_name(c.kernel) + " cp" +
          std::to_string(cp.cp_size()) + " rank" + std::to_string(cp.cp_rank());
      check_attention(cp, c, label);
    }
  }
}

// The tiny Qwen2-MoE through parallelize on dp_shard 1 x cp 2 (FSDP shards over those 2 ranks
// and divides the summed gradient by 2) against the same model unsharded on the whole batch:
// loss = mean over cp ranks of each rank's cross-entropy, the aux loss (the whole batch's on
// every rank) and every parameter gradient. float32 throughout.
MIXTRAIN_WORKER(cp_model) {
  const DeviceMesh mesh = cp_mesh(worker);
  const std::string method = worker.get("CP_METHOD");
  // MODEL deepseek_v3: latent attention (padded to one head dim) through the ring, and the
  // sequence-wise balance loss, whose per-sequence sums run over the cp group; its selection
  // biases drawn so they change choices.
  const bool deepseek = worker.get("MODEL") == "deepseek_v3";
  ModelConfig config = test_support::tiny_config();
  if (deepseek) {
    config = test_support::tiny_deepseek_v3();
    moe_config(config).router_aux_loss_coef = 0.05;
  }
  const double coef = moe_config(config).router_aux_loss_coef;
  const auto make = [&] {
    auto m = deepseek ? build_model(config, 3) : qwen2_moe::make_qwen2_moe(config, 3);
    auto bias_gen = at::make_generator<at::CPUGeneratorImpl>(9);
    for (const auto& [name, bias] : m->model_state()) {
      m->set_model_state(name, at::randn(bias.sizes(), bias_gen) * 0.1);
    }
    return m;
  };
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor ids = at::randint(config.vocab_size, {2, 16}, gen, at::kLong);
  const at::Tensor labels = ids.roll(-1, 1);

  auto reference = make();
  const CausalLMOutput ref_out = reference->forward(ids);
  const at::Tensor ref_ce = causal_lm_cross_entropy(*reference, ref_out.logits, labels);
  (ref_ce + coef * ref_out.aux_loss).backward();

  auto model = make();
  FsdpOptions options;
  options.cp_rotate_method = method;
  const auto fsdp = parallelize(*model, mesh, options);
  ASSERT_NE(fsdp->context_parallel(), nullptr);
  const int64_t n = mesh.cp, r = mesh.cp_index();
  const CausalLMOutput out = model->forward(context_parallel_slice(ids, r, n));
  const at::Tensor ce =
      causal_lm_cross_entropy(*model, out.logits, context_parallel_slice(labels, r, n));
  (ce + coef * out.aux_loss).backward();

  // Tolerances: float32 summation order only (attention blocks, the cp sums, FSDP's
  // reduce-scatter of two halves) on O(1) losses: 1e-5 absolute; gradients relative to each
  // tensor's largest entry, 1e-4 (entries span several decades; the large ones agree to ~1e-6
  // relative in the measured runs).
  at::Tensor mean_ce = ce.detach().clone();
  mesh.cp_group->all_reduce_sum(mean_ce);
  mean_ce.div_(double(n));
  EXPECT_NEAR(mean_ce.item<double>(), ref_ce.item<double>(), 1e-5);
  EXPECT_NEAR(out.aux_loss.item<double>(), ref_out.aux_loss.item<double>(), 1e-5);
  std::map<std::string, at::Tensor> ref_grads;
  for (const auto& item : reference->named_parameters())
    ref_grads[item.key()] = item.value().grad();
  int checked = 0;
  double worst = 0;
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    const at::Tensor full = fsdp->gather_full(item.key(), item.value().grad());
    const at::Tensor& want = ref_grads.at(item.key());
    const double scale = std::max(want.abs().max().item<double>(), 1e-30);
    const double rel = max_abs_diff(full, want) / scale;
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-4) << item.key();
    ++checked;
  }
  EXPECT_EQ(checked, int(ref_grads.size()));
  std::printf(
      "cp_model %s rank %lld: ce %.8f (ref %.8f), aux %.8f (ref %.8f), worst grad rel %.3g\n",
      method.c_str(), static_cast<long long>(r), mean_ce.item<double>(), ref_ce.item<double>(),
      out.aux_loss.item<double>(), ref_out.aux_loss.item<double>(), worst);
}

void run(const std::string& worker, int nproc, std::map<std::string, std::string> env = {}) {
  ParallelConfig parallel;
  const auto result = testing::run_workers(worker, nproc, parallel, std::move(env));
  ASSERT_TRUE(result.all_ok()) << result.summary();
  std::printf("%s", result.outputs[0].c_str());
}

// One attention forward + backward moves exactly the analytic volume (core/collectives.h's
// counting), with block = B x Hkv x (S / n) x D x 4 bytes (one rank's float32 K or V):
//   ring (alltoall): n - 1 shifts of K and V forward, n - 1 shifts of their float32 gradients
//     backward: 4 (n - 1) block;
//   allgather: K and V gathered once ((n - 1) block each), their gradients reduce-scattered
//     ((n - 1) / n of n blocks each): 4 (n - 1) block too, in fewer, larger messages.
// Nothing else is sent. Both float32 kernels (the flash ring Function and the composed kMath).
MIXTRAIN_WORKER(cp_traffic) {
  const DeviceMesh mesh = cp_mesh(worker);
  const int64_t n = mesh.cp, batch = 2, kv_heads = 2, local_seq = 4, dim = 8;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11 + mesh.rank);
  const int64_t block = batch * kv_heads * local_seq * dim * 4;
  for (const auto method : {CpRotateMethod::kAllToAll, CpRotateMethod::kAllGather}) {
    for (const auto kernel : {AttentionKernel::kFlash, AttentionKernel::kMath}) {
      ContextParallel cp(mesh.cp_group, method);
      const at::Tensor q = at::randn({batch, 4, local_seq, dim}, gen).requires_grad_(true);
      const at::Tensor k = at::randn({batch, kv_heads, local_seq, dim}, gen).requires_grad_(true);
      const at::Tensor v = at::randn({batch, kv_heads, local_seq, dim}, gen).requires_grad_(true);
      const CollectiveStats before = thread_collective_stats();
      cp.attention(q, k, v, kernel).sum().backward();
      const CollectiveStats sent = thread_collective_stats() - before;
      EXPECT_EQ(sent.total().bytes, 4 * (n - 1) * block)
          << (method == CpRotateMethod::kAllToAll ? "ring " : "allgather ")
          << attention_kernel_name(kernel);
    }
  }
}

TEST(ContextParallel, TrafficPerAttentionIsTheAnalyticVolume) {
  run("cp_traffic", 2);
  run("cp_traffic", 4);
}

TEST(ContextParallel, PositionsAndSumOnTwoAndFourRanks) {
  run("cp_positions_and_sum", 2);
  run("cp_positions_and_sum", 4);
}

TEST(ContextParallel, AttentionMatchesOneProcessOnTwoRanks) {
  run("cp_attention", 2);
}
TEST(ContextParallel, AttentionMatchesOneProcessOnFourRanks) {
  run("cp_attention", 4);
}

TEST(ContextParallel, TinyMoeThroughShardModelMatchesOneProcess) {
  run("cp_model", 2, {{"CP_METHOD", "alltoall"}});
  run("cp_model", 2, {{"CP_METHOD", "allgather"}});
}

TEST(ContextParallel, DeepseekV3ThroughShardModelMatchesOneProcess) {
  run("cp_model", 2, {{"CP_METHOD", "alltoall"}, {"MODEL", "deepseek_v3"}});
  run("cp_model", 2, {{"CP_METHOD", "allgather"}, {"MODEL", "deepseek_v3"}});
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
