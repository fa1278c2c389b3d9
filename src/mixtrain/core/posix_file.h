// POSIX file I/O with the loops written once: a file descriptor that closes itself, whole
// transfers that retry on EINTR and continue after short reads and writes, fsync of a file or
// a directory, and an atomic replace (temp file, fsync, rename, fsync of the directory).
//
// The transfer loops report rather than throw (IoResult), so that each caller keeps the message
// that names what its file is for; the *_or_throw forms and AtomicFile throw the messages that
// most readers and writers share, each naming the path and strerror.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace mixtrain {

// strerror(err), by default of the current errno.
std::string errno_text(int err);
std::string errno_text();

// Owns one open file descriptor (or none: -1); closes it when destroyed or reset. Move-only.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() { reset(); }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  // ::open(path, flags | O_CLOEXEC, mode); not valid(), with errno set, when it fails.
  static FileDescriptor open(const std::string& path, int flags, mode_t mode = 0);

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  // Closes the descriptor held (its close error is not reported: use close() where it matters).
  void reset(int fd = -1);
  // Closes it and returns 0, or the errno of close (the descriptor is gone either way).
  int close();

 private:
  int fd_ = -1;
};

// The outcome of a whole transfer: done == size with error 0 when complete; error is the errno
// of the call that failed; error 0 with done < size is end of file (reads) or a write the
// kernel accepted no byte of (writes).
struct IoResult {
  size_t done = 0;
  int error = 0;
};

// Transfers all `size` bytes (at `offset` for the p* forms), retrying EINTR and continuing
// after short transfers.
IoResult write_all(int fd, const void* data, size_t size);
IoResult pwrite_all(int fd, const void* data, size_t size, uint64_t offset);
IoResult pread_all(int fd, void* data, size_t size, uint64_t offset);

// write_all; UserError "<path>: write failed: <strerror>".
void write_all_or_throw(int fd, const void* data, size_t size, const std::string& path);
// pread_all; DataError "<path>: read failed: <strerror>", or on end of file
// "<path>: unexpected end of file (truncated?)".
void pread_all_or_throw(int fd, void* data, size_t size, uint64_t offset, const std::string& path);

// Opens `path` (a directory when `directory`) and fsyncs it. UserError
// "<path>: cannot open for fsync: <strerror>" / "<path>: fsync failed: <strerror>".
void fsync_path(const std::string& path, bool directory);
// fsync_path of the directory that holds `path` ("." for a bare name).
void fsync_parent_directory(const std::string& path);

// Replaces `path` atomically: the bytes go to `tmp_path` (created 0644, truncated), and
// publish() fsyncs it, closes it, renames it over `path` and, when asked, fsyncs the directory,
// so a reader sees the old file or the whole new one. Not published: the destructor removes
// the temp file. Errors (UserError): "<tmp>: cannot create: <strerror>", "<tmp>: write failed:
// <strerror>", "<tmp>: fsync failed: <strerror>", "<path>: cannot rename into place:
// <strerror>" (the temp file removed), and fsync_path's for the directory.
class AtomicFile {
 public:
  AtomicFile(std::string path, std::string tmp_path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // <path>.tmp-<pid>: the pid keeps two processes writing the same file apart.
  static std::string pid_tmp_path(const std::string& path);

  void write(const void* data, size_t size);
  void write(const std::string& bytes) { write(bytes.data(), bytes.size()); }
  void publish(bool sync_directory);

 private:
  std::string path_;
  std::string tmp_path_;
  FileDescriptor fd_;
  bool published_ = false;
};

}  // namespace mixtrain
