// core/posix_file.h: whole transfers across short writes and EINTR, end of file, and the
// atomic replace, each error naming the file.
#include "mixtrain/core/posix_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

class PosixFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "posix-file-XXXXXX").string();
    dir_ = mkdtemp(pattern.data());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }
  static std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  template <typename Error, typename Fn>
  static void expect_error(Fn fn, const std::vector<std::string>& fragments) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const auto& fragment : fragments) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      }
    }
  }

  std::string dir_;
};

// 0..255 repeating: a byte out of place shows.
std::string pattern_bytes(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 7 % 251);
  return bytes;
}

TEST_F(PosixFileTest, DescriptorClosesWhenDestroyedAndMoves) {
  std::ofstream(file("a")) << "x";
  int raw = -1;
  {
    FileDescriptor fd = FileDescriptor::open(file("a"), O_RDONLY);
    ASSERT_TRUE(fd.valid());
    raw = fd.get();
    EXPECT_NE(::fcntl(raw, F_GETFD) & FD_CLOEXEC, 0);  // O_CLOEXEC is always added
    FileDescriptor moved = std::move(fd);
    EXPECT_FALSE(fd.valid());
    EXPECT_EQ(moved.get(), raw);
    EXPECT_GE(::fcntl(raw, F_GETFD), 0);  // still open in `moved`
  }
  errno = 0;
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST_F(PosixFileTest, FailedOpenLeavesErrno) {
  errno = 0;
  const FileDescriptor fd = FileDescriptor::open(file("missing"), O_RDONLY);
  EXPECT_FALSE(fd.valid());
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(errno_text(ENOENT), "No such file or directory");
}

TEST_F(PosixFileTest, PositionedTransfersRoundTrip) {
  const std::string bytes = pattern_bytes(100000);
  FileDescriptor fd = FileDescriptor::open(file("p"), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_TRUE(fd.valid());
  IoResult w = pwrite_all(fd.get(), bytes.data(), bytes.size(), 12345);
  EXPECT_EQ(w.done, bytes.size());
  EXPECT_EQ(w.error, 0);
  std::string back(bytes.size(), '\0');
  IoResult r = pread_all(fd.get(), back.data(), back.size(), 12345);
  EXPECT_EQ(r.done, back.size());
  EXPECT_EQ(back, bytes);
  EXPECT_EQ(fs::file_size(file("p")), 12345 + bytes.size());
}

TEST_F(PosixFileTest, ReadPastTheEndIsEndOfFileNamingTheFile) {
  std::ofstream(file("short")) << "0123456789";
  const FileDescriptor fd = FileDescriptor::open(file("short"), O_RDONLY);
  char buffer[20];
  const IoResult r = pread_all(fd.get(), buffer, sizeof(buffer), 4);
  EXPECT_EQ(r.done, 6u);  // bytes 4..9, then end of file
  EXPECT_EQ(r.error, 0);
  EXPECT_EQ(std::string(buffer, 6), "456789");
  expect_error<DataError>(
      [&] { pread_all_or_throw(fd.get(), buffer, sizeof(buffer), 4, file("short")); },
      {file("short") + ": unexpected end of file (truncated?)"});
}

TEST_F(PosixFileTest, TransferErrorsNameTheFileAndTheReason) {
  std::ofstream(file("ro")) << "abc";
  const FileDescriptor read_only = FileDescriptor::open(file("ro"), O_RDONLY);
  const FileDescriptor write_only = FileDescriptor::open(file("ro"), O_WRONLY);
  char c = 'x';
  expect_error<UserError>([&] { write_all_or_throw(read_only.get(), &c, 1, file("ro")); },
                          {file("ro") + ": write failed: Bad file descriptor"});
  expect_error<DataError>([&] { pread_all_or_throw(write_only.get(), &c, 1, 0, file("ro")); },
                          {file("ro") + ": read failed: Bad file descriptor"});
}

// The file-size limit cuts a write short: the first pwrite stores what fits (a short write),
// the loop goes on, and the next one fails with EFBIG. In a child process, so the limit dies
// with it; the exit code says what the loop reported.
TEST_F(PosixFileTest, ShortWriteContinuesToTheRealError) {
  const std::string path = file("limited");
  auto write_past_the_limit = [&] {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {4096, 4096};
    setrlimit(RLIMIT_FSIZE, &limit);
    const FileDescriptor fd = FileDescriptor::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const std::string bytes = pattern_bytes(10000);
    const IoResult r = pwrite_all(fd.get(), bytes.data(), bytes.size(), 0);
    std::_Exit(r.done == 4096 && r.error == EFBIG ? 3 : 4);
  };
  EXPECT_EXIT(write_past_the_limit(), ::testing::ExitedWithCode(3), "");
  EXPECT_EQ(read_text(path), pattern_bytes(4096));
}

// A writer blocked on a full pipe is interrupted by signals (no SA_RESTART: write returns what
// it wrote so far, or EINTR) while a slow reader drains it: every byte arrives, in order.
TEST_F(PosixFileTest, WriteToAPipeSurvivesSignalsAndShortWrites) {
  int ends[2];
  ASSERT_EQ(::pipe(ends), 0);
  FileDescriptor read_end(ends[0]), write_end(ends[1]);
  ::fcntl(write_end.get(), F_SETPIPE_SZ, 4096);  // the smallest pipe: many partial writes

  static std::atomic<int> signals{0};
  struct sigaction action {
  }, previous{};
  action.sa_handler = [](int) { signals.fetch_add(1); };
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART
  ASSERT_EQ(sigaction(SIGUSR1, &action, &previous), 0);
  signals = 0;

  const std::string bytes = pattern_bytes(1 << 20);
  const pthread_t writer = pthread_self();
  std::string received;
  std::thread reader([&] {
    char chunk[1024];
    while (true) {
      pthread_kill(writer, SIGUSR1);  // the writer is most likely blocked in write
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      const ssize_t n = ::read(read_end.get(), chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      received.append(chunk, static_cast<size_t>(n));
    }
  });
  const IoResult r = write_all(write_end.get(), bytes.data(), bytes.size());
  write_end.reset();  // end of file for the reader
  reader.join();
  sigaction(SIGUSR1, &previous, nullptr);
  EXPECT_EQ(r.error, 0);
  EXPECT_EQ(r.done, bytes.size());
  EXPECT_GT(signals.load(), 0);
  EXPECT_EQ(received.size(), bytes.size());
  EXPECT_TRUE(received == bytes);
}

TEST_F(PosixFileTest, FsyncNamesAMissingPath) {
  fsync_path(dir_, /*directory=*/true);
  std::ofstream(file("f")) << "x";
  fsync_path(file("f"), /*directory=*/false);
  fsync_parent_directory(file("f"));
  expect_error<UserError>([&] { fsync_path(file("gone"), false); },
                          {file("gone") + ": cannot open for fsync: No such file or directory"});
}

TEST_F(PosixFileTest, AtomicFileReplacesTheWholeFile) {
  std::ofstream(file("t")) << "old contents";
  {
    AtomicFile out(file("t"), AtomicFile::pid_tmp_path(file("t")));
    out.write("new ");
    EXPECT_EQ(read_text(file("t")), "old contents");  // nothing visible before publish
    out.write(std::string("contents"));
    out.publish(/*sync_directory=*/true);
  }
  EXPECT_EQ(read_text(file("t")), "new contents");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  EXPECT_EQ(AtomicFile::pid_tmp_path("x"), "x.tmp-" + std::to_string(::getpid()));
}

TEST_F(PosixFileTest, UnpublishedAtomicFileLeavesNoTrace) {
  std::ofstream(file("t")) << "old";
  {
    AtomicFile out(file("t"), file("t.tmp"));
    out.write("half");
    EXPECT_TRUE(fs::exists(file("t.tmp")));
  }
  EXPECT_FALSE(fs::exists(file("t.tmp")));
  EXPECT_EQ(read_text(file("t")), "old");
}

TEST_F(PosixFileTest, AtomicFileErrorsNameThePaths) {
  expect_error<UserError>([&] { AtomicFile(file("no/dir/t"), file("no/dir/t.tmp")); },
                          {file("no/dir/t.tmp") + ": cannot create: No such file or directory"});
  // A directory in the way: the rename fails, and the temp file goes.
  fs::create_directories(file("blocked/inside"));
  expect_error<UserError>(
      [&] {
        AtomicFile out(file("blocked"), file("blocked.tmp"));
        out.write("x");
        out.publish(false);
      },
      {file("blocked") + ": cannot rename into place: Is a directory"});
  EXPECT_FALSE(fs::exists(file("blocked.tmp")));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
