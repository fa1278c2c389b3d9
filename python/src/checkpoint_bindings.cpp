// mixtrain._C's checkpoint half: one step directory of the trainer's checkpoint format
// (docs/checkpoint.md) read whole and written whole by one rank, for mixtrain.checkpoint
// (python/mixtrain/checkpoint.py). Every check is the checkpoint layer's own: the metadata's
// checksum and consistency, every chunk's checksum as it is read, the atomic publish.
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mixtrain/checkpoint/distributed_checkpoint.h"
#include "mixtrain/checkpoint/storage.h"
#include "mixtrain/core/collectives.h"
#include "mixtrain/core/safetensors.h"

namespace py = pybind11;

namespace mixtrain::python {
namespace {

// (step directory, step, tensors, state as JSON text) of `path`: a step directory, or a
// checkpoint directory whose `latest` names one.
std::tuple<std::string, int64_t, NamedTensors, std::string> read_checkpoint(
    const std::string& path) {
  py::gil_scoped_release release;
  CheckpointReader reader(resolve_step_dir(path));
  NamedTensors tensors;
  for (const auto& [key, tensor] : reader.metadata().tensors) {
    tensors.emplace_back(key, reader.read_full(key));
  }
  return {reader.dir(), reader.metadata().step, std::move(tensors), reader.metadata().state.dump()};
}

// Publishes <checkpoint_dir>/step-<step> holding `tensors` whole (one rank) and `state`
// (JSON text; rank_state becomes state.ranks[0]), points `latest` at it and keeps the newest
// keep_last steps (0: all).
void write_checkpoint(const std::string& checkpoint_dir, int64_t step, const NamedTensors& tensors,
                      const std::string& state, const std::string& rank_state, int64_t keep_last) {
  SaveRequest request;
  request.step = step;
  for (const auto& [key, tensor] : tensors) {
    const at::Tensor data = tensor.detach().to(at::kCPU).contiguous();
    request.chunks.push_back({key, data, data.sizes().vec(), std::vector<int64_t>(data.dim(), 0)});
  }
  request.state = nlohmann::json::parse(state);
  request.rank_state = nlohmann::json::parse(rank_state);
  py::gil_scoped_release release;
  CheckpointSaver saver(checkpoint_dir, keep_last, /*async=*/false,
                        make_local_collectives("world"));
  saver.save(std::move(request));
}

}  // namespace

void bind_checkpoint(py::module_& m) {
  m.def("read_checkpoint", &read_checkpoint, py::arg("path"));
  m.def("write_checkpoint", &write_checkpoint, py::arg("checkpoint_dir"), py::arg("step"),
        py::arg("tensors"), py::arg("state"), py::arg("rank_state"), py::arg("keep_last"));
}

}  // namespace mixtrain::python
