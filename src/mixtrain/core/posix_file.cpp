#include "mixtrain/core/posix_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "mixtrain/core/error.h"

namespace mixtrain {

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string errno_text() {
  return errno_text(errno);
}

// ---- FileDescriptor ----------------------------------------------------------------------------

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

FileDescriptor FileDescriptor::open(const std::string& path, int flags, mode_t mode) {
  return FileDescriptor(::open(path.c_str(), flags | O_CLOEXEC, mode));
}

int FileDescriptor::release() {
  return std::exchange(fd_, -1);
}

void FileDescriptor::reset(int fd) {
  const int old = std::exchange(fd_, fd);
  if (old >= 0) {
    const int saved = errno;  // a caller may still read the errno of the call that failed
    ::close(old);
    errno = saved;
  }
}

int FileDescriptor::close() {
  const int old = release();
  if (old < 0) return 0;
  return ::close(old) == 0 ? 0 : errno;
}

// ---- whole transfers ---------------------------------------------------------------------------

namespace {

// Calls `transfer(offset_into_buffer)` until `size` bytes moved: it returns what read/write
// return. Retries EINTR; a 0 return ends the loop (end of file, or no progress).
template <typename Transfer>
IoResult transfer_all(size_t size, Transfer transfer) {
  IoResult result;
  while (result.done < size) {
    const ssize_t n = transfer(result.done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      result.error = errno;
      break;
    }
    if (n == 0) break;
    result.done += static_cast<size_t>(n);
  }
  return result;
}

}  // namespace

IoResult write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  return transfer_all(size, [&](size_t done) { return ::write(fd, p + done, size - done); });
}

IoResult pwrite_all(int fd, const void* data, size_t size, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  return transfer_all(size, [&](size_t done) {
    return ::pwrite(fd, p + done, size - done, static_cast<off_t>(offset + done));
  });
}

IoResult pread_all(int fd, void* data, size_t size, uint64_t offset) {
  char* p = static_cast<char*>(data);
  return transfer_all(size, [&](size_t done) {
    return ::pread(fd, p + done, size - done, static_cast<off_t>(offset + done));
  });
}

void write_all_or_throw(int fd, const void* data, size_t size, const std::string& path) {
  const IoResult r = write_all(fd, data, size);
  if (r.done < size) {
    // A write of no byte without an errno: the kernel's way of saying the device is full.
    throw UserError(path + ": write failed: " + errno_text(r.error != 0 ? r.error : ENOSPC));
  }
}

void pread_all_or_throw(int fd, void* data, size_t size, uint64_t offset, const std::string& path) {
  const IoResult r = pread_all(fd, data, size, offset);
  if (r.error != 0) throw DataError(path + ": read failed: " + errno_text(r.error));
  if (r.done < size) throw DataError(path + ": unexpected end of file (truncated?)");
}

// ---- fsync -------------------------------------------------------------------------------------

void fsync_path(const std::string& path, bool directory) {
  FileDescriptor fd = FileDescriptor::open(path, O_RDONLY | (directory ? O_DIRECTORY : 0));
  if (!fd.valid()) throw UserError(path + ": cannot open for fsync: " + errno_text());
  if (::fsync(fd.get()) != 0) throw UserError(path + ": fsync failed: " + errno_text());
}

void fsync_parent_directory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  fsync_path(parent.empty() ? "." : parent.string(), true);
}

// ---- AtomicFile --------------------------------------------------------------------------------

AtomicFile::AtomicFile(std::string path, std::string tmp_path)
    : path_(std::move(path)), tmp_path_(std::move(tmp_path)) {
  fd_ = FileDescriptor::open(tmp_path_, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!fd_.valid()) throw UserError(tmp_path_ + ": cannot create: " + errno_text());
}

AtomicFile::~AtomicFile() {
  if (published_) return;
  fd_.reset();
  ::unlink(tmp_path_.c_str());
}

std::string AtomicFile::pid_tmp_path(const std::string& path) {
  return path + ".tmp-" + std::to_string(::getpid());
}

void AtomicFile::write(const void* data, size_t size) {
  write_all_or_throw(fd_.get(), data, size, tmp_path_);
}

void AtomicFile::publish(bool sync_directory) {
  // The data is on disk before the name points at it.
  if (::fsync(fd_.get()) != 0) throw UserError(tmp_path_ + ": fsync failed: " + errno_text());
  if (const int err = fd_.close(); err != 0) {
    throw UserError(tmp_path_ + ": write failed: " + errno_text(err));
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    throw UserError(path_ + ": cannot rename into place: " + errno_text());
  }
  published_ = true;
  if (sync_directory) fsync_parent_directory(path_);
}

}  // namespace mixtrain
