#include "mixtrain/optim/swap_file_tier.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "mixtrain/core/caching_cpu_allocator.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/large_buffer.h"

namespace mixtrain {
namespace {

// Keeps the TensorImpl and drops only its storage. Memory from the caching CPU allocator (state
// created in memory) goes back to the system, not into its cache: the point of swapping is that
// it leaves the process.
void drop_storage(const at::Tensor& t) {
  CachingCpuAllocator::release_to_system_on_free(t.storage().data_ptr());
  empty_state_storage(t);
}

// Memory for state read back from the file, mapped directly from the kernel: freeing it when
// the state goes back out returns it at once (the heap would keep freed blocks of these sizes).
at::Tensor mapped_empty(const at::Tensor& like) {
  try {
    return empty_mapped(like.sizes(), like.options(), HugePages::kNo);
  } catch (const std::system_error& e) {
    throw UserError("swap optimizer: cannot map " +
                    std::to_string(std::max<int64_t>(state_nbytes(like), 1)) +
                    " bytes for optimizer state: " + errno_text(e.code().value()));
  }
}

}  // namespace

// ---- SwapFile ----------------------------------------------------------------------------------

SwapFile::SwapFile(std::string path) : path_(std::move(path)) {
  fd_ = FileDescriptor::open(path_, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (!fd_.valid()) {
    throw UserError("swap optimizer: cannot create the swap file " + path_ + ": " + errno_text() +
                    " (the swap directory must be writable)");
  }
}

SwapFile::~SwapFile() {
  fd_.reset();
  ::unlink(path_.c_str());
}

void SwapFile::write(int64_t offset, const void* data, int64_t bytes) {
  const IoResult r = pwrite_all(fd_.get(), data, static_cast<size_t>(bytes), offset);
  if (r.done < static_cast<size_t>(bytes)) {
    throw UserError("swap optimizer: cannot write " + std::to_string(bytes) +
                    " bytes of optimizer state at offset " + std::to_string(offset) + " of " +
                    path_ + ": " + (r.error != 0 ? errno_text(r.error) : "no progress"));
  }
  // Start the write-back now and let the kernel drop the pages once clean: the state must not
  // simply move from the process into the page cache.
  ::sync_file_range(fd_.get(), offset, bytes, SYNC_FILE_RANGE_WRITE);
  ::posix_fadvise(fd_.get(), offset, bytes, POSIX_FADV_DONTNEED);
}

void SwapFile::read(int64_t offset, void* data, int64_t bytes) const {
  const IoResult r = pread_all(fd_.get(), data, static_cast<size_t>(bytes), offset);
  if (r.error != 0) {
    throw UserError("swap optimizer: cannot read optimizer state at offset " +
                    std::to_string(offset) + " of " + path_ + ": " + errno_text(r.error));
  }
  if (r.done < static_cast<size_t>(bytes)) {
    throw UserError("swap optimizer: " + path_ + " ends at byte " +
                    std::to_string(offset + static_cast<int64_t>(r.done)) +
                    " but optimizer state was written up to " + std::to_string(offset + bytes) +
                    ": the swap file was truncated");
  }
  ::posix_fadvise(fd_.get(), offset, bytes, POSIX_FADV_DONTNEED);
}

void SwapFile::check_intact(int64_t expected_bytes) const {
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) {
    throw UserError("swap optimizer: cannot stat " + path_ + ": " + errno_text());
  }
  if (st.st_nlink == 0) {
    throw UserError("swap optimizer: the swap file " + path_ +
                    " was deleted while training ran; its optimizer state is lost for any "
                    "other process (this run still held it, but stops rather than go on "
                    "with state nobody can inspect)");
  }
  if (st.st_size < expected_bytes) {
    throw UserError("swap optimizer: the swap file " + path_ + " has " +
                    std::to_string(st.st_size) + " bytes but " + std::to_string(expected_bytes) +
                    " were written: it was truncated while training ran");
  }
}

// ---- SwapFileTier ------------------------------------------------------------------------------

SwapFileTier::SwapFileTier(const std::string& path) : file_(path) {
  io_thread_ = std::thread([this] { io_loop(); });
}

SwapFileTier::~SwapFileTier() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  io_thread_.join();
}

void SwapFileTier::place(const SwapItem& item) {
  std::vector<int64_t> offsets;
  int64_t at = file_bytes_;
  for (const auto& t : item.tensors) {
    if (!t.device().is_cpu()) {
      throw std::logic_error("swap optimizer: the file tier swaps CPU tensors; state on " +
                             t.device().str() + " needs the device tier");
    }
    offsets.push_back(at);
    at += state_nbytes(t);
  }
  file_bytes_ += (at - file_bytes_ + 4095) / 4096 * 4096;  // page-aligned regions
  offsets_[item.key] = std::move(offsets);
}

SwapFileTier::Work SwapFileTier::work_of(const std::vector<SwapItem>& items) const {
  Work work;
  for (const auto& item : items) {
    const std::vector<int64_t>& offsets = offsets_.at(item.key);
    for (size_t i = 0; i < item.tensors.size(); ++i) work.emplace_back(item.tensors[i], offsets[i]);
  }
  return work;
}

int64_t SwapFileTier::enqueue(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mutex_);
  tasks_.push_back(std::move(task));
  changed_.notify_all();
  return ++enqueued_;
}

void SwapFileTier::io_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, nothing left
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    try {
      task();
    } catch (...) {
      lock.lock();
      if (!io_error_) io_error_ = std::current_exception();
      lock.unlock();
    }
    lock.lock();
    ++completed_;
    changed_.notify_all();
  }
}

void SwapFileTier::rethrow_io_error() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (io_error_) std::rethrow_exception(io_error_);
}

void SwapFileTier::begin_step() {
  rethrow_io_error();
  file_.check_intact(written_end_);
}

void SwapFileTier::read(int64_t group, std::vector<SwapItem> items) {
  read_ticket_[group] = enqueue([this, work = work_of(items)] {
    for (const auto& [t, at] : work) {
      if (state_in_memory(t)) continue;  // imported or created since: the live value is newer
      at::Tensor data = mapped_empty(t);
      file_.read(at, data.data_ptr(), state_nbytes(t));
      adopt_state_storage(t, data);
      count_resident(state_nbytes(t));
    }
  });
}

void SwapFileTier::write(std::vector<SwapItem> items) {
  for (const auto& item : items) {
    int64_t bytes = 0;
    for (const auto& t : item.tensors) bytes += state_nbytes(t);
    // An empty state (a parameter with no rows on this rank) writes nothing: its aligned offset
    // may lie past the file's end without the file having been truncated.
    if (bytes == 0) continue;
    // On this thread; a failed write fails the run.
    written_end_ = std::max(written_end_, offsets_.at(item.key).front() + bytes);
  }
  enqueue([this, work = work_of(items)] {
    for (const auto& [t, at] : work) {
      if (state_in_memory(t)) file_.write(at, t.data_ptr(), state_nbytes(t));
    }
    for (const auto& [t, at] : work) {
      if (state_in_memory(t)) count_resident(-state_nbytes(t));
      drop_storage(t);
    }
  });
}

void SwapFileTier::wait_usable(int64_t group) {
  const int64_t ticket = read_ticket_.at(group);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return completed_ >= ticket || io_error_ != nullptr; });
  }
  rethrow_io_error();
}

void SwapFileTier::drain() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return completed_ == enqueued_; });
  }
  rethrow_io_error();
}

at::Tensor SwapFileTier::read_home(const void* key, size_t index, const at::Tensor& like) {
  file_.check_intact(written_end_);
  at::Tensor data = at::empty(like.sizes(), like.options());
  file_.read(offsets_.at(key).at(index), data.data_ptr(), state_nbytes(like));
  return data;
}

}  // namespace mixtrain
