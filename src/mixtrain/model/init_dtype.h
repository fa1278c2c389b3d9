// model_init_dtype (fp32-main-params §6.3): converts a built model's precision in place.
//
// Every floating parameter and floating buffer becomes `dtype`; integer and bool buffers are left
// untouched; parameter and buffer objects keep their identity (same TensorImpl, so optimizers and
// maps that already hold them stay valid): the storage is swapped with set_data under NoGradGuard,
// never by re-registering a new tensor. A defined .grad is converted along with its parameter.
// Meta (storage-less) parameters convert the same way. nullopt is a no-op.
// Afterwards it verifies: identity unchanged (same names, same TensorImpl), every floating
// param/buffer has `dtype`, non-floating buffers unchanged (object, dtype, storage, values), shapes
// unchanged; a violated check throws std::logic_error naming the tensor. A non-floating `dtype`
// throws std::invalid_argument.
// The distributed points of 6.3 (DTensor mesh/placements, FSDP shard refresh) belong to the
// distributed/ layer, which converts before it shards.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <optional>

namespace mixtrain {

void apply_model_init_dtype(torch::nn::Module& model, std::optional<c10::ScalarType> dtype);

}  // namespace mixtrain
