#include "mixtrain/checkpoint/storage.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <c10/util/accumulate.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <new>
#include <set>
#include <stdexcept>
#include <utility>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/large_buffer.h"
#include "mixtrain/core/posix_file.h"
#include "mixtrain/core/printable.h"
#include "mixtrain/core/safetensors.h"
#include "mixtrain/core/text.h"

// Checksums and files hold the bytes as they are in memory; the format says little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint files are little-endian");

namespace mixtrain {
namespace fs = std::filesystem;
namespace {

// Writes `text` to <path>.tmp-<pid>, fsyncs, renames over path, fsyncs the directory.
void write_file_atomically(const std::string& path, const std::string& text) {
  AtomicFile file(path, AtomicFile::pid_tmp_path(path));
  file.write(text);
  file.publish(/*sync_directory=*/true);
}

// std::filesystem calls that report failure as UserError naming the path.
void remove_all(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) throw UserError(path + ": cannot remove: " + ec.message());
}

bool is_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// "step-00000012" -> 12 (also ".tmp-step-00000012" with prefix ".tmp-"); -1 if not that form.
int64_t parse_step_name(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() < 8 || digits.size() > 18) return -1;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
  }
  return std::stoll(digits);
}

std::string read_latest(const std::string& checkpoint_dir) {
  std::ifstream in(fs::path(checkpoint_dir) / kLatestFile);
  std::string name;
  in >> name;  // skips surrounding whitespace
  return name;
}

// The metadata JSON with one line per top-level field and per tensor: readable with less or
// grep, and not the many lines per chunk of an indented dump.
std::string format_metadata(const nlohmann::json& json) {
  std::string text = "{";
  const char* separator = "\n ";
  for (const auto& [field, value] : json.items()) {
    text += separator + nlohmann::json(field).dump() + ": ";
    separator = ",\n ";
    if (field != "tensors" || value.empty()) {
      text += value.dump();
      continue;
    }
    const char* inner = "{\n  ";
    for (const auto& [key, tensor] : value.items()) {
      text += inner + nlohmann::json(key).dump() + ": " + tensor.dump();
      inner = ",\n  ";
    }
    text += "\n }";
  }
  return text + "\n}\n";
}

// A whole file's bytes; DataError naming it when it cannot be read.
std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open: " + errno_text());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw DataError(path + ": read failed: " + errno_text());
  return bytes;
}

// The parsed .metadata.json of `dir`. With a .metadata.json.xxh3_64 beside it, the bytes are
// checked against it before they are parsed (checksummed = true); without one, checksummed =
// false and the caller decides by the format version.
nlohmann::json read_metadata_json(const std::string& dir, bool& checksummed) {
  const std::string meta_path = (fs::path(dir) / kCheckpointMetadataFile).string();
  const std::string sum_path = (fs::path(dir) / kCheckpointMetadataChecksumFile).string();
  const std::string text = read_file(meta_path);
  std::error_code ec;
  checksummed = fs::exists(sum_path, ec);
  if (checksummed) {
    std::string want = read_file(sum_path);
    if (!want.empty() && want.back() == '\n') want.pop_back();
    const auto expected = parse_xxh3_64(want);
    if (!expected) {
      throw DataError(
          printable(sum_path + ": \"" + want.substr(0, 40) + "\" is not 16 hex digits (corrupt?)"));
    }
    const uint64_t got = XXH3_64bits(text.data(), text.size());
    if (got != *expected) {
      throw DataError(meta_path + ": checksum " + format_xxh3_64(got) + " but " +
                      kCheckpointMetadataChecksumFile + " says " + format_xxh3_64(*expected) +
                      " (the file is corrupt or was edited)");
    }
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // The parser's message quotes the bytes it read last: never print them raw.
    throw DataError(printable(meta_path + ": not valid JSON: " + e.what()));
  }
}

}  // namespace

// --- writing ----------------------------------------------------------------------------------

std::vector<CheckpointChunk> write_rank_file(const std::string& step_tmp_dir, int64_t rank,
                                             const std::vector<LocalChunk>& chunks) {
  const std::string file = rank_file_name(rank);
  NamedTensors tensors;
  std::vector<CheckpointChunk> result;
  for (const LocalChunk& c : chunks) {
    const std::vector<int64_t> sizes = c.data.sizes().vec();
    bool inside = sizes.size() == c.global_shape.size() && c.offsets.size() == sizes.size();
    for (size_t d = 0; inside && d < sizes.size(); ++d) {
      inside = c.offsets[d] >= 0 && c.offsets[d] + sizes[d] <= c.global_shape[d];
    }
    if (!inside) {
      throw std::invalid_argument("write_rank_file: chunk of " + c.key + " with sizes " +
                                  format_list(sizes) + " at offsets " + format_list(c.offsets) +
                                  " is not inside the shape " + format_list(c.global_shape));
    }
    // The checksum is of exactly the bytes write_safetensors writes (it keeps contiguous CPU
    // tensors as they are).
    at::Tensor data = c.data.detach().cpu().contiguous();
    result.push_back(CheckpointChunk{file, c.offsets, sizes, tensor_xxh3_64(data)});
    tensors.emplace_back(c.key, std::move(data));
  }
  write_safetensors((fs::path(step_tmp_dir) / file).string(), tensors);
  return result;
}

void write_metadata(const std::string& step_tmp_dir, const CheckpointMetadata& metadata) {
  const std::string path = (fs::path(step_tmp_dir) / kCheckpointMetadataFile).string();
  CheckpointMetadata current = metadata;  // always written as this build's version
  current.format_version = kCheckpointFormatVersion;
  const nlohmann::json json = metadata_to_json(current);
  try {  // never publish metadata that the reader would refuse
    metadata_from_json(json, path);
  } catch (const DataError& e) {
    throw std::logic_error(std::string("write_metadata: invalid metadata: ") + e.what());
  }
  const std::string text = format_metadata(json);
  // The checksum first, .metadata.json last: the directory is complete when that exists.
  write_file_atomically((fs::path(step_tmp_dir) / kCheckpointMetadataChecksumFile).string(),
                        format_xxh3_64(XXH3_64bits(text.data(), text.size())) + "\n");
  write_file_atomically(path, text);
}

std::string step_tmp_dir(const std::string& checkpoint_dir, int64_t step) {
  return (fs::path(checkpoint_dir) / (".tmp-" + step_dir_name(step))).string();
}

std::string step_dir(const std::string& checkpoint_dir, int64_t step) {
  return (fs::path(checkpoint_dir) / step_dir_name(step)).string();
}

void prepare_step_tmp_dir(const std::string& checkpoint_dir, int64_t step) {
  const std::string tmp = step_tmp_dir(checkpoint_dir, step);
  std::error_code ec;
  fs::create_directories(checkpoint_dir, ec);
  if (ec) throw UserError(checkpoint_dir + ": cannot create: " + ec.message());
  remove_all(tmp);
  fs::create_directory(tmp, ec);
  if (ec) throw UserError(tmp + ": cannot create: " + ec.message());
}

void publish_step_dir(const std::string& checkpoint_dir, int64_t step) {
  const std::string tmp = step_tmp_dir(checkpoint_dir, step);
  const std::string final_dir = step_dir(checkpoint_dir, step);
  std::error_code ec;
  if (!fs::is_directory(tmp, ec)) throw UserError(tmp + ": missing, nothing to publish");
  for (const auto& entry : fs::directory_iterator(tmp, ec)) {
    if (entry.is_regular_file()) fsync_path(entry.path().string(), false);
  }
  if (ec) throw UserError(tmp + ": cannot list: " + ec.message());
  fsync_path(tmp, true);

  if (!fs::exists(final_dir, ec)) {
    if (std::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      throw UserError(final_dir + ": cannot rename " + tmp + " to it: " + errno_text());
    }
    fsync_path(checkpoint_dir, true);
    return;
  }
  // Re-saving an existing step: swap the two directories in one step so that a complete
  // step-N exists at every moment, then delete the old one (now under the tmp name).
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS) {
      throw UserError(final_dir + ": cannot exchange with " + tmp + ": " + errno_text());
    }
    // A file system without RENAME_EXCHANGE: move the old one aside first. A crash in between
    // leaves no step-N (the aside copy is a stale .tmp-step-* that prune removes later).
    const std::string aside = tmp + "-old";
    remove_all(aside);
    if (std::rename(final_dir.c_str(), aside.c_str()) != 0 ||
        std::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      throw UserError(final_dir + ": cannot replace with " + tmp + ": " + errno_text());
    }
    fsync_path(checkpoint_dir, true);
    remove_all(aside);
    return;
  }
  fsync_path(checkpoint_dir, true);
  remove_all(tmp);
}

void write_latest(const std::string& checkpoint_dir, int64_t step) {
  write_file_atomically((fs::path(checkpoint_dir) / kLatestFile).string(),
                        step_dir_name(step) + "\n");
}

std::vector<int64_t> list_complete_steps(const std::string& checkpoint_dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoint_dir, ec)) {
    const int64_t step = parse_step_name(entry.path().filename().string(), "step-");
    if (step >= 0 && step_dir_name(step) == entry.path().filename().string() &&
        is_file(entry.path() / kCheckpointMetadataFile)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void prune_checkpoints(const std::string& checkpoint_dir, int64_t keep_last) {
  const std::vector<int64_t> steps = list_complete_steps(checkpoint_dir);
  if (steps.empty()) return;
  const std::string latest = read_latest(checkpoint_dir);
  if (keep_last > 0 && static_cast<int64_t>(steps.size()) > keep_last) {
    for (size_t i = 0; i + keep_last < steps.size(); ++i) {
      if (step_dir_name(steps[i]) != latest) remove_all(step_dir(checkpoint_dir, steps[i]));
    }
  }
  std::error_code ec;
  std::vector<std::string> stale;
  for (const auto& entry : fs::directory_iterator(checkpoint_dir, ec)) {
    // ".tmp-step-<digits>" and the "-old" aside copy of publish_step_dir's fallback.
    std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, "-old") == 0) {
      name.resize(name.size() - 4);
    }
    const int64_t step = parse_step_name(name, ".tmp-step-");
    const bool killed_latest = name.rfind(std::string(kLatestFile) + ".tmp-", 0) == 0;
    if ((step >= 0 && step < steps.back()) || killed_latest) {
      stale.push_back(entry.path().string());
    }
  }
  for (const auto& path : stale) remove_all(path);
}

std::string resolve_step_dir(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw DataError(path + ": no such checkpoint directory");
  if (!fs::is_directory(path, ec)) throw DataError(path + ": not a directory");
  if (fs::exists(fs::path(path) / kCheckpointMetadataFile, ec)) return path;
  const fs::path latest = fs::path(path) / kLatestFile;
  if (!fs::exists(latest, ec)) {
    throw DataError(path + ": not a checkpoint: neither a step directory (no " +
                    kCheckpointMetadataFile + ") nor a checkpoint directory (no " + kLatestFile +
                    ")");
  }
  const std::string name = read_latest(path);
  if (name.empty()) throw DataError(latest.string() + ": empty");
  if (name.find('/') != std::string::npos || name == "." || name == "..") {
    throw DataError(latest.string() + ": \"" + name + "\" is not a step directory name");
  }
  const fs::path dir = fs::path(path) / name;
  if (!fs::is_directory(dir, ec)) {
    throw DataError(latest.string() + ": names " + name + ", which does not exist");
  }
  if (!fs::exists(dir / kCheckpointMetadataFile, ec)) {
    throw DataError(latest.string() + ": names " + name + ", which has no " +
                    kCheckpointMetadataFile + " (incomplete save?)");
  }
  return dir.string();
}

// --- reading ----------------------------------------------------------------------------------

struct CheckpointReader::Impl {
  struct File {
    FileDescriptor fd;
    SafetensorsHeader header;
    std::map<std::string, const SafetensorsEntry*> entries;  // into header.entries
  };
  std::map<std::string, File> files;                  // by file name
  std::set<std::pair<std::string, size_t>> verified;  // (key, chunk index)

  // The chunk's bytes as a tensor of its sizes; checks its checksum unless already verified.
  at::Tensor load(const std::string& dir, const std::string& key, const CheckpointChunk& chunk,
                  size_t index);
};

namespace {

std::string chunk_where(const std::string& dir, const std::string& key,
                        const CheckpointChunk& chunk) {
  return printable((fs::path(dir) / chunk.file).string() + ": " + key) + " chunk at offsets " +
         format_list(chunk.offsets);
}

}  // namespace

at::Tensor CheckpointReader::Impl::load(const std::string& dir, const std::string& key,
                                        const CheckpointChunk& chunk, size_t index) {
  const File& file = files.at(chunk.file);
  const std::string path = (fs::path(dir) / chunk.file).string();
  const SafetensorsEntry& entry = *file.entries.at(key);
  at::Tensor t = empty_large_buffer(entry.shape, entry.dtype);
  // Read in windows of one 4 MiB block per intra-op thread, the window's blocks read in
  // parallel (into fresh memory, the page faults dominate a load on a VM: bench_checkpoint_io;
  // they proceed in parallel on separate cores), then hashed in order while they are still in
  // the cache (XXH3's streaming form gives the same value as hashing the whole chunk at once).
  const bool check = verified.count({key, index}) == 0;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(
      check ? XXH3_createState() : nullptr, &XXH3_freeState);
  if (check && (!state || XXH3_64bits_reset(state.get()) != XXH_OK)) throw std::bad_alloc();
  constexpr uint64_t kBlock = uint64_t{4} << 20;
  char* out = static_cast<char*>(t.data_ptr());
  const uint64_t size = entry.end - entry.begin;
  const uint64_t file_offset = file.header.data_start + entry.begin;
  auto read_block = [&](uint64_t begin, uint64_t end) {
    pread_all_or_throw(file.fd.get(), out + begin, end - begin, file_offset + begin, path);
  };
  const uint64_t window = kBlock * static_cast<uint64_t>(std::max(1, at::get_num_threads()));
  for (uint64_t begin = 0; begin < size; begin += window) {
    const uint64_t end = std::min(size, begin + window);
    const auto blocks = static_cast<int64_t>((end - begin + kBlock - 1) / kBlock);
    at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
      for (int64_t b = first; b < last; ++b) {
        const uint64_t lo = begin + static_cast<uint64_t>(b) * kBlock;
        read_block(lo, std::min(end, lo + kBlock));
      }
    });
    if (check) XXH3_64bits_update(state.get(), out + begin, end - begin);
  }
  if (check) {
    const uint64_t got = XXH3_64bits_digest(state.get());
    if (got != chunk.xxh3_64) {
      throw DataError(chunk_where(dir, key, chunk) + ": checksum " + format_xxh3_64(got) + " but " +
                      kCheckpointMetadataFile + " says " + format_xxh3_64(chunk.xxh3_64));
    }
    verified.insert({key, index});
  }
  return t;
}

CheckpointReader::CheckpointReader(const std::string& step_dir)
    : dir_(step_dir), impl_(std::make_unique<Impl>()) {
  const std::string meta_path = (fs::path(dir_) / kCheckpointMetadataFile).string();
  const nlohmann::json json = read_metadata_json(dir_, metadata_checksummed_);
  metadata_ = metadata_from_json(json, meta_path);
  if (!metadata_checksummed_ && metadata_.format_version >= 2) {
    throw DataError((fs::path(dir_) / kCheckpointMetadataChecksumFile).string() +
                    ": missing (a format_version " + std::to_string(metadata_.format_version) +
                    " checkpoint has it; was it lost in a copy?)");
  }

  // Check every file and chunk, and report every problem at once (one line each).
  std::vector<std::string> problems;
  for (const auto& [key, tensor] : metadata_.tensors) {
    for (const CheckpointChunk& chunk : tensor.chunks) {
      const std::string path = (fs::path(dir_) / chunk.file).string();
      auto it = impl_->files.find(chunk.file);
      if (it == impl_->files.end()) {
        Impl::File file;
        try {
          file.fd = FileDescriptor::open(path, O_RDONLY);
          if (!file.fd.valid()) {
            throw DataError(path + ": cannot open (listed in " + meta_path + "): " + errno_text());
          }
          file.header = read_safetensors_header(file.fd.get(), path);
        } catch (const DataError& e) {
          problems.push_back(e.what());
        }
        it = impl_->files.emplace(chunk.file, std::move(file)).first;
        for (const auto& entry : it->second.header.entries) it->second.entries[entry.name] = &entry;
      }
      if (it->second.header.data_start == 0) continue;  // the file's problem is reported
      auto entry = it->second.entries.find(key);
      const std::string where = chunk_where(dir_, key, chunk);
      if (entry == it->second.entries.end()) {
        problems.push_back(where + ": missing from the file");
      } else if (entry->second->dtype != tensor.dtype) {
        problems.push_back(where + ": dtype " + dtype_name(entry->second->dtype) + " but " +
                           kCheckpointMetadataFile + " says " + dtype_name(tensor.dtype));
      } else if (entry->second->shape != chunk.sizes) {
        problems.push_back(where + ": shape " + format_list(entry->second->shape) + " but " +
                           kCheckpointMetadataFile + " says sizes " + format_list(chunk.sizes));
      }
    }
  }
  if (!problems.empty()) {
    std::string message = problems[0];
    for (size_t i = 1; i < problems.size(); ++i) message += "\n" + problems[i];
    throw DataError(printable(message, /*keep_newlines=*/true));
  }
}

CheckpointReader::~CheckpointReader() = default;

at::Tensor CheckpointReader::read(const std::string& key, const std::vector<int64_t>& offsets,
                                  const std::vector<int64_t>& sizes) {
  auto it = metadata_.tensors.find(key);
  if (it == metadata_.tensors.end()) throw DataError(dir_ + ": no tensor " + key);
  const CheckpointTensor& tensor = it->second;
  bool inside = offsets.size() == tensor.shape.size() && sizes.size() == tensor.shape.size();
  for (size_t d = 0; inside && d < sizes.size(); ++d) {
    inside = offsets[d] >= 0 && sizes[d] >= 0 && offsets[d] <= tensor.shape[d] - sizes[d];
  }
  if (!inside) {
    throw DataError(dir_ + ": " + key + ": region at offsets " + format_list(offsets) +
                    " with sizes " + format_list(sizes) + " is outside the shape " +
                    format_list(tensor.shape));
  }
  // A region that is exactly one chunk (every read_full of a checkpoint saved by one rank, and
  // every read on as many ranks as saved it) is that chunk as read: no second buffer, no copy.
  // The chunks cover the shape exactly once, so no other chunk overlaps it.
  const int64_t numel = c10::multiply_integers(sizes);
  if (numel > 0) {
    for (size_t i = 0; i < tensor.chunks.size(); ++i) {
      const CheckpointChunk& chunk = tensor.chunks[i];
      if (chunk.offsets == offsets && chunk.sizes == sizes) return impl_->load(dir_, key, chunk, i);
    }
  }
  at::Tensor result = empty_large_buffer(sizes, tensor.dtype);
  if (result.numel() == 0) return result;
  // The chunks cover the shape exactly once (checked with the metadata), so copying each
  // chunk's intersection with the region fills the result completely.
  for (size_t i = 0; i < tensor.chunks.size(); ++i) {
    const CheckpointChunk& chunk = tensor.chunks[i];
    std::vector<std::pair<int64_t, int64_t>> box;  // intersection [lo, hi) per dim
    for (size_t d = 0; d < sizes.size(); ++d) {
      const int64_t lo = std::max(offsets[d], chunk.offsets[d]);
      const int64_t hi = std::min(offsets[d] + sizes[d], chunk.offsets[d] + chunk.sizes[d]);
      if (lo >= hi) break;
      box.emplace_back(lo, hi);
    }
    if (box.size() != sizes.size()) continue;  // no overlap
    at::Tensor src = impl_->load(dir_, key, chunk, i);
    at::Tensor dst = result;
    for (size_t d = 0; d < box.size(); ++d) {
      const auto [lo, hi] = box[d];
      src = src.narrow(static_cast<int64_t>(d), lo - chunk.offsets[d], hi - lo);
      dst = dst.narrow(static_cast<int64_t>(d), lo - offsets[d], hi - lo);
    }
    dst.copy_(src);
  }
  return result;
}

at::Tensor CheckpointReader::read_full(const std::string& key) {
  auto it = metadata_.tensors.find(key);
  if (it == metadata_.tensors.end()) throw DataError(dir_ + ": no tensor " + key);
  return read(key, std::vector<int64_t>(it->second.shape.size(), 0), it->second.shape);
}

void CheckpointReader::verify_key(const std::string& key) {
  auto it = metadata_.tensors.find(key);
  if (it == metadata_.tensors.end()) throw DataError(dir_ + ": no tensor " + key);
  for (size_t i = 0; i < it->second.chunks.size(); ++i) {
    if (impl_->verified.count({key, i}) == 0) impl_->load(dir_, key, it->second.chunks[i], i);
  }
}

std::vector<std::string> CheckpointReader::verify() {
  std::vector<std::string> problems;
  for (const auto& [key, tensor] : metadata_.tensors) {
    for (size_t i = 0; i < tensor.chunks.size(); ++i) {
      if (impl_->verified.count({key, i}) != 0) continue;
      try {
        impl_->load(dir_, key, tensor.chunks[i], i);
      } catch (const DataError& e) {
        problems.push_back(e.what());
      }
    }
  }
  return problems;
}

}  // namespace mixtrain
