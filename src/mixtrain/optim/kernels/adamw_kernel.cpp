// Compiled three times (CPU_CAPABILITY = DEFAULT, AVX2, AVX512); see the header for the
// contract.
//
// Bitwise agreement with the unfused ATen ops rests on four facts about LibTorch 2.11's CPU
// kernels, measured against the installed library (tests/unit/optim/adamw_test.cpp re-checks
// them for every capability):
// - mul_, div, add_ (alpha 1) and addcdiv_ round each operation once, in every build:
//   addcdiv_ is self + (value * t1) / t2, with no multiply-add to fuse.
// - lerp_ (self + w * (end - self), or end - (end - self) * (1 - w) for |w| >= 0.5) and
//   addcmul_ (self + value * t1 * t2) each end in one fused multiply-add in ATen's AVX2 and
//   AVX-512 builds and in none in its DEFAULT build. at::vec::fmadd is exactly that: a fused
//   multiply-add in our AVX2/AVX-512 builds and a * b + c with two roundings in DEFAULT.
// - sqrt is NOT correctly rounded: a LibTorch built with MKL (the x86-64 torch wheel) takes a
//   contiguous float sqrt from MKL VML, vmsSqrt in high-accuracy mode (ATen/cpu/vml.h), whose
//   result is 1 ulp off the rounded square root for about 0.6% of inputs, at every ATen
//   capability (MKL picks its own code path from the CPU). So we call that same function (see
//   aten_sqrt); the result of an element does not depend on where in the array it is.
// - to(kBFloat16) and to(kHalf) round to nearest even.
// Everything else must NOT be fused: see rounded() (vec_float.h).
#include "mixtrain/optim/kernels/adamw_kernel.h"

#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>

#include "mixtrain/optim/kernels/vec_float.h"

#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__) && !defined(__clang__)
// GCC 12 false positive: its AVX-512 intrinsics start from _mm512_undefined_epi32(), a
// deliberately self-initialised register, and -Wmaybe-uninitialized reports it wherever
// ATen's bf16 conversion is inlined into our code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// ATen's own condition for taking sqrt from MKL (ATen/cpu/vml.h). The wheel ships no MKL
// headers; libtorch_cpu exports MKL's C interface, declared here as MKL 2024 declares it for
// LP64, the interface ATen is built against (its MKL_INT is int here).
#if AT_MKL_ENABLED() && !defined(__APPLE__)
#define MIXTRAIN_ATEN_SQRT_IS_MKL 1
extern "C" {
void vmsSqrt(int n, const float* a, float* r, long long mode);
int MKL_Set_Num_Threads_Local(int threads);
}
#else
#define MIXTRAIN_ATEN_SQRT_IS_MKL 0
#endif

namespace mixtrain {
namespace CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
// One iteration updates two vectors: Vectorized<BFloat16> packs two float vectors.
constexpr int64_t kBlock = 2 * kLanes;
static_assert(kAdamWChunk % kBlock == 0, "a chunk is whole blocks");
// The elements whose square roots are taken in one call: small enough that the span's moments
// stay in L1 between the passes over it, large enough to amortize the call.
constexpr int64_t kSpan = 1024;
static_assert(kSpan % kBlock == 0, "a span is whole blocks");

#if MIXTRAIN_ATEN_SQRT_IS_MKL
// The mode ATen passes: VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE (mkl_vml_defines.h).
constexpr long long kAtenVmlMode = 0x2 | 0x140000 | 0x100;
#endif

struct VecScalars {
  explicit VecScalars(const AdamWStepScalars& s)
      : decay(s.decay),
        exp_avg_weight(s.exp_avg_weight),
        one_minus_exp_avg_weight(1.f - s.exp_avg_weight),  // lerp's (1 - weight), in float
        beta2(s.beta2),
        one_minus_beta2(s.one_minus_beta2),
        bias_correction2_sqrt(s.bias_correction2_sqrt),
        eps(s.eps),
        neg_step_size(s.neg_step_size),
        small_weight(std::abs(s.exp_avg_weight) < 0.5f) {}
  Vec decay, exp_avg_weight, one_minus_exp_avg_weight, beta2, one_minus_beta2,
      bias_correction2_sqrt, eps, neg_step_size;
  bool small_weight;  // which of lerp's two formulas ATen uses
};

// The moment updates of kLanes elements, in place. Each line is one op of the unfused sequence
// (adamw.h), with its rounding.
inline void update_moments(const VecScalars& s, const Vec& grad, Vec& exp_avg, Vec& exp_avg_sq) {
  // exp_avg.lerp_(grad, 1 - beta1)
  const Vec diff = grad - exp_avg;
  exp_avg = s.small_weight ? at::vec::fmadd(s.exp_avg_weight, diff, exp_avg)
                           : at::vec::fmadd(diff.neg(), s.one_minus_exp_avg_weight, grad);
  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
  exp_avg_sq = at::vec::fmadd(s.one_minus_beta2 * grad, grad, exp_avg_sq * s.beta2);
}

// The new param of kLanes elements, from the updated exp_avg and sqrt(exp_avg_sq) as ATen's
// sqrt gives it.
inline Vec update_param(const VecScalars& s, Vec param, const Vec& exp_avg,
                        const Vec& exp_avg_sq_sqrt) {
  // param.mul_(1 - lr * weight_decay)
  param = rounded(param * s.decay);
  // denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)).add_(eps)
  const Vec denom = exp_avg_sq_sqrt / s.bias_correction2_sqrt + s.eps;
  // param.addcdiv_(exp_avg, denom, -step_size)
  return param + s.neg_step_size * exp_avg / denom;
}

// out[0, n) = sqrt(in[0, n)), bitwise what at::sqrt gives for a contiguous float tensor; n is a
// multiple of kLanes.
inline void aten_sqrt(const float* in, float* out, int64_t n) {
#if MIXTRAIN_ATEN_SQRT_IS_MKL
  vmsSqrt(static_cast<int>(n), in, out, kAtenVmlMode);
#else
  for (int64_t i = 0; i < n; i += kLanes) Vec::loadu(in + i).sqrt().store(out + i);
#endif
}

// Updates n elements at the given pointers, n a multiple of kBlock and at most kSpan: the moments
// first, then their square roots in one call, then the params; the span's moments are still in
// L1 when the second and third steps read them again, so memory sees one pass.
// Always inlined into both of its calls (whole spans, padded tail), as GCC did when adamw_range
// spelled the two out; through for_blocks_padded's lambda GCC 12 otherwise outlines it.
template <typename ModelT>
C10_ALWAYS_INLINE void adamw_span(const VecScalars& s, float* param, const float* grad,
                                  float* exp_avg, float* exp_avg_sq, ModelT* model, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    Vec m = Vec::loadu(exp_avg + i), v = Vec::loadu(exp_avg_sq + i);
    update_moments(s, Vec::loadu(grad + i), m, v);
    m.store(exp_avg + i);
    v.store(exp_avg_sq + i);
  }
  alignas(64) float root[kSpan];
  aten_sqrt(exp_avg_sq, root, n);
  for (int64_t i = 0; i < n; i += kBlock) {
    const Vec p0 =
        update_param(s, Vec::loadu(param + i), Vec::loadu(exp_avg + i), Vec::loadu(root + i));
    const Vec p1 = update_param(s, Vec::loadu(param + i + kLanes), Vec::loadu(exp_avg + i + kLanes),
                                Vec::loadu(root + i + kLanes));
    p0.store(param + i);
    p1.store(param + i + kLanes);
    store_float(p0, p1, at_offset(model, i));
  }
}

// The fused form's block (correctly_rounded_sqrt): the same operations with Vectorized's sqrt,
// so each pair of vectors is read, updated and written once.
template <typename ModelT>
C10_ALWAYS_INLINE void adamw_block_exact_sqrt(const VecScalars& s, float* param, const float* grad,
                                              float* exp_avg, float* exp_avg_sq, ModelT* model) {
  Vec m0 = Vec::loadu(exp_avg), v0 = Vec::loadu(exp_avg_sq);
  Vec m1 = Vec::loadu(exp_avg + kLanes), v1 = Vec::loadu(exp_avg_sq + kLanes);
  update_moments(s, Vec::loadu(grad), m0, v0);
  update_moments(s, Vec::loadu(grad + kLanes), m1, v1);
  const Vec p0 = update_param(s, Vec::loadu(param), m0, v0.sqrt());
  const Vec p1 = update_param(s, Vec::loadu(param + kLanes), m1, v1.sqrt());
  m0.store(exp_avg);
  m1.store(exp_avg + kLanes);
  v0.store(exp_avg_sq);
  v1.store(exp_avg_sq + kLanes);
  p0.store(param);
  p1.store(param + kLanes);
  store_float(p0, p1, model);
}

// Elements [0, n) of one chunk, the tail zero-padded (for_blocks_padded): kSpan at a time with
// ATen's single-tensor sqrt, or a block at a time with a correctly rounded one (kExactSqrt).
template <bool kExactSqrt, typename ModelT>
void adamw_range(const VecScalars& s, float* param, const float* grad, float* exp_avg,
                 float* exp_avg_sq, ModelT* model, int64_t n) {
  for_blocks_padded<kBlock>(
      n,
      [&](int64_t len, float* p, const float* g, float* m, float* v, ModelT* out) {
        if constexpr (kExactSqrt) {
          for (int64_t i = 0; i < len; i += kBlock) {
            adamw_block_exact_sqrt(s, p + i, g + i, m + i, v + i, at_offset(out, i));
          }
        } else {
          for (int64_t i = 0; i < len; i += kSpan) {
            adamw_span(s, p + i, g + i, m + i, v + i, at_offset(out, i), std::min(kSpan, len - i));
          }
        }
      },
      updates(param), reads(grad), updates(exp_avg), updates(exp_avg_sq), writes(model));
}

template <bool kExactSqrt, typename ModelT>
void adamw_chunks(const VecScalars& s, float* param, const float* grad, float* exp_avg,
                  float* exp_avg_sq, ModelT* model, int64_t numel) {
  const int64_t chunks = (numel + kAdamWChunk - 1) / kAdamWChunk;
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
#if MIXTRAIN_ATEN_SQRT_IS_MKL
    // One MKL thread per call: VML would otherwise start its own threads for each span where
    // this body runs outside a parallel region (one chunk, or one ATen thread). The results do
    // not depend on it: vmsSqrt is elementwise.
    const int mkl_threads = MKL_Set_Num_Threads_Local(1);
#endif
    for (int64_t c = begin; c < end; ++c) {
      const int64_t offset = c * kAdamWChunk;
      adamw_range<kExactSqrt>(s, param + offset, grad + offset, exp_avg + offset,
                              exp_avg_sq + offset, at_offset(model, offset),
                              std::min(kAdamWChunk, numel - offset));
    }
#if MIXTRAIN_ATEN_SQRT_IS_MKL
    MKL_Set_Num_Threads_Local(mkl_threads);
#endif
  });
}

template <typename ModelT>
void adamw_chunks(const AdamWStepScalars& scalars, float* param, const float* grad, float* exp_avg,
                  float* exp_avg_sq, ModelT* model, int64_t numel) {
  const VecScalars s(scalars);
  if (scalars.correctly_rounded_sqrt) {
    adamw_chunks<true>(s, param, grad, exp_avg, exp_avg_sq, model, numel);
  } else {
    adamw_chunks<false>(s, param, grad, exp_avg, exp_avg_sq, model, numel);
  }
}

}  // namespace

void adamw_step(const AdamWStepScalars& scalars, float* param, const float* grad, float* exp_avg,
                float* exp_avg_sq, void* model_param, c10::ScalarType model_dtype, int64_t numel) {
  TORCH_CHECK(numel >= 0, "adamw_step: negative numel ", numel);
  if (numel == 0) return;
  if (model_param == nullptr) {
    NoOutput* none = nullptr;
    adamw_chunks(scalars, param, grad, exp_avg, exp_avg_sq, none, numel);
    return;
  }
  switch (model_dtype) {
    case c10::ScalarType::BFloat16:
      adamw_chunks(scalars, param, grad, exp_avg, exp_avg_sq,
                   static_cast<c10::BFloat16*>(model_param), numel);
      return;
    case c10::ScalarType::Half:
      adamw_chunks(scalars, param, grad, exp_avg, exp_avg_sq, static_cast<c10::Half*>(model_param),
                   numel);
      return;
    default:
      TORCH_CHECK(false, "adamw_step: model param dtype must be bfloat16 or float16, not ",
                  model_dtype);
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace mixtrain
