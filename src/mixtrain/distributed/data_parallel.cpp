#include "mixtrain/distributed/data_parallel.h"

#include <ATen/ATen.h>

namespace mixtrain {

double average_over_data_parallel(double value, const DeviceMesh& mesh) {
  return average_over_data_parallel(at::full({1}, value, at::kDouble), mesh).item<double>();
}

at::Tensor average_over_data_parallel(const at::Tensor& values, const DeviceMesh& mesh) {
  at::Tensor total = values.contiguous().clone();
  if (mesh.world->size() == 1) return total;
  mesh.world->all_reduce_sum(total);
  return total / static_cast<double>(mesh.world->size());  // float64: x / n as on the host
}

}  // namespace mixtrain
