// The fused elementwise passes of a Muon step on one contiguous float32 parameter: the
// per-capability kernel variants.
//
// muon_kernel.cpp is compiled once per capability (docs/architecture.md §1), defining
// muon_momentum and muon_apply in namespaces DEFAULT, AVX2 and AVX512; Muon dispatches with
// select_kernel() (core/cpu_capability.h). Call an AVX2/AVX512 variant only when the CPU
// supports it.
//
// muon_momentum, for i < n (g: grad widened exactly from float32, bfloat16 or float16):
//   kMulAdd: buf = buf * mu + g                 buf.mul_(mu).add_(g), two roundings
//   kLerp:   buf = lerp(buf, g, buffer_weight)  buf.lerp_(g, 1 - mu)
//   u = buf | g + mu * buf (g.add(buf, mu)) | lerp(g, buf, mu)
//   out[i] = u rounded to nearest even into out_dtype (float32, bfloat16 or float16)
// muon_apply, for i < n (o: update widened exactly from float32, bfloat16 or float16):
//   param = param * decay                       param.mul_(decay), only when decay_param
//   param = param + alpha * o                   param.add_(o, alpha)
//   model[i] = param rounded to nearest even    when model is not null (bfloat16 or float16)
// Each element gets exactly the float operations LibTorch 2.11's CPU kernels of the same
// capability perform for that op sequence (muon.h), so the results are bitwise the unfused
// ops'; one pass over the bytes, where the ops make four (momentum) and three (update) plus
// float32 copies of every 16-bit operand. Threads split the range with at::parallel_for; the
// result does not depend on the split.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace mixtrain {

enum class MuonBufferRule { kMulAdd, kLerp };
enum class MuonDirectionRule { kBuffer, kAdd, kLerp };

// Each float is the one ATen's op sees: the double Scalar cast to float.
struct MuonMomentumScalars {
  MuonBufferRule buffer_rule;
  MuonDirectionRule direction_rule;
  float mu;             // mul_(mu), add(buf, alpha = mu), lerp(buf, weight = mu)
  float buffer_weight;  // lerp_(g, weight = 1 - mu), 1 - mu taken in double
};

struct MuonApplyScalars {
  bool decay_param;  // weight_decay != 0
  float decay;       // 1 - lr * weight_decay
  float alpha;       // -lr * scale
};

namespace DEFAULT {
void muon_momentum(const MuonMomentumScalars& s, float* buffer, const void* grad,
                   c10::ScalarType grad_dtype, void* out, c10::ScalarType out_dtype, int64_t n);
void muon_apply(const MuonApplyScalars& s, float* param, const void* update,
                c10::ScalarType update_dtype, void* model, c10::ScalarType model_dtype, int64_t n);
}  // namespace DEFAULT
namespace AVX2 {
void muon_momentum(const MuonMomentumScalars& s, float* buffer, const void* grad,
                   c10::ScalarType grad_dtype, void* out, c10::ScalarType out_dtype, int64_t n);
void muon_apply(const MuonApplyScalars& s, float* param, const void* update,
                c10::ScalarType update_dtype, void* model, c10::ScalarType model_dtype, int64_t n);
}  // namespace AVX2
namespace AVX512 {
void muon_momentum(const MuonMomentumScalars& s, float* buffer, const void* grad,
                   c10::ScalarType grad_dtype, void* out, c10::ScalarType out_dtype, int64_t n);
void muon_apply(const MuonApplyScalars& s, float* param, const void* update,
                c10::ScalarType update_dtype, void* model, c10::ScalarType model_dtype, int64_t n);
}  // namespace AVX512

}  // namespace mixtrain
