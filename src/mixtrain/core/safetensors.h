// safetensors files: an 8-byte little-endian header length N, N bytes of JSON header
// ({"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"k": "v"}}), then the raw little-endian tensor bytes, packed without holes.
// Readable by any safetensors reader (Python `safetensors`, Rust `safetensors`).
//
// write_safetensors is atomic: it writes <path>.tmp-<pid>, fsyncs it, and renames it over
// path, so a crash never leaves a half-written file under the final name.
// read_safetensors validates everything (header size, JSON, dtypes, shapes, offsets within
// the file, no overlap, no holes, no trailing bytes) and throws DataError naming the file and
// the problem.
#pragma once

#include <ATen/core/Tensor.h>

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

// "BF16" <-> at::kBFloat16 etc.; throws std::invalid_argument for an unsupported one.
std::string safetensors_dtype_name(c10::ScalarType dtype);

}  // namespace mixtrain
