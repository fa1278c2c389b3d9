// What every Collectives implementation over c10d shares (gloo_collectives, nccl_collectives,
// device_mesh): the checks, result shapes and byte counts of the collectives whose arithmetic
// depends on the group size (a one-rank group makes every collective the identity, so the
// multi-rank arithmetic is tested here, host-side: collective_checks_test), and the one-line
// reason of a c10d failure.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace mixtrain {

// The result of an all_to_all of `input` with these counts on rank `rank` of `size`, after the
// checks (std::invalid_argument naming `group`): one send and one receive count per rank, none
// negative, the send counts summing to input's rows.
struct AllToAllShape {
  std::vector<int64_t> result;  // [sum(recv_counts), input.shape[1:]...]
  int64_t sent_bytes = 0;       // the rows this rank sends to its peers (core/collectives.h)
};
AllToAllShape check_all_to_all(const std::string& group, int rank, int size,
                               const at::Tensor& input, const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& recv_counts);

// An all_gather of `local` over `size` ranks: the result is every rank's block along dim 0
// (a 0-dim local gathers into a vector of `size`); `block` is the shape local takes as one block
// of it; the bytes charged are local's to each of the size - 1 peers (core/collectives.h).
struct AllGatherShape {
  std::vector<int64_t> result;  // [size * rows, local.shape[1:]...]
  std::vector<int64_t> block;   // [rows, local.shape[1:]...]
  int64_t sent_bytes = 0;
};
AllGatherShape all_gather_shape(const at::Tensor& local, int size);

// A reduce_scatter_sum of `full` over `size` ranks, after the checks (std::invalid_argument
// naming `group`: a dtype the contract does not reduce (bfloat16, uint8, int8), a 0-dim tensor
// or a dim 0 not divisible by `size`): this rank's result shape (dim 0 / size), the chunk rows,
// and the bytes charged: the size - 1 peers' chunks of `wire_nbytes` (the bytes of what goes on
// the wire: NCCL widens float16 to float32 first).
struct ReduceScatterShape {
  std::vector<int64_t> result;  // [full.shape[0] / size, full.shape[1:]...]
  int64_t rows = 0;
  int64_t sent_bytes = 0;
};
ReduceScatterShape check_reduce_scatter(const std::string& group, int size, const at::Tensor& full,
                                        int64_t wire_nbytes);

// A broadcast from `root` of a tensor of `nbytes` on rank `rank` of `size`: std::invalid_argument
// naming `group` for a root out of range; else the bytes charged to this rank (core/collectives.h:
// the root's tensor reaches the size - 1 peers, charged to the root; 0 elsewhere).
int64_t check_broadcast(const std::string& group, int rank, int size, int root, int64_t nbytes);

// std::invalid_argument naming `group` and `op` unless `type` is a payload dtype of
// core/collectives.h (float32/64, float16, bfloat16, uint8, int8, int32, int64).
void check_payload_dtype(const std::string& group, const char* op, at::ScalarType type);

// c10::Error::what() carries a C++ backtrace after the first line; the first line is the reason.
std::string first_line(const std::exception& error);

}  // namespace mixtrain
