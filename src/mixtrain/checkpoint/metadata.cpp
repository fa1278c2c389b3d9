#include "mixtrain/checkpoint/metadata.h"

#include <ATen/ATen.h>
#include <xxhash.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <optional>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/printable.h"
#include "mixtrain/core/text.h"

namespace mixtrain {
namespace {

constexpr c10::ScalarType kDtypes[] = {
    c10::kFloat, c10::kBFloat16, c10::kHalf, c10::kDouble, c10::kLong,
    c10::kInt,   c10::kShort,    c10::kChar, c10::kByte,   c10::kBool,
};

std::optional<c10::ScalarType> dtype_from_name(const std::string& name) {
  for (c10::ScalarType dtype : kDtypes) {
    if (dtype_name(dtype) == name) return dtype;
  }
  return std::nullopt;
}

// "__<r>_0.safetensors" with r a decimal rank (no leading zeros); nullopt otherwise.
std::optional<int64_t> rank_of_file(const std::string& name) {
  const std::string prefix = "__", suffix = "_0.safetensors";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, 2, prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string digits = name.substr(2, name.size() - prefix.size() - suffix.size());
  if (digits.size() > 18 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return std::stoll(digits);
}

int64_t numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool overlap(const CheckpointChunk& a, const CheckpointChunk& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] >= b.offsets[d] + b.sizes[d] || b.offsets[d] >= a.offsets[d] + a.sizes[d]) {
      return false;
    }
  }
  return true;
}

CheckpointTensor parse_tensor(const JsonFieldReader& p, const nlohmann::json& json,
                              const std::string& field, int64_t world_size) {
  if (!json.is_object()) p.fail(field, "must be an object, got " + json.dump());
  CheckpointTensor tensor;
  const std::string dtype = p.string(p.member(json, "dtype", field + ".dtype"), field + ".dtype");
  const auto parsed = dtype_from_name(dtype);
  if (!parsed) {
    p.fail(field + ".dtype",
           "unknown dtype \"" + dtype +
               "\" (float32, bfloat16, float16, float64, int64, int32, int16, int8, uint8, bool)");
  }
  tensor.dtype = *parsed;
  tensor.shape = p.integers(p.member(json, "shape", field + ".shape"), field + ".shape", 0);
  int64_t total = 1;
  for (int64_t d : tensor.shape) {
    if (__builtin_mul_overflow(total, d, &total)) p.fail(field + ".shape", "too many elements");
  }

  const nlohmann::json& chunks = p.member(json, "chunks", field + ".chunks");
  if (!chunks.is_array()) p.fail(field + ".chunks", "must be a list, got " + chunks.dump());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const std::string cf = field + ".chunks[" + std::to_string(i) + "]";
    const nlohmann::json& c = chunks[i];
    if (!c.is_object()) p.fail(cf, "must be an object, got " + c.dump());
    CheckpointChunk chunk;
    chunk.file = p.string(p.member(c, "file", cf + ".file"), cf + ".file");
    const auto rank = rank_of_file(chunk.file);
    if (!rank)
      p.fail(cf + ".file", "\"" + chunk.file + "\" is not of the form __<rank>_0.safetensors");
    if (*rank >= world_size) {
      p.fail(cf + ".file", "\"" + chunk.file + "\" names rank " + std::to_string(*rank) +
                               " but world_size is " + std::to_string(world_size));
    }
    chunk.offsets = p.integers(p.member(c, "offsets", cf + ".offsets"), cf + ".offsets", 0);
    chunk.sizes = p.integers(p.member(c, "sizes", cf + ".sizes"), cf + ".sizes", 0);
    for (const char* name : {"offsets", "sizes"}) {
      const auto& v = std::string(name) == "offsets" ? chunk.offsets : chunk.sizes;
      if (v.size() != tensor.shape.size()) {
        p.fail(cf + "." + name, "has " + std::to_string(v.size()) + " entries but the shape " +
                                    format_list(tensor.shape) + " has " +
                                    std::to_string(tensor.shape.size()) + " dims");
      }
    }
    for (size_t d = 0; d < tensor.shape.size(); ++d) {
      if (chunk.offsets[d] > tensor.shape[d] - chunk.sizes[d]) {
        p.fail(cf, "offsets " + format_list(chunk.offsets) + " + sizes " +
                       format_list(chunk.sizes) + " fall outside the shape " +
                       format_list(tensor.shape));
      }
    }
    const std::string hex = p.string(p.member(c, "xxh3_64", cf + ".xxh3_64"), cf + ".xxh3_64");
    const auto hash = parse_xxh3_64(hex);
    if (!hash) p.fail(cf + ".xxh3_64", "\"" + hex + "\" is not 16 hex digits");
    chunk.xxh3_64 = *hash;
    tensor.chunks.push_back(std::move(chunk));
  }

  // Exact cover: no two chunks overlap and together they hold as many elements as the shape.
  // Pairwise is quadratic in the chunk count, which is at most the world size per key.
  const auto& cs = tensor.chunks;
  int64_t covered = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    covered += numel(cs[i].sizes);
    for (size_t j = i + 1; j < cs.size(); ++j) {
      const std::string pair =
          "chunks[" + std::to_string(i) + "] and chunks[" + std::to_string(j) + "]";
      if (cs[i].file == cs[j].file) {
        p.fail(field + ".chunks",
               pair + " are both in " + cs[i].file + " (a file holds one chunk per key)");
      }
      if (numel(cs[i].sizes) > 0 && numel(cs[j].sizes) > 0 && overlap(cs[i], cs[j])) {
        p.fail(field + ".chunks", pair + " overlap (offsets " + format_list(cs[i].offsets) +
                                      " and " + format_list(cs[j].offsets) + ")");
      }
    }
  }
  if (covered != total) {
    p.fail(field + ".chunks", "cover " + std::to_string(covered) + " of the " +
                                  std::to_string(total) + " elements of shape " +
                                  format_list(tensor.shape));
  }
  return tensor;
}

}  // namespace

std::string step_dir_name(int64_t step) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "step-%08" PRId64, step);
  return buffer;
}

std::string rank_file_name(int64_t rank) {
  return "__" + std::to_string(rank) + "_0.safetensors";
}

nlohmann::json metadata_to_json(const CheckpointMetadata& metadata) {
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [key, tensor] : metadata.tensors) {
    nlohmann::json chunks = nlohmann::json::array();
    for (const auto& c : tensor.chunks) {
      chunks.push_back({{"file", c.file},
                        {"offsets", c.offsets},
                        {"sizes", c.sizes},
                        {"xxh3_64", format_xxh3_64(c.xxh3_64)}});
    }
    tensors[key] = {
        {"dtype", dtype_name(tensor.dtype)}, {"shape", tensor.shape}, {"chunks", chunks}};
  }
  return {{"format", "mixtrain-checkpoint"},
          {"format_version", metadata.format_version},
          {"step", metadata.step},
          {"world_size", metadata.world_size},
          {"mesh",
           {{"dp_replicate", metadata.mesh.dp_replicate},
            {"dp_shard", metadata.mesh.dp_shard},
            {"ep", metadata.mesh.ep},
            {"cp", metadata.mesh.cp},
            {"tp", metadata.mesh.tp}}},
          {"tensors", tensors},
          {"state", metadata.state}};
}

CheckpointMetadata metadata_from_json(const nlohmann::json& json, const std::string& where) {
  const JsonFieldReader p(where);
  if (!json.is_object())
    p.fail("(top level)", std::string("must be a JSON object, got ") + json.type_name());
  const nlohmann::json& format = p.member(json, "format", "format");
  if (format != "mixtrain-checkpoint") {
    p.fail("format", "must be \"mixtrain-checkpoint\", got " + format.dump());
  }
  CheckpointMetadata m;
  const nlohmann::json& version = p.member(json, "format_version", "format_version");
  if (!version.is_number_integer() || version.get<int64_t>() < kOldestCheckpointFormatVersion ||
      version.get<int64_t>() > kCheckpointFormatVersion) {
    p.fail("format_version", version.dump() + " is not supported (this build reads versions " +
                                 std::to_string(kOldestCheckpointFormatVersion) + " to " +
                                 std::to_string(kCheckpointFormatVersion) + ")");
  }
  m.format_version = version.get<int>();
  m.step = p.integer(p.member(json, "step", "step"), "step", 0);
  m.world_size = p.integer(p.member(json, "world_size", "world_size"), "world_size", 1);
  const nlohmann::json& mesh = p.object(json, "mesh", "mesh");
  m.mesh.dp_replicate =
      p.integer(p.member(mesh, "dp_replicate", "mesh.dp_replicate"), "mesh.dp_replicate", 1);
  m.mesh.dp_shard = p.integer(p.member(mesh, "dp_shard", "mesh.dp_shard"), "mesh.dp_shard", 1);
  m.mesh.ep = p.integer(p.member(mesh, "ep", "mesh.ep"), "mesh.ep", 1);
  // Written since tensor / context parallelism; older checkpoints had neither (1).
  if (mesh.contains("cp")) m.mesh.cp = p.integer(mesh.at("cp"), "mesh.cp", 1);
  if (mesh.contains("tp")) m.mesh.tp = p.integer(mesh.at("tp"), "mesh.tp", 1);
  for (const auto& [key, tensor] : p.object(json, "tensors", "tensors").items()) {
    m.tensors[key] = parse_tensor(p, tensor, "tensors." + key, m.world_size);
  }
  m.state = p.object(json, "state", "state");
  return m;
}

uint64_t tensor_xxh3_64(const at::Tensor& tensor) {
  const at::Tensor t = tensor.device().is_cpu() ? tensor.contiguous() : tensor.cpu().contiguous();
  return XXH3_64bits(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
}

std::string format_xxh3_64(uint64_t hash) {
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%016" PRIx64, hash);
  return buffer;
}

std::optional<uint64_t> parse_xxh3_64(const std::string& text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    value = value << 4 | static_cast<uint64_t>(digit);
  }
  return value;
}

}  // namespace mixtrain
