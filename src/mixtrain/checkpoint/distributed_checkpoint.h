// Distributed save (docs/architecture.md §8, torch DCP's plan -> write -> finish, natively): every
// rank passes its pieces of the global tensors; pieces that several ranks hold (HSDP replicas,
// expert-data-parallel replicas, replicated scalars) are written once, by the lowest rank
// holding them. Each rank writes its own __<rank>_0.safetensors into the step's temporary
// directory; rank 0 then writes .metadata.json with every chunk's checksum, publishes the
// directory and points `latest` at it (storage.h: a kill at any moment leaves the previous
// checkpoint loadable), and prunes to keep_last.
//
// A failure on any rank (disk full, permissions) fails the save on every rank with one
// UserError naming each failing rank and its error; the temporary directory is removed and
// the previous checkpoint stays. No rank can hang: every phase is a collective that all ranks
// reach whether their own part failed or not.
//
// async: save() snapshots the tensors (a copy, so training may go on changing them) and
// returns; a background thread runs the collective phases on its own process group (the
// trainer passes DeviceMesh::background), so its collectives never interleave with the
// training's. At most one save is in flight: save() and wait() join the previous one first
// and rethrow its error.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mixtrain/checkpoint/metadata.h"
#include "mixtrain/checkpoint/storage.h"
#include "mixtrain/core/collectives.h"

namespace mixtrain {

struct SaveRequest {
  int64_t step = 0;
  CheckpointMesh mesh;
  std::vector<LocalChunk> chunks;  // this rank's pieces (keys unique per rank)
  nlohmann::json state;            // non-tensor state; rank 0's is written
  nlohmann::json rank_state;       // per-rank state; written as state["ranks"][rank]
};

class CheckpointSaver {
 public:
  // `group` spans every rank (one rank: a LocalCollectives); with async it must be a group no
  // other thread uses.
  CheckpointSaver(std::string checkpoint_dir, int64_t keep_last, bool async,
                  std::shared_ptr<Collectives> group);
  ~CheckpointSaver();  // joins an in-flight save; its error is logged, not thrown
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Collective over `group`. Synchronous: returns when the step directory is published.
  void save(SaveRequest request);
  // Joins the in-flight save (if any) and rethrows its error.
  void wait();
  const std::string& dir() const { return dir_; }

 private:
  void write(const SaveRequest& request);
  std::string dir_;
  int64_t keep_last_;
  bool async_;
  std::shared_ptr<Collectives> group_;
  std::thread worker_;
  std::exception_ptr error_;
};

}  // namespace mixtrain
