#include "mixtrain/core/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>

#include "mixtrain/core/error.h"

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
  throw DataError(path + ": not a valid safetensors file: " + what);
}

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw UserError(path + ": write failed: " + std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
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

  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(tmp + ": cannot create: " + std::strerror(errno));
  try {
    write_all(fd, size_bytes, sizeof(size_bytes), tmp);
    write_all(fd, text.data(), text.size(), tmp);
    for (const auto& t : contiguous) {
      write_all(fd, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size(), tmp);
    }
    if (::fsync(fd) != 0) throw UserError(tmp + ": fsync failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw UserError(path + ": cannot rename into place: " + reason);
  }
}

SafetensorsContent read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw DataError(path + ": cannot open: " + std::strerror(errno));
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  if (file_size < 8) fail(path, "shorter than the 8-byte header length");
  in.seekg(0);
  unsigned char size_bytes[8];
  in.read(reinterpret_cast<char*>(size_bytes), 8);
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(size_bytes[i]) << (8 * i);
  if (header_size > file_size - 8) fail(path, "header length runs past the end of the file");
  std::string text(header_size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_size));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  const uint64_t data_size = file_size - 8 - header_size;
  struct Entry {
    std::string name;
    c10::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  SafetensorsContent content;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) fail(path, "__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) fail(path, "__metadata__." + k + " is not a string");
        content.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      Entry e{name, c10::kFloat, {}, 0, 0};
      auto dtype = dtype_from_name(value.at("dtype").get<std::string>());
      if (!dtype) fail(path, name + ": unsupported dtype " + value.at("dtype").dump());
      e.dtype = *dtype;
      e.shape = value.at("shape").get<std::vector<int64_t>>();
      auto offsets = value.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1]) fail(path, name + ": bad data_offsets");
      e.begin = offsets[0];
      e.end = offsets[1];
      uint64_t numel = 1;
      for (int64_t d : e.shape) {
        if (d < 0) fail(path, name + ": negative dimension");
        numel *= static_cast<uint64_t>(d);
      }
      if (numel * c10::elementSize(e.dtype) != e.end - e.begin) {
        fail(path, name + ": data_offsets size does not match dtype and shape");
      }
      if (e.end > data_size) fail(path, name + ": data runs past the end of the file");
      entries.push_back(std::move(e));
    } catch (const nlohmann::json::exception& ex) {
      fail(path, name + ": malformed entry: " + ex.what());
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t expected = 0;
  for (const auto& e : entries) {
    if (e.begin != expected) fail(path, e.name + ": tensors overlap or leave a hole");
    expected = e.end;
  }
  if (expected != data_size) fail(path, "trailing bytes after the last tensor");

  for (const auto& e : entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    in.seekg(static_cast<std::streamoff>(8 + header_size + e.begin));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
    if (!in) fail(path, e.name + ": short read");
    content.tensors.emplace_back(e.name, std::move(t));
  }
  return content;
}

}  // namespace mixtrain
