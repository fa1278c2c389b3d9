// Compiled three times (CPU_CAPABILITY = DEFAULT, AVX2, AVX512); see the header for the
// contract.
//
// Bitwise agreement with the unfused ATen ops rests on these facts about LibTorch 2.11's CPU
// kernels (tests/unit/optim/muon_kernel_test.cpp re-checks them at every capability):
// - mul_ rounds once; add with alpha is at::vec::fmadd(other, alpha, self) (ufunc/add.h), a
//   fused multiply-add in the AVX2/AVX-512 builds and two roundings in DEFAULT, vector tails
//   included. With alpha 1 both are one rounded addition.
// - lerp is fmadd(w, end - self, self) for |w| < 0.5, else fmadd(w - 1, end - self, end): the
//   same as AdamW's exp_avg (adamw_kernel.cpp).
// - A 16-bit operand of a float32 op is widened exactly first; to(kBFloat16 / kHalf) rounds to
//   nearest even.
#include "mixtrain/optim/kernels/muon_kernel.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cmath>

#include "mixtrain/optim/kernels/vec_float.h"

#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__) && !defined(__clang__)
// GCC 12 false positive in ATen's inlined bf16 conversion (see sum_of_squares_kernel.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mixtrain {
namespace CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
constexpr int64_t kBlock = 2 * kLanes;  // one 16-bit store holds two float vectors
constexpr int64_t kGrain = 1 << 16;     // elements per parallel task

// ATen's lerp(self, end, w) (ATen/native/Lerp.h) as its vectorized CPU kernel computes it.
inline Vec lerp(const Vec& self, const Vec& end, float w) {
  const Vec diff = end - self;
  return std::abs(w) < 0.5f ? at::vec::fmadd(Vec(w), diff, self)
                            : at::vec::fmadd(Vec(w - 1.f), diff, end);
}

// The momentum update of kLanes elements: buf in place, returns u.
inline Vec momentum_lanes(const MuonMomentumScalars& s, Vec& buf, const Vec& g) {
  if (s.buffer_rule == MuonBufferRule::kMulAdd) {
    buf = rounded(buf * Vec(s.mu)) + g;  // mul_(mu), then add_(g)
  } else {
    buf = lerp(buf, g, s.buffer_weight);
  }
  switch (s.direction_rule) {
    case MuonDirectionRule::kAdd:
      return at::vec::fmadd(buf, Vec(s.mu), g);
    case MuonDirectionRule::kLerp:
      return lerp(g, buf, s.mu);
    case MuonDirectionRule::kBuffer:
      break;
  }
  return buf;
}

// n elements, n a multiple of kBlock.
template <typename GradT, typename OutT>
void momentum_blocks(const MuonMomentumScalars& s, float* buffer, const GradT* grad, OutT* out,
                     int64_t n) {
  for (int64_t i = 0; i < n; i += kBlock) {
    Vec b0 = Vec::loadu(buffer + i), b1 = Vec::loadu(buffer + i + kLanes);
    const Vec u0 = momentum_lanes(s, b0, load_float(grad + i));
    const Vec u1 = momentum_lanes(s, b1, load_float(grad + i + kLanes));
    b0.store(buffer + i);
    b1.store(buffer + i + kLanes);
    store_float(u0, u1, out + i);
  }
}

// Elements [0, n), the tail zero-padded (for_blocks_padded).
template <typename GradT, typename OutT>
void momentum_range(const MuonMomentumScalars& s, float* buffer, const GradT* grad, OutT* out,
                    int64_t n) {
  for_blocks_padded<kBlock>(
      n, [&](int64_t len, float* b, const GradT* g, OutT* o) { momentum_blocks(s, b, g, o, len); },
      updates(buffer), reads(grad), writes(out));
}

template <typename GradT>
void momentum_grad(const MuonMomentumScalars& s, float* buffer, const GradT* grad, void* out,
                   c10::ScalarType out_dtype, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    const int64_t len = end - begin;
    switch (out_dtype) {
      case c10::ScalarType::BFloat16:
        momentum_range(s, buffer + begin, grad + begin, static_cast<c10::BFloat16*>(out) + begin,
                       len);
        break;
      case c10::ScalarType::Half:
        momentum_range(s, buffer + begin, grad + begin, static_cast<c10::Half*>(out) + begin, len);
        break;
      default:
        momentum_range(s, buffer + begin, grad + begin, static_cast<float*>(out) + begin, len);
        break;
    }
  });
}

inline Vec apply_lanes(const MuonApplyScalars& s, Vec p, const Vec& o) {
  if (s.decay_param) p = rounded(p * Vec(s.decay));  // mul_(decay)
  return at::vec::fmadd(o, Vec(s.alpha), p);         // add_(o, alpha)
}

template <typename UpdateT, typename ModelT>
void apply_blocks(const MuonApplyScalars& s, float* param, const UpdateT* update, ModelT* model,
                  int64_t n) {
  for (int64_t i = 0; i < n; i += kBlock) {
    const Vec p0 = apply_lanes(s, Vec::loadu(param + i), load_float(update + i));
    const Vec p1 = apply_lanes(s, Vec::loadu(param + i + kLanes), load_float(update + i + kLanes));
    p0.store(param + i);
    p1.store(param + i + kLanes);
    store_float(p0, p1, at_offset(model, i));
  }
}

// Elements [0, n), the tail zero-padded (for_blocks_padded); a NoOutput model is not written.
template <typename UpdateT, typename ModelT>
void apply_range(const MuonApplyScalars& s, float* param, const UpdateT* update, ModelT* model,
                 int64_t n) {
  for_blocks_padded<kBlock>(
      n, [&](int64_t len, float* p, const UpdateT* u, ModelT* m) { apply_blocks(s, p, u, m, len); },
      updates(param), reads(update), writes(model));
}

template <typename UpdateT>
void apply_update(const MuonApplyScalars& s, float* param, const UpdateT* update, void* model,
                  c10::ScalarType model_dtype, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    const int64_t len = end - begin;
    if (model == nullptr) {
      NoOutput none;
      apply_range(s, param + begin, update + begin, &none, len);
    } else if (model_dtype == c10::ScalarType::BFloat16) {
      apply_range(s, param + begin, update + begin, static_cast<c10::BFloat16*>(model) + begin,
                  len);
    } else {
      apply_range(s, param + begin, update + begin, static_cast<c10::Half*>(model) + begin, len);
    }
  });
}

void check_float_dtype(const char* what, c10::ScalarType dtype) {
  TORCH_CHECK(dtype == c10::ScalarType::Float || dtype == c10::ScalarType::BFloat16 ||
                  dtype == c10::ScalarType::Half,
              what, " must be float32, bfloat16 or float16, not ", dtype);
}

}  // namespace

void muon_momentum(const MuonMomentumScalars& s, float* buffer, const void* grad,
                   c10::ScalarType grad_dtype, void* out, c10::ScalarType out_dtype, int64_t n) {
  TORCH_CHECK(n >= 0, "muon_momentum: negative numel ", n);
  check_float_dtype("muon_momentum: grad dtype", grad_dtype);
  check_float_dtype("muon_momentum: out dtype", out_dtype);
  switch (grad_dtype) {
    case c10::ScalarType::BFloat16:
      momentum_grad(s, buffer, static_cast<const c10::BFloat16*>(grad), out, out_dtype, n);
      break;
    case c10::ScalarType::Half:
      momentum_grad(s, buffer, static_cast<const c10::Half*>(grad), out, out_dtype, n);
      break;
    default:
      momentum_grad(s, buffer, static_cast<const float*>(grad), out, out_dtype, n);
      break;
  }
}

void muon_apply(const MuonApplyScalars& s, float* param, const void* update,
                c10::ScalarType update_dtype, void* model, c10::ScalarType model_dtype, int64_t n) {
  TORCH_CHECK(n >= 0, "muon_apply: negative numel ", n);
  check_float_dtype("muon_apply: update dtype", update_dtype);
  TORCH_CHECK(model == nullptr || model_dtype == c10::ScalarType::BFloat16 ||
                  model_dtype == c10::ScalarType::Half,
              "muon_apply: model param dtype must be bfloat16 or float16, not ", model_dtype);
  switch (update_dtype) {
    case c10::ScalarType::BFloat16:
      apply_update(s, param, static_cast<const c10::BFloat16*>(update), model, model_dtype, n);
      break;
    case c10::ScalarType::Half:
      apply_update(s, param, static_cast<const c10::Half*>(update), model, model_dtype, n);
      break;
    default:
      apply_update(s, param, static_cast<const float*>(update), model, model_dtype, n);
      break;
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace mixtrain
