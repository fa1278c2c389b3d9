// Test-only checkpoint rewriting: copies a step directory into a one-rank checkpoint, dropping
// or changing tensors, to build the damaged or foreign checkpoints fp32-main-params §2.4 and the
// fault tests need. Uses the storage layer's public API only.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <xxhash.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "mixtrain/checkpoint/storage.h"

namespace mixtrain::test_support {

// Writes <dst_dir>/step-<step>/ (and `latest`) holding every tensor of `src_step_dir` for
// which keep(key) is true, passed through edit(key, tensor) (identity by default).
inline std::string copy_checkpoint(
    const std::string& src_step_dir, const std::string& dst_dir,
    const std::function<bool(const std::string&)>& keep,
    const std::function<at::Tensor(const std::string&, at::Tensor)>& edit = nullptr) {
  CheckpointReader reader(src_step_dir);
  CheckpointMetadata metadata = reader.metadata();
  std::vector<LocalChunk> chunks;
  for (const auto& [key, tensor] : reader.metadata().tensors) {
    if (!keep(key)) {
      metadata.tensors.erase(key);
      continue;
    }
    at::Tensor data = reader.read_full(key);
    if (edit) data = edit(key, data);
    chunks.push_back(
        LocalChunk{key, data, data.sizes().vec(), std::vector<int64_t>(data.dim(), 0)});
  }
  metadata.world_size = 1;
  metadata.mesh = CheckpointMesh{};
  prepare_step_tmp_dir(dst_dir, metadata.step);
  const std::string tmp = step_tmp_dir(dst_dir, metadata.step);
  const std::vector<CheckpointChunk> written = write_rank_file(tmp, 0, chunks);
  for (size_t i = 0; i < chunks.size(); ++i) {
    CheckpointTensor& t = metadata.tensors.at(chunks[i].key);
    t.dtype = chunks[i].data.scalar_type();
    t.shape = chunks[i].data.sizes().vec();
    t.chunks = {written[i]};
  }
  write_metadata(tmp, metadata);
  publish_step_dir(dst_dir, metadata.step);
  write_latest(dst_dir, metadata.step);
  return step_dir(dst_dir, metadata.step);
}

// Replaces <step_dir>/.metadata.json with `text` as it is (no validation: the damaged metadata
// the fault tests need) and rewrites .metadata.json.xxh3_64 to match, so that the damage gets
// past the checksum to the checks behind it.
inline void rewrite_metadata_text(const std::string& step_dir, const std::string& text) {
  std::ofstream(step_dir + "/" + kCheckpointMetadataFile, std::ios::binary | std::ios::trunc)
      << text;
  std::ofstream(step_dir + "/" + kCheckpointMetadataChecksumFile, std::ios::trunc)
      << format_xxh3_64(XXH3_64bits(text.data(), text.size())) << "\n";
}
inline void rewrite_metadata(const std::string& step_dir, const nlohmann::json& json) {
  rewrite_metadata_text(step_dir, json.dump());
}

}  // namespace mixtrain::test_support
