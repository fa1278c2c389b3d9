// Checkpoint I/O (docs/architecture.md §8): how close a checkpoint save and load come to what the
// disk can do, and what an async save costs the training steps that run while it is in flight.
//
// A plain program (no Google Benchmark). In one run it measures and prints:
//   1. the raw sequential rate of the target directory's disk: a file as large as the checkpoint
//      written with 8 MiB pwrite calls from a prefaulted buffer and fsynced (MB/s), then read
//      back with 8 MiB preads into that buffer after its pages were dropped from the page cache;
//   2. our checkpoint: tensors of the same total size (bfloat16 and float32 2-D tensors, small
//      1-D ones, int64 scalars) saved through CheckpointSaver with a one-rank LocalCollectives,
//      synchronously (MB/s, and the ratio to the raw write rate; target >= 0.7), then loaded
//      with CheckpointReader::read_full of every key, which checks every checksum, after
//      dropping the step directory's pages, keeping the tensors as a restore does (MB/s, ratio
//      to the raw read rate; target >= 0.7). Splits that explain where the time goes: XXH3 over
//      the same bytes in memory; write_safetensors alone (no checksums); read_safetensors_tensor
//      of every tensor (the plain reader: fresh tensors, no checksums); pread + streaming XXH3
//      of every chunk into memory that already exists (what reading straight into a restore's
//      own tensors would cost); and the first-touch rate of fresh memory with 4 KiB and with
//      2 MiB pages, which bounds any load into newly allocated tensors.
//      A repetition runs all of these back to back and the ratios pair the same repetition's
//      figures, so that a machine whose load changes between repetitions still compares like
//      with like;
//   3. an async save during training: a Trainer (41M-parameter Qwen2-MoE from
//      configs/qwen2_moe_tiny.yaml, bfloat16, fp32 main params, Muon + AdamW, checkpoint.async)
//      on a single-process mesh; per repetition two normal steps are timed, then
//      save_checkpoint() (its own blocking time: the snapshot copy), then every step that starts
//      while the save is in flight (until <dir>/latest names the new step); the ratio of the
//      in-flight steps to the normal steps of the same repetition (target <= 1.2), and of the
//      fastest of each (the least disturbed by other processes);
// and a markdown table of the figures with their targets, and the machine (CPUs, CPU model,
// memory, the filesystem and device of the directory).
//
// Page cache: reads are measured cold by dropping the file's pages with
// posix_fadvise(POSIX_FADV_DONTNEED) after fsync (clean pages are dropped at once; no root
// and no global /proc/sys/vm/drop_caches needed, and nothing else on the machine is disturbed).
// mincore() then counts the pages still resident and the output shows the largest fraction
// seen; still, without drop_caches a read may partly hit a cache (on a VM, the host's cache
// below the guest, which nothing here can drop).
//
// Usage: bench_checkpoint_io [--dir DIR] [--mib N] [--reps N] [--trainer-reps N]
//                            [--config YAML] [--no-trainer | --only-trainer] [--keep]
//   --dir: where the files go (a fresh directory is created under it; default $TMPDIR or
//   /tmp); --mib: size of the raw file and of the checkpoint (default 512); --reps: repetitions
//   of parts 1-2 (default 3); --trainer-reps: saves in part 3 (default 5); --config: the
//   trainer's base config (default configs/qwen2_moe_tiny.yaml of this source tree).
//   OMP_NUM_THREADS, when set, sets the intra-op threads (the load's readers, the trainer's
//   compute; unset: every core, as `mixtrain train`). Figures are medians (min-max) over the
//   repetitions.
// Exit code 0 when everything was measured (targets met or not), 1 on an error.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_support.h"
#include "mixtrain/checkpoint/distributed_checkpoint.h"
#include "mixtrain/checkpoint/metadata.h"
#include "mixtrain/checkpoint/storage.h"
#include "mixtrain/config/load.h"
#include "mixtrain/core/collectives.h"
#include "mixtrain/core/large_buffer.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/core/posix_file.h"
#include "mixtrain/core/safetensors.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/optimizer_table.h"
#include "mixtrain/trainer/trainer.h"

namespace {

using namespace mixtrain::bench;  // bench_support.h

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr double kMinSaveRatio = 0.70;        // checkpoint save MB/s / raw write MB/s
constexpr double kMinLoadRatio = 0.70;        // checkpoint load MB/s / raw read MB/s
constexpr double kMaxInFlightRatio = 1.20;    // step with an async save in flight / normal step
constexpr size_t kIoBlock = size_t{8} << 20;  // bytes per pwrite/pread of the raw test

struct Options {
  std::string dir;
  int64_t mib = 512;
  int reps = 3;
  int trainer_reps = 5;
  std::string config = std::string(MIXTRAIN_SOURCE_DIR) + "/configs/qwen2_moe_tiny.yaml";
  bool io = true;       // parts 1 and 2
  bool trainer = true;  // part 3
  bool keep = false;
};

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] { return option_value(argc, argv, i); };
    if (arg == "--dir") {
      options.dir = value();
    } else if (arg == "--mib") {
      options.mib = std::atoll(value().c_str());
      if (options.mib < 16) fail("--mib must be >= 16");
    } else if (arg == "--reps") {
      options.reps = std::atoi(value().c_str());
      if (options.reps < 1) fail("--reps must be >= 1");
    } else if (arg == "--trainer-reps") {
      options.trainer_reps = std::atoi(value().c_str());
      if (options.trainer_reps < 1) fail("--trainer-reps must be >= 1");
    } else if (arg == "--config") {
      options.config = value();
    } else if (arg == "--no-trainer") {
      options.trainer = false;
    } else if (arg == "--only-trainer") {
      options.io = false;
    } else if (arg == "--keep") {
      options.keep = true;
    } else if (arg == "-h" || arg == "--help") {
      std::printf(
          "usage: %s [--dir DIR] [--mib N] [--reps N] [--trainer-reps N] [--config YAML]\n"
          "       [--no-trainer | --only-trainer] [--keep]\n"
          "Raw disk write/read rate vs. checkpoint save/load rate (N MiB, default 512), and\n"
          "the step time while an async checkpoint save is in flight.\n",
          argv[0]);
      std::exit(0);
    } else {
      fail("unknown argument " + arg + " (see --help)");
    }
  }
  return options;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double min_of(const std::vector<double>& values) {
  return values.empty() ? NAN : *std::min_element(values.begin(), values.end());
}

double max_of(const std::vector<double>& values) {
  return values.empty() ? NAN : *std::max_element(values.begin(), values.end());
}

double mb_per_s(double bytes, double seconds) {
  return bytes / seconds / 1e6;
}

// "median (min-max)" of a list of rates.
std::string spread(const std::vector<double>& values, const char* format = "%.0f") {
  char a[32], b[32], c[32];
  std::snprintf(a, sizeof(a), format, median(values));
  std::snprintf(b, sizeof(b), format, min_of(values));
  std::snprintf(c, sizeof(c), format, max_of(values));
  return std::string(a) + " (" + b + "-" + c + ")";
}

// --- machine ------------------------------------------------------------------------------

// The block device behind `path` ("/dev/vda"), from /proc/self/mountinfo; "" if unknown.
std::string device_of(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "";
  const std::string want =
      std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    // id parent major:minor root mount-point options ... - fstype source super-options
    std::istringstream fields(line);
    std::string id, parent, dev;
    fields >> id >> parent >> dev;
    if (dev != want) continue;
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream rest(line.substr(dash + 3));
    std::string type, source;
    rest >> type >> source;
    return source;
  }
  return "";
}

// --- page cache -----------------------------------------------------------------------------

// Writes back (already done by the fsync of whoever wrote it) and drops the file's pages.
void drop_pages(const std::string& path) {
  const mixtrain::FileDescriptor fd = mixtrain::FileDescriptor::open(path, O_RDONLY);
  if (!fd.valid()) fail(path + ": cannot open: " + std::strerror(errno));
  if (fdatasync(fd.get()) != 0) fail(path + ": fdatasync: " + std::strerror(errno));
  const int rc = posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  if (rc != 0) fail(path + ": posix_fadvise(DONTNEED): " + std::strerror(rc));
}

struct Residency {
  int64_t resident = 0, total = 0;  // pages
};

// How many of the file's pages are in the page cache (mincore on a mapping; reads nothing).
Residency resident_pages(const std::string& path) {
  Residency r;
  const mixtrain::FileDescriptor fd = mixtrain::FileDescriptor::open(path, O_RDONLY);
  if (!fd.valid()) return r;
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || st.st_size == 0) return r;
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return r;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  if (mincore(map, size, vec.data()) == 0) {
    r.total = static_cast<int64_t>(vec.size());
    for (unsigned char v : vec) r.resident += v & 1;
  }
  munmap(map, size);
  return r;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path().string());
  }
  return files;
}

// Drops the pages of every file in `dir`; returns the resident fraction left afterwards.
double drop_dir_pages(const std::string& dir) {
  Residency total;
  for (const std::string& file : files_in(dir)) {
    drop_pages(file);
    const Residency r = resident_pages(file);
    total.resident += r.resident;
    total.total += r.total;
  }
  return total.total > 0 ? static_cast<double>(total.resident) / total.total : 0.0;
}

// --- 1 and 2. raw sequential I/O, checkpoint save and load -----------------------------------

// Fills `n` bytes with xorshift noise: nothing below could compress or deduplicate it.
void fill_noise(char* data, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(data + i, &x, 8);
  }
  for (; i < n; ++i) data[i] = static_cast<char>(i);
}

// A realistic mix totalling ~`bytes`: per "layer" a bfloat16 weight [rows, 1024] with its
// float32 main param and float32 momentum (10 bytes per element), two 1-D norms (bfloat16 and
// float32), and an int64 step counter; plus a few int64 scalars.
std::vector<mixtrain::LocalChunk> make_chunks(size_t bytes) {
  constexpr int64_t kLayers = 8, kCols = 1024;
  const int64_t rows = static_cast<int64_t>(bytes) / (kLayers * kCols * 10);
  std::vector<mixtrain::LocalChunk> chunks;
  auto add = [&](const std::string& key, at::Tensor data) {
    mixtrain::LocalChunk c;
    c.key = key;
    c.global_shape = data.sizes().vec();
    c.offsets.assign(c.global_shape.size(), 0);
    c.data = std::move(data);
    chunks.push_back(std::move(c));
  };
  at::manual_seed(1234);
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    const std::string fqn = "model.layers." + std::to_string(layer) + ".mlp.weight";
    const at::Tensor main = at::randn({rows, kCols});
    add("model." + fqn, main.to(at::kBFloat16));
    add("optimizer._mixed_precision_optimizer.fp32_from_fp16_params." + fqn, main);
    add("optimizer.state." + fqn + ".momentum_buffer", at::randn({rows, kCols}));
    add("optimizer.state." + fqn + ".step", at::scalar_tensor(layer + 7, at::kLong));
    const std::string norm = "model.layers." + std::to_string(layer) + ".input_layernorm.weight";
    add("model." + norm, at::randn({kCols}).to(at::kBFloat16));
    add("optimizer._mixed_precision_optimizer.fp32_from_fp16_params." + norm, at::randn({kCols}));
  }
  for (int i = 0; i < 3; ++i) {
    add("state.counter." + std::to_string(i), at::scalar_tensor(1000 + i, at::kLong));
  }
  return chunks;
}

struct IoResult {
  double bytes = 0;  // of the checkpoint's tensors (the raw file is `--mib` MiB)
  size_t tensors = 0;
  // Per repetition; a repetition runs everything below back to back, so that the ratios pair
  // measurements taken under the same machine load.
  std::vector<double> raw_write_mb_s, raw_read_mb_s;
  std::vector<double> save_mb_s, load_mb_s;
  std::vector<double> save_ratio, load_ratio;  // to the same repetition's raw rate
  std::vector<double> xxh3_mb_s;               // in memory, the same bytes
  std::vector<double> write_safetensors_mb_s;  // write + fsync, no checksums
  std::vector<double> pread_mb_s;  // read_safetensors_tensor of every tensor, cold, no checksums
  std::vector<double> open_ms;     // CheckpointReader constructor, cold
  std::vector<double> touch_4k_mb_s, touch_2m_mb_s;  // first touch of fresh memory
  // pread + XXH3 of every chunk into memory that is already touched (no allocation)
  std::vector<double> read_into_mb_s, read_into_ratio;
  double max_resident = 0;  // largest fraction of pages still cached before a cold read
};

// Writes `bytes` from `buffer` to a new file with kIoBlock pwrites and fsyncs it; MB/s.
double raw_write(const std::string& path, const char* buffer, size_t bytes) {
  const auto start = Clock::now();
  const mixtrain::FileDescriptor fd =
      mixtrain::FileDescriptor::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!fd.valid()) fail(path + ": cannot create: " + std::strerror(errno));
  for (size_t done = 0; done < bytes; done += kIoBlock) {
    const size_t block = std::min(kIoBlock, bytes - done);
    const mixtrain::IoResult r = mixtrain::pwrite_all(fd.get(), buffer + done, block, done);
    if (r.done < block) fail(path + ": write failed: " + std::strerror(r.error));
  }
  if (fsync(fd.get()) != 0) fail(path + ": fsync failed: " + std::strerror(errno));
  return mb_per_s(static_cast<double>(bytes), seconds_since(start));
}

// Reads the file into `buffer` with kIoBlock preads; MB/s.
double raw_read(const std::string& path, char* buffer, size_t bytes) {
  const auto start = Clock::now();
  const mixtrain::FileDescriptor fd = mixtrain::FileDescriptor::open(path, O_RDONLY);
  if (!fd.valid()) fail(path + ": cannot open: " + std::strerror(errno));
  for (size_t done = 0; done < bytes; done += kIoBlock) {
    const size_t block = std::min(kIoBlock, bytes - done);
    const mixtrain::IoResult r = mixtrain::pread_all(fd.get(), buffer + done, block, done);
    if (r.done < block) fail(path + ": read failed: " + std::strerror(r.error));
  }
  return mb_per_s(static_cast<double>(bytes), seconds_since(start));
}

// The rate at which a process can write memory it has just allocated (a fresh anonymous
// mapping, so every page is faulted in on first touch): with 4 KiB pages, and 2 MiB aligned
// with madvise(MADV_HUGEPAGE) (one fault per 2 MiB where transparent huge pages are on). Every
// load fills fresh tensors, so this bounds it; MB/s.
double first_touch_mb_s(size_t bytes, bool huge) {
  const auto start = Clock::now();
  const c10::DataPtr memory = mixtrain::map_anonymous(
      bytes, huge ? mixtrain::HugePages::kAligned : mixtrain::HugePages::kNo);
  if (!memory) fail(std::string("mmap: ") + std::strerror(errno));
  std::memset(memory.get(), 1, bytes);
  return mb_per_s(static_cast<double>(bytes), seconds_since(start));
}

IoResult measure_io(const std::string& dir, size_t bytes, int reps) {
  IoResult result;
  // The raw test's buffer is as large as the file and prefaulted: the writes read distinct
  // memory as a checkpoint's do, and the reads land in memory that needs no page faults (the
  // device's rate, not the allocator's).
  // (1 MiB more than the file: the checkpoint's tensors land in it too, further below.)
  const size_t buffer_size = bytes + (size_t{1} << 20);
  void* raw = nullptr;
  if (posix_memalign(&raw, 4096, buffer_size) != 0) fail("cannot allocate the raw I/O buffer");
  std::unique_ptr<char, decltype(&std::free)> buffer(static_cast<char*>(raw), &std::free);
  fill_noise(buffer.get(), buffer_size, 42);

  const std::vector<mixtrain::LocalChunk> chunks = make_chunks(bytes);
  for (const auto& c : chunks) result.bytes += static_cast<double>(c.data.nbytes());
  result.tensors = chunks.size();
  const std::string checkpoint_dir = dir + "/checkpoint";

  for (int rep = 0; rep < reps; ++rep) {
    // 1. Raw: write + fsync, drop the pages, read.
    const std::string raw_path = dir + "/raw.bin";
    result.raw_write_mb_s.push_back(raw_write(raw_path, buffer.get(), bytes));
    drop_pages(raw_path);
    const Residency r = resident_pages(raw_path);
    result.max_resident =
        std::max(result.max_resident, r.total > 0 ? double(r.resident) / r.total : 0.0);
    result.raw_read_mb_s.push_back(raw_read(raw_path, buffer.get(), bytes));
    fs::remove(raw_path);

    result.touch_4k_mb_s.push_back(first_touch_mb_s(bytes, false));
    result.touch_2m_mb_s.push_back(first_touch_mb_s(bytes, true));

    // XXH3 alone, in memory (what save and load both pay on top of the I/O).
    auto start = Clock::now();
    uint64_t sink = 0;
    for (const auto& c : chunks) sink ^= mixtrain::tensor_xxh3_64(c.data);
    result.xxh3_mb_s.push_back(mb_per_s(result.bytes, seconds_since(start)));
    if (sink == 0x1234) std::printf(" ");  // keep the hashes

    // write_safetensors alone: the file writer the checkpoint uses, without checksums.
    {
      mixtrain::NamedTensors tensors;
      for (const auto& c : chunks) tensors.emplace_back(c.key, c.data);
      const std::string path = dir + "/plain.safetensors";
      start = Clock::now();
      mixtrain::write_safetensors(path, tensors);
      result.write_safetensors_mb_s.push_back(mb_per_s(result.bytes, seconds_since(start)));
      fs::remove(path);
    }

    // 2. The save: synchronous, one rank.
    const int64_t step = rep + 1;
    {
      mixtrain::CheckpointSaver saver(checkpoint_dir, 0, false,
                                      mixtrain::make_local_collectives("bench"));
      mixtrain::SaveRequest request;
      request.step = step;
      request.chunks = chunks;
      request.state = {{"bench", "checkpoint_io"}};
      request.rank_state = nlohmann::json::object();
      start = Clock::now();
      saver.save(std::move(request));
      result.save_mb_s.push_back(mb_per_s(result.bytes, seconds_since(start)));
    }
    const std::string step_dir = mixtrain::step_dir(checkpoint_dir, step);

    // The load: every key through read_full (checksums checked), pages dropped first. The
    // tensors are kept until the end, as a restore keeps them until it copies them in.
    result.max_resident = std::max(result.max_resident, drop_dir_pages(step_dir));
    {
      std::vector<at::Tensor> loaded;
      start = Clock::now();
      mixtrain::CheckpointReader reader(step_dir);
      result.open_ms.push_back(seconds_since(start) * 1e3);
      double loaded_bytes = 0;
      for (const auto& [key, tensor] : reader.metadata().tensors) {
        loaded.push_back(reader.read_full(key));
        loaded_bytes += static_cast<double>(loaded.back().nbytes());
      }
      result.load_mb_s.push_back(mb_per_s(loaded_bytes, seconds_since(start)));
      if (std::abs(loaded_bytes - result.bytes) > 0.5) fail("loaded a different number of bytes");
    }
    result.save_ratio.push_back(result.save_mb_s.back() / result.raw_write_mb_s.back());
    result.load_ratio.push_back(result.load_mb_s.back() / result.raw_read_mb_s.back());

    // The same file read by the bare safetensors primitive: pread into fresh tensors.
    drop_dir_pages(step_dir);
    {
      const std::string path = step_dir + "/" + mixtrain::rank_file_name(0);
      start = Clock::now();
      const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) fail(path + ": cannot open: " + std::strerror(errno));
      const mixtrain::SafetensorsHeader header = mixtrain::read_safetensors_header(fd, path);
      std::vector<at::Tensor> loaded;
      double loaded_bytes = 0;
      for (const auto& entry : header.entries) {
        loaded.push_back(mixtrain::read_safetensors_tensor(fd, header, entry, path));
        loaded_bytes += static_cast<double>(loaded.back().nbytes());
      }
      close(fd);
      result.pread_mb_s.push_back(mb_per_s(loaded_bytes, seconds_since(start)));
    }

    // What reading into tensors that already exist (a restore's own parameters and optimizer
    // state) would cost: every chunk pread in kIoBlock pieces into the raw test's touched
    // buffer, each piece hashed (streaming XXH3) right after it is read, checksums compared.
    drop_dir_pages(step_dir);
    {
      const mixtrain::CheckpointMetadata metadata = mixtrain::CheckpointReader(step_dir).metadata();
      const std::string path = step_dir + "/" + mixtrain::rank_file_name(0);
      start = Clock::now();
      const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) fail(path + ": cannot open: " + std::strerror(errno));
      const mixtrain::SafetensorsHeader header = mixtrain::read_safetensors_header(fd, path);
      std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                     &XXH3_freeState);
      size_t at = 0;
      for (const auto& entry : header.entries) {
        const size_t size = entry.end - entry.begin;
        if (at + size > buffer_size) fail("the checkpoint is larger than the raw buffer");
        XXH3_64bits_reset(state.get());
        for (size_t done = 0; done < size;) {
          const size_t want = std::min(kIoBlock, size - done);
          const ssize_t n = pread(fd, buffer.get() + at + done, want,
                                  static_cast<off_t>(header.data_start + entry.begin + done));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) fail(path + ": read failed: " + std::strerror(errno));
          XXH3_64bits_update(state.get(), buffer.get() + at + done, static_cast<size_t>(n));
          done += static_cast<size_t>(n);
        }
        if (XXH3_64bits_digest(state.get()) != metadata.tensors.at(entry.name).chunks[0].xxh3_64) {
          fail(path + ": checksum mismatch of " + entry.name);
        }
        at += size;
      }
      close(fd);
      result.read_into_mb_s.push_back(mb_per_s(static_cast<double>(at), seconds_since(start)));
      result.read_into_ratio.push_back(result.read_into_mb_s.back() / result.raw_read_mb_s.back());
    }
    fs::remove_all(step_dir);
  }
  fs::remove_all(checkpoint_dir);
  return result;
}

// --- 3. async save during training ----------------------------------------------------------

struct TrainerResult {
  int64_t params = 0;
  double checkpoint_mib = 0;
  int threads = 0;
  std::vector<double> normal_s;     // steps with no save in flight
  std::vector<double> in_flight_s;  // steps that started while a save was in flight
  std::vector<double> call_s;       // save_checkpoint() itself (blocking: the snapshot copy)
  std::vector<double> save_s;       // save_checkpoint() until `latest` was written
  std::vector<double> in_flight_steps;
  std::vector<double> ratio;  // per repetition: median in-flight step / median normal step
};

bool latest_names(const std::string& checkpoint_dir, int64_t step) {
  std::ifstream in(checkpoint_dir + "/" + mixtrain::kLatestFile);
  std::string name;
  in >> name;
  return name == mixtrain::step_dir_name(step);
}

double realtime_now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// When `latest` was last written (the end of a save), on the CLOCK_REALTIME scale.
double latest_written(const std::string& checkpoint_dir) {
  struct stat st {};
  if (stat((checkpoint_dir + "/" + mixtrain::kLatestFile).c_str(), &st) != 0) return NAN;
  return static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
}

TrainerResult measure_trainer(const Options& options, const std::string& dir) {
  constexpr int kNormalSteps = 2;
  constexpr int kMaxInFlightSteps = 8;
  TrainerResult result;
  const std::string checkpoint_dir = dir + "/trainer-checkpoints";
  // ~41M parameters: 6.1M embedding + 6.1M lm_head + 6 x ~4.8M (attention, 8 experts of 384,
  // a shared expert of 768). 14 bytes per parameter in the checkpoint (bfloat16 model, fp32
  // main params, Muon momentum or AdamW moments).
  const std::vector<std::string> overrides = {
      "model.vocab_size=16000",
      "model.hidden_size=384",
      "model.num_layers=6",
      "model.num_heads=6",
      "model.num_kv_heads=2",
      "model.head_dim=64",
      "model.moe_intermediate_size=384",
      "model.num_experts=8",
      "model.shared_expert_intermediate_size=768",
      "model.max_seq_len=128",
      "data.seq_len=128",
      "data.micro_batch_size=2",
      "data.global_batch_size=2",
      "train.steps=1000",
      "train.lr_scheduler.warmup_steps=1",
      "checkpoint.async=true",
      "checkpoint.keep_last=1",
      "checkpoint.dir=" + checkpoint_dir,
  };
  const mixtrain::ResolvedConfig resolved = mixtrain::load_config(options.config, overrides);
  result.threads = at::get_num_threads();
  const mixtrain::DeviceMesh mesh = mixtrain::make_single_process_mesh();
  mixtrain::Trainer trainer(resolved, mesh, dir + "/trainer-run");
  for (const auto& p : trainer.model().parameters()) result.params += p.numel();

  auto timed_step = [&] {
    const auto start = Clock::now();
    trainer.step();
    return seconds_since(start);
  };
  timed_step();  // creates the optimizer state
  for (int rep = 0; rep < options.trainer_reps; ++rep) {
    timed_step();  // settles (after the previous save)
    std::vector<double> normal, in_flight;
    for (int i = 0; i < kNormalSteps; ++i) normal.push_back(timed_step());
    const int64_t step = trainer.completed_steps();
    const double wall_start = realtime_now();
    const auto start = Clock::now();
    trainer.save_checkpoint();
    result.call_s.push_back(seconds_since(start));
    // A step counts as in flight when it starts before the save has published the step.
    while (!latest_names(checkpoint_dir, step) &&
           static_cast<int>(in_flight.size()) < kMaxInFlightSteps) {
      in_flight.push_back(timed_step());
    }
    trainer.wait_for_checkpoint();
    result.save_s.push_back(latest_written(checkpoint_dir) - wall_start);
    result.in_flight_steps.push_back(static_cast<double>(in_flight.size()));
    if (!in_flight.empty()) result.ratio.push_back(median(in_flight) / median(normal));
    result.normal_s.insert(result.normal_s.end(), normal.begin(), normal.end());
    result.in_flight_s.insert(result.in_flight_s.end(), in_flight.begin(), in_flight.end());
    if (rep == 0) {
      for (const auto& file : files_in(mixtrain::step_dir(checkpoint_dir, step))) {
        result.checkpoint_mib += static_cast<double>(fs::file_size(file)) / (1 << 20);
      }
    }
  }
  return result;
}

const char* verdict(bool met) {
  return met ? "met" : "NOT met";
}

}  // namespace

int main(int argc, char** argv) {
  mixtrain::register_model_sections();  // before any config is read
  mixtrain::register_optimizer_sections();
  program_name() = "bench_checkpoint_io";
  const Options options = parse_options(argc, argv);
  // As `mixtrain train`: every core unless OMP_NUM_THREADS says otherwise (a load reads its
  // blocks on every intra-op thread; the trainer computes on them).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  }
  const std::string dir = make_work_dir(options.dir, "mixtrain-ckpt-bench");
  const size_t bytes = static_cast<size_t>(options.mib) << 20;
  const std::string device = device_of(dir);
  mixtrain::set_log_level(mixtrain::LogLevel::kWarn);  // no "saved step" lines in the output

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M", std::localtime(&now));
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 0) load[0] = NAN;
  char memory[32];
  std::snprintf(memory, sizeof(memory), "%.1f GiB memory", mem_total_kib() / 1048576.0);
  const std::string machine = std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " CPUs, " +
                              cpu_model() + ", " + memory + "; directory on " + filesystem_of(dir) +
                              (device.empty() ? "" : " (" + device + ")");
  std::printf("machine: %s\n", machine.c_str());
  std::printf("%s, load average %.2f at the start; directory %s\n", date, load[0], dir.c_str());
  std::printf(
      "page cache: every read is measured after fsync + posix_fadvise(POSIX_FADV_DONTNEED) on its\n"
      "  files, and mincore() checks how much stayed resident. Without root and\n"
      "  /proc/sys/vm/drop_caches (not used even as root: it would flush the whole shared\n"
      "  machine) a read may still partly hit the page cache; on a VM a cache below the guest may\n"
      "  serve it too, which nothing here can drop.\n");
  std::printf("size: %lld MiB; %d repetition(s); figures are medians (min-max)\n\n",
              static_cast<long long>(options.mib), options.reps);
  std::fflush(stdout);

  try {
    IoResult io;
    if (options.io) {
      std::printf(
          "1+2. per repetition: raw write+fsync and cold read (%zu MiB calls), XXH3 in memory,\n"
          "     write_safetensors, checkpoint save (CheckpointSaver, sync), checkpoint load\n"
          "     (CheckpointReader::read_full of every key), read_safetensors_tensor ...\n",
          kIoBlock >> 20);
      std::fflush(stdout);
      io = measure_io(dir, bytes, options.reps);
      std::printf(
          "     %zu tensors, %.1f MiB; at most %.1f%% of a file's pages were still cached before "
          "a cold read\n",
          io.tensors, io.bytes / (1 << 20), 100 * io.max_resident);
    }

    TrainerResult train;
    if (options.trainer) {
      std::printf("3. async save during training (%s) ...\n", options.config.c_str());
      std::fflush(stdout);
      train = measure_trainer(options, dir);
      std::printf(
          "   %.1fM parameters, checkpoint %.1f MiB, %d thread(s); %s steps in flight per save\n",
          train.params / 1e6, train.checkpoint_mib, train.threads,
          spread(train.in_flight_steps, "%.0f").c_str());
    }

    std::printf("\n| measure | result | vs | ratio | target |\n");
    std::printf("| --- | --- | --- | --- | --- |\n");
    if (options.io) {
      const double raw_write = median(io.raw_write_mb_s), raw_read = median(io.raw_read_mb_s);
      const double save = median(io.save_ratio), load = median(io.load_ratio);
      std::printf("| raw write + fsync (MB/s) | %s | | | |\n", spread(io.raw_write_mb_s).c_str());
      std::printf("| raw cold read (MB/s) | %s | | | |\n", spread(io.raw_read_mb_s).c_str());
      std::printf("| checkpoint save, sync (MB/s) | %s | raw write | %s | >= %.2f: %s |\n",
                  spread(io.save_mb_s).c_str(), spread(io.save_ratio, "%.2f").c_str(),
                  kMinSaveRatio, verdict(save >= kMinSaveRatio));
      std::printf(
          "| checkpoint load, read_full + checksums (MB/s) | %s | raw read | %s | >= %.2f: %s |\n",
          spread(io.load_mb_s).c_str(), spread(io.load_ratio, "%.2f").c_str(), kMinLoadRatio,
          verdict(load >= kMinLoadRatio));
      std::printf("| XXH3-64 in memory (MB/s) | %s | | | |\n", spread(io.xxh3_mb_s).c_str());
      std::printf(
          "| write_safetensors alone, no checksums (MB/s) | %s | raw write %.0f | %.2f | |\n",
          spread(io.write_safetensors_mb_s).c_str(), raw_write,
          median(io.write_safetensors_mb_s) / raw_write);
      std::printf(
          "| read_safetensors_tensor alone, cold, no checksums (MB/s) | %s | raw read %.0f | %.2f "
          "| |\n",
          spread(io.pread_mb_s).c_str(), raw_read, median(io.pread_mb_s) / raw_read);
      std::printf(
          "| pread + XXH3 of every chunk into existing memory, cold (MB/s) | %s | raw read | %s "
          "| |\n",
          spread(io.read_into_mb_s).c_str(), spread(io.read_into_ratio, "%.2f").c_str());
      std::printf("| first touch of fresh memory, 4 KiB pages (MB/s) | %s | | | |\n",
                  spread(io.touch_4k_mb_s).c_str());
      std::printf("| first touch of fresh memory, 2 MiB pages (MB/s) | %s | | | |\n",
                  spread(io.touch_2m_mb_s).c_str());
      std::printf("| CheckpointReader constructor, cold (ms) | %s | | | |\n",
                  spread(io.open_ms, "%.1f").c_str());
    }
    if (options.trainer) {
      const double normal = median(train.normal_s);
      std::printf("| step, no save in flight (s) | %s | | | |\n",
                  spread(train.normal_s, "%.3f").c_str());
      std::printf("| step, async save in flight (s) | %s | normal step | %s | <= %.2f: %s |\n",
                  spread(train.in_flight_s, "%.3f").c_str(), spread(train.ratio, "%.2f").c_str(),
                  kMaxInFlightRatio, verdict(median(train.ratio) <= kMaxInFlightRatio));
      // A busy machine shows as a wide spread; the fastest steps are the least disturbed.
      std::printf("| fastest step, in flight vs none (s) | %.3f vs %.3f | | %.2f | |\n",
                  min_of(train.in_flight_s), min_of(train.normal_s),
                  min_of(train.in_flight_s) / min_of(train.normal_s));
      std::printf("| save_checkpoint() call, async (s) | %s | normal step %.3f | %.2f | |\n",
                  spread(train.call_s, "%.3f").c_str(), normal, median(train.call_s) / normal);
      std::printf("| async save, call to published (s) | %s | | | |\n",
                  spread(train.save_s, "%.2f").c_str());
    }
    std::printf("\nratios: per repetition (measurements taken back to back), median (min-max).\n");
    std::printf("Machine: %s; %lld MiB; %d repetition(s).\n", machine.c_str(),
                static_cast<long long>(options.mib), options.reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint_io: %s (files kept in %s)\n", e.what(), dir.c_str());
    return 1;
  }
  keep_or_remove(dir, options.keep, "files kept in ");
  return 0;
}
