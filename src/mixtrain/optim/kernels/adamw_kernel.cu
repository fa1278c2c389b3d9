// CUDA twin of adamw_kernel.cpp (contract in adamw_kernel.h): one launch updates many tensors.
//
// The launch's table (tensor pointers, sizes, each tensor's first chunk, up to
// kAdamWLaunchScalars scalar sets) is a kernel argument, below the classic 4 KiB limit, so no
// host buffer has to outlive the launch and nothing synchronizes. Block b updates chunk b of the
// launch: the tensor t with first_chunk[t] <= b < first_chunk[t + 1], elements
// [(b - first_chunk[t]) * kAdamWCudaChunk, +kAdamWCudaChunk).
//
// Bitwise parity with the CPU's AVX2 / AVX-512 variants: each operation is an explicit
// round-to-nearest intrinsic (__fmaf_rn, __fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn,
// __fsqrt_rn), which nvcc never contracts or reassociates, in the CPU kernel's order. Every
// element gets the same operations whether it goes through the float4 path or the scalar one.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "mixtrain/optim/kernels/adamw_kernel.h"
#include "mixtrain/optim/kernels/multi_tensor_chunk.cuh"

namespace mixtrain {
namespace CUDA {
namespace {

constexpr int kThreads = 256;
static_assert(kAdamWCudaChunk % (4 * kThreads) == 0, "a chunk is whole float4 rounds");

enum ModelKind : uint8_t { kNoModel = 0, kBFloat16Model = 1, kHalfModel = 2 };

// The scalars the CPU kernel's VecScalars holds, computed the same way on the host.
struct Scalars {
  float decay, exp_avg_weight, one_minus_exp_avg_weight, beta2, one_minus_beta2,
      bias_correction2_sqrt, eps, neg_step_size;
  int small_weight;  // |exp_avg_weight| < 0.5: which of lerp's two formulas ATen uses
};

struct Table {
  float* param[kAdamWLaunchTensors];
  const float* grad[kAdamWLaunchTensors];
  float* exp_avg[kAdamWLaunchTensors];
  float* exp_avg_sq[kAdamWLaunchTensors];
  void* model[kAdamWLaunchTensors];
  int64_t numel[kAdamWLaunchTensors];
  int first_chunk[kAdamWLaunchTensors + 1];
  uint8_t model_kind[kAdamWLaunchTensors];
  uint8_t scalar_set[kAdamWLaunchTensors];
  Scalars scalars[kAdamWLaunchScalars];
  int count;
};
static_assert(sizeof(Table) <= 4096, "the table must fit the 4 KiB kernel-argument limit");

// One element: exactly update_moments then update_param of adamw_kernel.cpp, with a correctly
// rounded sqrt in place of MKL's.
__device__ __forceinline__ void update(const Scalars& s, float& p, float g, float& m, float& v) {
  // exp_avg.lerp_(grad, 1 - beta1): one fused multiply-add after the difference
  const float diff = __fsub_rn(g, m);
  m = s.small_weight ? __fmaf_rn(s.exp_avg_weight, diff, m)
                     : __fmaf_rn(-diff, s.one_minus_exp_avg_weight, g);
  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
  v = __fmaf_rn(__fmul_rn(s.one_minus_beta2, g), g, __fmul_rn(v, s.beta2));
  // param.mul_(1 - lr * wd); denom = sqrt(v) / sqrt(bc2) + eps; param += -step * m / denom
  const float decayed = __fmul_rn(p, s.decay);
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
  p = __fadd_rn(decayed, __fdiv_rn(__fmul_rn(s.neg_step_size, m), denom));
}

// Round to nearest even, as c10::BFloat16(float) does (NaN: 0x7fc0).
__device__ __forceinline__ uint16_t bfloat16_bits(float x) {
  if (x != x) return 0x7fc0;
  const uint32_t u = __float_as_uint(x);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
template <int kModel>
__device__ __forceinline__ uint16_t model_bits(float x) {
  if (kModel == kBFloat16Model) return bfloat16_bits(x);
  return __half_as_ushort(__float2half_rn(x));  // round to nearest even, as F16C
}

template <int kModel>
__device__ void update_range(const Scalars& s, float* p, const float* g, float* m, float* v,
                             uint16_t* model, int64_t n) {
  const uintptr_t addresses = reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g) |
                              reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v);
  const bool aligned =
      (addresses % 16 == 0) && (kModel == kNoModel || reinterpret_cast<uintptr_t>(model) % 8 == 0);
  int64_t vector_end = 0;
  if (aligned) {
    vector_end = n / 4 * 4;
    for (int64_t i = 4 * static_cast<int64_t>(threadIdx.x); i < vector_end; i += 4 * kThreads) {
      float4 pp = *reinterpret_cast<const float4*>(p + i);
      const float4 gg = *reinterpret_cast<const float4*>(g + i);
      float4 mm = *reinterpret_cast<const float4*>(m + i);
      float4 vv = *reinterpret_cast<const float4*>(v + i);
      update(s, pp.x, gg.x, mm.x, vv.x);
      update(s, pp.y, gg.y, mm.y, vv.y);
      update(s, pp.z, gg.z, mm.z, vv.z);
      update(s, pp.w, gg.w, mm.w, vv.w);
      *reinterpret_cast<float4*>(p + i) = pp;
      *reinterpret_cast<float4*>(m + i) = mm;
      *reinterpret_cast<float4*>(v + i) = vv;
      if (kModel != kNoModel) {
        const uint32_t lo = model_bits<kModel>(pp.x) | (uint32_t{model_bits<kModel>(pp.y)} << 16);
        const uint32_t hi = model_bits<kModel>(pp.z) | (uint32_t{model_bits<kModel>(pp.w)} << 16);
        *reinterpret_cast<uint2*>(model + i) = make_uint2(lo, hi);
      }
    }
  }
  for (int64_t i = vector_end + threadIdx.x; i < n; i += kThreads) {
    float pp = p[i], mm = m[i], vv = v[i];
    update(s, pp, g[i], mm, vv);
    p[i] = pp;
    m[i] = mm;
    v[i] = vv;
    if (kModel != kNoModel) model[i] = model_bits<kModel>(pp);
  }
}

__global__ void __launch_bounds__(kThreads) adamw_multi_tensor(const Table table) {
  const int chunk = static_cast<int>(blockIdx.x);
  const int t = tensor_of_chunk(table.first_chunk, table.count, chunk);
  const int64_t begin = static_cast<int64_t>(chunk - table.first_chunk[t]) * kAdamWCudaChunk;
  const int64_t rest = table.numel[t] - begin;
  const int64_t n = rest < kAdamWCudaChunk ? rest : kAdamWCudaChunk;
  const Scalars& s = table.scalars[table.scalar_set[t]];
  float* p = table.param[t] + begin;
  const float* g = table.grad[t] + begin;
  float* m = table.exp_avg[t] + begin;
  float* v = table.exp_avg_sq[t] + begin;
  uint16_t* model = static_cast<uint16_t*>(table.model[t]);
  switch (table.model_kind[t]) {
    case kBFloat16Model:
      update_range<kBFloat16Model>(s, p, g, m, v, model + begin, n);
      break;
    case kHalfModel:
      update_range<kHalfModel>(s, p, g, m, v, model + begin, n);
      break;
    default:
      update_range<kNoModel>(s, p, g, m, v, nullptr, n);
      break;
  }
}

Scalars device_scalars(const AdamWStepScalars& s) {
  Scalars out;
  out.decay = s.decay;
  out.exp_avg_weight = s.exp_avg_weight;
  out.one_minus_exp_avg_weight = 1.f - s.exp_avg_weight;  // as VecScalars: one float subtraction
  out.beta2 = s.beta2;
  out.one_minus_beta2 = s.one_minus_beta2;
  out.bias_correction2_sqrt = s.bias_correction2_sqrt;
  out.eps = s.eps;
  out.neg_step_size = s.neg_step_size;
  out.small_weight = (s.exp_avg_weight < 0.5f && s.exp_avg_weight > -0.5f) ? 1 : 0;
  return out;
}

bool same_scalars(const Scalars& a, const Scalars& b) {
  return std::memcmp(&a, &b, sizeof(Scalars)) == 0;  // bitwise: -0.f and 0.f differ
}

void launch(const Table& table, cudaStream_t stream) {
  if (table.count == 0) return;
  adamw_multi_tensor<<<table.first_chunk[table.count], kThreads, 0, stream>>>(table);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("adamw_step (CUDA): launch failed: ") +
                             cudaGetErrorString(status));
  }
}

}  // namespace

void adamw_step(const AdamWTensor* tensors, int64_t count, void* stream) {
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  constexpr int64_t kMaxChunks = 0x7fffffff;  // the grid's x limit
  Table table;
  std::memset(&table, 0, sizeof(table));
  int scalar_sets = 0;
  for (int64_t i = 0; i < count; ++i) {
    const AdamWTensor& t = tensors[i];
    if (t.numel < 0) throw std::invalid_argument("adamw_step (CUDA): negative numel");
    if (t.numel == 0) continue;
    uint8_t kind = kNoModel;
    if (t.model_param != nullptr) {
      if (t.model_dtype == c10::ScalarType::BFloat16) {
        kind = kBFloat16Model;
      } else if (t.model_dtype == c10::ScalarType::Half) {
        kind = kHalfModel;
      } else {
        throw std::invalid_argument(
            "adamw_step (CUDA): model param dtype must be bfloat16 or float16");
      }
    }
    const Scalars s = device_scalars(t.scalars);
    int set = 0;
    while (set < scalar_sets && !same_scalars(table.scalars[set], s)) ++set;
    const int64_t chunks = (t.numel + kAdamWCudaChunk - 1) / kAdamWCudaChunk;
    if (chunks > kMaxChunks) throw std::invalid_argument("adamw_step (CUDA): tensor too large");
    // Launch what the table holds when this tensor does not fit.
    if (table.count == kAdamWLaunchTensors || (set == scalar_sets && set == kAdamWLaunchScalars) ||
        table.first_chunk[table.count] + chunks > kMaxChunks) {
      launch(table, cuda_stream);
      std::memset(&table, 0, sizeof(table));
      scalar_sets = 0;
      set = 0;
    }
    if (set == scalar_sets) table.scalars[scalar_sets++] = s;
    const int k = table.count++;
    table.param[k] = t.param;
    table.grad[k] = t.grad;
    table.exp_avg[k] = t.exp_avg;
    table.exp_avg_sq[k] = t.exp_avg_sq;
    table.model[k] = t.model_param;
    table.numel[k] = t.numel;
    table.model_kind[k] = kind;
    table.scalar_set[k] = static_cast<uint8_t>(set);
    table.first_chunk[k + 1] = table.first_chunk[k] + static_cast<int>(chunks);
  }
  launch(table, cuda_stream);
}

}  // namespace CUDA
}  // namespace mixtrain
