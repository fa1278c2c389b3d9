// model_init_dtype, one test per point of fp32-main-params §6.3 that applies to a single process
// (floating params and buffers converted, int/bool buffers untouched, identity kept, meta
// params converted in place), plus nullopt, grads, roundtrip values and the real model.
#include "mixtrain/model/init_dtype.h"

#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "mixtrain/model/registry.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

struct Child : torch::nn::Module {
  Child() {
    weight = register_parameter("weight", torch::linspace(-1.0, 1.0, 6).view({2, 3}));
    running = register_buffer("running", torch::full({3}, 0.1, torch::kFloat64));
    steps = register_buffer("steps", torch::tensor({3, 1, 4}, torch::kInt32));
  }
  torch::Tensor weight, running, steps;
};

// Floating params (one frozen), float32 and float64 buffers, int64 and bool buffers, a child.
struct Probe : torch::nn::Module {
  Probe() {
    weight = register_parameter("weight", torch::randn({4, 3}));
    bias = register_parameter("bias", torch::randn({4}));
    frozen = register_parameter("frozen", torch::randn({2}), /*requires_grad=*/false);
    scale = register_buffer("scale", torch::full({2}, 0.3f));
    index = register_buffer("index", torch::arange(5, torch::kInt64));
    mask = register_buffer("mask", torch::tensor({true, false, true}));
    child = register_module("child", std::make_shared<Child>());
  }
  torch::Tensor weight, bias, frozen, scale, index, mask;
  std::shared_ptr<Child> child;
};

TEST(ModelInitDtype, FloatingParametersGetTheDtype) {
  for (auto dtype : {torch::kBFloat16, torch::kFloat16, torch::kFloat64}) {
    Probe m;
    apply_model_init_dtype(m, dtype);
    for (auto& item : m.named_parameters()) {
      EXPECT_EQ(item.value().scalar_type(), dtype) << item.key();
    }
    EXPECT_FALSE(m.frozen.requires_grad());  // requires_grad is kept, frozen stays frozen
    EXPECT_TRUE(m.weight.requires_grad());
  }
}

TEST(ModelInitDtype, FloatingBuffersGetTheDtype) {
  Probe m;
  apply_model_init_dtype(m, torch::kBFloat16);
  EXPECT_EQ(m.scale.scalar_type(), torch::kBFloat16);           // was float32
  EXPECT_EQ(m.child->running.scalar_type(), torch::kBFloat16);  // was float64
  EXPECT_EQ(m.named_buffers().find("child.running")->scalar_type(), torch::kBFloat16);
}

TEST(ModelInitDtype, IntegerAndBoolBuffersAreUntouched) {
  Probe m;
  const auto* index_data = m.index.data_ptr();
  const auto* mask_impl = m.mask.unsafeGetTensorImpl();
  apply_model_init_dtype(m, torch::kBFloat16);
  EXPECT_EQ(m.index.scalar_type(), torch::kInt64);
  EXPECT_EQ(m.mask.scalar_type(), torch::kBool);
  EXPECT_EQ(m.child->steps.scalar_type(), torch::kInt32);
  EXPECT_EQ(m.index.data_ptr(), index_data);  // not even copied
  EXPECT_EQ(m.mask.unsafeGetTensorImpl(), mask_impl);
  EXPECT_TRUE(torch::equal(m.index, torch::tensor({0, 1, 2, 3, 4}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(m.mask, torch::tensor({true, false, true})));
  EXPECT_TRUE(torch::equal(m.child->steps, torch::tensor({3, 1, 4}, torch::kInt32)));
}

TEST(ModelInitDtype, ParameterObjectsKeepTheirIdentity) {
  Probe m;
  // What an optimizer and a name map hold before the conversion.
  torch::optim::SGD sgd(m.parameters(), torch::optim::SGDOptions(0.1));
  std::vector<torch::Tensor> held;
  std::vector<const c10::TensorImpl*> impls;
  for (auto& item : m.named_parameters()) {
    held.push_back(item.value());
    impls.push_back(item.value().unsafeGetTensorImpl());
  }
  const auto* scale_impl = m.scale.unsafeGetTensorImpl();
  apply_model_init_dtype(m, torch::kBFloat16);
  const auto after = m.named_parameters();
  ASSERT_EQ(after.size(), impls.size());
  for (size_t i = 0; i < impls.size(); ++i) {
    EXPECT_EQ(after[i].value().unsafeGetTensorImpl(), impls[i]) << after[i].key();
    EXPECT_EQ(held[i].scalar_type(), torch::kBFloat16) << after[i].key();  // same object
    EXPECT_EQ(sgd.param_groups()[0].params()[i].unsafeGetTensorImpl(), impls[i]);
  }
  EXPECT_EQ(m.scale.unsafeGetTensorImpl(), scale_impl);  // buffers too
  EXPECT_TRUE(m.weight.is_leaf());
}

TEST(ModelInitDtype, NulloptIsANoOp) {
  Probe m;
  const auto before = m.weight.detach().clone();
  const auto* data = m.weight.data_ptr();
  const auto* scale_data = m.scale.data_ptr();
  apply_model_init_dtype(m, std::nullopt);
  EXPECT_EQ(m.weight.scalar_type(), torch::kFloat32);
  EXPECT_EQ(m.child->running.scalar_type(), torch::kFloat64);
  EXPECT_EQ(m.weight.data_ptr(), data);
  EXPECT_EQ(m.scale.data_ptr(), scale_data);
  EXPECT_TRUE(torch::equal(m.weight, before));
}

TEST(ModelInitDtype, SameDtypeKeepsTheStorage) {
  Probe m;
  const auto* data = m.weight.data_ptr();
  apply_model_init_dtype(m, torch::kFloat32);
  EXPECT_EQ(m.weight.data_ptr(), data);
  EXPECT_EQ(m.child->running.scalar_type(), torch::kFloat32);  // float64 buffer still converted
}

// float32 -> bfloat16 by round-to-nearest-even on the bits, written here independently of
// LibTorch's conversion (finite inputs only).
float bf16_round(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  bits &= 0xFFFF0000u;
  float y;
  std::memcpy(&y, &bits, sizeof y);
  return y;
}

TEST(ModelInitDtype, Float32ToBfloat16AndBackRoundsToNearestEven) {
  Probe m;
  // Values with bits below bf16's 8-bit mantissa, including exact ties (1 + 2^-8 is halfway
  // between 1 and 1 + 2^-7: even rounds down; 1 + 3 * 2^-8 rounds up).
  m.weight.detach().view({-1}).copy_(
      torch::tensor({1.0f, 1.00390625f, 1.01171875f, -3.14159265f, 0.1f, 1e-3f, 123456.789f,
                     -7.7e-5f, 2.5f, 1e10f, -0.0f, 0.33333334f}));
  const auto original = m.weight.detach().clone();
  apply_model_init_dtype(m, torch::kBFloat16);
  apply_model_init_dtype(m, torch::kFloat32);
  ASSERT_EQ(m.weight.scalar_type(), torch::kFloat32);
  for (int64_t i = 0; i < original.numel(); ++i) {
    const float x = original.view({-1})[i].item<float>();
    EXPECT_EQ(m.weight.detach().view({-1})[i].item<float>(), bf16_round(x)) << x;  // exact
  }
  EXPECT_EQ(bf16_round(1.00390625f), 1.0f);  // the tie cases do what the comment says
  EXPECT_EQ(bf16_round(1.01171875f), 1.015625f);
}

TEST(ModelInitDtype, GradientsFollowTheirParameter) {
  Probe m;
  m.weight.sum().backward();
  apply_model_init_dtype(m, torch::kBFloat16);
  ASSERT_TRUE(m.weight.grad().defined());
  EXPECT_EQ(m.weight.grad().scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(m.weight.grad(), torch::ones({4, 3}, torch::kBFloat16)));
}

TEST(ModelInitDtype, MetaParametersConvertWithoutReplacement) {
  torch::nn::Module m;
  auto p = m.register_parameter("weight", torch::empty({8, 4}, torch::Device(torch::kMeta)));
  const auto* impl = p.unsafeGetTensorImpl();
  apply_model_init_dtype(m, torch::kBFloat16);
  EXPECT_EQ(p.unsafeGetTensorImpl(), impl);
  EXPECT_TRUE(p.is_meta());
  EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(p.sizes().vec(), (std::vector<int64_t>{8, 4}));
}

TEST(ModelInitDtype, NonFloatingTargetIsRejected) {
  Probe m;
  EXPECT_THROW(apply_model_init_dtype(m, torch::kInt32), std::invalid_argument);
  EXPECT_EQ(m.weight.scalar_type(), torch::kFloat32);
}

TEST(ModelInitDtype, WholeModelToBfloat16) {
  ModelConfig c;
  c.vocab_size = 40;
  auto model = build_model(c, 3);
  std::vector<const c10::TensorImpl*> impls;
  for (auto& p : model->parameters()) impls.push_back(p.unsafeGetTensorImpl());
  apply_model_init_dtype(*model, torch::kBFloat16);
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].scalar_type(), torch::kBFloat16);
    EXPECT_EQ(params[i].unsafeGetTensorImpl(), impls[i]);
  }
  EXPECT_EQ(model->forward(torch::ones({1, 3}, torch::kInt64)).logits.scalar_type(),
            torch::kBFloat16);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
