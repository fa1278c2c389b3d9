// trainer/qk_clip_hook.h: the hook's contract around a step, on the tiny Qwen2-MoE in float32 on
// one process (the clipping arithmetic itself is optim/qk_clip's test): the statistic is the
// max logit of the training forwards since before_forward, evaluation forwards add nothing, the
// step's result gets the figures, and after a clip at tau the same batch's max logit is tau.
#include "mixtrain/trainer/qk_clip_hook.h"

#include <gtest/gtest.h>

#include <torch/types.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "mixtrain/trainer/trainer.h"
#include "support/hook_fixture.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using test_support::HookFixture;

struct QkClipSetup : HookFixture {
  // deepseek: configs/deepseek_v3_tiny.yaml (multi-head latent attention: MuonClip scales the
  // query and key content rows by sqrt(gamma) and the query's rotary rows by gamma).
  explicit QkClipSetup(double tau, bool deepseek = false)
      // One layer: a clip in layer 0 changes what later layers see, so only the first layer's
      // logits scale exactly by gamma.
      : HookFixture(
            {"model.num_layers=1", "optimizer.muon_config.muon_qk_clip_tau=" + std::to_string(tau)},
            deepseek ? MIXTRAIN_SOURCE_DIR "/configs/deepseek_v3_tiny.yaml" : ""),
        hook(*model, *optimizer, mesh, resolved.config.model, tau,
             [] { return std::vector<ParamPlacement>{}; }) {}

  void forward(const at::Tensor& ids) {
    torch::NoGradGuard no_grad;
    model->forward(ids);
  }
  // after_update's figures (no optimizer step in between: only the clip touches the weights).
  StepResult update() {
    StepResult result;
    hook.after_update(result);
    return result;
  }
  // One "step" over `ids`: before_forward, the forward, after_update.
  StepResult step(const at::Tensor& ids) {
    hook.before_forward(1);
    forward(ids);
    return update();
  }

  QkClipHook hook;
};

constexpr double kNoClip = 1e30;

TEST(QkClipHook, TheStatisticIsTheTrainingForwardsSinceBeforeForward) {
  QkClipSetup s(kNoClip);
  const at::Tensor a = s.batch(1), b = s.batch(2);
  const StepResult ra = s.step(a), rb = s.step(b);
  ASSERT_TRUE(ra.qk_clip);
  EXPECT_EQ(ra.qk_clip_heads, 0);
  ASSERT_TRUE(std::isfinite(ra.qk_max_logit) && ra.qk_max_logit > 0) << ra.qk_max_logit;
  ASSERT_NE(ra.qk_max_logit, rb.qk_max_logit) << "the batches must tell the statistics apart";
  // A forward before before_forward (the last step's) is forgotten.
  s.forward(b);
  s.hook.before_forward(2);
  s.forward(a);
  EXPECT_EQ(s.update().qk_max_logit, ra.qk_max_logit);
  // Two micro-batches: the max over both.
  s.hook.before_forward(3);
  s.forward(a);
  s.forward(b);
  EXPECT_EQ(s.update().qk_max_logit, std::max(ra.qk_max_logit, rb.qk_max_logit));
}

TEST(QkClipHook, EvaluationForwardsAreNotRecorded) {
  QkClipSetup s(kNoClip);
  const at::Tensor a = s.batch(1), b = s.batch(2);
  const double ma = s.step(a).qk_max_logit, mb = s.step(b).qk_max_logit;
  // Evaluate on whichever batch gives the larger max: it would show if recorded.
  const at::Tensor& train = ma < mb ? a : b;
  const at::Tensor& eval = ma < mb ? b : a;
  s.hook.before_forward(3);
  s.forward(train);
  s.hook.before_eval();
  s.forward(eval);
  s.hook.after_eval();
  EXPECT_EQ(s.update().qk_max_logit, std::min(ma, mb));
  // Recording resumes after the evaluation.
  EXPECT_EQ(s.step(eval).qk_max_logit, std::max(ma, mb));
}

void expect_clips_to_tau(bool deepseek) {
  const at::Tensor ids = QkClipSetup(kNoClip, deepseek).batch(1);
  const double unclipped = QkClipSetup(kNoClip, deepseek).step(ids).qk_max_logit;
  const double tau = unclipped / 2;
  QkClipSetup s(tau, deepseek);
  const StepResult first = s.step(ids);
  EXPECT_EQ(first.qk_max_logit, unclipped) << "the figure is the statistic before the clip";
  const int64_t heads = s.resolved.config.model.num_layers * s.resolved.config.model.num_heads;
  EXPECT_GE(first.qk_clip_heads, 1);
  EXPECT_LE(first.qk_clip_heads, heads);
  // The same batch through the clipped weights: every head's max logit is now at most tau
  // (gamma scales each head's logits exactly; float32 forwards round to ~1e-6 relative).
  const StepResult second = s.step(ids);
  EXPECT_LE(second.qk_max_logit, tau * (1 + 1e-5));
  EXPECT_GE(second.qk_max_logit, tau * (1 - 1e-5)) << "the largest head was clipped to tau";
}

TEST(QkClipHook, ClipsTheHeadsAboveTauToTau) {
  expect_clips_to_tau(/*deepseek=*/false);
}

// MuonClip on DeepSeek-V3's latent attention, through the model's own forward: the clipped
// weights give the same batch a max logit of tau (optim/qk_clip_test checks each part's factor).
TEST(QkClipHook, ClipsLatentAttentionHeadsToTau) {
  expect_clips_to_tau(/*deepseek=*/true);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
