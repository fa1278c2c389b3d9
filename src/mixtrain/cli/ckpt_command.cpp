#include "mixtrain/cli/ckpt_command.h"

#include <ATen/ATen.h>

#include <c10/util/accumulate.h>
#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <limits>
#include <set>
#include <vector>

#include "mixtrain/checkpoint/storage.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/core/printable.h"
#include "mixtrain/core/text.h"

namespace mixtrain {
namespace {

std::string number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.6g", value);
  return buffer;
}

// A JSON value on one line, cut to `limit` characters.
std::string compact(const nlohmann::json& value, size_t limit = 120) {
  std::string text = value.dump();
  if (text.size() > limit) text = text.substr(0, limit - 3) + "...";
  return text;
}

std::string count(int64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

int64_t numel(const std::vector<int64_t>& shape) {
  return c10::multiply_integers(shape);
}

std::string mesh_text(const CheckpointMesh& m) {
  return "dp_replicate=" + std::to_string(m.dp_replicate) +
         " dp_shard=" + std::to_string(m.dp_shard) + " ep=" + std::to_string(m.ep) +
         " cp=" + std::to_string(m.cp) + " tp=" + std::to_string(m.tp);
}

std::set<std::string> files_of(const CheckpointMetadata& m) {
  std::set<std::string> files;
  for (const auto& [key, tensor] : m.tensors) {
    for (const auto& chunk : tensor.chunks) files.insert(chunk.file);
  }
  return files;
}

// The two checkpoints' difference on one tensor of equal dtype and shape.
struct TensorDiff {
  int64_t differing = 0;  // elements whose bits differ
  double max_abs = 0;     // float64; one side NaN counts as infinity, both NaN as 0
  double max_rel = 0;     // |a - b| / max(|a|, |b|), 0 / 0 = 0
};

// Bitwise element comparison through an integer view of the same element size.
at::Tensor bits_differ(const at::Tensor& a, const at::Tensor& b) {
  const c10::ScalarType as_int[] = {c10::kByte, c10::kShort, c10::kByte, c10::kInt,
                                    c10::kByte, c10::kByte,  c10::kByte, c10::kLong};
  const c10::ScalarType view = as_int[a.element_size() - 1];
  return a.contiguous().view(view) != b.contiguous().view(view);
}

void accumulate(const at::Tensor& a, const at::Tensor& b, TensorDiff& diff) {
  const int64_t differing = bits_differ(a, b).sum().item<int64_t>();
  if (differing == 0) return;
  diff.differing += differing;
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  const double inf = std::numeric_limits<double>::infinity();
  at::Tensor d = (x - y).abs();
  d = at::where(x == y, at::zeros_like(d), d);  // inf == inf, 0 == -0
  d = at::where(x.isnan() & y.isnan(), at::zeros_like(d), d);
  d = at::where(d.isnan(), at::full_like(d, inf), d);  // exactly one side NaN
  at::Tensor rel = d / at::maximum(x.abs(), y.abs());
  rel = at::where(d == 0, at::zeros_like(rel), rel);
  rel = at::where(rel.isnan(), at::full_like(rel, inf), rel);
  diff.max_abs = std::max(diff.max_abs, d.max().item<double>());
  diff.max_rel = std::max(diff.max_rel, rel.max().item<double>());
}

// Compares a key in blocks of about 4M elements (whole rows along dim 0), so that the float64
// copies stay small for big tensors.
TensorDiff diff_tensor(CheckpointReader& a, CheckpointReader& b, const std::string& key,
                       const std::vector<int64_t>& shape) {
  TensorDiff diff;
  if (shape.empty()) {
    accumulate(a.read_full(key), b.read_full(key), diff);
    return diff;
  }
  const int64_t row = std::max<int64_t>(1, numel(shape) / std::max<int64_t>(1, shape[0]));
  const int64_t rows_per_block = std::max<int64_t>(1, (int64_t(1) << 22) / row);
  for (int64_t start = 0; start < shape[0]; start += rows_per_block) {
    std::vector<int64_t> offsets(shape.size(), 0), sizes = shape;
    offsets[0] = start;
    sizes[0] = std::min(rows_per_block, shape[0] - start);
    accumulate(a.read(key, offsets, sizes), b.read(key, offsets, sizes), diff);
  }
  return diff;
}

}  // namespace

int ckpt_inspect_command(const std::string& path) {
  CheckpointReader reader(resolve_step_dir(path));
  const CheckpointMetadata& m = reader.metadata();
  std::cout << "checkpoint: " << reader.dir() << "\n"
            << "step: " << m.step << "\n"
            << "world size: " << m.world_size << "\n"
            << "mesh: " << mesh_text(m.mesh) << "\n";
  size_t width = 3;
  int64_t total = 0;
  for (const auto& [key, tensor] : m.tensors) {
    width = std::max(width, key.size());
    total += numel(tensor.shape) * static_cast<int64_t>(c10::elementSize(tensor.dtype));
  }
  std::cout << "tensors: " << m.tensors.size() << " (" << total << " bytes in "
            << files_of(m).size() << " files)\n";
  for (const auto& [key, tensor] : m.tensors) {
    const int64_t bytes =
        numel(tensor.shape) * static_cast<int64_t>(c10::elementSize(tensor.dtype));
    std::cout << "  " << std::left << std::setw(static_cast<int>(width)) << printable(key) << "  "
              << std::setw(8) << dtype_name(tensor.dtype) << "  " << std::setw(14)
              << format_list(tensor.shape) << std::right << std::setw(12) << bytes << " bytes  "
              << tensor.chunks.size() << (tensor.chunks.size() == 1 ? " chunk" : " chunks") << "\n";
  }
  std::cout << "state: " << m.state.size() << " keys\n";
  for (const auto& [name, value] : m.state.items()) {
    std::cout << "  " << printable(name) << ": " << printable(compact(value)) << "\n";
  }
  return 0;
}

int ckpt_verify_command(const std::string& path) {
  CheckpointReader reader(resolve_step_dir(path));  // checks every file and chunk listing
  size_t chunks = 0;
  for (const auto& [key, tensor] : reader.metadata().tensors) chunks += tensor.chunks.size();
  const size_t files = files_of(reader.metadata()).size();
  const std::vector<std::string> problems = reader.verify();
  for (const auto& line : problems) std::cout << printable(line) << "\n";
  if (!problems.empty()) {
    std::cout << "FAILED: " << problems.size() << " of " << chunks << " chunks in " << files
              << " files are corrupt\n";
    return 1;
  }
  std::cout << "ok: " << chunks << " chunks in " << files << " files";
  if (reader.metadata_checksummed()) {
    std::cout << ", " << kCheckpointMetadataFile << " matches " << kCheckpointMetadataChecksumFile
              << "\n";
  } else {
    std::cout << "\nnote: format_version " << reader.metadata().format_version << " has no "
              << kCheckpointMetadataChecksumFile << ": " << kCheckpointMetadataFile
              << " was checked for consistency only, not against a checksum\n";
  }
  return 0;
}

int ckpt_diff_command(const std::string& path_a, const std::string& path_b,
                      std::optional<double> atol) {
  CheckpointReader a(resolve_step_dir(path_a));
  CheckpointReader b(resolve_step_dir(path_b));
  const CheckpointMetadata& ma = a.metadata();
  const CheckpointMetadata& mb = b.metadata();
  std::cout << "A: " << a.dir() << "\nB: " << b.dir() << "\n";
  int structural = 0;  // keys, dtypes, shapes: fail with or without --atol
  int other = 0;       // step and state: fail without --atol (which compares tensors only)
  int differing_tensors = 0;
  double worst = 0;
  bool within = true;

  if (ma.step != mb.step) {
    std::cout << "step: " << ma.step << " vs " << mb.step << "\n";
    ++other;
  }
  // The layout at save is not content: tensors are compared as global tensors.
  if (ma.world_size != mb.world_size) {
    std::cout << "note: world size " << ma.world_size << " vs " << mb.world_size << "\n";
  }
  if (mesh_text(ma.mesh) != mesh_text(mb.mesh)) {
    std::cout << "note: mesh " << mesh_text(ma.mesh) << " vs " << mesh_text(mb.mesh) << "\n";
  }

  for (const auto& [key, ta] : ma.tensors) {
    auto it = mb.tensors.find(key);
    if (it == mb.tensors.end()) {
      std::cout << printable(key) << ": only in A\n";
      ++structural;
      continue;
    }
    const CheckpointTensor& tb = it->second;
    if (ta.dtype != tb.dtype || ta.shape != tb.shape) {
      std::cout << printable(key) << ": " << dtype_name(ta.dtype) << " " << format_list(ta.shape)
                << " vs " << dtype_name(tb.dtype) << " " << format_list(tb.shape) << "\n";
      ++structural;
      continue;
    }
    const TensorDiff d = diff_tensor(a, b, key, ta.shape);
    if (d.differing == 0) continue;
    ++differing_tensors;
    worst = std::max(worst, d.max_abs);
    if (atol && d.max_abs > *atol) within = false;
    std::cout << printable(key) << ": max abs diff " << number(d.max_abs) << ", max rel diff "
              << number(d.max_rel) << " (" << d.differing << " of " << numel(ta.shape)
              << " elements differ)\n";
  }
  for (const auto& [key, tb] : mb.tensors) {
    if (ma.tensors.count(key) == 0) {
      std::cout << printable(key) << ": only in B\n";
      ++structural;
    }
  }

  std::set<std::string> state_keys;
  for (const auto& [k, v] : ma.state.items()) state_keys.insert(k);
  for (const auto& [k, v] : mb.state.items()) state_keys.insert(k);
  for (const auto& k : state_keys) {
    const bool in_a = ma.state.contains(k), in_b = mb.state.contains(k);
    if (in_a && in_b && ma.state[k] == mb.state[k]) continue;
    ++other;
    std::cout << "state." << printable(k) << ": ";
    if (!in_b) {
      std::cout << "only in A\n";
    } else if (!in_a) {
      std::cout << "only in B\n";
    } else {
      std::cout << compact(ma.state[k], 200) << " vs " << compact(mb.state[k], 200) << "\n";
    }
  }

  if (structural == 0 && differing_tensors == 0 && other == 0) {
    std::cout << "identical: " << ma.tensors.size() << " tensors and the state\n";
    return 0;
  }
  if (atol && structural == 0 && within) {
    std::cout << "within --atol " << number(*atol) << ": " << count(differing_tensors, "tensor")
              << " with differences, at most " << number(worst);
    if (other > 0) std::cout << " (step and state are not compared with --atol)";
    std::cout << "\n";
    return 0;
  }
  std::vector<std::string> parts;
  if (structural > 0) parts.push_back(count(structural, "key") + " missing or mismatched");
  if (differing_tensors > 0) {
    parts.push_back(count(differing_tensors, "tensor") + " with differences" +
                    (atol && !within ? " (some by more than --atol " + number(*atol) + ")" : ""));
  }
  if (other > 0) parts.push_back(count(other, "step/state field") + " with differences");
  std::cout << "different:";
  for (size_t i = 0; i < parts.size(); ++i) std::cout << (i ? "; " : " ") << parts[i];
  std::cout << "\n";
  return 1;
}

}  // namespace mixtrain
