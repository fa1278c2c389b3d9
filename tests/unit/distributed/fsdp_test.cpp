// FSDP / DDP / HSDP (distributed/fsdp.h) on the tiny Qwen2-MoE.
//
// Single process: the materializer hooks leave the model bit-identical; the one-rank layout
// routes grads into main_grad / .grad exactly.
// Multi-process (tests/support/multiprocess.h, real Gloo): the fp32-main-params §2.1.
// Every rank also runs the reference (one process, unsharded, the same global batch as
// data_parallel_size micro-batches in rank order, gradient accumulation with loss / n) and
// compares its own sharded run against it at every step.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <torch/torch.h>
#include "support/tiny_model_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/model/init_dtype.h"
#include "mixtrain/model/qwen2_moe.h"
#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/distributed_muon.h"
#include "mixtrain/optim/grad_clip.h"
#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "support/multiprocess.h"

namespace mixtrain {
namespace {

using test_support::tiny_config;

// fp32-main-params §2.1: bfloat16 model, fp32 main params, param/output bfloat16, reduce float32.
TrainerConfig rfc_config(const std::string& target) {
  TrainerConfig config;
  config.model = tiny_config();
  config.model_init_dtype = "bfloat16";
  config.optimizer.target = target;
  config.optimizer.fp32_main_params = true;
  config.optimizer.adamw.lr = 1e-2;  // large enough that every step moves the bf16 params
  config.mix_precision.param_dtype = "bfloat16";
  config.mix_precision.reduce_dtype = "float32";
  config.mix_precision.output_dtype = "bfloat16";
  config.train.max_grad_norm = 0.5;  // below the tiny model's norm: clipping is exercised
  return config;
}

torch::Tensor ids_for_step(const ModelConfig& c, int64_t step, int64_t batch, int64_t seq) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return torch::randint(c.vocab_size, {batch, seq}, gen, torch::kInt64);
}

torch::Tensor loss_of(const CausalLMOutput& out, const torch::Tensor& ids, double aux_coef) {
  const int64_t vocab = out.logits.size(-1);
  const auto ce = torch::nn::functional::cross_entropy(
      out.logits.reshape({-1, vocab}).to(torch::kFloat), ids.roll(-1, 1).reshape({-1}));
  return ce + aux_coef * out.aux_loss;
}

std::vector<std::pair<std::string, at::Tensor>> named_params(torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

// A materializer that computes with a copy made by a custom Function whose backward passes the
// gradient through: the one-rank FSDP shape of the hook, with no communication.
struct CopyThrough : public torch::autograd::Function<CopyThrough> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& p) {
    return p.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0]};
  }
};

class CopyMaterializer : public ParameterMaterializer {
 public:
  torch::Tensor unshard(const std::string& name, const torch::Tensor& param) override {
    names.push_back(name);
    return CopyThrough::apply(param);
  }
  torch::Tensor post_forward(const std::vector<std::string>& module_names,
                             const torch::Tensor& output) override {
    for (const auto& n : module_names) released.push_back(n);
    return output;
  }
  std::vector<std::string> names, released;
};

struct ForwardBackward {
  torch::Tensor logits, aux;
  std::map<std::string, torch::Tensor> grads;
};

ForwardBackward run_once(CausalLM& model, const torch::Tensor& ids) {
  ForwardBackward r;
  const auto out = model.forward(ids);
  loss_of(out, ids, model.config().router_aux_loss_coef).backward();
  r.logits = out.logits.detach();
  r.aux = out.aux_loss.detach();
  for (auto& item : model.named_parameters()) {
    if (item.value().grad().defined()) r.grads[item.key()] = item.value().grad();
  }
  return r;
}

void expect_bitwise(const ForwardBackward& a, const ForwardBackward& b) {
  EXPECT_TRUE(torch::equal(a.logits, b.logits));
  EXPECT_TRUE(torch::equal(a.aux, b.aux));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, g] : a.grads) {
    ASSERT_TRUE(b.grads.count(name)) << name;
    EXPECT_TRUE(torch::equal(g, b.grads.at(name))) << name;
  }
}

TEST(FsdpSingleProcess, MaterializerHooksLeaveLogitsAndGradsBitwiseUnchanged) {
  const auto c = tiny_config();
  const auto ids = ids_for_step(c, 0, 3, 9);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto plain = qwen2_moe::make_qwen2_moe(c, 5);
    auto hooked = qwen2_moe::make_qwen2_moe(c, 5);
    apply_model_init_dtype(*plain, dtype);
    apply_model_init_dtype(*hooked, dtype);
    auto materializer = std::make_shared<CopyMaterializer>();
    hooked->set_parameter_materializer(materializer);
    expect_bitwise(run_once(*plain, ids), run_once(*hooked, ids));
    // Every parameter was materialized once under its HF name and released by its module.
    std::vector<std::string> expected;
    for (auto& item : plain->named_parameters()) expected.push_back(item.key());
    auto seen = materializer->names, released = materializer->released;
    std::sort(expected.begin(), expected.end());
    std::sort(seen.begin(), seen.end());
    std::sort(released.begin(), released.end());
    EXPECT_EQ(seen, expected);
    EXPECT_EQ(released, expected);
    // Removing the materializer restores the direct path.
    hooked->set_parameter_materializer(nullptr);
    hooked->zero_grad();
    plain->zero_grad();
    expect_bitwise(run_once(*plain, ids), run_once(*hooked, ids));
  }
}

// One rank: shard_model is the identity layout; the gradient must arrive unchanged in main_grad
// (fp32_main_params) or .grad, and the logits take output_dtype.
TEST(FsdpSingleProcess, OneRankRoutesGradsIntoMainGradOrGrad) {
  const auto c = tiny_config();
  const auto ids = ids_for_step(c, 0, 2, 8);
  auto plain = qwen2_moe::make_qwen2_moe(c, 7);
  apply_model_init_dtype(*plain, torch::kBFloat16);
  const ForwardBackward ref = run_once(*plain, ids);

  for (bool fp32_main : {false, true}) {
    auto model = qwen2_moe::make_qwen2_moe(c, 7);
    apply_model_init_dtype(*model, torch::kBFloat16);
    TrainerConfig config = rfc_config("AdamW");
    config.optimizer.fp32_main_params = fp32_main;
    FsdpOptions options{config.mix_precision, fp32_main, true};
    auto fsdp = shard_model(*model, make_single_process_mesh(), options);
    auto optimizer = build_optimizer(named_params(*model), config);
    fsdp->set_main_grads(optimizer.get());
    const auto out = model->forward(ids);
    EXPECT_EQ(out.logits.scalar_type(), torch::kBFloat16);
    loss_of(out, ids, c.router_aux_loss_coef).backward();
    EXPECT_TRUE(torch::equal(out.logits.detach(), ref.logits));
    for (auto& item : model->named_parameters()) {
      const auto& name = item.key();
      if (fp32_main) {
        EXPECT_FALSE(item.value().grad().defined()) << name;
        const at::Tensor& main_grad = optimizer->main_grad(name);
        EXPECT_EQ(main_grad.scalar_type(), torch::kFloat32) << name;
        EXPECT_TRUE(torch::equal(main_grad, ref.grads.at(name).to(torch::kFloat))) << name;
      } else {
        ASSERT_TRUE(item.value().grad().defined()) << name;
        EXPECT_TRUE(torch::equal(item.value().grad(), ref.grads.at(name))) << name;
      }
    }
  }
}

TEST(FsdpSingleProcess, OutputDtypeAndBadDtypes) {
  auto model = qwen2_moe::make_qwen2_moe(tiny_config(), 7);
  FsdpOptions options;
  options.mix_precision.param_dtype = "bfloat16";
  options.mix_precision.output_dtype = "float32";
  shard_model(*model, make_single_process_mesh(), options);
  const auto out = model->forward(ids_for_step(tiny_config(), 0, 1, 4));
  EXPECT_EQ(out.logits.scalar_type(), torch::kFloat32);  // computed in bf16, cast on output
  EXPECT_EQ(out.aux_loss.scalar_type(), torch::kFloat32);
  options.mix_precision.param_dtype = "bfloat17";
  auto other = qwen2_moe::make_qwen2_moe(tiny_config(), 7);
  EXPECT_THROW(shard_model(*other, make_single_process_mesh(), options), std::invalid_argument);
}

// fp32-main-params §2.5 for options built in code: main_grads are float32, so an unset or bfloat16
// reduce_dtype is refused, never filled in.
TEST(FsdpSingleProcess, MainParamsNeedFloat32Reduce) {
  for (const char* reduce : {"", "bfloat16"}) {
    auto model = qwen2_moe::make_qwen2_moe(tiny_config(), 7);
    FsdpOptions options;
    options.mix_precision.param_dtype = "bfloat16";
    if (*reduce != '\0') options.mix_precision.reduce_dtype = reduce;
    options.fp32_main_params = true;
    try {
      shard_model(*model, make_single_process_mesh(), options);
      ADD_FAILURE() << "reduce_dtype '" << reduce << "' was accepted";
    } catch (const std::invalid_argument& error) {
      EXPECT_EQ(std::string(error.what()),
                "shard_model: fp32 main grads need reduce dtype float32, got " +
                    std::string(*reduce == '\0' ? "none" : "'bfloat16'"));
    }
  }
  auto model = qwen2_moe::make_qwen2_moe(tiny_config(), 7);
  FsdpOptions options;
  options.mix_precision.reduce_dtype = "float32";
  options.fp32_main_params = true;
  EXPECT_NO_THROW(shard_model(*model, make_single_process_mesh(), options));
}

// ---- multi-process: fp32-main-params §2.1
// ------------------------------------------------------------

constexpr int64_t kGlobalBatch = 4, kSeq = 8;

// Relative tolerances (max |diff| / max |ref| per tensor) for steps after the first; the first
// step always uses `exact` (see run_case_2_1).
struct Tolerances {
  double main_grad, main_param, loss, grad_norm;
};
// Identical forward/backward per micro-batch on identical bf16 params, so only float32 sum order
// may differ (HSDP: (g0+g1)+(g2+g3) vs ((g0+g1)+g2)+g3): a few float32 ulps of the largest
// element; AdamW is elementwise, so equal grads give equal updates; the loss is a double sum
// of bit-identical per-rank losses; the norm sums float32 squares in double, regrouped.
constexpr Tolerances kExact{1e-6, 1e-6, 1e-12, 1e-6};

struct Diffs {
  double loss = 0, grad_norm = 0, main_grad = 0, main_param = 0;  // max relative differences
  void merge(const Diffs& o) {
    loss = std::max(loss, o.loss);
    grad_norm = std::max(grad_norm, o.grad_norm);
    main_grad = std::max(main_grad, o.main_grad);
    main_param = std::max(main_param, o.main_param);
  }
};

// max |a - b| / max(max |b|, tiny)
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() / scale;
}

// The case-2.1 run on this rank: target optimizer, `steps` steps, tolerances for step 1 (where
// the params are still bit-identical) and the later steps; EXPECTs inside, and the max
// differences written to the test dir as "diffs_<rank>".
void run_case_2_1(const testing::WorkerEnv& worker, const std::string& target, int steps,
                  bool reshard_after_forward, const Tolerances& first_step,
                  const Tolerances& later_steps) {
  DeviceMesh mesh = worker.make_mesh();
  const TrainerConfig config = rfc_config(target);
  const ModelConfig& c = config.model;
  const int64_t dp = mesh.world_size, rows_per_rank = kGlobalBatch / dp;

  // Reference: one process, unsharded, accumulating the dp micro-batches in rank order.
  auto ref_model = qwen2_moe::make_qwen2_moe(c, 21);
  apply_model_init_dtype(*ref_model, torch::kBFloat16);
  auto ref_opt = build_optimizer(named_params(*ref_model), config);
  auto* ref_mp = dynamic_cast<MixedPrecisionOptimizer*>(ref_opt.get());
  ASSERT_NE(ref_mp, nullptr);

  // Tested: the same model sharded over the mesh (fp32-main-params §6.1 order: init dtype, shard,
  // optimizer).
  auto model = qwen2_moe::make_qwen2_moe(c, 21);
  apply_model_init_dtype(*model, torch::kBFloat16);
  FsdpOptions options{config.mix_precision, true, reshard_after_forward};
  auto fsdp = shard_model(*model, mesh, options);
  auto opt = build_optimizer(named_params(*model), config);
  auto* mp = dynamic_cast<MixedPrecisionOptimizer*>(opt.get());
  ASSERT_NE(mp, nullptr);
  fsdp->set_main_grads(opt.get());
  mp->chained().set_placements(fsdp->placements());

  // fp32-main-params §2.1 checks on the built state: bf16 model params, each with its own fp32 main
  // param.
  std::set<c10::TensorImpl*> mains;
  for (auto& [name, p] : named_params(*model)) {
    EXPECT_EQ(p.scalar_type(), torch::kBFloat16) << name;
    EXPECT_EQ(p.size(0), fsdp->layout(name).rows) << name;
    EXPECT_FALSE(mp->is_own_main_param(name)) << name;
    const at::Tensor& main = mp->main_param(name);
    EXPECT_EQ(main.scalar_type(), torch::kFloat32) << name;
    EXPECT_EQ(main.sizes(), p.sizes()) << name;
    EXPECT_TRUE(mains.insert(main.unsafeGetTensorImpl()).second) << name << " shares a main";
  }
  for (auto& item : model->named_buffers()) {
    if (at::isFloatingType(item.value().scalar_type())) {
      EXPECT_EQ(item.value().scalar_type(), torch::kBFloat16) << item.key();
    }
  }

  Diffs diffs;
  for (int step = 1; step <= steps; ++step) {
    const Tolerances& tol = step == 1 ? first_step : later_steps;
    const auto ids = ids_for_step(c, step, kGlobalBatch, kSeq);
    // Reference step.
    double ref_loss = 0;
    for (int64_t r = 0; r < dp; ++r) {
      const auto micro = ids.narrow(0, r * rows_per_rank, rows_per_rank);
      const auto loss = loss_of(ref_model->forward(micro), micro, c.router_aux_loss_coef);
      (loss / static_cast<double>(dp)).backward();
      ref_opt->accumulate_model_grads();
      ref_loss += loss.item<double>() / static_cast<double>(dp);
    }
    std::map<std::string, at::Tensor> ref_main_grads;
    for (auto& [name, p] : named_params(*ref_model)) {
      ref_main_grads[name] = ref_opt->main_grad(name).clone();
    }
    ref_opt->prepare_grads();
    const double ref_norm = clip_grad_norm(ref_opt->grads_for_clipping(), 0.5);
    ref_opt->step_with_ready_grads();
    ref_opt->zero_grad();

    // Tested step: this rank's slice of the same global batch.
    const auto micro = ids.narrow(0, mesh.rank * rows_per_rank, rows_per_rank);
    const auto local_loss = loss_of(model->forward(micro), micro, c.router_aux_loss_coef);
    local_loss.backward();
    const double loss = average_over_data_parallel(local_loss.item<double>(), mesh);
    for (auto& [name, p] : named_params(*model)) {
      EXPECT_FALSE(p.grad().defined()) << name << ": .grad must stay empty (fp32-main-params §8.1)";
      const at::Tensor& main_grad = opt->main_grad(name);
      EXPECT_EQ(main_grad.scalar_type(), torch::kFloat32) << name;
      const auto full = fsdp->gather_full(name, main_grad);
      const double d = rel_diff(full, ref_main_grads.at(name));
      diffs.main_grad = std::max(diffs.main_grad, d);
      EXPECT_LE(d, tol.main_grad) << "step " << step << " main_grad " << name;
    }
    opt->prepare_grads();
    const double norm = opt->chained().clip_grad_norm(0.5);
    opt->step_with_ready_grads();
    opt->zero_grad();

    diffs.loss = std::max(diffs.loss, std::abs(loss - ref_loss) / std::abs(ref_loss));
    diffs.grad_norm = std::max(diffs.grad_norm, std::abs(norm - ref_norm) / ref_norm);
    EXPECT_LE(std::abs(loss - ref_loss), tol.loss * std::abs(ref_loss)) << "step " << step;
    EXPECT_LE(std::abs(norm - ref_norm), tol.grad_norm * ref_norm) << "step " << step;

    for (auto& [name, p] : named_params(*model)) {
      const at::Tensor& main = mp->main_param(name);
      // fp32-main-params §2.1: after each step the model param is its main param rounded to
      // bfloat16.
      EXPECT_TRUE(torch::equal(p.detach(), main.to(torch::kBFloat16))) << name;
      const auto full_main = fsdp->gather_full(name, main);
      const double d = rel_diff(full_main, ref_mp->main_param(name));
      diffs.main_param = std::max(diffs.main_param, d);
      EXPECT_LE(d, tol.main_param) << "step " << step << " main param " << name;
    }
  }
  std::ostringstream text;
  text << diffs.loss << " " << diffs.grad_norm << " " << diffs.main_grad << " " << diffs.main_param;
  worker.write_text("diffs_" + std::to_string(mesh.rank), text.str());
}

MIXTRAIN_WORKER(fsdp_case_2_1_adamw) {
  run_case_2_1(worker, "AdamW", 3, worker.get("RESHARD", "1") == "1", kExact, kExact);
}

// Muon + AdamW. Step 1 starts from bit-identical params, so the pre-step numbers (loss, norm,
// main_grad) are held to kExact; the Muon update itself is computed by distributed Muon with
// Newton-Schulz in bfloat16 on differently batched GEMMs, so its main params agree to bf16
// Newton-Schulz rounding (measured: exact on the FSDP path, 0.9% of the param scale for the
// DDP path's k/v projections): bound 2%. From step 2 on, one-ulp differences of bf16 model
// params can flip MoE top-k routing, a discontinuous change of single expert grads and, through
// Muon's normalisation, of their updates (measured up to 40% / 60% of a tensor's scale), so
// only the step's loss and global grad norm are compared (measured 7.6e-5 and 9.6e-4: bounds
// 5e-4 and 5e-3); a layout bug moves them by O(1).
constexpr double kNotCompared = std::numeric_limits<double>::infinity();
constexpr Tolerances kMuonFirst{1e-6, 2e-2, 1e-12, 1e-6};
constexpr Tolerances kMuonLater{kNotCompared, kNotCompared, 5e-4, 5e-3};

// Muon + AdamW, the Muon group through distributed Muon (owner-per-bucket for FSDP, round-robin
// owners for DDP, local experts); step 1 is held to kExact like AdamW.
MIXTRAIN_WORKER(fsdp_case_2_1_muon) {
  run_case_2_1(worker, "Muon", 3, true, kMuonFirst, kMuonLater);
}

ParallelConfig degrees(int64_t replicate, int64_t shard) {
  ParallelConfig p;
  p.dp_replicate = replicate;
  p.dp_shard = shard;
  return p;
}

void run_and_report(const std::string& worker, int nproc, const ParallelConfig& parallel,
                    std::map<std::string, std::string> env = {}) {
  const auto result = testing::run_workers(worker, nproc, parallel, std::move(env), 120);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  for (int r = 0; r < nproc; ++r) {
    ::testing::Test::RecordProperty("diffs_rank" + std::to_string(r),
                                    result.read_text("diffs_" + std::to_string(r)));
  }
}

TEST(FsdpCase21, TwoRankFsdpMatchesUnshardedReference) {
  run_and_report("fsdp_case_2_1_adamw", 2, degrees(1, 2));
}
TEST(FsdpCase21, TwoRankFsdpWithoutReshardAfterForward) {
  run_and_report("fsdp_case_2_1_adamw", 2, degrees(1, 2), {{"RESHARD", "0"}});
}
TEST(FsdpCase21, TwoRankDdpMatchesUnshardedReference) {
  run_and_report("fsdp_case_2_1_adamw", 2, degrees(2, 1));
}
TEST(FsdpCase21, FourRankHsdpMatchesUnshardedReference) {
  run_and_report("fsdp_case_2_1_adamw", 4, degrees(2, 2));
}
TEST(FsdpCase21, FourRankFsdpUnevenShards) {
  run_and_report("fsdp_case_2_1_adamw", 4, degrees(1, 4));
}
TEST(FsdpCase21, MuonAndAdamWOnTwoRankFsdp) {
  run_and_report("fsdp_case_2_1_muon", 2, degrees(1, 2));
}
TEST(FsdpCase21, MuonAndAdamWOnTwoRankDdp) {
  run_and_report("fsdp_case_2_1_muon", 2, degrees(2, 1));
}
TEST(FsdpCase21, MuonAndAdamWOnFourRankHsdp) {
  run_and_report("fsdp_case_2_1_muon", 4, degrees(2, 2));
}

}  // namespace
}  // namespace mixtrain
