#include "mixtrain/cli/export_hf_command.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <utility>
#include <vector>

#include "mixtrain/checkpoint/storage.h"
#include "mixtrain/config/document.h"
#include "mixtrain/config/schema.h"
#include "mixtrain/config/yaml_reader.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/posix_file.h"
#include "mixtrain/core/safetensors.h"
#include "mixtrain/core/text.h"
#include "mixtrain/model/hf_config.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/training_optimizer.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kModelPrefix = "model.";

// The checkpoint's recorded model.* leaves back into a ModelConfig (the leaves are the
// resolved values, so config.json is not needed again).
ModelConfig recorded_model_config(const CheckpointMetadata& metadata, const std::string& where) {
  const auto config = metadata.state.find("config");
  if (config == metadata.state.end() || !config->is_object()) {
    throw DataError(where + ": state.config: missing (the checkpoint records no config)");
  }
  TrainerConfig trainer;
  for (const auto& [key, value] : config->items()) {
    if (!starts_with(key, kModelPrefix) || !value.is_string()) continue;
    const LeafSpec* leaf = find_canonical_leaf(key);
    if (leaf == nullptr || !leaf->settable) continue;  // a key of another version
    const Where at{where, "state.config." + key};
    try {
      leaf->assign(trainer, parse_yaml_value(value.get<std::string>(), at), at);
    } catch (const ConfigError& error) {
      throw DataError(error.what());
    }
  }
  return trainer.model;
}

// Natural order: digit runs compare as numbers ("layers.2" before "layers.10").
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string x = a.substr(i, ie - i), y = b.substr(j, je - j);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// One exported tensor, read when its shard is written.
struct ExportTensor {
  std::string hf_key;
  std::string checkpoint_key;
  int64_t expert = -1;  // >= 0: slice `expert` of a 3-D expert tensor
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  at::ScalarType dtype = at::kFloat;  // as written
};

// Whether transformers keeps `fqn` in float32 whatever the model's dtype (the family's
// _keep_in_fp32_modules_strict: deepseek_v3's router weights and selection biases).
bool keeps_float32(const HfFamily& family, const std::string& fqn) {
  for (const std::string& suffix : family.float32_suffixes) {
    if (ends_with(fqn, suffix)) return true;
  }
  return false;
}

std::vector<ExportTensor> plan_tensors(const CheckpointMetadata& metadata, const HfFamily& family,
                                       at::ScalarType export_dtype, bool& from_main_params) {
  static const std::regex expert(R"(^(.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj)$)");
  std::vector<ExportTensor> out;
  from_main_params = false;
  for (const auto& [key, tensor] : metadata.tensors) {
    if (!starts_with(key, kModelPrefix)) continue;
    const std::string fqn = key.substr(std::string(kModelPrefix).size());
    const at::ScalarType dtype = keeps_float32(family, fqn) ? at::kFloat : export_dtype;
    const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
    std::string source = key;
    const std::string main = std::string(kMainParamPrefix) + fqn;
    if (metadata.tensors.count(main) != 0) {
      source = main;
      from_main_params = true;
    }
    std::smatch match;
    if (tensor.shape.size() == 3 && std::regex_match(fqn, match, expert)) {
      const std::vector<int64_t> shape(tensor.shape.begin() + 1, tensor.shape.end());
      for (int64_t e = 0; e < tensor.shape[0]; ++e) {
        out.push_back({match[1].str() + "." + std::to_string(e) + "." + match[2].str() + ".weight",
                       source, e, shape, static_cast<uint64_t>(shape[0] * shape[1] * element),
                       dtype});
      }
      continue;
    }
    int64_t numel = 1;
    for (int64_t d : tensor.shape) numel *= d;
    out.push_back({fqn, source, -1, tensor.shape, static_cast<uint64_t>(numel * element), dtype});
  }
  std::sort(out.begin(), out.end(), [](const ExportTensor& a, const ExportTensor& b) {
    return natural_less(a.hf_key, b.hf_key);
  });
  return out;
}

// Greedy in key order: a shard closes when the next tensor would take it past max_bytes.
std::vector<std::vector<const ExportTensor*>> shard(const std::vector<ExportTensor>& tensors,
                                                    uint64_t max_bytes) {
  std::vector<std::vector<const ExportTensor*>> shards(1);
  uint64_t size = 0;
  for (const ExportTensor& t : tensors) {
    if (!shards.back().empty() && size + t.bytes > max_bytes) {
      shards.emplace_back();
      size = 0;
    }
    shards.back().push_back(&t);
    size += t.bytes;
  }
  return shards;
}

std::string shard_name(size_t index, size_t count) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buffer;
}

void write_text_file(const std::string& path, const std::string& text) {
  AtomicFile file(path, path + ".tmp");
  file.write(text.data(), text.size());
  file.publish(false);
}

// OUT_DIR may be missing or empty; returns whether it existed (empty).
bool check_out_dir(const std::string& out_dir) {
  std::error_code error;
  if (!fs::exists(out_dir, error)) return false;
  if (!fs::is_directory(out_dir, error))
    throw UserError(out_dir + ": exists and is not a directory");
  if (!fs::is_empty(out_dir, error)) {
    throw UserError(out_dir +
                    ": is not empty (export-hf writes a new directory; remove it or "
                    "choose another)");
  }
  return true;
}

// The whole export into `tmp`.
void write_export(CheckpointReader& reader, const ModelConfig& model, const std::string& dtype_name,
                  uint64_t max_bytes, const std::string& tmp,
                  const std::vector<ExportTensor>& tensors) {
  write_text_file(tmp + "/config.json", hf_config_json(model, dtype_name).dump(2) + "\n");
  const auto shards = shard(tensors, max_bytes);
  json weight_map = json::object();
  uint64_t total = 0;
  std::string cached_key;
  at::Tensor cached;  // the last 3-D expert tensor read (its experts are consecutive keys)
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name =
        shards.size() == 1 ? "model.safetensors" : shard_name(s, shards.size());
    NamedTensors out;
    for (const ExportTensor* t : shards[s]) {
      if (t->checkpoint_key != cached_key) {
        cached = reader.read_full(t->checkpoint_key);
        cached_key = t->checkpoint_key;
      }
      const at::Tensor value = t->expert >= 0 ? cached[t->expert] : cached;
      out.emplace_back(t->hf_key, value.to(t->dtype).contiguous());
      weight_map[t->hf_key] = name;
      total += t->bytes;
    }
    write_safetensors(tmp + "/" + name, out, {{"format", "pt"}});
  }
  if (shards.size() > 1) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text_file(tmp + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  fsync_path(tmp, true);
}

}  // namespace

uint64_t parse_shard_size(const std::string& text) {
  static const std::regex pattern(R"(^\s*([0-9]+)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*$)",
                                  std::regex::icase);
  std::smatch match;
  const auto fail = [&] {
    throw ConfigError("--max-shard-size: '" + text +
                      "' is not a size (bytes, or a number with KB/MB/GB = 10^3/10^6/10^9 or "
                      "KiB/MiB/GiB = 2^10/2^20/2^30), or is 0");
  };
  if (!std::regex_match(text, match, pattern)) fail();
  std::string unit = match[2].str();
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const double scale = unit == "KB"    ? 1e3
                       : unit == "MB"  ? 1e6
                       : unit == "GB"  ? 1e9
                       : unit == "TB"  ? 1e12
                       : unit == "KIB" ? 1024.0
                       : unit == "MIB" ? 1048576.0
                       : unit == "GIB" ? 1073741824.0
                       : unit == "TIB" ? 1099511627776.0
                                       : 1.0;
  const double value = std::stod(match[1].str()) * scale;
  if (!(value >= 1) || value > 9e18) fail();
  return static_cast<uint64_t>(value);
}

int export_hf_command(const std::string& checkpoint, const std::string& out_dir,
                      const std::string& dtype_option, const std::string& max_shard_size) {
  if (dtype_option != "bf16" && dtype_option != "f32") {
    throw ConfigError("--dtype: must be bf16 or f32, got '" + dtype_option + "'");
  }
  const at::ScalarType dtype = dtype_option == "bf16" ? at::kBFloat16 : at::kFloat;
  const std::string dtype_name = dtype_option == "bf16" ? "bfloat16" : "float32";
  const uint64_t max_bytes = parse_shard_size(max_shard_size);
  const bool existed = check_out_dir(out_dir);

  CheckpointReader reader(resolve_step_dir(checkpoint));
  const std::string where = reader.dir() + "/" + kCheckpointMetadataFile;
  const ModelConfig model = recorded_model_config(reader.metadata(), where);
  try {
    hf_config_json(model, dtype_name);
  } catch (const std::invalid_argument& error) {
    throw UserError(where + ": " + error.what());
  }
  const ModelEntry* entry = nullptr;
  for (const ModelEntry& e : model_registry()) {
    if (e.name == model.name) entry = &e;
  }
  bool from_main_params = false;
  const std::vector<ExportTensor> tensors =
      plan_tensors(reader.metadata(), entry->hf, dtype, from_main_params);
  if (tensors.empty()) throw DataError(where + ": the checkpoint holds no model.* tensors");

  // A sibling, so the final rename stays on one file system.
  const fs::path target = fs::absolute(out_dir).lexically_normal();
  const std::string tmp = (target.parent_path() / ("." + target.filename().string() +
                                                   ".tmp-export-" + std::to_string(getpid())))
                              .string();
  std::error_code ignored;
  fs::remove_all(tmp, ignored);
  if (!fs::create_directories(tmp, ignored))
    throw UserError(tmp + ": cannot create: " + ignored.message());
  try {
    write_export(reader, model, dtype_name, max_bytes, tmp, tensors);
    std::error_code error;
    if (existed) fs::remove(target, error);  // empty, checked above
    if (!error) fs::rename(tmp, target, error);
    if (error)
      throw UserError(target.string() + ": cannot move the export into place: " + error.message());
    fsync_parent_directory(target.string());
  } catch (...) {
    fs::remove_all(tmp, ignored);
    throw;
  }
  uint64_t bytes = 0;
  for (const ExportTensor& t : tensors) bytes += t.bytes;
  const size_t files = shard(tensors, max_bytes).size();
  std::cout << "exported step " << reader.metadata().step << " of " << reader.dir() << " ("
            << model.name << ", " << tensors.size() << " tensors, " << bytes << " bytes, "
            << dtype_name << ", from the "
            << (from_main_params ? "fp32 main params" : "model params") << ") to " << out_dir
            << " in " << files << " safetensors file" << (files == 1 ? "" : "s") << std::endl;
  return 0;
}

}  // namespace mixtrain
