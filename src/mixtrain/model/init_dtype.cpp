#include "mixtrain/model/init_dtype.h"

#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/logging.h"

namespace mixtrain {
namespace {

struct ParamRecord {
  std::string name;
  c10::TensorImpl* impl;
  std::vector<int64_t> shape;
};

struct BufferRecord {
  std::string name;
  c10::TensorImpl* impl;
  std::vector<int64_t> shape;
  c10::ScalarType dtype;
  bool is_floating;
  const void* data;      // storage must not move for non-floating buffers
  torch::Tensor values;  // copy of a non-floating buffer, to prove it was not rewritten
};

void fail(const std::string& what) {
  throw std::logic_error("apply_model_init_dtype: " + what);
}

// Swaps the tensor's storage for a converted copy; the TensorImpl (the object every optimizer,
// parameter map and module slot holds) stays the same. Meta tensors convert without storage.
void convert_in_place(torch::Tensor& t, c10::ScalarType dtype) {
  if (t.scalar_type() == dtype) return;  // also skips a tensor shared by two modules the 2nd time
  t.set_data(t.detach().to(dtype));
  if (t.grad().defined()) t.mutable_grad() = t.grad().to(dtype);
}

}  // namespace

void apply_model_init_dtype(torch::nn::Module& model, std::optional<c10::ScalarType> dtype) {
  if (!dtype) return;
  if (!c10::isFloatingType(*dtype)) {
    throw std::invalid_argument("apply_model_init_dtype: target dtype must be floating, got " +
                                dtype_name(*dtype));
  }

  std::vector<ParamRecord> params;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    params.push_back({item.key(), item.value().unsafeGetTensorImpl(), item.value().sizes().vec()});
  }
  std::vector<BufferRecord> buffers;
  for (auto& item : model.named_buffers(/*recurse=*/true)) {
    const auto& b = item.value();
    const bool floating = c10::isFloatingType(b.scalar_type());
    buffers.push_back({item.key(), b.unsafeGetTensorImpl(), b.sizes().vec(), b.scalar_type(),
                       floating, floating || b.is_meta() ? nullptr : b.data_ptr(),
                       floating || b.is_meta() ? torch::Tensor() : b.clone()});
  }

  int64_t converted = 0;
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model.named_parameters(/*recurse=*/true)) {
      auto& p = item.value();
      if (!c10::isFloatingType(p.scalar_type())) continue;  // e.g. an int parameter without grad
      if (p.scalar_type() != *dtype) ++converted;
      convert_in_place(p, *dtype);
    }
    for (auto& item : model.named_buffers(/*recurse=*/true)) {
      auto& b = item.value();
      if (c10::isFloatingType(b.scalar_type())) convert_in_place(b, *dtype);
    }
  }

  // Verification (fp32-main-params §6.3): the conversion must be invisible to everything but the
  // dtype.
  const auto after_params = model.named_parameters(/*recurse=*/true);
  if (after_params.size() != params.size()) fail("the number of parameters changed");
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& item = after_params[i];
    const auto& before = params[i];
    if (item.key() != before.name) fail("parameter '" + before.name + "' was renamed or moved");
    if (item.value().unsafeGetTensorImpl() != before.impl) {
      fail("parameter '" + before.name + "' was replaced by a new object");
    }
    if (item.value().sizes().vec() != before.shape) {
      fail("parameter '" + before.name + "' changed shape");
    }
    if (c10::isFloatingType(item.value().scalar_type()) && item.value().scalar_type() != *dtype) {
      fail("parameter '" + before.name + "' is " + dtype_name(item.value().scalar_type()) +
           ", expected " + dtype_name(*dtype));
    }
  }
  const auto after_buffers = model.named_buffers(/*recurse=*/true);
  if (after_buffers.size() != buffers.size()) fail("the number of buffers changed");
  for (size_t i = 0; i < buffers.size(); ++i) {
    const auto& b = after_buffers[i].value();
    const auto& before = buffers[i];
    if (after_buffers[i].key() != before.name || b.unsafeGetTensorImpl() != before.impl) {
      fail("buffer '" + before.name + "' was replaced by a new object");
    }
    if (b.sizes().vec() != before.shape) fail("buffer '" + before.name + "' changed shape");
    if (before.is_floating) {
      if (b.scalar_type() != *dtype) {
        fail("buffer '" + before.name + "' is " + dtype_name(b.scalar_type()) + ", expected " +
             dtype_name(*dtype));
      }
    } else if (b.scalar_type() != before.dtype ||
               (before.values.defined() &&
                (b.data_ptr() != before.data || !torch::equal(b, before.values)))) {
      fail("non-floating buffer '" + before.name + "' was modified");
    }
  }

  log_info("model_init_dtype: " + std::to_string(converted) + " of " +
           std::to_string(params.size()) + " parameters converted to " + dtype_name(*dtype));
}

}  // namespace mixtrain
