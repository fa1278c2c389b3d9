// The CUDA twins of muon_kernel.cpp's passes; the contract is in muon_kernel_cuda.h. One thread
// per element (grid-stride): the passes are elementwise and memory-bound, and an element's result
// must not depend on where it sits, so there is no tail code to get wrong.
#include <c10/util/Exception.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "mixtrain/optim/kernels/muon_kernel_cuda.h"

namespace mixtrain {
namespace CUDA {
namespace {

// 16-bit operands as raw bits, so every conversion below is spelled out.
struct Bf16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};
struct NoModel {};  // muon_apply without a copy-back target

__device__ inline float widen(float x) {
  return x;
}
__device__ inline float widen(Bf16 x) {
  return __uint_as_float(static_cast<uint32_t>(x.bits) << 16);
}
__device__ inline float widen(Half x) {
  return __half2float(__ushort_as_half(x.bits));
}

__device__ inline void store(float* p, float x) {
  *p = x;
}
// ATen's AVX2/AVX-512 cvtfp32_bf16: add 0x7FFF plus the kept lsb, truncate; NaN -> 0xFFFF.
__device__ inline void store(Bf16* p, float x) {
  const uint32_t bits = __float_as_uint(x);
  p->bits = isnan(x) ? uint16_t{0xFFFF}
                     : static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}
// F16C's vcvtps2ph (round to nearest even); a NaN keeps its sign and top fraction bits, quieted.
__device__ inline void store(Half* p, float x) {
  const uint32_t bits = __float_as_uint(x);
  p->bits =
      isnan(x) ? static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7E00u | ((bits >> 13) & 0x3FFu))
               : __half_as_ushort(__float2half_rn(x));
}
__device__ inline void store(NoModel* /*p*/, float /*x*/) {}

template <typename T>
__device__ inline T* at(T* p, int64_t i) {
  return p + i;
}
__device__ inline NoModel* at(NoModel* p, int64_t /*i*/) {
  return p;
}  // never dereferenced

// ATen's lerp(self, end, w) as its vectorized CPU kernel computes it (muon_kernel.cpp).
__device__ inline float lerp(float self, float end, float w) {
  const float diff = __fsub_rn(end, self);
  return fabsf(w) < 0.5f ? __fmaf_rn(w, diff, self) : __fmaf_rn(__fsub_rn(w, 1.f), diff, end);
}

// muon_kernel.cpp's momentum_lanes for one element: buf in place, returns u.
__device__ inline float momentum_element(const MuonMomentumScalars& s, float& buf, float g) {
  if (s.buffer_rule == MuonBufferRule::kMulAdd) {
    buf = __fadd_rn(__fmul_rn(buf, s.mu), g);  // mul_(mu), then add_(g)
  } else {
    buf = lerp(buf, g, s.buffer_weight);
  }
  switch (s.direction_rule) {
    case MuonDirectionRule::kAdd:
      return __fmaf_rn(buf, s.mu, g);  // g.add(buf, mu)
    case MuonDirectionRule::kLerp:
      return lerp(g, buf, s.mu);
    case MuonDirectionRule::kBuffer:
      break;
  }
  return buf;
}

template <typename GradT, typename OutT>
__global__ void momentum_kernel(MuonMomentumScalars s, float* buffer, const GradT* grad, OutT* out,
                                int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float buf = buffer[i];
    const float u = momentum_element(s, buf, widen(grad[i]));
    buffer[i] = buf;
    store(out + i, u);
  }
}

template <typename UpdateT, typename ModelT>
__global__ void apply_kernel(MuonApplyScalars s, float* param, const UpdateT* update, ModelT* model,
                             int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float p = param[i];
    if (s.decay_param) p = __fmul_rn(p, s.decay);  // mul_(decay)
    p = __fmaf_rn(widen(update[i]), s.alpha, p);   // add_(o, alpha)
    param[i] = p;
    store(at(model, i), p);
  }
}

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; the grid-stride loop does the rest.
constexpr int64_t kMaxBlocks = 4096;

dim3 blocks_for(int64_t n) {
  return dim3(static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)));
}

// Calls f with a null pointer of the element type for dtype (float32, bfloat16, float16).
template <typename F>
void with_float_type(const char* what, c10::ScalarType dtype, F&& f) {
  switch (dtype) {
    case c10::ScalarType::Float:
      f(static_cast<float*>(nullptr));
      break;
    case c10::ScalarType::BFloat16:
      f(static_cast<Bf16*>(nullptr));
      break;
    case c10::ScalarType::Half:
      f(static_cast<Half*>(nullptr));
      break;
    default:
      TORCH_CHECK(false, what, " must be float32, bfloat16 or float16, not ", dtype);
  }
}

void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  TORCH_CHECK(error == cudaSuccess, what, ": kernel launch failed: ", cudaGetErrorString(error));
}

}  // namespace

void muon_momentum(const MuonMomentumScalars& s, float* buffer, const void* grad,
                   c10::ScalarType grad_dtype, void* out, c10::ScalarType out_dtype, int64_t n,
                   cudaStream_t stream) {
  TORCH_CHECK(n >= 0, "muon_momentum (CUDA): negative numel ", n);
  with_float_type("muon_momentum (CUDA): grad dtype", grad_dtype, [&](auto* grad_tag) {
    using GradT = std::remove_pointer_t<decltype(grad_tag)>;
    with_float_type("muon_momentum (CUDA): out dtype", out_dtype, [&](auto* out_tag) {
      using OutT = std::remove_pointer_t<decltype(out_tag)>;
      if (n == 0) return;
      momentum_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
          s, buffer, static_cast<const GradT*>(grad), static_cast<OutT*>(out), n);
      check_launch("muon_momentum (CUDA)");
    });
  });
}

void muon_apply(const MuonApplyScalars& s, float* param, const void* update,
                c10::ScalarType update_dtype, void* model, c10::ScalarType model_dtype, int64_t n,
                cudaStream_t stream) {
  TORCH_CHECK(n >= 0, "muon_apply (CUDA): negative numel ", n);
  TORCH_CHECK(model == nullptr || model_dtype == c10::ScalarType::BFloat16 ||
                  model_dtype == c10::ScalarType::Half,
              "muon_apply (CUDA): model param dtype must be bfloat16 or float16, not ",
              model_dtype);
  with_float_type("muon_apply (CUDA): update dtype", update_dtype, [&](auto* update_tag) {
    using UpdateT = std::remove_pointer_t<decltype(update_tag)>;
    if (n == 0) return;
    const auto* u = static_cast<const UpdateT*>(update);
    if (model == nullptr) {
      apply_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, param, u,
                                                           static_cast<NoModel*>(nullptr), n);
    } else if (model_dtype == c10::ScalarType::BFloat16) {
      apply_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, param, u, static_cast<Bf16*>(model),
                                                           n);
    } else {
      apply_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, param, u, static_cast<Half*>(model),
                                                           n);
    }
    check_launch("muon_apply (CUDA)");
  });
}

}  // namespace CUDA
}  // namespace mixtrain
