// Swap optimizer (optim/state_swap.h): the state goes through the file bit for bit, is out of
// memory between steps, checkpoints read and write through it, and every failure of the file
// is a clear error naming it.
#include "mixtrain/optim/state_swap.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "mixtrain/core/error.h"
#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/leaf_optimizer.h"
#include "mixtrain/optim/param_groups.h"
#include "mixtrain/optim/training_optimizer.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

class StateSwapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("mixtrain_state_swap_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // bfloat16 params of several shapes (Muon matrices, AdamW embeddings and vectors), fp32 main
  // params, Muon + AdamW, as the fp32-main-params §1 config; deterministic values.
  std::unique_ptr<TrainingOptimizer> build(NamedParameters& params) const {
    params.clear();
    const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
        {"embed_tokens.weight", {40, 16}}, {"layers.0.q.weight", {16, 16}},
        {"layers.0.norm.weight", {16}},    {"layers.0.up.weight", {48, 16}},
        {"layers.1.q.weight", {16, 16}},   {"lm_head.weight", {40, 16}}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto& [name, shape] = shapes[i];
      at::Tensor p = at::randn(shape, at::TensorOptions().dtype(at::kFloat).requires_grad(false))
                         .mul(0.1 * (i + 1))
                         .to(at::kBFloat16)
                         .requires_grad_(true);
      params.emplace_back(name, p);
    }
    TrainerConfig config;
    config.optimizer.target = "Muon";
    config.optimizer.fp32_main_params = true;
    config.mix_precision.reduce_dtype = "float32";  // fp32-main-params §2.5
    return build_optimizer(params, config);
  }
  std::unique_ptr<StateSwap> swap(const std::string& name, int64_t bucket_bytes = 1024,
                                  int64_t merge = 2) const {
    return std::make_unique<StateSwap>((dir_ / name).string(), bucket_bytes, merge);
  }
  // One step with the same pseudo-random grads for a given step number.
  static void step(TrainingOptimizer& optimizer, NamedParameters& params, int64_t k) {
    at::manual_seed(1000 + k);
    for (auto& [name, p] : params) p.mutable_grad() = at::randn(p.sizes()).to(p.scalar_type());
    optimizer.step();
    optimizer.zero_grad();
  }
  static void expect_same_state(TrainingOptimizer& a, TrainingOptimizer& b) {
    const NamedTensors sa = a.state_dict(), sb = b.state_dict();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sa[i].first, sb[i].first);
      EXPECT_TRUE(sa[i].second.equal(sb[i].second)) << sa[i].first;
    }
  }

  std::filesystem::path dir_;
};

// Bucket sizes: 1 KiB (a group per one or two params: read-ahead and write-behind overlap
// the leaves all the time), 2 KiB (AdamW's and Muon's params share groups, so a leaf moves
// past a group another leaf has not used yet), 1 MiB (one group).
class StateSwapBuckets : public StateSwapTest, public ::testing::WithParamInterface<int64_t> {};
INSTANTIATE_TEST_SUITE_P(Sizes, StateSwapBuckets, ::testing::Values(1024, 2048, 1 << 20));

TEST_P(StateSwapBuckets, SwappedStepsAreBitwiseTheUnswappedOnes) {
  at::manual_seed(7);
  NamedParameters plain_params, swapped_params;
  auto plain = build(plain_params);
  at::manual_seed(7);
  auto swapped = build(swapped_params);
  swapped->chained().enable_state_swap(swap("a.swap", GetParam()));
  StateSwap& tier = *swapped->chained().state_swap();
  for (int64_t k = 1; k <= 4; ++k) {
    step(*plain, plain_params, k);
    step(*swapped, swapped_params, k);
    for (size_t i = 0; i < plain_params.size(); ++i) {
      EXPECT_TRUE(plain_params[i].second.equal(swapped_params[i].second))
          << "step " << k << ": " << plain_params[i].first;
    }
    expect_same_state(*plain, *swapped);
    // Between steps no state is in memory: every floating state tensor has an empty storage.
    ChainedOptimizer& chained = swapped->chained();
    for (const auto& name : chained.names()) {
      for (const auto& [state_name, t] :
           chained.leaf_of(name).export_state(chained.optimizer_param(name))) {
        if (at::isFloatingType(t.scalar_type())) {
          EXPECT_EQ(t.storage().nbytes(), 0u) << name << "." << state_name;
        }
      }
    }
  }
  EXPECT_EQ(tier.groups() > 2, GetParam() == 1024);
  EXPECT_GE(static_cast<int64_t>(std::filesystem::file_size(tier.path())), 40 * 16 * 4 * 2);
}

TEST_P(StateSwapBuckets, CheckpointLoadWritesIntoTheFile) {
  at::manual_seed(7);
  NamedParameters source_params, target_params;
  auto source = build(source_params);
  step(*source, source_params, 1);
  at::manual_seed(8);
  auto target = build(target_params);
  target->chained().enable_state_swap(swap("b.swap", GetParam()));
  // The fp32-main-params §9.2 restore path: state is created (through the file), then filled.
  target->load_state_dict(source->state_dict());
  expect_same_state(*source, *target);
  for (size_t i = 0; i < source_params.size(); ++i) {
    target_params[i].second.detach().copy_(source_params[i].second.detach());
  }
  step(*source, source_params, 2);
  step(*target, target_params, 2);
  for (size_t i = 0; i < source_params.size(); ++i) {
    EXPECT_TRUE(source_params[i].second.equal(target_params[i].second)) << source_params[i].first;
  }
  expect_same_state(*source, *target);
}

// Bytes of floating state (the tensors the swap moves), counted on the state_dict's copies: the
// whole state as it would sit in memory without swap.
int64_t state_bytes(TrainingOptimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& [name, t] : optimizer.state_dict()) {
    if (at::isFloatingType(t.scalar_type()) && t.dim() >= 1) bytes += t.numel() * t.element_size();
  }
  return bytes;
}

// The resident-bytes count (what bench and profile read): none between steps; in steps after
// the first, at most two consecutive groups (the one in use and the one read ahead), so with
// 1 KiB buckets (more than two groups) less than the whole state.
TEST_P(StateSwapBuckets, AtMostTwoGroupsAreResident) {
  at::manual_seed(7);
  NamedParameters params;
  auto optimizer = build(params);
  optimizer->chained().enable_state_swap(swap("r.swap", GetParam()));
  StateSwap& tier = *optimizer->chained().state_swap();
  EXPECT_EQ(tier.resident_bytes(), 0);
  for (int64_t k = 1; k <= 4; ++k) {
    tier.reset_peak_resident_bytes();
    step(*optimizer, params, k);
    EXPECT_EQ(tier.resident_bytes(), 0) << "after step " << k;
    if (k == 1) continue;  // state appears: written a group's worth at a time
    int64_t two_groups = 0;
    for (int64_t g = 0; g < tier.groups(); ++g) {
      two_groups = std::max(
          two_groups, tier.group_bytes(g) + (g + 1 < tier.groups() ? tier.group_bytes(g + 1) : 0));
    }
    EXPECT_GT(tier.peak_resident_bytes(), 0) << "step " << k;
    EXPECT_LE(tier.peak_resident_bytes(), two_groups) << "step " << k;
    if (GetParam() == 1024) {
      EXPECT_LT(tier.peak_resident_bytes(), state_bytes(*optimizer));
    }
  }
}

// A pass over the state in reverse order, as a leaf uses it (acquire, update in place, release),
// inside begin_step / end_step when swapped. The next step then acquires against a layout learned
// from the reverse order: every parameter after the first is out of order and its group is read
// back at once. Swapped and unswapped stay bitwise equal through it.
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
      if (at::isFloatingType(t.scalar_type()) && t.dim() >= 1) t.mul_(0.5).add_(0.25);
    }
    if (swap) swap->release(leaf, param);
  }
  if (swap) swap->end_step();
}

TEST_P(StateSwapBuckets, OutOfOrderAcquiresAreCorrect) {
  at::manual_seed(7);
  NamedParameters plain_params, swapped_params;
  auto plain = build(plain_params);
  at::manual_seed(7);
  auto swapped = build(swapped_params);
  swapped->chained().enable_state_swap(swap("o.swap", GetParam()));
  for (int64_t k = 1; k <= 5; ++k) {
    if (k == 3) {
      reverse_pass(*plain);
      reverse_pass(*swapped);
      expect_same_state(*plain, *swapped);
    }
    step(*plain, plain_params, k);
    step(*swapped, swapped_params, k);
    for (size_t i = 0; i < plain_params.size(); ++i) {
      EXPECT_TRUE(plain_params[i].second.equal(swapped_params[i].second))
          << "step " << k << ": " << plain_params[i].first;
    }
    expect_same_state(*plain, *swapped);
    EXPECT_EQ(swapped->chained().state_swap()->resident_bytes(), 0) << "after step " << k;
  }
}

// Expects `action` to throw a UserError mentioning every needle.
template <typename F>
void expect_user_error(F&& action, const std::vector<std::string>& needles) {
  try {
    action();
    ADD_FAILURE() << "no error";
  } catch (const UserError& error) {
    for (const auto& needle : needles)
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
          << "'" << needle << "' not in: " << error.what();
  }
}

TEST_F(StateSwapTest, UnwritableDirectoryIsNamed) {
  const std::string not_a_dir = (dir_ / "plain_file").string();
  std::ofstream(not_a_dir) << "x";
  expect_user_error([&] { StateSwap((not_a_dir + "/s.swap"), 1 << 20, 1); },
                    {not_a_dir + "/s.swap", "cannot create"});
}

TEST_F(StateSwapTest, DeletedOrTruncatedFileStopsTheNextStep) {
  for (const bool truncate : {false, true}) {
    at::manual_seed(7);
    NamedParameters params;
    auto optimizer = build(params);
    optimizer->chained().enable_state_swap(swap(truncate ? "t.swap" : "d.swap"));
    step(*optimizer, params, 1);
    const std::string path = optimizer->chained().state_swap()->path();
    if (truncate) {
      std::filesystem::resize_file(path, 100);
    } else {
      std::filesystem::remove(path);
    }
    expect_user_error([&] { step(*optimizer, params, 2); },
                      {path, truncate ? "truncated" : "deleted"});
  }
}

TEST_F(StateSwapTest, FullDiskIsNamed) {
  // A file-size limit makes pwrite fail as a full disk does (EFBIG instead of ENOSPC); in a
  // child process, so the limit dies with it.
  auto fill_the_disk = [this] {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {4096, 4096};
    setrlimit(RLIMIT_FSIZE, &limit);
    NamedParameters params;
    auto optimizer = build(params);
    optimizer->chained().enable_state_swap(swap("full.swap"));
    try {
      step(*optimizer, params, 1);
    } catch (const UserError& error) {
      std::cerr << error.what() << std::endl;
      std::_Exit(3);
    }
    std::_Exit(0);
  };
  EXPECT_EXIT(fill_the_disk(), ::testing::ExitedWithCode(3),
              "cannot write .* of .*full\\.swap: File too large");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
