// File-level checkpoint storage (docs/architecture.md §8): what one rank writes, how a step
// directory is published atomically, and how any process reads any region back. No collectives
// here; the distributed save (checkpoint/distributed_checkpoint.h) drives these from every rank.
//
// Crash safety: a step is written into a temporary directory <dir>/.tmp-step-<8 digits>,
// every file fsynced; publish_step_dir() fsyncs the directory and renames it to
// <dir>/step-<8 digits> (atomically exchanging an existing one, which is then removed), then
// write_latest() replaces <dir>/latest through a fsynced temporary file and a rename. A process
// killed at any moment leaves the previous step directory and `latest` intact and loadable.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/checkpoint/metadata.h"

namespace mixtrain {

// One piece of a global tensor held by this rank.
struct LocalChunk {
  std::string key;
  at::Tensor data;                    // CPU; its shape is the chunk's sizes
  std::vector<int64_t> global_shape;  // of the whole tensor
  std::vector<int64_t> offsets;       // of data inside it, per dim
};

// Writes <step_tmp_dir>/__<rank>_0.safetensors holding `chunks` (tensor name = key; keys
// unique) and fsyncs it. Returns, per chunk in order, its CheckpointChunk (file, offsets,
// sizes, checksum of the bytes written). Throws UserError naming the file on an I/O error.
// Chunks with zero elements (an FSDP rank holding 0 rows) are kept, not skipped: they are
// written as empty tensors and belong in the metadata like any other chunk, so the result
// stays one entry per input chunk (they cover no elements; the coverage check counts
// elements). No chunks at all gives a valid safetensors file with no tensors.
std::vector<CheckpointChunk> write_rank_file(const std::string& step_tmp_dir, int64_t rank,
                                             const std::vector<LocalChunk>& chunks);

// <step_tmp_dir>/.metadata.json.xxh3_64 and then <step_tmp_dir>/.metadata.json (as
// kCheckpointFormatVersion, whatever metadata.format_version says), each written through a
// temporary file, fsynced, renamed.
void write_metadata(const std::string& step_tmp_dir, const CheckpointMetadata& metadata);

// <dir>/.tmp-step-<8 digits>, and <dir>/step-<8 digits>.
std::string step_tmp_dir(const std::string& checkpoint_dir, int64_t step);
std::string step_dir(const std::string& checkpoint_dir, int64_t step);

// Removes a leftover temporary directory of `step` (a save killed earlier) and creates it
// empty (and checkpoint_dir if needed).
void prepare_step_tmp_dir(const std::string& checkpoint_dir, int64_t step);
// fsyncs tmp and its files, renames it to step_dir (replacing an existing one atomically with
// renameat2(RENAME_EXCHANGE), then deleting the old contents), fsyncs checkpoint_dir.
void publish_step_dir(const std::string& checkpoint_dir, int64_t step);
// Atomically points <checkpoint_dir>/latest at step-<8 digits>.
void write_latest(const std::string& checkpoint_dir, int64_t step);
// Complete step directories (name step-<8 digits> with a .metadata.json), ascending by step.
std::vector<int64_t> list_complete_steps(const std::string& checkpoint_dir);
// Deletes the oldest complete step directories so that keep_last remain (0: keep all); never
// the one `latest` names. Also removes stale .tmp-step-* directories older than the newest
// complete step (and latest.tmp-* files left by a killed write_latest).
void prune_checkpoints(const std::string& checkpoint_dir, int64_t keep_last);

// `path` is a step directory (has .metadata.json) or a checkpoint directory with `latest`:
// returns the step directory. DataError naming the path otherwise (missing, no latest, latest
// naming a missing or incomplete step).
std::string resolve_step_dir(const std::string& path);

// Read access to one step directory. The constructor checks .metadata.json against
// .metadata.json.xxh3_64 (required from format version 2), reads and validates it
// (metadata_from_json) and checks every rank file it names: it exists, its safetensors header
// is valid, it is exactly as long as its header says, and each chunk listed for it is there
// under its key with the metadata's dtype and sizes. Checksums are checked as chunks are read
// (each chunk once), and all at once by verify(). Every error is a DataError naming the file
// and, for chunk problems, the key and chunk offsets.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& step_dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& dir() const { return dir_; }
  const CheckpointMetadata& metadata() const { return metadata_; }
  // Whether .metadata.json was checked against its checksum (false: a version-1 checkpoint).
  bool metadata_checksummed() const { return metadata_checksummed_; }
  bool contains(const std::string& key) const { return metadata_.tensors.count(key) != 0; }

  // The region [offsets, offsets + sizes) of tensor `key` (its dtype), assembled from every
  // chunk overlapping it; checks each chunk's checksum before its bytes are used. Throws
  // DataError for an unknown key, a region outside the shape or a checksum mismatch.
  at::Tensor read(const std::string& key, const std::vector<int64_t>& offsets,
                  const std::vector<int64_t>& sizes);
  at::Tensor read_full(const std::string& key);
  // Checks the checksum of every chunk of `key` (so that a region read later cannot fail).
  void verify_key(const std::string& key);
  // Checks every chunk; returns one line per bad chunk ("<file>: <key> chunk at offsets [..]:
  // checksum <got>, metadata says <want>"), empty when all are good.
  std::vector<std::string> verify();

 private:
  struct Impl;
  std::string dir_;
  CheckpointMetadata metadata_;
  bool metadata_checksummed_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mixtrain
