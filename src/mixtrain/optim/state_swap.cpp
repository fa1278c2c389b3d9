#include "mixtrain/optim/state_swap.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "mixtrain/core/caching_cpu_allocator.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/large_buffer.h"
#include "mixtrain/core/posix_file.h"
#include "mixtrain/optim/leaf_optimizer.h"

namespace mixtrain {
namespace {

int64_t nbytes(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

bool in_memory(const at::Tensor& t) {
  return t.numel() == 0 || (t.storage().data() != nullptr && t.storage().nbytes() > 0);
}

// Keeps the TensorImpl (shape, dtype, the leaves' handles) and swaps only its storage. Memory
// from the caching CPU allocator (state created in memory) goes back to the system, not into
// its cache: the point of swapping is that it leaves the process.
void drop_storage(const at::Tensor& t) {
  CachingCpuAllocator::release_to_system_on_free(t.storage().data_ptr());
  t.unsafeGetTensorImpl()->set_storage_keep_dtype(at::empty({0}, t.options()).storage());
}
void adopt_storage(const at::Tensor& t, const at::Tensor& data) {
  t.unsafeGetTensorImpl()->set_storage_keep_dtype(data.storage());
}

// Memory for state read back from the file, mapped directly from the kernel: freeing it when
// the state goes back out returns it at once (the heap would keep freed blocks of these sizes).
at::Tensor mapped_empty(const at::Tensor& like) {
  try {
    return empty_mapped(like.sizes(), like.options(), HugePages::kNo);
  } catch (const std::system_error& e) {
    throw UserError("swap optimizer: cannot map " +
                    std::to_string(std::max<int64_t>(nbytes(like), 1)) +
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

// ---- StateSwap ---------------------------------------------------------------------------------

StateSwap::StateSwap(const std::string& path, int64_t bucket_bytes, int64_t merge_buckets)
    : file_(path),
      bucket_bytes_(std::max<int64_t>(1, bucket_bytes)),
      merge_buckets_(std::max<int64_t>(1, merge_buckets)) {
  io_thread_ = std::thread([this] { io_loop(); });
}

StateSwap::~StateSwap() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  io_thread_.join();
}

std::vector<at::Tensor> StateSwap::swappable(LeafOptimizer& leaf, const at::Tensor& param) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : leaf.export_state(param)) {
    if (t.defined() && at::isFloatingType(t.scalar_type()) && t.dim() >= 1) out.push_back(t);
  }
  return out;
}

StateSwap::Entry& StateSwap::register_param(LeafOptimizer& leaf, const at::Tensor& param) {
  const void* key = param.unsafeGetTensorImpl();
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second;
  Entry e;
  e.leaf = &leaf;
  e.param = param;
  for (const auto& t : swappable(leaf, param)) {
    if (!t.is_contiguous() || t.storage_offset() != 0) {
      throw std::logic_error("swap optimizer: " + leaf.kind() +
                             " state of a parameter is not a contiguous tensor of its own");
    }
    e.bytes += nbytes(t);
  }
  e.offset = file_bytes_;
  file_bytes_ += (e.bytes + 4095) / 4096 * 4096;  // page-aligned regions
  return entries_.emplace(key, std::move(e)).first->second;
}

void StateSwap::io_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, nothing left
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    busy_ = true;
    lock.unlock();
    task();  // records its own errors
    lock.lock();
    busy_ = false;
    changed_.notify_all();
  }
}

void StateSwap::enqueue_read(int64_t group) {
  std::vector<std::pair<std::vector<at::Tensor>, int64_t>> work;  // live tensors, file offset
  for (const void* key : groups_[group].members) {
    Entry& e = entries_.at(key);
    std::vector<at::Tensor> tensors = swappable(*e.leaf, e.param);
    if (!tensors.empty() && e.on_file) work.emplace_back(std::move(tensors), e.offset);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  groups_[group].state = GroupState::kReading;
  tasks_.push_back([this, group, work = std::move(work)] {
    try {
      for (const auto& [tensors, offset] : work) {
        int64_t at = offset;
        for (const auto& t : tensors) {
          if (in_memory(t)) {  // imported or created since: the live value is newer
            at += nbytes(t);
            continue;
          }
          at::Tensor data = mapped_empty(t);
          file_.read(at, data.data_ptr(), nbytes(t));
          adopt_storage(t, data);
          at += nbytes(t);
        }
      }
      std::lock_guard<std::mutex> done(mutex_);
      // A write queued behind this read (the leaves moved past the group) owns it now.
      if (groups_[group].state == GroupState::kReading)
        groups_[group].state = GroupState::kInMemory;
    } catch (...) {
      std::lock_guard<std::mutex> done(mutex_);
      groups_[group].state = GroupState::kFailed;
      if (!io_error_) io_error_ = std::current_exception();
    }
  });
  changed_.notify_all();
}

void StateSwap::enqueue_write_entries(std::vector<const void*> keys, int64_t group) {
  std::vector<std::pair<std::vector<at::Tensor>, int64_t>> work;
  for (const void* key : keys) {
    Entry& e = entries_.at(key);
    std::vector<at::Tensor> tensors = swappable(*e.leaf, e.param);
    if (tensors.empty()) continue;
    e.on_file = true;  // bookkeeping stays on this thread; a failed write fails the run
    written_end_ = std::max(written_end_, e.offset + e.bytes);
    work.emplace_back(std::move(tensors), e.offset);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (group >= 0) groups_[group].state = GroupState::kWriting;
  tasks_.push_back([this, group, work = std::move(work)] {
    try {
      for (const auto& [tensors, offset] : work) {
        int64_t at = offset;
        for (const auto& t : tensors) {
          if (in_memory(t)) file_.write(at, t.data_ptr(), nbytes(t));
          at += nbytes(t);
        }
      }
      for (const auto& [tensors, offset] : work) {
        for (const auto& t : tensors) drop_storage(t);
      }
      std::lock_guard<std::mutex> done(mutex_);
      if (group >= 0) groups_[group].state = GroupState::kOnFile;
    } catch (...) {
      std::lock_guard<std::mutex> done(mutex_);
      if (group >= 0) groups_[group].state = GroupState::kFailed;
      if (!io_error_) io_error_ = std::current_exception();
    }
  });
  changed_.notify_all();
}

void StateSwap::enqueue_write(int64_t group) {
  enqueue_write_entries(groups_[group].members, group);
}

StateSwap::GroupState StateSwap::state_of(int64_t group) {
  std::lock_guard<std::mutex> lock(mutex_);
  return groups_[group].state;
}

void StateSwap::wait_for(int64_t group, GroupState state) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] {
    return groups_[group].state == state || groups_[group].state == GroupState::kFailed ||
           io_error_ != nullptr;
  });
  lock.unlock();
  rethrow_io_error();
}

void StateSwap::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return tasks_.empty() && !busy_; });
}

void StateSwap::rethrow_io_error() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (io_error_) std::rethrow_exception(io_error_);
}

void StateSwap::begin_step() {
  rethrow_io_error();
  file_.check_intact(written_end_);
  in_step_ = true;
  order_.clear();
  current_group_ = -1;
  for (int64_t g = 0; g < std::min<int64_t>(2, groups()); ++g) {
    if (state_of(g) == GroupState::kOnFile) enqueue_read(g);
  }
}

void StateSwap::acquire(LeafOptimizer& leaf, const at::Tensor& param) {
  (void)leaf;
  const void* key = param.unsafeGetTensorImpl();
  order_.push_back(key);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.group < 0) return;  // no state on file yet
  const int64_t g = it->second.group;
  if (g > current_group_) {
    // The leaves moved on: what they used before goes back to the file (after its read, in
    // queue order), then the next group is read ahead.
    for (int64_t h = 0; h < g; ++h) {
      const GroupState s = state_of(h);
      if (s == GroupState::kInMemory || s == GroupState::kReading) enqueue_write(h);
    }
    current_group_ = g;
    for (int64_t h = g; h < std::min(g + 2, groups()); ++h) {
      if (state_of(h) == GroupState::kOnFile) enqueue_read(h);
    }
  } else if (state_of(g) == GroupState::kWriting || state_of(g) == GroupState::kOnFile) {
    // Out of order: back into memory now; it is written again at end_step.
    wait_for(g, GroupState::kOnFile);
    enqueue_read(g);
  }
  wait_for(g, GroupState::kInMemory);
}

void StateSwap::release(LeafOptimizer& leaf, const at::Tensor& param) {
  const void* key = param.unsafeGetTensorImpl();
  if (entries_.count(key)) return;
  if (swappable(leaf, param).empty()) return;
  // State that appeared in this step: out to the file a group's worth at a time, at most one
  // such group being written while the next fills.
  Entry& e = register_param(leaf, param);
  fresh_.push_back(key);
  fresh_bytes_ += e.bytes;
  if (fresh_bytes_ >= bucket_bytes_ * merge_buckets_) {
    wait_idle();
    rethrow_io_error();
    enqueue_write_entries(std::exchange(fresh_, {}), -1);
    fresh_bytes_ = 0;
  }
}

void StateSwap::end_step() {
  for (int64_t g = 0; g < groups(); ++g) {
    const GroupState s = state_of(g);
    if (s == GroupState::kInMemory || s == GroupState::kReading) enqueue_write(g);
  }
  if (!fresh_.empty()) enqueue_write_entries(std::exchange(fresh_, {}), -1);
  fresh_bytes_ = 0;
  wait_idle();
  in_step_ = false;
  current_group_ = -1;
  rethrow_io_error();
  // Lay the groups out in this step's acquire order when it changed (first step, new state).
  std::vector<const void*> layout;
  for (const auto& group : groups_)
    layout.insert(layout.end(), group.members.begin(), group.members.end());
  std::vector<const void*> seen;
  std::unordered_set<const void*> unique;
  for (const void* key : order_) {
    if (entries_.count(key) && unique.insert(key).second) seen.push_back(key);
  }
  if (seen != layout || static_cast<size_t>(entries_.size()) != layout.size()) rebuild_groups(seen);
}

void StateSwap::rebuild_groups(const std::vector<const void*>& order) {
  std::vector<const void*> keys = order;
  std::unordered_set<const void*> placed(order.begin(), order.end());
  for (const auto& [key, e] : entries_) {
    if (!placed.count(key)) keys.push_back(key);  // state not used this step: last
  }
  groups_.clear();
  int64_t bucket_fill = 0, buckets_in_group = 0;
  for (const void* key : keys) {
    if (groups_.empty() || buckets_in_group == merge_buckets_) {
      groups_.emplace_back();
      buckets_in_group = 0;
    }
    Entry& e = entries_.at(key);
    e.group = static_cast<int64_t>(groups_.size()) - 1;
    groups_.back().members.push_back(key);
    bucket_fill += e.bytes;
    if (bucket_fill >= bucket_bytes_) {
      bucket_fill = 0;
      ++buckets_in_group;
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> StateSwap::read_state(LeafOptimizer& leaf,
                                                                      const at::Tensor& param) {
  wait_idle();
  rethrow_io_error();
  auto state = leaf.export_state(param);
  auto it = entries_.find(param.unsafeGetTensorImpl());
  int64_t at = it != entries_.end() ? it->second.offset : 0;
  for (auto& [name, t] : state) {
    if (!(t.defined() && at::isFloatingType(t.scalar_type()) && t.dim() >= 1)) continue;
    if (!in_memory(t)) {
      file_.check_intact(written_end_);
      at::Tensor data = at::empty(t.sizes(), t.options());
      file_.read(at, data.data_ptr(), nbytes(t));
      t = data;
    }
    at += nbytes(t);
  }
  return state;
}

void StateSwap::store(const std::vector<std::pair<LeafOptimizer*, at::Tensor>>& params) {
  wait_idle();
  rethrow_io_error();
  std::vector<const void*> order;
  for (const auto& group : groups_)
    order.insert(order.end(), group.members.begin(), group.members.end());
  std::vector<const void*> keys;
  for (const auto& [leaf, param] : params) {
    if (swappable(*leaf, param).empty()) continue;
    const bool known = entries_.count(param.unsafeGetTensorImpl()) != 0;
    register_param(*leaf, param);
    if (!known) order.push_back(param.unsafeGetTensorImpl());
    keys.push_back(param.unsafeGetTensorImpl());
  }
  enqueue_write_entries(keys, -1);
  wait_idle();
  rethrow_io_error();
  rebuild_groups(order);
}

}  // namespace mixtrain
