#include "mixtrain/core/dtype.h"

namespace mixtrain {

std::optional<c10::ScalarType> parse_float_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32" || name == "float") return c10::kFloat;
  if (name == "bfloat16" || name == "bf16") return c10::kBFloat16;
  if (name == "float16" || name == "fp16" || name == "half") return c10::kHalf;
  return std::nullopt;
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat:
      return "float32";
    case c10::kBFloat16:
      return "bfloat16";
    case c10::kHalf:
      return "float16";
    case c10::kDouble:
      return "float64";
    case c10::kLong:
      return "int64";
    case c10::kInt:
      return "int32";
    case c10::kShort:
      return "int16";
    case c10::kChar:
      return "int8";
    case c10::kByte:
      return "uint8";
    case c10::kBool:
      return "bool";
    default:
      return c10::toString(dtype);
  }
}

}  // namespace mixtrain
