#include "mixtrain/core/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>

#include "mixtrain/core/error.h"
#include "mixtrain/core/json_reader.h"
#include "mixtrain/core/posix_file.h"
#include "mixtrain/core/printable.h"

namespace mixtrain {
namespace {

struct DtypeName {
  c10::ScalarType dtype;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {c10::kDouble, "F64"}, {c10::kFloat, "F32"}, {c10::kHalf, "F16"},  {c10::kBFloat16, "BF16"},
    {c10::kLong, "I64"},   {c10::kInt, "I32"},   {c10::kShort, "I16"}, {c10::kChar, "I8"},
    {c10::kByte, "U8"},    {c10::kBool, "BOOL"},
};

std::optional<c10::ScalarType> dtype_from_name(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError(printable(path + ": not a valid safetensors file: " + what));
}

}  // namespace

std::string safetensors_dtype_name(c10::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  throw std::invalid_argument(std::string("safetensors: unsupported dtype ") +
                              c10::toString(dtype));
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__" || !names.insert(name).second) {
      throw std::invalid_argument("safetensors: duplicate or reserved tensor name " + name);
    }
    at::Tensor t = tensor.detach().cpu().contiguous();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  const uint64_t header_size = text.size();
  unsigned char size_bytes[8];
  for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<unsigned char>(header_size >> (8 * i));

  AtomicFile file(path, AtomicFile::pid_tmp_path(path));
  file.write(size_bytes, sizeof(size_bytes));
  file.write(text);
  for (const auto& t : contiguous) {
    file.write(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
  // The directory is not synced here: a checkpoint syncs its step directory once, when it
  // publishes it (checkpoint/storage.h).
  file.publish(/*sync_directory=*/false);
}

namespace {

// The byte size of a tensor of `shape` and `dtype`, or nullopt when it overflows 64 bits.
std::optional<uint64_t> byte_size(const std::vector<int64_t>& shape, c10::ScalarType dtype) {
  uint64_t bytes = c10::elementSize(dtype);
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) return std::nullopt;
  }
  return bytes;
}

}  // namespace

SafetensorsHeader read_safetensors_header(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw DataError(path + ": cannot stat: " + std::strerror(errno));
  SafetensorsHeader result;
  result.file_size = static_cast<uint64_t>(st.st_size);
  if (result.file_size < 8) fail(path, "shorter than the 8-byte header length");
  unsigned char size_bytes[8];
  pread_all_or_throw(fd, size_bytes, 8, 0, path);
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(size_bytes[i]) << (8 * i);
  if (header_size > result.file_size - 8) {
    fail(path, "header length " + std::to_string(header_size) +
                   " runs past the end of the file (file is " + std::to_string(result.file_size) +
                   " bytes; truncated?)");
  }
  result.data_start = 8 + header_size;
  std::string text(header_size, '\0');
  pread_all_or_throw(fd, text.data(), header_size, 8, path);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  // Every field through the one JSON reader: "<path>: not a valid safetensors file: <field>: ...".
  const JsonFieldReader r(path + ": not a valid safetensors file");
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) r.fail(name, "must be an object, got " + value.dump());
      for (const auto& [k, v] : value.items()) result.metadata[k] = r.string(v, name + "." + k);
      continue;
    }
    if (!value.is_object()) r.fail(name, "must be an object, got " + value.dump());
    SafetensorsEntry e;
    e.name = name;
    const std::string dtype_text =
        r.string(r.member(value, "dtype", name + ".dtype"), name + ".dtype");
    auto dtype = dtype_from_name(dtype_text);
    if (!dtype) r.fail(name + ".dtype", "unsupported dtype \"" + dtype_text + "\"");
    e.dtype = *dtype;
    e.shape = r.integers(r.member(value, "shape", name + ".shape"), name + ".shape", 0);
    const std::vector<int64_t> offsets = r.integers(
        r.member(value, "data_offsets", name + ".data_offsets"), name + ".data_offsets", 0);
    if (offsets.size() != 2 || offsets[0] > offsets[1]) {
      r.fail(name + ".data_offsets",
             "must be [begin, end] with begin <= end, got " + value.at("data_offsets").dump());
    }
    e.begin = static_cast<uint64_t>(offsets[0]);
    e.end = static_cast<uint64_t>(offsets[1]);
    const std::optional<uint64_t> bytes = byte_size(e.shape, e.dtype);
    if (!bytes || *bytes != e.end - e.begin) {
      r.fail(name + ".data_offsets", "size does not match dtype and shape");
    }
    result.entries.push_back(std::move(e));
  }
  std::sort(result.entries.begin(), result.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  uint64_t expected = 0;
  for (const auto& e : result.entries) {
    if (e.begin != expected) fail(path, e.name + ": tensors overlap or leave a hole");
    expected = e.end;
  }
  // The tensors are packed without holes, so the header fixes the file's exact length.
  const uint64_t data_size = result.file_size - result.data_start;
  const std::string sizes = "file is " + std::to_string(result.file_size) +
                            " bytes, its header says " +
                            std::to_string(result.data_start + expected);
  if (expected > data_size) {
    throw DataError(path + ": " + sizes + " (truncated? data runs past the end of the file)");
  }
  if (expected < data_size) {
    throw DataError(path + ": " + sizes + " (trailing bytes after the last tensor)");
  }
  return result;
}

at::Tensor read_safetensors_tensor(int fd, const SafetensorsHeader& header,
                                   const SafetensorsEntry& entry, const std::string& path) {
  at::Tensor t = at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype));
  pread_all_or_throw(fd, t.data_ptr(), entry.end - entry.begin, header.data_start + entry.begin,
                     path);
  return t;
}

SafetensorsContent read_safetensors(const std::string& path) {
  const FileDescriptor fd = FileDescriptor::open(path, O_RDONLY);
  if (!fd.valid()) throw DataError(path + ": cannot open: " + errno_text());
  SafetensorsHeader header = read_safetensors_header(fd.get(), path);
  SafetensorsContent content;
  content.metadata = std::move(header.metadata);
  for (const auto& e : header.entries) {
    content.tensors.emplace_back(e.name, read_safetensors_tensor(fd.get(), header, e, path));
  }
  return content;
}

}  // namespace mixtrain
