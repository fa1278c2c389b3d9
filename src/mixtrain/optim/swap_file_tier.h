// The swap optimizer's file tier (swap_tier.h), for CPU tensors: state lives in one file per rank
// between steps, moved by one I/O thread in the order the schedule asks.
//
// The file (`<dir>/optimizer_state.rank<r>.swap`) is written with pwrite and read with pread;
// each parameter has a page-aligned region, its tensors back to back. Written ranges are queued
// for write-back and read ranges dropped from the page cache (posix_fadvise DONTNEED), so neither
// the process nor the page cache keeps the state; state read back is mapped from the kernel
// (core/large_buffer.h), so dropping it returns the memory at once. Errors (directory not
// writable, disk full, the file deleted or truncated while training) raise a UserError naming
// the file, on the training thread, at the next wait_usable, throttle, finish_step or drain; a
// failed read never leaves a half-filled tensor in use.
#pragma once

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
#include "mixtrain/optim/swap_tier.h"

namespace mixtrain {

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

class SwapFileTier final : public SwapTier {
 public:
  explicit SwapFileTier(const std::string& path);  // creates the file (SwapFile's errors)
  ~SwapFileTier() override;                        // finishes the queued transfers
  SwapFileTier(const SwapFileTier&) = delete;
  SwapFileTier& operator=(const SwapFileTier&) = delete;

  std::string where() const override { return file_.path(); }
  const std::string& path() const { return file_.path(); }
  int64_t file_bytes() const { return file_bytes_; }

  void place(const SwapItem& item) override;
  void begin_step() override;  // rethrows an I/O error; the file must be intact
  void read(int64_t group, std::vector<SwapItem> items) override;
  void write(std::vector<SwapItem> items) override;
  void wait_usable(int64_t group) override;  // waits on the host for the group's read
  void throttle() override { drain(); }
  void finish_step() override { drain(); }
  void drain() override;
  at::Tensor read_home(const void* key, size_t index, const at::Tensor& like) override;

 private:
  // Live tensors with their file offsets.
  using Work = std::vector<std::pair<at::Tensor, int64_t>>;
  Work work_of(const std::vector<SwapItem>& items) const;
  int64_t enqueue(std::function<void()> task);  // returns the task's ticket
  void io_loop();
  void rethrow_io_error();

  SwapFile file_;
  int64_t file_bytes_ = 0;   // regions handed out (page-aligned)
  int64_t written_end_ = 0;  // end of the last region written: the file's least length
  std::unordered_map<const void*, std::vector<int64_t>> offsets_;  // per tensor, by key
  std::unordered_map<int64_t, int64_t> read_ticket_;               // by group: its last read

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;
  int64_t enqueued_ = 0, completed_ = 0;  // tickets: tasks run in the order they were queued
  bool stopping_ = false;
  std::exception_ptr io_error_;
  std::thread io_thread_;
};

}  // namespace mixtrain
