// Floating dtype names as the configs spell them ("bfloat16", "float16", "float32").
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace mixtrain {

// "float32"/"fp32"/"float", "bfloat16"/"bf16", "float16"/"fp16"/"half"; nullopt otherwise.
std::optional<c10::ScalarType> parse_float_dtype(const std::string& name);

// Canonical spelling of a dtype as PyTorch prints it without "torch." ("bfloat16", "int64").
std::string dtype_name(c10::ScalarType dtype);

// bfloat16 or float16: the dtypes that get an fp32 main param.
inline bool is_low_precision(c10::ScalarType dtype) {
  return dtype == c10::kBFloat16 || dtype == c10::kHalf;
}

}  // namespace mixtrain
