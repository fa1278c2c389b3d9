#include "mixtrain/distributed/collective_checks.h"

#include <c10/util/Exception.h>

#include <numeric>
#include <stdexcept>

namespace mixtrain {

AllToAllShape check_all_to_all(const std::string& group, int rank, int size,
                               const at::Tensor& input, const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& recv_counts) {
  if (static_cast<int>(send_counts.size()) != size ||
      static_cast<int>(recv_counts.size()) != size) {
    throw std::invalid_argument(group + ": all_to_all needs one send and one receive count per " +
                                "rank (" + std::to_string(size) + ")");
  }
  for (size_t i = 0; i < send_counts.size(); ++i) {
    if (send_counts[i] < 0 || recv_counts[i] < 0) {
      throw std::invalid_argument(group + ": all_to_all counts must be >= 0");
    }
  }
  const int64_t send_total = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  if (input.dim() == 0 || send_total != input.size(0)) {
    throw std::invalid_argument(group + ": all_to_all send counts sum to " +
                                std::to_string(send_total) + " but the input has " +
                                std::to_string(input.dim() == 0 ? 0 : input.size(0)) + " rows");
  }
  AllToAllShape out;
  out.result = input.sizes().vec();
  out.result[0] = recv_total;
  // Every block but the one this rank keeps.
  int64_t row_bytes = static_cast<int64_t>(input.element_size());
  for (int64_t d = 1; d < input.dim(); ++d) row_bytes *= input.size(d);
  for (int i = 0; i < size; ++i) {
    if (i != rank) out.sent_bytes += send_counts[i] * row_bytes;
  }
  return out;
}

AllGatherShape all_gather_shape(const at::Tensor& local, int size) {
  AllGatherShape out;
  out.block = local.sizes().vec();
  if (out.block.empty()) out.block.push_back(1);  // a scalar gathers into a vector
  out.result = out.block;
  out.result[0] = out.block[0] * size;
  out.sent_bytes = (size - 1) * static_cast<int64_t>(local.nbytes());
  return out;
}

ReduceScatterShape check_reduce_scatter(const std::string& group, int size, const at::Tensor& full,
                                        int64_t wire_nbytes) {
  const at::ScalarType type = full.scalar_type();
  if (type == at::kBFloat16 || type == at::kByte || type == at::kChar) {
    throw std::invalid_argument(group + ": reduce_scatter_sum of " +
                                std::string(c10::toString(type)) +
                                " is not offered; reduce in float32");
  }
  if (full.dim() == 0 || full.size(0) % size != 0) {
    throw std::invalid_argument(group + ": reduce_scatter_sum needs dim 0 divisible by the " +
                                "group size " + std::to_string(size));
  }
  ReduceScatterShape out;
  out.rows = full.size(0) / size;
  out.result = full.sizes().vec();
  out.result[0] = out.rows;
  // The chunks of the n-1 peers leave this rank (as in a ring reduce-scatter).
  out.sent_bytes = (size - 1) * wire_nbytes / size;
  return out;
}

void check_payload_dtype(const std::string& group, const char* op, at::ScalarType type) {
  switch (type) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kByte:
    case at::kChar:
    case at::kInt:
    case at::kLong:
      return;
    default:
      throw std::invalid_argument(group + ": " + op + " does not support dtype " +
                                  std::string(c10::toString(type)));
  }
}

std::string first_line(const std::exception& error) {
  std::string text = error.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    text = c10_error->what_without_backtrace();
  }
  const auto newline = text.find('\n');
  if (newline != std::string::npos) text.resize(newline);
  return text;
}

int64_t check_broadcast(const std::string& group, int rank, int size, int root, int64_t nbytes) {
  if (root < 0 || root >= size) {
    throw std::invalid_argument(group + ": broadcast root " + std::to_string(root) +
                                " out of range");
  }
  return rank == root ? (size - 1) * nbytes : 0;
}

}  // namespace mixtrain
