// The variants of a per-capability CPU kernel (one function compiled into namespaces DEFAULT,
// AVX2 and AVX512; docs/architecture.md §1) that this CPU can run, for kernel tests that check
// each against ATen; and the bitwise comparison they make.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstring>
#include <vector>

#include "mixtrain/core/cpu_capability.h"

namespace mixtrain::testing {

template <typename Kernel>
struct KernelVariant {
  CpuCapability capability;
  Kernel kernel;
};

// DEFAULT, AVX2 and AVX512 as far as hardware_cpu_capability() goes, lowest first.
template <typename Kernel>
std::vector<KernelVariant<Kernel>> runnable_variants(Kernel default_kernel, Kernel avx2,
                                                     Kernel avx512) {
  const std::vector<KernelVariant<Kernel>> all = {{CpuCapability::kDefault, default_kernel},
                                                  {CpuCapability::kAvx2, avx2},
                                                  {CpuCapability::kAvx512, avx512}};
  std::vector<KernelVariant<Kernel>> runnable;
  for (const auto& v : all) {
    if (v.capability <= hardware_cpu_capability()) runnable.push_back(v);
  }
  return runnable;
}

// The same sizes and bytes (contiguous CPU tensors).
inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace mixtrain::testing
