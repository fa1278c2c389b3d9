// The swap optimizer's device tier (optim/swap_pinned_tier.h) on CUDA tensors: bfloat16 params
// with fp32 main params on cuda:0, Muon + AdamW and AdamW alone, trained with swap on and off in
// the same process with the same grads (drawn on the CPU). The values go through pinned host
// memory bit for bit, so params and state must be bitwise equal (compared as bytes); between
// steps no state tensor has device storage and the resident count is 0; in a step the resident
// count stays within two consecutive groups; a pass acquiring in reverse order (every later
// acquire out of order) changes nothing; the leaves may run on a stream other than the default;
// a checkpoint's state loaded into a swapped optimizer trains on identically.
#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>

#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/leaf_optimizer.h"
#include "mixtrain/optim/param_groups.h"
#include "mixtrain/optim/state_swap.h"
#include "mixtrain/optim/training_optimizer.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

const c10::Device kCuda(c10::kCUDA, 0);

bool is_swapped_state(const at::Tensor& t) {
  return t.defined() && at::isFloatingType(t.scalar_type()) && t.dim() >= 1;
}

// Same bytes (and shape and dtype): no tolerance, the swap only copies.
bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;
  return a.reshape({-1}).contiguous().view(at::kByte).equal(
      b.reshape({-1}).contiguous().view(at::kByte));
}

// bfloat16 params of the shapes of state_swap_test (Muon matrices; AdamW embeddings, norms and
// the head), fp32 main params, on the GPU; values drawn on the CPU so both builds are the same.
std::unique_ptr<TrainingOptimizer> build(NamedParameters& params, const std::string& target) {
  params.clear();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"embed_tokens.weight", {40, 16}}, {"layers.0.q.weight", {16, 16}},
      {"layers.0.norm.weight", {16}},    {"layers.0.up.weight", {48, 16}},
      {"layers.1.q.weight", {16, 16}},   {"lm_head.weight", {40, 16}}};
  at::manual_seed(7);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& [name, shape] = shapes[i];
    at::Tensor p = at::randn(shape, at::TensorOptions().dtype(at::kFloat))
                       .mul(0.1 * (i + 1))
                       .to(at::kBFloat16)
                       .to(kCuda)
                       .requires_grad_(true);
    params.emplace_back(name, p);
  }
  TrainerConfig config;
  config.optimizer.target = target;
  config.optimizer.fp32_main_params = true;
  config.mix_precision.reduce_dtype = "float32";  // fp32-main-params §2.5
  return build_optimizer(params, config);
}

void step(TrainingOptimizer& optimizer, NamedParameters& params, int64_t k) {
  at::manual_seed(1000 + k);
  for (auto& [name, p] : params) {
    p.mutable_grad() = at::randn(p.sizes()).to(p.scalar_type()).to(p.device());
  }
  optimizer.step();
  optimizer.zero_grad();
}

void expect_same(TrainingOptimizer& plain, NamedParameters& plain_params,
                 TrainingOptimizer& swapped, NamedParameters& swapped_params,
                 const std::string& when) {
  for (size_t i = 0; i < plain_params.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(plain_params[i].second, swapped_params[i].second))
        << when << ": " << plain_params[i].first;
  }
  const NamedTensors a = plain.state_dict(), b = swapped.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(bitwise_equal(a[i].second, b[i].second)) << when << ": " << a[i].first;
    if (is_swapped_state(b[i].second)) {
      EXPECT_EQ(b[i].second.device(), kCuda) << a[i].first;
    }
  }
}

// Between steps: no floating state tensor holds device storage, and the count says so.
void expect_nothing_resident(TrainingOptimizer& swapped, const std::string& when) {
  ChainedOptimizer& chained = swapped.chained();
  EXPECT_EQ(chained.state_swap()->resident_bytes(), 0) << when;
  for (const auto& name : chained.names()) {
    for (const auto& [state_name, t] :
         chained.leaf_of(name).export_state(chained.optimizer_param(name))) {
      if (!is_swapped_state(t)) continue;
      EXPECT_EQ(t.device(), kCuda) << name << "." << state_name;
      EXPECT_EQ(t.storage().nbytes(), 0u) << when << ": " << name << "." << state_name;
    }
  }
}

int64_t two_groups(const StateSwap& swap) {
  int64_t bytes = 0;
  for (int64_t g = 0; g < swap.groups(); ++g) {
    const int64_t next = g + 1 < swap.groups() ? swap.group_bytes(g + 1) : 0;
    bytes = std::max(bytes, swap.group_bytes(g) + next);
  }
  return bytes;
}

// As in state_swap_test: the state in reverse order, acquired, updated in place and released as
// a leaf does; the next step acquires against the layout this pass taught (out of order).
void reverse_pass(TrainingOptimizer& optimizer) {
  ChainedOptimizer& chained = optimizer.chained();
  StateSwap* swap = chained.state_swap();
  std::vector<std::string> names = chained.names();
  std::reverse(names.begin(), names.end());
  if (swap) swap->begin_step();
  for (const auto& name : names) {
    LeafOptimizer& leaf = chained.leaf_of(name);
    const at::Tensor& param = chained.optimizer_param(name);
    if (swap) swap->acquire(leaf, param);
    for (const auto& [state_name, t] : leaf.export_state(param)) {
      if (is_swapped_state(t)) t.mul_(0.5).add_(0.25);
    }
    if (swap) swap->release(leaf, param);
  }
  if (swap) swap->end_step();
}

// (optimizer target, bucket bytes, leaves on a pool stream instead of the default stream).
// 1 KiB buckets: a group per one or two params, prefetch and write-back overlap all the time;
// 1 MiB: one group.
class StateSwapCuda : public ::testing::TestWithParam<std::tuple<std::string, int64_t, bool>> {};
INSTANTIATE_TEST_SUITE_P(Cases, StateSwapCuda,
                         ::testing::Values(std::make_tuple("Muon", 1024, false),
                                           std::make_tuple("Muon", 1 << 20, false),
                                           std::make_tuple("AdamW", 1024, false),
                                           std::make_tuple("Muon", 1024, true)));

TEST_P(StateSwapCuda, SwappedStepsAreBitwiseTheUnswappedOnes) {
  const auto& [target, bucket_bytes, pool_stream] = GetParam();
  NamedParameters plain_params, swapped_params;
  auto plain = build(plain_params, target);
  auto swapped = build(swapped_params, target);
  swapped->chained().enable_state_swap(
      std::make_unique<StateSwap>("", bucket_bytes, /*merge_buckets=*/2, kCuda));
  StateSwap& swap = *swapped->chained().state_swap();
  EXPECT_EQ(swap.path().find("pinned host memory"), 0u) << swap.path();

  std::optional<c10::StreamGuard> on_pool;
  if (pool_stream) {
    on_pool.emplace(c10::impl::VirtualGuardImpl(c10::kCUDA).getStreamFromGlobalPool(kCuda));
  }
  for (int64_t k = 1; k <= 6; ++k) {
    const std::string when = "step " + std::to_string(k);
    if (k == 4) {
      reverse_pass(*plain);
      reverse_pass(*swapped);
      expect_nothing_resident(*swapped, "after the reverse pass");
    }
    swap.reset_peak_resident_bytes();
    step(*plain, plain_params, k);
    step(*swapped, swapped_params, k);
    // The comparisons run on the current stream; with the pool stream, the side stream's last
    // copies are covered by state_dict's drain, the leaves' work by the stream order.
    expect_same(*plain, plain_params, *swapped, swapped_params, when);
    expect_nothing_resident(*swapped, when);
    // Steps 2, 3, 5, 6 follow the learned order: the group in use and the one read ahead.
    // (Step 1 creates the state; step 4 runs against the reverse pass's layout.)
    if (k != 1 && k != 4) {
      EXPECT_GT(swap.peak_resident_bytes(), 0) << when;
      EXPECT_LE(swap.peak_resident_bytes(), two_groups(swap)) << when;
    }
  }
  on_pool.reset();
  at::accelerator::synchronizeDevice(0);  // a CUDA error of the side stream surfaces here
  if (bucket_bytes == 1024) {
    EXPECT_GT(swap.groups(), 2) << "the case must stream many groups";
  }
}

// The checkpoint restore path (fp32-main-params §9.2): state imported into a swapped optimizer
// goes to pinned memory (StateSwap::store), then trains on as the source does.
TEST(StateSwapCudaRestore, LoadedStateTrainsOnIdentically) {
  NamedParameters source_params, target_params;
  auto source = build(source_params, "Muon");
  step(*source, source_params, 1);
  auto target = build(target_params, "Muon");
  target->chained().enable_state_swap(
      std::make_unique<StateSwap>("", /*bucket_bytes=*/1024, /*merge_buckets=*/2, kCuda));
  target->load_state_dict(source->state_dict());
  expect_nothing_resident(*target, "after the load");
  for (size_t i = 0; i < source_params.size(); ++i) {
    target_params[i].second.detach().copy_(source_params[i].second.detach());
  }
  expect_same(*source, source_params, *target, target_params, "after the load");
  for (int64_t k = 2; k <= 3; ++k) {
    step(*source, source_params, k);
    step(*target, target_params, k);
    expect_same(*source, source_params, *target, target_params, "step " + std::to_string(k));
    expect_nothing_resident(*target, "step " + std::to_string(k));
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
