// The checkpoint format (docs/architecture.md §8, docs/checkpoint.md): a step directory
//   <checkpoint.dir>/step-<8 digits>/
//     __<rank>_0.safetensors   one per rank at save; each holds the chunks that rank wrote,
//                              one safetensors tensor per key (name = the key)
//     .metadata.json.xxh3_64   XXH3-64 of .metadata.json's bytes (16 hex digits and "\n")
//     .metadata.json           everything below, written last
//   <checkpoint.dir>/latest    the name of the newest complete step directory ("step-00000012")
//
// .metadata.json:
//   {"format": "mixtrain-checkpoint", "format_version": 1, "step": 12, "world_size": 2,
//    "mesh": {"dp_replicate": 1, "dp_shard": 2, "ep": 1, "cp": 1, "tp": 1},
//    "tensors": {"<key>": {"dtype": "bfloat16", "shape": [64, 32],
//                          "chunks": [{"file": "__0_0.safetensors", "offsets": [0, 0],
//                                      "sizes": [32, 32], "xxh3_64": "<16 hex digits>"}, ...]}},
//    "state": {...non-tensor state, opaque to this layer...}}
// dtype uses torch names (float32, bfloat16, float16, float64, int64, int32, int16, int8,
// uint8, bool); the checksum is XXH3-64 (seed 0) of the chunk's bytes as stored in the file
// (row-major, little-endian). The chunks of a key cover its global shape exactly once.
//
// Format versions: 2 (written now) has .metadata.json.xxh3_64, and a reader refuses a version-2
// step directory without it or whose .metadata.json does not match it. Version 1 (before the
// metadata checksum) is otherwise the same and is still read, its metadata checked for
// consistency only (CheckpointReader::metadata_checksummed() is false).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <nlohmann/json.hpp>

#include "mixtrain/core/json_reader.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain {

inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr int kOldestCheckpointFormatVersion = 1;  // without the metadata checksum
inline constexpr const char* kCheckpointMetadataFile = ".metadata.json";
inline constexpr const char* kCheckpointMetadataChecksumFile = ".metadata.json.xxh3_64";
inline constexpr const char* kLatestFile = "latest";

struct CheckpointChunk {
  std::string file;              // "__<rank>_0.safetensors", in the step directory
  std::vector<int64_t> offsets;  // first index per dim in the global tensor
  std::vector<int64_t> sizes;    // extent per dim
  uint64_t xxh3_64 = 0;
};

struct CheckpointTensor {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;  // global
  std::vector<CheckpointChunk> chunks;
};

struct CheckpointMesh {
  int64_t dp_replicate = 1;
  int64_t dp_shard = 1;
  int64_t ep = 1;
  int64_t cp = 1;  // absent from checkpoints written before context parallelism: 1
  int64_t tp = 1;  // likewise for tensor parallelism
};

struct CheckpointMetadata {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;
  int64_t world_size = 1;
  CheckpointMesh mesh;
  std::map<std::string, CheckpointTensor> tensors;
  nlohmann::json state = nlohmann::json::object();
};

// "step-00000012"; "__3_0.safetensors".
std::string step_dir_name(int64_t step);
std::string rank_file_name(int64_t rank);

nlohmann::json metadata_to_json(const CheckpointMetadata& metadata);
// Validates everything (fields present with the right types, format and version, dtypes,
// shapes, chunk ranks/offsets/sizes inside the shape, chunks of a key covering it exactly
// once, checksum syntax) and throws DataError naming `where` (the file) and the field.
CheckpointMetadata metadata_from_json(const nlohmann::json& json, const std::string& where);

// XXH3-64 of a contiguous CPU tensor's bytes.
uint64_t tensor_xxh3_64(const at::Tensor& tensor);
std::string format_xxh3_64(uint64_t hash);  // 16 lower-case hex digits
// 16 hex digits (either case) -> the value; nullopt otherwise.
std::optional<uint64_t> parse_xxh3_64(const std::string& text);

}  // namespace mixtrain
