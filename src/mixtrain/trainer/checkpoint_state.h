// The non-tensor state of a training checkpoint (`state` in .metadata.json, written by
// make_save_request, listed in docs/checkpoint.md), read and checked in full before a restore
// changes anything: every field present with its type and range, train.step equal to the
// metadata's step, config_hash matching config, every recorded RNG state one LibTorch accepts.
// Each malformed value is one problem "<file>: state.<field>: <problem>" (core/json_reader.h),
// and every one is reported, not only the first.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixtrain/checkpoint/metadata.h"

namespace mixtrain {

struct SavedLossScaler {
  double scale = 1;  // finite, > 0
  int64_t growth_tracker = 0;
  int64_t skipped_steps = 0;
};

struct SavedTrainingState {
  int64_t step = 0;           // train.step
  int64_t data_position = 0;  // data.position (>= 0; the dataset checks the rank count)
  std::optional<SavedLossScaler> loss_scaler;  // absent: the run had none
  bool optimizer_saved = false;
  bool fp32_main_params = false;
  // optimizer.param_groups: an array of objects; ChainedOptimizer::load_param_groups_state
  // checks each group's fields against the optimizer.
  nlohmann::json param_groups;
  std::map<std::string, std::string> config;  // every recorded config leaf
  // ranks[r].rng_cpu as uint8 tensors, each a state the CPU generator accepts; empty when
  // the checkpoint records none.
  std::vector<at::Tensor> rng_cpu;
  // The parts ("train", "lr_schedule", "data", "loss_scaler", "optimizer", "config", "ranks")
  // that had a problem: their fields above are defaults, never to be used.
  std::set<std::string> unread_parts;
};

// `where` names the file in messages (the step directory's .metadata.json). Every problem
// goes to `problems` (one message each, in field order); the fields of a bad part keep their
// defaults and must not be applied.
SavedTrainingState read_training_state(const CheckpointMetadata& metadata, const std::string& where,
                                       std::vector<std::string>& problems);
// The same, throwing one DataError with every problem (one per line) when there is any.
SavedTrainingState read_training_state(const CheckpointMetadata& metadata,
                                       const std::string& where);

// The CPU generator state as lower-case hex (what ranks[r].rng_cpu holds), and back; the
// reverse checks the length and the digits and that LibTorch accepts it (on a scratch
// generator), DataError naming `field` otherwise.
std::string cpu_rng_state_hex();
at::Tensor cpu_rng_state_from_hex(const std::string& hex, const JsonFieldReader& reader,
                                  const std::string& field);

}  // namespace mixtrain
