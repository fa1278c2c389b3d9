// Which vectorized kernel variant to run on this CPU, chosen once per process.
//
// Kernel files (src/mixtrain/<module>/kernels/*.cpp) are compiled three times, into namespaces
// DEFAULT, AVX2 and AVX512 (docs/architecture.md §1); the caller picks the variant with
// cpu_capability(). Detection: AVX512 needs avx512f+bw+vl+dq, AVX2 needs avx2+fma. The environment
// variable MIXTRAIN_CPU_CAPABILITY=default|avx2|avx512 lowers the choice (for tests and A/B runs);
// a request above what the CPU supports is clamped with a warning, an unknown name is a
// ConfigError.
#pragma once

namespace mixtrain {

// Ordered: a larger value implies every smaller one is also supported.
enum class CpuCapability { kDefault = 0, kAvx2 = 1, kAvx512 = 2 };

// The capability in use: the hardware's, lowered by MIXTRAIN_CPU_CAPABILITY. Cached.
CpuCapability cpu_capability();

// What the CPU itself supports (no environment override).
CpuCapability hardware_cpu_capability();

// The pure rule behind cpu_capability(): `requested` is the override (nullptr or "" = none).
CpuCapability resolve_cpu_capability(CpuCapability hardware, const char* requested);

// "default", "avx2", "avx512" (the override's spelling).
const char* cpu_capability_name(CpuCapability capability);

// Picks one of a kernel's three per-capability variants for cpu_capability().
template <typename Fn>
Fn select_kernel(Fn default_fn, Fn avx2_fn, Fn avx512_fn) {
  switch (cpu_capability()) {
    case CpuCapability::kAvx512:
      return avx512_fn;
    case CpuCapability::kAvx2:
      return avx2_fn;
    case CpuCapability::kDefault:
      break;
  }
  return default_fn;
}

}  // namespace mixtrain
