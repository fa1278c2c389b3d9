// Vector loads and stores of float32, bfloat16 and float16 as float32, a rounding barrier, and
// the loop over whole blocks plus a zero-padded tail, for the kernel files compiled once per
// capability. Include it inside no namespace: it opens
// mixtrain::CPU_CAPABILITY itself, with internal linkage, so each capability's copy stays its own
// (see sum_of_squares_kernel.cpp on weak symbols).
#pragma once

#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

namespace mixtrain {
namespace CPU_CAPABILITY {
namespace {

// Vectorized<float>::size() consecutive values, widened exactly.
inline at::vec::Vectorized<float> load_float(const float* p) {
  return at::vec::Vectorized<float>::loadu(p);
}
inline at::vec::Vectorized<float> load_float(const c10::BFloat16* p) {
  at::vec::Vectorized<float> out;
  at::vec::load_fp32_from_bf16(p, out);
  return out;
}
inline at::vec::Vectorized<float> load_float(const c10::Half* p) {
  at::vec::Vectorized<float> out;
  at::vec::load_fp32_from_fp16(p, out);
  return out;
}

// 2 * Vectorized<float>::size() consecutive values, v0 first, rounded to nearest even as ATen's
// to(dtype) rounds (a Vectorized<BFloat16> or <Half> holds two float vectors).
inline void store_float(const at::vec::Vectorized<float>& v0, const at::vec::Vectorized<float>& v1,
                        float* out) {
  v0.store(out);
  v1.store(out + at::vec::Vectorized<float>::size());
}
inline void store_float(const at::vec::Vectorized<float>& v0, const at::vec::Vectorized<float>& v1,
                        c10::BFloat16* out) {
  at::vec::convert_float_bfloat16(v0, v1).store(out);
}
inline void store_float(const at::vec::Vectorized<float>& v0, const at::vec::Vectorized<float>& v1,
                        c10::Half* out) {
  at::vec::convert_float_half(v0, v1).store(out);  // F16C in the vector builds
}

// Returns v, rounded to float here. GCC contracts a product feeding an addition into a fused
// multiply-add (-ffp-contract=fast is its C++ default) wherever the target has FMA; where ATen
// stores a product (x.mul_(c)) before the next op reads it, that product must stay rounded. The
// empty asm makes the value opaque to the optimizer and costs no instruction.
inline at::vec::Vectorized<float> rounded(at::vec::Vectorized<float> v) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512 r = v;
  __asm__("" : "+v"(r));
  return at::vec::Vectorized<float>(r);
#elif defined(CPU_CAPABILITY_AVX2)
  __m256 r = v;
  __asm__("" : "+x"(r));
  return at::vec::Vectorized<float>(r);
#else
  return v;  // no FMA instructions in the baseline x86-64 build: nothing can be fused
#endif
}

// The output type where a kernel has nothing to write: stores to it do nothing.
struct NoOutput {};
inline void store_float(const at::vec::Vectorized<float>& /*v0*/,
                        const at::vec::Vectorized<float>& /*v1*/, NoOutput* /*out*/) {}
template <typename T>
inline T* at_offset(T* p, int64_t offset) {
  return p + offset;
}
inline NoOutput* at_offset(NoOutput* p, int64_t /*offset*/) {
  return p;
}

// How for_blocks_padded treats one array: read only (reads), read and written back (updates),
// or only written back (writes; writes of a NoOutput* is passed through untouched).
template <typename T>
struct Read {
  const T* p;
};
template <typename T>
struct Update {
  T* p;
};
template <typename T>
struct Write {
  T* p;
};
template <typename T>
Read<T> reads(const T* p) {
  return {p};
}
template <typename T>
Update<T> updates(T* p) {
  return {p};
}
template <typename T>
Write<T> writes(T* p) {
  return {p};
}

// One array's stand-in for the tail: a zero-padded block of kBlock elements.
template <int64_t kBlock, typename Array>
struct PaddedBlock;
template <int64_t kBlock, typename T>
struct PaddedBlock<kBlock, Read<T>> {
  PaddedBlock(Read<T> a, int64_t rest) { std::copy_n(a.p, rest, block); }
  const T* ptr() { return block; }
  void write_back(int64_t /*rest*/) {}
  T block[kBlock] = {};
};
template <int64_t kBlock, typename T>
struct PaddedBlock<kBlock, Update<T>> {
  PaddedBlock(Update<T> a, int64_t rest) : dst(a.p) { std::copy_n(a.p, rest, block); }
  T* ptr() { return block; }
  void write_back(int64_t rest) { std::copy_n(block, rest, dst); }
  T* dst;
  T block[kBlock] = {};
};
template <int64_t kBlock, typename T>
struct PaddedBlock<kBlock, Write<T>> {
  PaddedBlock(Write<T> a, int64_t /*rest*/) : dst(a.p) {}
  T* ptr() { return block; }
  void write_back(int64_t rest) { std::copy_n(block, rest, dst); }
  T* dst;
  T block[kBlock] = {};
};
template <int64_t kBlock>
struct PaddedBlock<kBlock, Write<NoOutput>> {
  PaddedBlock(Write<NoOutput> a, int64_t /*rest*/) : dst(a.p) {}
  NoOutput* ptr() { return dst; }
  void write_back(int64_t /*rest*/) {}
  NoOutput* dst;
};

template <typename Array>
auto unpadded(Array a) {
  return a.p;
}
template <typename Array>
Array shifted(Array a, int64_t offset) {
  a.p = at_offset(a.p, offset);
  return a;
}

// Elements [0, n) of the arrays, in two calls of blocks(len, pointers...): the first n / kBlock
// whole blocks in place (len a multiple of kBlock), then the last n % kBlock elements on
// zero-padded copies (len = kBlock), of which the first n % kBlock are written back. Every
// element thus sees the same vector operations, whatever its position. Arrays are reads(p),
// updates(p) or writes(p); blocks gets their pointers in the same order.
template <int64_t kBlock, typename Blocks, typename... Arrays>
void for_blocks_padded(int64_t n, Blocks&& blocks, Arrays... arrays) {
  const int64_t full = n / kBlock * kBlock;
  blocks(full, unpadded(arrays)...);
  const int64_t rest = n - full;
  if (rest == 0) return;
  std::tuple<PaddedBlock<kBlock, Arrays>...> tail{
      PaddedBlock<kBlock, Arrays>(shifted(arrays, full), rest)...};
  std::apply([&](auto&... block) { blocks(kBlock, block.ptr()...); }, tail);
  std::apply([&](auto&... block) { (block.write_back(rest), ...); }, tail);
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace mixtrain
