#include "mixtrain/trainer/threads.h"

#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "mixtrain/core/logging.h"
#include "mixtrain/distributed/launcher.h"

namespace mixtrain {

void configure_threads() {
  if (std::getenv("OMP_NUM_THREADS") == nullptr) at::set_num_threads(threads_per_worker(1));
}

std::string busy_cores_warning(double load_average, int threads, int usable_cores) {
  if (threads < 2 || load_average < 1.0) return "";
  char text[400];
  std::snprintf(text, sizeof text,
                "other processes are using this machine's cores (load average %.1f on %d usable "
                "cores) and each rank computes on %d threads: OpenMP threads then wait for "
                "descheduled peers and steps may run several times slower; OMP_NUM_THREADS=1 "
                "or OMP_WAIT_POLICY=passive avoids that",
                load_average, usable_cores, threads);
  return text;
}

void warn_if_cores_are_busy() {
  double load_average = 0.0;
  std::ifstream loadavg("/proc/loadavg");
  if (!(loadavg >> load_average)) return;  // not Linux: nothing to go by
  const std::string warning =
      busy_cores_warning(load_average, at::get_num_threads(), threads_per_worker(1));
  if (!warning.empty()) log_warn(warning);
}

}  // namespace mixtrain
