// The multi-tensor launches' grid (adamw_kernel.cu, sum_of_squares_kernel.cu): block b works on
// one fixed-size chunk of one tensor; tensor t owns blocks [first_chunk[t], first_chunk[t+1]).
#pragma once

// The tensor whose chunks include `chunk`: the last t with first_chunk[t] <= chunk (binary
// search over the launch's `count` tensors; first_chunk is ascending, first_chunk[0] == 0).
__device__ inline int tensor_of_chunk(const int* first_chunk, int count, int chunk) {
  int t = 0, hi = count - 1;
  while (t < hi) {
    const int mid = (t + hi + 1) / 2;
    if (first_chunk[mid] <= chunk) {
      t = mid;
    } else {
      hi = mid - 1;
    }
  }
  return t;
}
