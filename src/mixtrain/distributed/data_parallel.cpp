#include "mixtrain/distributed/data_parallel.h"

#include <ATen/ATen.h>

namespace mixtrain {

double average_over_data_parallel(double value, const DeviceMesh& mesh) {
  if (mesh.world->size() == 1) return value;
  at::Tensor total = at::full({1}, value, at::TensorOptions().dtype(at::kDouble));
  mesh.world->all_reduce_sum(total);
  return total.item<double>() / static_cast<double>(mesh.world->size());
}

}  // namespace mixtrain
