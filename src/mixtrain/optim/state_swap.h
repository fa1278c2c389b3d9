// Swap optimizer (docs/architecture.md §9; the Muon feature's swap_optimizer / swap_merge_buckets):
// AdamW's exp_avg / exp_avg_sq and Muon's momentum_buffer live in a file between steps and come
// into memory bucket by bucket while step() runs.
//
// The leaves (AdamW, Muon on every path) bracket each parameter's state use with
// acquire(param) / release(param) (LeafOptimizer::acquire_state). The floating state tensors of
// a parameter keep their TensorImpl, shape and dtype at all times; only their storage comes and
// goes (an empty storage while swapped out), so the leaves' state maps, shape checks and
// checkpoint keys never notice. A state tensor swapped out must not be read.
//
// Schedule: parameters are laid out in the file and grouped in the order the leaves acquired
// them in the previous step (the order is the same every step): buckets of `bucket_bytes` of
// state, groups of `merge_buckets` buckets. During a step, while group g is in use, group g+1
// is read ahead and, once the leaves moved past g, g is written back and dropped, on one I/O
// thread in that order, so at most two groups are in memory. Parameters acquired out of order
// are brought in synchronously (correct, just slower); parameters whose state appears during a
// step (first step, or initialize_state) are written out as soon as a group's worth of them
// exists. Values go through the file bit for bit: swap on and off train identically.
//
// The file (`<dir>/optimizer_state.rank<r>.swap`) is written with pwrite and read with pread;
// written ranges are queued for write-back and read ranges dropped from the page cache
// (posix_fadvise DONTNEED), so neither the process nor the page cache keeps the state. Errors
// (directory not writable, disk full, the file deleted or truncated while training) raise a
// UserError naming the file, on the training thread, at the next acquire or at end_step; a
// failed read never leaves a half-filled tensor in use.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "mixtrain/core/posix_file.h"

namespace mixtrain {

class LeafOptimizer;

// One rank's swap file. Errors: UserError naming the path.
class SwapFile {
 public:
  explicit SwapFile(std::string path);  // creates (truncates) it; the directory must exist
  ~SwapFile();                          // closes and deletes it
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  const std::string& path() const { return path_; }
  void write(int64_t offset, const void* data, int64_t bytes);
  void read(int64_t offset, void* data, int64_t bytes) const;
  // Throws when the file was deleted or is shorter than `expected_bytes`.
  void check_intact(int64_t expected_bytes) const;

 private:
  std::string path_;
  FileDescriptor fd_;
};

class StateSwap {
 public:
  StateSwap(const std::string& path, int64_t bucket_bytes, int64_t merge_buckets);
  ~StateSwap();
  StateSwap(const StateSwap&) = delete;
  StateSwap& operator=(const StateSwap&) = delete;

  // Around every leaf step (ChainedOptimizer::step_with_ready_grads, initialize_state).
  void begin_step();
  void end_step();  // writes back everything in memory and waits; rethrows I/O errors
  // The leaves, around their use of one parameter's state.
  void acquire(LeafOptimizer& leaf, const at::Tensor& param);
  void release(LeafOptimizer& leaf, const at::Tensor& param);

  // Outside steps. The state of `param` as leaf.export_state names it, with swapped-out tensors
  // read from the file into new tensors (the live state is not touched).
  std::vector<std::pair<std::string, at::Tensor>> read_state(LeafOptimizer& leaf,
                                                             const at::Tensor& param);
  // After state was imported into the leaves (checkpoint load): writes every listed
  // parameter's state to the file and drops it from memory.
  void store(const std::vector<std::pair<LeafOptimizer*, at::Tensor>>& params);

  const std::string& path() const { return file_.path(); }
  int64_t file_bytes() const { return file_bytes_; }
  int64_t groups() const { return static_cast<int64_t>(groups_.size()); }

 private:
  struct Entry {
    LeafOptimizer* leaf = nullptr;
    at::Tensor param;
    int64_t offset = 0;  // in the file
    int64_t bytes = 0;   // of all its swapped tensors
    bool on_file = false;
    int64_t group = -1;
  };
  enum class GroupState { kOnFile, kReading, kInMemory, kWriting, kFailed };
  struct Group {
    std::vector<const void*> members;  // Entry keys, acquire order
    GroupState state = GroupState::kOnFile;
  };
  // The live floating state tensors of a parameter (main thread only).
  static std::vector<at::Tensor> swappable(LeafOptimizer& leaf, const at::Tensor& param);
  Entry& register_param(LeafOptimizer& leaf, const at::Tensor& param);
  void enqueue_read(int64_t group);
  void enqueue_write(int64_t group);
  void enqueue_write_entries(std::vector<const void*> keys, int64_t group);
  GroupState state_of(int64_t group);  // under the lock: the I/O thread changes it
  void wait_for(int64_t group, GroupState state);
  void wait_idle();
  void rethrow_io_error();
  void rebuild_groups(const std::vector<const void*>& order);
  void io_loop();

  SwapFile file_;
  int64_t bucket_bytes_, merge_buckets_;
  int64_t file_bytes_ = 0;   // regions handed out (page-aligned)
  int64_t written_end_ = 0;  // end of the last region written: the file's least length
  std::unordered_map<const void*, Entry> entries_;  // by optimizer-param TensorImpl
  std::vector<Group> groups_;
  // This step: acquire order, the group in use, state that appeared (not yet on file).
  std::vector<const void*> order_;
  int64_t current_group_ = -1;
  std::vector<const void*> fresh_;
  int64_t fresh_bytes_ = 0;
  bool in_step_ = false;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;
  bool busy_ = false, stopping_ = false;
  std::exception_ptr io_error_;
  std::thread io_thread_;
};

}  // namespace mixtrain
