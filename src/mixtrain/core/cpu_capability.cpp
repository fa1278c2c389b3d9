#include "mixtrain/core/cpu_capability.h"

#include <cstdlib>
#include <string>

#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"

namespace mixtrain {

CpuCapability hardware_cpu_capability() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return CpuCapability::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return CpuCapability::kAvx2;
  }
#endif
  return CpuCapability::kDefault;
}

CpuCapability resolve_cpu_capability(CpuCapability hardware, const char* requested) {
  if (requested == nullptr || *requested == '\0') return hardware;
  const std::string name(requested);
  CpuCapability wanted;
  if (name == "default") {
    wanted = CpuCapability::kDefault;
  } else if (name == "avx2") {
    wanted = CpuCapability::kAvx2;
  } else if (name == "avx512") {
    wanted = CpuCapability::kAvx512;
  } else {
    throw ConfigError("MIXTRAIN_CPU_CAPABILITY='" + name + "' is not one of default, avx2, avx512");
  }
  if (wanted > hardware) {
    // Running an AVX-512 kernel on a CPU without it would die with SIGILL.
    log_warn(std::string("MIXTRAIN_CPU_CAPABILITY=") + name +
             " is above what this CPU supports; using " + cpu_capability_name(hardware));
    return hardware;
  }
  return wanted;
}

CpuCapability cpu_capability() {
  static const CpuCapability capability =
      resolve_cpu_capability(hardware_cpu_capability(), std::getenv("MIXTRAIN_CPU_CAPABILITY"));
  return capability;
}

const char* cpu_capability_name(CpuCapability capability) {
  switch (capability) {
    case CpuCapability::kAvx512:
      return "avx512";
    case CpuCapability::kAvx2:
      return "avx2";
    case CpuCapability::kDefault:
      break;
  }
  return "default";
}

}  // namespace mixtrain
