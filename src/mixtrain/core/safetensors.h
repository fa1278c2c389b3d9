// safetensors files: an 8-byte little-endian header length N, N bytes of JSON header
// ({"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"k": "v"}}), then the raw little-endian tensor bytes, packed without holes.
// Readable by any safetensors reader (Python `safetensors`, Rust `safetensors`).
//
// write_safetensors is atomic: it writes <path>.tmp-<pid>, fsyncs it, and renames it over
// path, so a crash never leaves a half-written file under the final name.
// read_safetensors validates everything (header size, JSON, dtypes, shapes, offsets within
// the file, no overlap, no holes, no trailing bytes) and throws DataError naming the file and
// the problem. read_safetensors_header does the same checks without loading the data, for
// readers that fetch single tensors (the checkpoint reader).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct SafetensorsContent {
  NamedTensors tensors;  // in file-offset order
  std::map<std::string, std::string> metadata;
};

// Tensors are written in the given order (any layout; made contiguous on CPU). Names must be
// unique and not "__metadata__". Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

SafetensorsContent read_safetensors(const std::string& path);

struct SafetensorsEntry {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range inside the data section
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in file-offset order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data section: 8 + header length
  uint64_t file_size = 0;
};

// Reads and validates the header of the open file `fd` (`path` is for messages only): all the
// checks of read_safetensors, including that the file is exactly as long as the header says
// ("file is 1200 bytes, its header says 1460 (truncated? ...)"). Does not read the data.
SafetensorsHeader read_safetensors_header(int fd, const std::string& path);
// Reads one entry's bytes (pread) into a new CPU tensor of its dtype and shape.
at::Tensor read_safetensors_tensor(int fd, const SafetensorsHeader& header,
                                   const SafetensorsEntry& entry, const std::string& path);

// "BF16" <-> at::kBFloat16 etc.; throws std::invalid_argument for an unsupported one.
std::string safetensors_dtype_name(c10::ScalarType dtype);

}  // namespace mixtrain
