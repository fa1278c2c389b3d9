#include "mixtrain/checkpoint/hf_import.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/accumulate.h>
#include <fcntl.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "mixtrain/core/error.h"
#include "mixtrain/core/json_reader.h"
#include "mixtrain/core/posix_file.h"
#include "mixtrain/core/printable.h"
#include "mixtrain/core/safetensors.h"

namespace mixtrain {
namespace {

struct SourceFile {
  std::string path;
  FileDescriptor fd;
  SafetensorsHeader header;
  std::map<std::string, const SafetensorsEntry*> entries;
};

// Every file of the directory, opened and its header read, and which file holds each key.
struct Sources {
  std::vector<std::unique_ptr<SourceFile>> files;
  std::map<std::string, SourceFile*> by_key;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

SourceFile& open_source(Sources& sources, const std::string& path) {
  for (auto& file : sources.files) {
    if (file->path == path) return *file;
  }
  auto file = std::make_unique<SourceFile>();
  file->path = path;
  file->fd = FileDescriptor::open(path, O_RDONLY);
  if (!file->fd.valid()) throw DataError(path + ": cannot open: " + errno_text());
  file->header = read_safetensors_header(file->fd.get(), path);
  for (const SafetensorsEntry& entry : file->header.entries) file->entries[entry.name] = &entry;
  sources.files.push_back(std::move(file));
  return *sources.files.back();
}

// model.safetensors, else the shards model.safetensors.index.json names. A key the index puts
// in a file that lacks it, or a shard it names that is missing, is a problem.
Sources open_sources(const std::string& dir, std::vector<std::string>& problems) {
  Sources sources;
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (std::filesystem::exists(single)) {
    SourceFile& file = open_source(sources, single);
    for (const SafetensorsEntry& entry : file.header.entries) sources.by_key[entry.name] = &file;
    return sources;
  }
  if (!std::filesystem::exists(index_path)) {
    throw DataError(dir + ": has neither model.safetensors nor model.safetensors.index.json");
  }
  std::ifstream in(index_path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& error) {
    throw DataError(index_path + ": not valid JSON: " + printable(error.what()));
  }
  const JsonFieldReader reader(index_path);
  if (!index.is_object()) reader.fail("(top level)", "must be a JSON object");
  const nlohmann::json& map = reader.object(index, "weight_map", "weight_map");
  for (const auto& [key, value] : map.items()) {
    const std::string name = reader.string(value, "weight_map." + key);
    if (name.empty() || name.find('/') != std::string::npos) {
      reader.fail("weight_map." + key, "\"" + name + "\" is not a file name in " + dir);
    }
    const std::string path = dir + "/" + name;
    if (!std::filesystem::exists(path)) {
      problems.push_back(path + ": " + key + ": the shard the index names for it is missing");
      continue;
    }
    SourceFile& file = open_source(sources, path);
    if (file.entries.count(key) == 0) {
      problems.push_back(path + ": " + key + ": the index puts it here, but the file lacks it");
      continue;
    }
    sources.by_key[key] = &file;
  }
  // A tensor in a shard that the index does not name is extra too.
  for (const auto& file : sources.files) {
    for (const SafetensorsEntry& entry : file->header.entries) {
      if (sources.by_key.count(entry.name) == 0) {
        problems.push_back(file->path + ": " + entry.name + ": not named by " + index_path);
      }
    }
  }
  return sources;
}

// Rows [first_row, first_row + rows) of the file tensor `key` seen as rows of `row_elems`
// elements, into `dest` (rows x row_elems elements, any dtype/device). With a box (a
// tensor-parallel piece split along a dim > 0): the rows are read whole, seen as
// [rows, row_shape...], and dims 1.. narrowed to [box_offsets, box_offsets + dest's sizes).
constexpr const char* kHeadKey = "lm_head.weight";
constexpr const char* kEmbeddingKey = "model.embed_tokens.weight";

struct Copy {
  std::string key;
  int64_t row_elems = 0;
  int64_t first_row = 0;
  int64_t rows = 0;
  at::Tensor dest;
  std::vector<int64_t> row_shape = {};    // empty: no box
  std::vector<int64_t> box_offsets = {};  // per dim 1.., when row_shape is set
};

// What the model expects of the files: each key once, with its shape; and the copies that fill
// this rank's pieces.
struct Plan {
  std::map<std::string, std::vector<int64_t>> expected;
  std::vector<Copy> copies;
};

const std::regex& expert_name() {
  static const std::regex pattern(R"(^(.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj)$)");
  return pattern;
}

void expect(Plan& plan, const std::string& key, const std::vector<int64_t>& shape) {
  plan.expected.emplace(key, shape);
}

void plan_target(const HfImportTarget& t, const Sources& sources, Plan& plan) {
  const std::vector<int64_t>& shape = t.placement.global_shape;
  const int64_t begin = t.placement.offset, rows = t.placement.rows;
  const int64_t row_elems = c10::multiply_integers(shape.begin() + 1, shape.end());
  std::smatch match;
  if (shape.size() != 3 || !std::regex_match(t.name, match, expert_name())) {
    expect(plan, t.name, shape);
    if (!t.placement.tp_split() || shape.empty()) {
      if (rows > 0) plan.copies.push_back({t.name, row_elems, begin, rows, t.local});
      return;
    }
    // The tensor-parallel box: its dim-0 rows (contiguous in the file), then dims 1.. narrowed.
    const std::vector<int64_t> offsets = t.placement.global_offsets();
    const std::vector<int64_t> sizes = t.placement.local_sizes();
    if (sizes[0] == 0) return;
    Copy copy{t.name, row_elems, offsets[0], sizes[0], t.local};
    if (t.placement.tp_dim > 0) {
      copy.row_shape.assign(shape.begin() + 1, shape.end());
      copy.box_offsets.assign(offsets.begin() + 1, offsets.end());
    }
    plan.copies.push_back(std::move(copy));
    return;
  }
  if (t.placement.tp_split()) {
    throw std::invalid_argument("import_hf_weights: expert tensor '" + t.name +
                                "' has a tensor-parallel split (experts are never tp-split)");
  }
  const std::string prefix = match[1], proj = match[2];
  const int64_t experts = shape[0], out = shape[1], in = shape[2];
  if (sources.by_key.count(prefix + ".gate_up_proj") != 0) {  // fused
    if (proj == "down_proj") {
      expect(plan, t.name, shape);
      if (rows > 0) plan.copies.push_back({t.name, row_elems, begin, rows, t.local});
      return;
    }
    const std::string key = prefix + ".gate_up_proj";
    expect(plan, key, {experts, 2 * out, in});
    const int64_t half = proj == "gate_proj" ? 0 : 1;  // gate first, then up
    for (int64_t e = begin; e < begin + rows; ++e) {
      plan.copies.push_back({key, in, (2 * e + half) * out, out, t.local[e - begin]});
    }
    return;
  }
  if (sources.by_key.count(t.name) != 0) {  // ours: the 3-D tensor itself
    expect(plan, t.name, shape);
    if (rows > 0) plan.copies.push_back({t.name, row_elems, begin, rows, t.local});
    return;
  }
  for (int64_t e = 0; e < experts; ++e) {  // per-expert 2-D weights
    const std::string key = prefix + "." + std::to_string(e) + "." + proj + ".weight";
    expect(plan, key, {out, in});
    if (e >= begin && e < begin + rows) {
      plan.copies.push_back({key, in, 0, out, t.local[e - begin]});
    }
  }
}

void check_plan(const Plan& plan, const Sources& sources, const std::string& dir,
                std::vector<std::string>& problems) {
  for (const auto& [key, shape] : plan.expected) {
    const auto found = sources.by_key.find(key);
    if (found == sources.by_key.end()) {
      problems.push_back(dir + ": " + key + ": missing (the model has it, shape " +
                         shape_text(shape) + ")");
      continue;
    }
    const SafetensorsEntry& entry = *found->second->entries.at(key);
    if (entry.shape != shape) {
      problems.push_back(found->second->path + ": " + key + ": shape " + shape_text(entry.shape) +
                         ", the model's is " + shape_text(shape));
    }
    const c10::ScalarType dtype = entry.dtype;
    if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf &&
        dtype != at::kDouble) {
      problems.push_back(found->second->path + ": " + key + ": dtype " +
                         safetensors_dtype_name(dtype) +
                         " cannot be converted (F32, BF16, F16 or F64)");
    }
  }
  for (const auto& [key, file] : sources.by_key) {
    if (plan.expected.count(key) == 0) {
      problems.push_back(file->path + ": " + key + ": extra (the model has no such parameter)");
    }
  }
}

}  // namespace

HfImportStats import_hf_weights(const std::string& dir,
                                const std::vector<HfImportTarget>& targets) {
  std::vector<std::string> problems;
  Sources sources = open_sources(dir, problems);
  Plan plan;
  for (const HfImportTarget& target : targets) plan_target(target, sources, plan);
  // A tied model (no lm_head.weight: tie_word_embeddings) reads HF's layouts of it: no
  // lm_head.weight, or one that must equal the embedding, read beside it and compared below.
  std::vector<std::pair<at::Tensor, at::Tensor>> tied;  // (lm_head rows, embedding rows)
  const bool has_head = std::any_of(targets.begin(), targets.end(),
                                    [](const HfImportTarget& t) { return t.name == kHeadKey; });
  if (!has_head && sources.by_key.count(kHeadKey) != 0 && plan.expected.count(kEmbeddingKey) != 0) {
    expect(plan, kHeadKey, plan.expected.at(kEmbeddingKey));
    const size_t planned = plan.copies.size();
    for (size_t i = 0; i < planned; ++i) {
      if (plan.copies[i].key != kEmbeddingKey) continue;
      Copy head = plan.copies[i];
      head.key = kHeadKey;
      head.dest = at::empty_like(head.dest);
      tied.emplace_back(head.dest, plan.copies[i].dest);
      plan.copies.push_back(std::move(head));
    }
  }
  check_plan(plan, sources, dir, problems);
  if (!problems.empty()) {
    std::string message = dir + ": cannot load the Hugging Face weights (" +
                          std::to_string(problems.size()) + " problem" +
                          (problems.size() == 1 ? "" : "s") + "): ";
    const size_t shown = std::min<size_t>(problems.size(), 8);
    for (size_t i = 0; i < shown; ++i) message += (i ? "; " : "") + problems[i];
    if (shown < problems.size()) {
      message += "; and " + std::to_string(problems.size() - shown) + " more";
    }
    throw DataError(message);
  }

  HfImportStats stats;
  stats.files = static_cast<int64_t>(sources.files.size());
  c10::NoGradGuard no_grad;
  for (const Copy& copy : plan.copies) {
    SourceFile& file = *sources.by_key.at(copy.key);
    const SafetensorsEntry& entry = *file.entries.at(copy.key);
    const int64_t elems = copy.rows * copy.row_elems;
    at::Tensor buffer = at::empty({elems}, at::TensorOptions().dtype(entry.dtype));
    const uint64_t bytes = static_cast<uint64_t>(elems) * buffer.element_size();
    const uint64_t at_byte =
        file.header.data_start + entry.begin +
        static_cast<uint64_t>(copy.first_row * copy.row_elems) * buffer.element_size();
    pread_all_or_throw(file.fd.get(), buffer.data_ptr(), bytes, at_byte, file.path);
    stats.data_bytes_read += bytes;
    if (copy.row_shape.empty()) {
      copy.dest.copy_(buffer.view(copy.dest.sizes()));
      continue;
    }
    std::vector<int64_t> read_shape = {copy.rows};
    read_shape.insert(read_shape.end(), copy.row_shape.begin(), copy.row_shape.end());
    at::Tensor box = buffer.view(read_shape);
    for (size_t d = 0; d < copy.box_offsets.size(); ++d) {
      box = box.narrow(static_cast<int64_t>(d + 1), copy.box_offsets[d], copy.dest.size(d + 1));
    }
    copy.dest.copy_(box);
  }
  for (const auto& [head, embedding] : tied) {
    if (!at::equal(head, embedding)) {
      throw DataError(dir + ": " + kHeadKey + ": differs from " + kEmbeddingKey +
                      ", but the model ties them (model.tie_word_embeddings: true): one matrix "
                      "serves both; untie it, or use a checkpoint whose " +
                      kHeadKey + " is the embedding");
    }
  }
  return stats;
}

}  // namespace mixtrain
