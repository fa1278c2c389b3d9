#include "mixtrain/checkpoint/distributed_checkpoint.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <c10/util/accumulate.h>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "mixtrain/checkpoint/storage.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/large_buffer.h"
#include "mixtrain/core/logging.h"

namespace mixtrain {
namespace {

using json = nlohmann::json;
using Region = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>>;

// A save that every rank agreed has failed (agree()), as opposed to a collective that failed.
class SaveFailed : public UserError {
 public:
  using UserError::UserError;
};

// Every rank's `error` (empty: fine); if any is non-empty, every rank throws the same SaveFailed.
void agree(Collectives& group, int64_t step, const std::string& phase, const std::string& error) {
  const std::vector<std::string> errors = all_gather_strings(group, error);
  std::string message;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    message += (message.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + errors[r]);
  }
  if (!message.empty()) {
    throw SaveFailed("checkpoint: saving step " + std::to_string(step) + " failed while " + phase +
                     " (the previous checkpoint is untouched): " + message);
  }
}

// Runs a save; a collective failing inside it (a rank died or stopped answering mid-save: Gloo
// reports the closed connection or the timeout) is reported as the failed save it is.
template <typename F>
void as_save(int64_t step, F&& action) {
  try {
    action();
  } catch (const SaveFailed&) {
    throw;
  } catch (const UserError& error) {
    throw UserError("checkpoint: saving step " + std::to_string(step) +
                    " failed (a rank stopped during the save; latest names the newest complete "
                    "step): " +
                    error.what());
  }
}

template <typename F>
std::string error_of(F&& action) {
  try {
    action();
    return "";
  } catch (const std::exception& error) {
    return error.what();
  }
}

json plan_of(const std::vector<LocalChunk>& chunks) {
  json plan = json::array();
  for (const auto& c : chunks) {
    plan.push_back({{"key", c.key},
                    {"offsets", c.offsets},
                    {"sizes", c.data.sizes().vec()},
                    {"shape", c.global_shape},
                    {"dtype", static_cast<int>(c.data.scalar_type())}});
  }
  return plan;
}

}  // namespace

CheckpointSaver::CheckpointSaver(std::string checkpoint_dir, int64_t keep_last, bool async,
                                 std::shared_ptr<Collectives> group)
    : dir_(std::move(checkpoint_dir)),
      keep_last_(keep_last),
      async_(async),
      group_(std::move(group)) {}

CheckpointSaver::~CheckpointSaver() {
  try {
    wait();
  } catch (const std::exception& error) {
    log_warn(std::string("checkpoint: ") + error.what());
  }
}

void CheckpointSaver::wait() {
  if (worker_.joinable()) worker_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void CheckpointSaver::save(SaveRequest request) {
  wait();
  if (!async_) {
    as_save(request.step, [&] { write(request); });
    return;
  }
  // Snapshot: training changes params and state in place while the worker writes. Not in
  // malloc'd memory: that would take the memory the training step's temporaries are recycled
  // from, and every step until the save ends would fault its temporaries in anew.
  // Device tensors go to pinned host memory, their copies queued on the device's current
  // stream (before the next step's updates, so they see this step's values) without the
  // training thread waiting: the writer waits for them (`copied`) before it reads the bytes.
  const c10::NoGradGuard no_grad;
  std::optional<c10::Device> device;
  for (auto& chunk : request.chunks) {
    at::Tensor copy;
    if (chunk.data.is_cpu()) {
      copy = empty_large_buffer(chunk.data.sizes(), chunk.data.scalar_type());
      copy.copy_(chunk.data);
    } else {
      device = chunk.data.device();
      copy = at::empty(chunk.data.sizes(),
                       at::TensorOptions().dtype(chunk.data.scalar_type()).pinned_memory(true));
      copy.copy_(chunk.data, /*non_blocking=*/true);
    }
    chunk.data = std::move(copy);
  }
  std::shared_ptr<c10::Event> copied;
  if (device) {
    const c10::impl::VirtualGuardImpl guard(device->type());
    copied = std::make_shared<c10::Event>(device->type());
    copied->record(guard.getStream(*device));
  }
  worker_ = std::thread([this, request = std::move(request), copied] {
    // The lowest CPU priority (Linux: per thread): the training's compute threads use every
    // core, and a writer that preempts one of them stalls every parallel region behind it (a
    // busy thread at equal priority made the steps 2x slower). At nice 19 it runs where they
    // leave a core idle; the save takes longer on a busy machine, training does not.
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
    try {
      if (copied) copied->synchronize();  // the staged device bytes are in host memory
      as_save(request.step, [&] { write(request); });
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void CheckpointSaver::write(const SaveRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  Collectives& group = *group_;
  const int rank = group.rank();
  const int64_t step = request.step;

  // Plan: who writes what. A region held by several ranks is written by the lowest of them.
  const std::vector<std::string> plans = all_gather_strings(group, plan_of(request.chunks).dump());
  std::map<Region, int> owner;
  std::map<std::string, std::pair<std::vector<int64_t>, int>> tensors;  // shape, dtype
  std::string plan_error;
  for (int r = 0; r < static_cast<int>(plans.size()); ++r) {
    for (const auto& entry : json::parse(plans[r])) {
      const std::string key = entry.at("key");
      owner.emplace(Region{key, entry.at("offsets"), entry.at("sizes")}, r);
      auto [it, added] =
          tensors.emplace(key, std::make_pair(entry.at("shape").get<std::vector<int64_t>>(),
                                              entry.at("dtype").get<int>()));
      if (!added &&
          (it->second.first != entry.at("shape") || it->second.second != entry.at("dtype")))
        plan_error = "ranks disagree on the shape or dtype of " + key;
    }
  }
  agree(group, step, "planning", plan_error);
  std::vector<LocalChunk> mine;
  for (const auto& chunk : request.chunks) {
    // Zero-element pieces (an FSDP rank past the last row) have nothing to write.
    if (chunk.data.numel() > 0 &&
        owner.at(Region{chunk.key, chunk.offsets, chunk.data.sizes().vec()}) == rank)
      mine.push_back(chunk);
  }

  agree(group, step, "creating the temporary directory",
        rank == 0 ? error_of([&] { prepare_step_tmp_dir(dir_, step); }) : "");

  const std::string tmp = step_tmp_dir(dir_, step);
  std::vector<CheckpointChunk> written;
  const std::string write_error = error_of([&] { written = write_rank_file(tmp, rank, mine); });
  json result = {
      {"error", write_error}, {"rank_state", request.rank_state}, {"chunks", json::array()}};
  for (size_t i = 0; i < written.size(); ++i) {
    result["chunks"].push_back({{"key", mine[i].key},
                                {"file", written[i].file},
                                {"offsets", written[i].offsets},
                                {"sizes", written[i].sizes},
                                {"xxh3_64", written[i].xxh3_64}});
  }
  // The written chunks (and each rank's error) go to every rank; only rank 0 uses them.
  const std::vector<std::string> results = all_gather_strings(group, result.dump());
  bool failed = false;
  for (const std::string& text : results) {
    failed = failed || !json::parse(text).at("error").get<std::string>().empty();
  }
  if (failed) {
    if (rank == 0) {
      std::error_code ignored;
      std::filesystem::remove_all(tmp, ignored);
    }
    // Each rank passes its own error: the message says "rank <r>: <error>" once per rank.
    agree(group, step, "writing the rank files", write_error);
  }

  std::string publish_error;
  int64_t total_bytes = 0;
  if (rank == 0) {
    publish_error = error_of([&] {
      CheckpointMetadata metadata;
      metadata.step = step;
      metadata.world_size = group.size();
      metadata.mesh = request.mesh;
      metadata.state = request.state;
      metadata.state["ranks"] = json::array();
      for (const auto& text : results) {
        const json r = json::parse(text);
        metadata.state["ranks"].push_back(r.at("rank_state"));
        for (const auto& c : r.at("chunks")) {
          CheckpointTensor& t = metadata.tensors[c.at("key").get<std::string>()];
          t.chunks.push_back(CheckpointChunk{c.at("file"), c.at("offsets"), c.at("sizes"),
                                             c.at("xxh3_64").get<uint64_t>()});
        }
      }
      for (const auto& [key, shape_and_dtype] : tensors) {
        const auto& [shape, dtype] = shape_and_dtype;
        CheckpointTensor& t = metadata.tensors[key];
        t.shape = shape;
        t.dtype = static_cast<c10::ScalarType>(dtype);
        total_bytes +=
            c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(t.dtype));
      }
      write_metadata(tmp, metadata);
      publish_step_dir(dir_, step);
      write_latest(dir_, step);
      prune_checkpoints(dir_, keep_last_);
    });
  }
  agree(group, step, "publishing the step directory", publish_error);
  if (rank == 0) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char summary[64];
    std::snprintf(summary, sizeof(summary), " (%.1f MiB in %.0f ms)",
                  static_cast<double>(total_bytes) / (1 << 20), seconds * 1e3);
    log_info("checkpoint: saved step " + std::to_string(step) + " to " + step_dir(dir_, step) +
             summary);
  }
}

}  // namespace mixtrain
