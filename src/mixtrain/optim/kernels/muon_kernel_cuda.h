// The CUDA twins of the fused Muon passes (muon_kernel.h): muon_momentum and muon_apply on
// device pointers, enqueued on `stream` (no host synchronisation).
//
// Each element gets the float operations of the AVX2/AVX512 variants, spelled with round-to-
// nearest intrinsics (__fmul_rn, __fadd_rn, __fsub_rn, __fmaf_rn) so nvcc cannot contract or
// reorder them: mul_ and the lerp difference round once each, add with alpha 1 is one rounded
// addition, add with alpha and lerp are one fused multiply-add. 16-bit operands widen exactly;
// bfloat16 results round to nearest even with a NaN stored as 0xFFFF (ATen's AVX2/AVX-512
// conversion), float16 results round to nearest even (F16C). So every non-NaN result is
// bitwise the CPU AVX2 variant's; a NaN stays a NaN (float32 NaN payloads may differ: the GPU
// produces its canonical NaN where x86 propagates an operand's).
// Pointers must be on the stream's device; n may be 0 (nothing is launched).
#pragma once

#include <c10/core/ScalarType.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "mixtrain/optim/kernels/muon_kernel.h"

namespace mixtrain {
namespace CUDA {

void muon_momentum(const MuonMomentumScalars& s, float* buffer, const void* grad,
                   c10::ScalarType grad_dtype, void* out, c10::ScalarType out_dtype, int64_t n,
                   cudaStream_t stream);
void muon_apply(const MuonApplyScalars& s, float* param, const void* update,
                c10::ScalarType update_dtype, void* model, c10::ScalarType model_dtype, int64_t n,
                cudaStream_t stream);

}  // namespace CUDA
}  // namespace mixtrain
