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

}  // namespace mixtrain
