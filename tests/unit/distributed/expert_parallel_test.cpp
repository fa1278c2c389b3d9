// Expert parallelism (distributed/expert_parallel.h, the EP path of fsdp.h) on real Gloo ranks
// (tests/support/multiprocess.h).
//
// - token_dispatch / token_combine: rows routed to remote experts come back in order, each
//   expert sees exactly its rows (source-rank order kept), and the backward of the exchange
//   gives the single-process gradients (inputs and per-expert parameters), in float32 and
//   bfloat16, also when a rank sends nothing to its peer.
// - The fp32-main-params §2.1 with parallel.ep = 2 on the MoE: 2 ranks (dp_shard 2)
//   and 4 ranks (2x2 HSDP), AdamW and Muon + AdamW, against the one-process reference (the same
//   global batch as data-parallel micro-batches, accumulated in rank order).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <torch/types.h>
#include <torch/utils.h>
#include "support/tiny_model_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/expert_parallel.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/distributed/parallelize.h"
#include "mixtrain/model/init_dtype.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/qwen2_moe.h"
#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/distributed_muon.h"
#include "mixtrain/optim/grad_clip.h"
#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "support/case_2_1.h"
#include "support/multiprocess.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(ExpertParallelSingleProcess, ExpertParamNames) {
  auto c = test_support::tiny_config();
  c.num_layers = 12;
  const auto model = qwen2_moe::make_qwen2_moe(c, 1);
  EXPECT_TRUE(model->is_expert("model.layers.0.mlp.experts.gate_proj"));
  EXPECT_TRUE(model->is_expert("model.layers.11.mlp.experts.down_proj"));
  EXPECT_FALSE(model->is_expert("model.layers.0.mlp.shared_expert.gate_proj.weight"));
  EXPECT_FALSE(model->is_expert("model.layers.0.mlp.gate.weight"));
}

// ---- token_dispatch / token_combine ---------------------------------------------------------

constexpr int64_t kExperts = 4, kHidden = 6;

// One rank's routed rows: expert ids (sorted, as the model sorts them), the rows, and the
// upstream gradient of the combined output. Every rank can rebuild every rank's data.
struct RankRows {
  std::vector<int64_t> experts;  // per row, ascending
  at::Tensor rows, upstream;     // [n, H] float32
};

RankRows rows_of(int rank, int64_t n, const std::string& pattern) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77 + rank);
  RankRows r;
  at::Tensor ids;
  if (pattern == "local") {
    // Rank 0 routes everything to expert 0, rank 1 to expert 3: both to their own ep rank, so
    // the exchange moves zero rows (counts still travel).
    ids = at::full({n}, rank == 0 ? 0 : kExperts - 1, at::kLong);
  } else {
    ids = std::get<0>(at::randint(kExperts, {n}, gen, at::kLong).sort());
  }
  r.experts.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n);
  r.rows = at::randn({n, kHidden}, gen, at::kFloat);
  r.upstream = at::randn({n, kHidden}, gen, at::kFloat);
  return r;
}

// Expert e's "computation": row * scale[e] + e (elementwise, so exact in any row grouping).
MIXTRAIN_WORKER(ep_dispatch) {
  DeviceMesh mesh = worker.make_mesh();
  const int ranks = mesh.ep_group->size(), me = mesh.ep_group->rank();
  const int64_t local = kExperts / ranks;
  const std::string pattern = worker.get("PATTERN", "random");
  const auto dtype = worker.get("DTYPE", "float32") == "bfloat16" ? at::kBFloat16 : at::kFloat;
  const at::Tensor scale_full = at::arange(1, kExperts + 1, at::kFloat) * 0.5;
  int backward_calls = 0;
  ExpertParallel ep(mesh.ep_group, [&] { ++backward_calls; });

  std::vector<RankRows> all;
  for (int r = 0; r < ranks; ++r) all.push_back(rows_of(r, 5 + 3 * r, pattern));
  const RankRows& mine = all[me];
  const int64_t n = mine.rows.size(0);
  std::vector<int64_t> counts(kExperts, 0);
  for (int64_t e : mine.experts) ++counts[e];

  at::Tensor input = mine.rows.to(dtype).requires_grad_(true);
  at::Tensor scale = scale_full.narrow(0, me * local, local).clone().to(dtype).requires_grad_(true);
  const DispatchedTokens d = ep.token_dispatch(input, counts);
  ASSERT_EQ(static_cast<int64_t>(d.tokens_per_expert.size()), local);

  // Each local expert got exactly the rows routed to it, source ranks in order.
  int64_t offset = 0;
  std::vector<at::Tensor> outputs{d.tokens.narrow(0, 0, 0)};
  for (int64_t e = 0; e < local; ++e) {
    const int64_t global = me * local + e;
    std::vector<at::Tensor> expected;
    for (const auto& src : all) {
      for (size_t i = 0; i < src.experts.size(); ++i) {
        if (src.experts[i] == global) expected.push_back(src.rows[i].to(dtype));
      }
    }
    ASSERT_EQ(d.tokens_per_expert[e], static_cast<int64_t>(expected.size())) << "expert " << global;
    if (expected.empty()) continue;
    const auto x = d.tokens.narrow(0, offset, d.tokens_per_expert[e]);
    EXPECT_TRUE(torch::equal(x.detach(), at::stack(expected))) << "expert " << global;
    outputs.push_back(x * scale[e] + static_cast<double>(global));
    offset += d.tokens_per_expert[e];
  }
  const at::Tensor out = ep.token_combine(at::cat(outputs, 0), d);
  ASSERT_EQ(out.sizes(), input.sizes());

  // Reference: the same expert computation on this rank's rows, in their order.
  at::Tensor expected_out = at::empty_like(input);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = mine.experts[i];
    expected_out[i] = input[i].detach() * scale_full[e].to(dtype) + static_cast<double>(e);
  }
  EXPECT_TRUE(torch::equal(out.detach(), expected_out)) << "rows came back out of order";

  (out * mine.upstream.to(dtype)).sum().backward();
  EXPECT_GE(backward_calls, 2) << "both exchanges ran their backward";
  // d out_i / d row_i = scale[e_i]: the gradient came back to the rank that sent the row.
  at::Tensor expected_grad = at::empty_like(input);
  for (int64_t i = 0; i < n; ++i) {
    expected_grad[i] = mine.upstream[i].to(dtype) * scale_full[mine.experts[i]].to(dtype);
  }
  EXPECT_TRUE(torch::equal(input.grad(), expected_grad));
  // d loss / d scale[e] sums row * upstream over every rank's rows for expert e (float64
  // reference; the exchange adds them in one float32/bf16 sum, hence the tolerance).
  for (int64_t e = 0; e < local; ++e) {
    const int64_t global = me * local + e;
    double expected = 0;
    for (const auto& src : all) {
      for (size_t i = 0; i < src.experts.size(); ++i) {
        if (src.experts[i] != global) continue;
        expected +=
            (src.rows[i].to(dtype).to(at::kDouble) * src.upstream[i].to(dtype).to(at::kDouble))
                .sum()
                .item<double>();
      }
    }
    const double tol = dtype == at::kBFloat16 ? 2e-2 * (1 + std::abs(expected)) : 1e-5;
    EXPECT_NEAR(scale.grad()[e].item<double>(), expected, tol) << "expert " << global;
  }
}

ParallelConfig ep_degrees(int64_t replicate, int64_t shard, int64_t ep) {
  ParallelConfig p;
  p.dp_replicate = replicate;
  p.dp_shard = shard;
  p.ep = ep;
  return p;
}

TEST(ExpertParallelDispatch, RowsReachTheirExpertsAndComeBackInOrder) {
  for (const char* dtype : {"float32", "bfloat16"}) {
    const auto result = testing::run_workers("ep_dispatch", 2, ep_degrees(1, 2, 2),
                                             {{"DTYPE", dtype}, {"PATTERN", "random"}}, 60);
    ASSERT_TRUE(result.all_ok()) << dtype << "\n" << result.summary();
  }
}

TEST(ExpertParallelDispatch, RanksThatSendNothingStillTakePart) {
  const auto result =
      testing::run_workers("ep_dispatch", 2, ep_degrees(1, 2, 2), {{"PATTERN", "local"}}, 60);
  ASSERT_TRUE(result.all_ok()) << result.summary();
}

// ---- fp32-main-params §2.1 with expert parallelism
// ---------------------------------------------------

using test_support::ids_for_step;
using test_support::kGlobalBatch;
using test_support::kSeq;
using test_support::loss_of;
using test_support::named_params;
using test_support::rel_diff;
using test_support::rfc_config;
using test_support::run_and_report;
using test_support::Tolerances;

void run_ep_case_2_1(const testing::WorkerEnv& worker, const std::string& target, int steps,
                     const Tolerances& first_step, const Tolerances& later_steps) {
  DeviceMesh mesh = worker.make_mesh();
  ASSERT_GT(mesh.ep, 1);
  const TrainerConfig config = rfc_config(target);
  const ModelConfig& c = config.model;
  test_support::Case21Stacks s =
      test_support::build_case_2_1(config, mesh, FsdpOptions{config.mix_precision, true, true});
  ASSERT_NE(s.ref_mp, nullptr);
  ASSERT_NE(s.mp, nullptr);
  std::map<std::string, MuonSharding> sharding;
  for (const auto& placement : s.fsdp->placements()) {
    sharding[placement.name] = muon_sharding_of(placement);
  }

  // The built state: expert tensors hold this ep rank's E/ep whole experts (kLocal for Muon),
  // everything else its dp_shard chunk; bf16 model params, each with its own fp32 main param.
  const int64_t local_experts = moe_config(c).num_experts / mesh.ep;
  const int64_t ep_rank = mesh.ep_group->rank();
  std::set<c10::TensorImpl*> mains;
  int expert_params = 0;
  for (auto& [name, p] : named_params(*s.model)) {
    EXPECT_EQ(p.scalar_type(), torch::kBFloat16) << name;
    if (s.model->is_expert(name)) {
      ++expert_params;
      EXPECT_TRUE(s.fsdp->is_expert_parallel(name)) << name;
      EXPECT_EQ(p.size(0), local_experts) << name;
      EXPECT_EQ(s.fsdp->layout(name).offset, ep_rank * local_experts) << name;
      EXPECT_EQ(sharding.at(name).kind, MuonSharding::Kind::kLocal) << name;
    } else {
      EXPECT_FALSE(s.fsdp->is_expert_parallel(name)) << name;
      EXPECT_EQ(p.size(0), s.fsdp->layout(name).rows) << name;
    }
    const at::Tensor& main = s.mp->main_param(name);
    EXPECT_EQ(main.scalar_type(), torch::kFloat32) << name;
    EXPECT_EQ(main.sizes(), p.sizes()) << name;
    EXPECT_TRUE(mains.insert(main.unsafeGetTensorImpl()).second) << name << " shares a main";
  }
  EXPECT_EQ(expert_params, 3 * c.num_layers);
  // The norm: the trainer's EP norm (the chained optimizer's clip_grad_norm), expert slices
  // counted once per ep block (matters for dp_shard > ep).
  test_support::compare_case_2_1_steps(worker, mesh, config, s, steps, first_step, later_steps);
}

// Tolerances (relative to the reference tensor's max |element|), with the measured values.
// AdamW: every rank computes each of its rows exactly as the reference computes them (same
// bf16 params, same per-source GEMM shapes, see Qwen2MoeExperts::forward_expert_parallel),
// each source's expert gradient reaches main_grad in float32 as the reference's micro-batch
// gradient does, and AdamW is elementwise; only float32 summation order may differ (HSDP,
// and the expert_dp sum (g0+g1)+(g2+g3) vs ((g0+g1)+g2)+g3): measured 0 on 2 ranks and 3e-9
// (main_grad) / 1e-8 (norm) on 4, at every step. Bound: a few float32 ulps, as fsdp_test.
constexpr Tolerances kExact{1e-6, 1e-6, 1e-12, 1e-6};
// Muon + AdamW. Step 1: loss, norm and main_grad as above (measured identical); the Muon
// update is Newton-Schulz in bfloat16 on differently batched GEMMs (E/ep experts per batch
// here, E in the reference; the FSDP owner buckets for the rest): measured 0.9% / 1.0% of a
// tensor's scale on 2 / 4 ranks, bound 2% as in fsdp_test. Later steps: one-ulp differences
// of bf16 params flip MoE top-k routes (measured main_grad up to 40%, params 62%), so only
// loss and global grad norm are compared: measured 7.6e-5 and 9.6e-4, bounds 5e-4 and 5e-3
// (a layout bug moves them by O(1)).
constexpr double kNotCompared = std::numeric_limits<double>::infinity();
constexpr Tolerances kMuonFirst{1e-6, 2e-2, 1e-12, 1e-6};
constexpr Tolerances kMuonLater{kNotCompared, kNotCompared, 5e-4, 5e-3};

MIXTRAIN_WORKER(ep_case_2_1_adamw) {
  run_ep_case_2_1(worker, "AdamW", 3, kExact, kExact);
}
MIXTRAIN_WORKER(ep_case_2_1_muon) {
  run_ep_case_2_1(worker, "Muon", 3, kMuonFirst, kMuonLater);
}

// fp32_main_params off: every gradient, the experts' included, lands in .grad in the
// parameter's dtype (bfloat16). The reference accumulates its two micro-batches in bfloat16
// .grad, the ranks sum in float32 and round once, so they differ by up to one bf16 rounding of
// an element (2^-8 relative): bound 1e-2 of the tensor's max.
MIXTRAIN_WORKER(ep_grads_without_main_params) {
  DeviceMesh mesh = worker.make_mesh();
  TrainerConfig config = rfc_config("AdamW");
  config.optimizer.fp32_main_params = false;
  const ModelConfig& c = config.model;
  const int64_t dp = mesh.world_size, rows_per_rank = kGlobalBatch / dp;
  auto ref_model = qwen2_moe::make_qwen2_moe(c, 21);
  apply_model_init_dtype(*ref_model, torch::kBFloat16);
  auto model = qwen2_moe::make_qwen2_moe(c, 21);
  apply_model_init_dtype(*model, torch::kBFloat16);
  auto fsdp = parallelize(*model, mesh, FsdpOptions{config.mix_precision, false, true});
  const auto ids = ids_for_step(c, 1, kGlobalBatch, kSeq);
  for (int64_t r = 0; r < dp; ++r) {
    const auto micro = ids.narrow(0, r * rows_per_rank, rows_per_rank);
    (loss_of(ref_model->forward(micro), micro, moe_config(c).router_aux_loss_coef) /
     static_cast<double>(dp))
        .backward();
  }
  const auto micro = ids.narrow(0, mesh.rank * rows_per_rank, rows_per_rank);
  loss_of(model->forward(micro), micro, moe_config(c).router_aux_loss_coef).backward();
  auto ref = named_params(*ref_model);
  auto tested = named_params(*model);
  for (size_t i = 0; i < tested.size(); ++i) {
    const auto& [name, p] = tested[i];
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().scalar_type(), torch::kBFloat16) << name;
    EXPECT_LE(rel_diff(fsdp->gather_full(name, p.grad()), ref[i].second.grad()), 1e-2) << name;
  }
}

// Every expert on every token (top-k = E = 4): each token's output sums 4 expert outputs, and
// the expert-parallel model must produce the bits the all-experts-local model produces on the
// same micro-batch. Regression: the EP path once added all experts' outputs in one index_add_,
// which LibTorch 2.x sums in float32 and rounds once, while the local path rounds to bfloat16
// after each expert (measured on 2.11: logits off by bf16 ulps, the loss by 5e-7).
MIXTRAIN_WORKER(ep_forward_every_expert) {
  DeviceMesh mesh = worker.make_mesh();
  TrainerConfig config = rfc_config("AdamW");
  moe_config(config.model).num_experts_per_tok = moe_config(config.model).num_experts;
  const ModelConfig& c = config.model;
  auto ref_model = qwen2_moe::make_qwen2_moe(c, 21);
  apply_model_init_dtype(*ref_model, torch::kBFloat16);
  auto model = qwen2_moe::make_qwen2_moe(c, 21);
  apply_model_init_dtype(*model, torch::kBFloat16);
  auto fsdp = parallelize(*model, mesh, FsdpOptions{config.mix_precision, false, true});
  const auto ids = ids_for_step(c, 1, kGlobalBatch, kSeq);
  const int64_t rows_per_rank = kGlobalBatch / mesh.world_size;
  const auto micro = ids.narrow(0, mesh.rank * rows_per_rank, rows_per_rank);
  torch::NoGradGuard no_grad;
  const auto want = ref_model->forward(micro);
  const auto got = model->forward(micro);
  EXPECT_EQ(got.logits.scalar_type(), torch::kBFloat16);
  const int64_t differing = got.logits.ne(want.logits).sum().item<int64_t>();
  EXPECT_EQ(differing, 0) << "of " << want.logits.numel() << " logits differ";
  EXPECT_TRUE(torch::equal(got.aux_loss, want.aux_loss));
}

TEST(ExpertParallelCase21, TwoRankEpMatchesUnshardedReference) {
  run_and_report("ep_case_2_1_adamw", 2, ep_degrees(1, 2, 2));
}
TEST(ExpertParallelCase21, FourRankHsdpWithEpMatchesUnshardedReference) {
  run_and_report("ep_case_2_1_adamw", 4, ep_degrees(2, 2, 2));
}
TEST(ExpertParallelCase21, GradsWithoutMainParamsLandInGrad) {
  const auto result =
      testing::run_workers("ep_grads_without_main_params", 2, ep_degrees(1, 2, 2), {}, 120);
  ASSERT_TRUE(result.all_ok()) << result.summary();
}
// dp_shard 4 with ep 2: two ep blocks in one row hold copies of the experts (expert_dp).
TEST(ExpertParallelCase21, FourRankFsdpWithTwoEpBlocksMatchesUnshardedReference) {
  run_and_report("ep_case_2_1_adamw", 4, ep_degrees(1, 4, 2));
}
TEST(ExpertParallel, EveryExpertPerTokenGivesTheLocalModelsBits) {
  const auto result =
      testing::run_workers("ep_forward_every_expert", 2, ep_degrees(1, 2, 2), {}, 120);
  ASSERT_TRUE(result.all_ok()) << result.summary();
}
TEST(ExpertParallelCase21, MuonAndAdamWOnTwoRankEp) {
  run_and_report("ep_case_2_1_muon", 2, ep_degrees(1, 2, 2));
}
TEST(ExpertParallelCase21, MuonAndAdamWOnFourRankHsdpWithEp) {
  run_and_report("ep_case_2_1_muon", 4, ep_degrees(2, 2, 2));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
