// mixtrain._C's optimizer half: the C++ leaf optimizers (AdamW, SGD, Muon) and the FP32
// main-params wrapper, over the Python tensors themselves (the same TensorImpl: no copy).
// python/mixtrain/optim.py gives them torch.optim's interface (docs/python.md); this file only
// moves arguments across. Hyper-parameters cross as the JSON object a leaf's
// group_hyperparameters() gives (its own names), so every check stays the leaf's.
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/optim/adamw.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "mixtrain/optim/muon.h"
#include "mixtrain/optim/muon_config.h"
#include "mixtrain/optim/optimizer_table.h"
#include "mixtrain/optim/routing.h"
#include "mixtrain/optim/sgd.h"
#include "mixtrain/optim/state_swap.h"

namespace py = pybind11;

namespace mixtrain::python {
namespace {

using Groups = std::vector<std::vector<at::Tensor>>;

std::shared_ptr<LeafOptimizer> make_leaf(const std::string& kind, const Groups& groups) {
  std::vector<torch::optim::OptimizerParamGroup> torch_groups;
  for (const auto& params : groups) torch_groups.emplace_back(params);
  if (kind == "adamw") return std::make_shared<AdamW>(std::move(torch_groups));
  if (kind == "sgd") return std::make_shared<Sgd>(std::move(torch_groups));
  if (kind == "muon") return std::make_shared<Muon>(std::move(torch_groups));
  throw std::invalid_argument("mixtrain._C.make_leaf: unknown optimizer '" + kind + "'");
}

torch::optim::OptimizerParamGroup& group_at(LeafOptimizer& leaf, size_t group) {
  auto& groups = leaf.param_groups();
  if (group >= groups.size())
    throw std::out_of_range(leaf.kind() + ": no param group " + std::to_string(group));
  return groups[group];
}

// The leaf's step on the tensors as they are (no autograd recording), without the GIL: the
// step touches no Python object.
void step_leaf(LeafOptimizer& leaf) {
  py::gil_scoped_release release;
  leaf.step();
}

AdamW& as_adamw(LeafOptimizer& leaf) {
  auto* adamw = dynamic_cast<AdamW*>(&leaf);
  if (adamw == nullptr)
    throw std::invalid_argument(leaf.kind() + " has no fused form (AdamW only)");
  return *adamw;
}

Muon& as_muon(LeafOptimizer& leaf) {
  auto* muon = dynamic_cast<Muon*>(&leaf);
  if (muon == nullptr) throw std::invalid_argument(leaf.kind() + " has no head split (Muon only)");
  return *muon;
}

// The wrapper over Python-owned leaves: each leaf with the model names of its params, in the
// order of its groups.
std::unique_ptr<MixedPrecisionOptimizer> make_fp32_main_params(
    const std::vector<std::shared_ptr<LeafOptimizer>>& leaves,
    const std::vector<NamedTensors>& named, const DynamicLossScalerOptions& scaler) {
  if (leaves.size() != named.size())
    throw std::invalid_argument("FP32MainParams: one list of named parameters per optimizer");
  auto chained = std::make_unique<ChainedOptimizer>();
  for (size_t i = 0; i < leaves.size(); ++i) chained->add_leaf(leaves[i], named[i]);
  return std::make_unique<MixedPrecisionOptimizer>(std::move(chained), scaler);
}

// Muon's routing rule (muon_routing.h) under `dialect` ("yaml" | "toml"): per trainable param,
// "muon", "adamw" or (yaml's no-decay names, param_groups.h) "adamw_no_decay".
std::vector<std::pair<std::string, std::string>> route_muon(
    const NamedTensors& named, const std::string& dialect,
    const std::vector<std::string>& keywords) {
  register_optimizer_sections();
  OptimizerConfig config;
  config.target = "Muon";
  config.routing = dialect;
  config.options.get<torch::optim::AdamWOptions>().weight_decay(1.0);  // 0 marks no-decay
  config.options.get<MuonConfig>().adamw_keywords = keywords;
  std::vector<std::pair<std::string, std::string>> out;
  for (const RouteEntry& route : route_parameters(named, config)) {
    const bool no_decay = route.optimizer == "adamw" && route.weight_decay == 0.0;
    out.emplace_back(route.name, no_decay ? "adamw_no_decay" : route.optimizer);
  }
  return out;
}

}  // namespace

void bind_optim(py::module_& m) {
  py::class_<LeafOptimizer, std::shared_ptr<LeafOptimizer>>(m, "Leaf")
      .def_property_readonly("kind", &LeafOptimizer::kind)
      .def("step", &step_leaf)
      .def("hyperparameters", [](const LeafOptimizer& leaf,
                                 size_t group) { return leaf.group_hyperparameters(group).dump(); })
      .def("set_hyperparameters",
           [](LeafOptimizer& leaf, size_t group, const std::string& values) {
             leaf.set_group_hyperparameters(group, nlohmann::json::parse(values));
           })
      .def("check_hyperparameters",
           [](const LeafOptimizer& leaf, size_t group, const std::string& values) {
             leaf.options_with_hyperparameters(group, nlohmann::json::parse(values));
           })
      .def("set_lr", [](LeafOptimizer& leaf, size_t group,
                        double lr) { group_at(leaf, group).options().set_lr(lr); })
      .def("group_params",
           [](LeafOptimizer& leaf, size_t group) { return group_at(leaf, group).params(); })
      .def("state", &LeafOptimizer::export_state)
      .def("state_problems", &LeafOptimizer::check_state)
      .def("import_state", &LeafOptimizer::import_state)
      .def("set_fused_form",
           [](LeafOptimizer& leaf, bool fused) { as_adamw(leaf).set_fused_form(fused); })
      .def("set_head_split",
           [](LeafOptimizer& leaf, const at::Tensor& param, int64_t dim, int64_t block) {
             as_muon(leaf).set_head_split(param, {dim, block});
           });
  m.def("make_leaf", &make_leaf, py::arg("kind"), py::arg("groups"));
  m.attr("MAIN_PARAM_PREFIX") = kMainParamPrefix;
  m.def("route_muon", &route_muon, py::arg("named"), py::arg("dialect"), py::arg("keywords"));

  py::class_<DynamicLossScalerOptions>(m, "LossScalerOptions")
      .def(py::init<>())
      .def_readwrite("initial_scale", &DynamicLossScalerOptions::initial_scale)
      .def_readwrite("growth_factor", &DynamicLossScalerOptions::growth_factor)
      .def_readwrite("backoff_factor", &DynamicLossScalerOptions::backoff_factor)
      .def_readwrite("growth_interval", &DynamicLossScalerOptions::growth_interval)
      .def_readwrite("min_scale", &DynamicLossScalerOptions::min_scale);

  using MP = MixedPrecisionOptimizer;
  py::class_<MP>(m, "MixedPrecision")
      .def(py::init(&make_fp32_main_params), py::arg("leaves"), py::arg("named"), py::arg("scaler"))
      .def("accumulate_in_backward", &MP::accumulate_model_grads_in_backward)
      .def("accumulate_model_grads", &MP::accumulate_model_grads)
      .def("prepare_grads",
           [](MP& mp) {
             py::gil_scoped_release release;
             mp.prepare_grads();
           })
      .def("clip_grad_norm",
           [](MP& mp, double max_norm) {
             py::gil_scoped_release release;
             return mp.chained().clip_grad_norm(max_norm);
           })
      .def("step_with_ready_grads",
           [](MP& mp) {
             py::gil_scoped_release release;
             return mp.step_with_ready_grads();
           })
      .def("zero_grad", &MP::zero_grad)
      // The swap optimizer (state_swap.h): CPU state in `path` between steps (device state in
      // pinned host memory, `path` unused).
      .def("enable_swap",
           [](MP& mp, const std::string& path, int64_t bucket_mb, int64_t merge_buckets,
              const std::string& device) {
             mp.chained().enable_state_swap(std::make_unique<StateSwap>(
                 path, bucket_mb << 20, merge_buckets, c10::Device(device)));
           })
      // One parameter's state as its leaf exports it, read through the swap when it is on
      // (copies then; aliases of the live state otherwise).
      .def("leaf_state",
           [](MP& mp, const std::shared_ptr<LeafOptimizer>& leaf, const at::Tensor& param) {
             StateSwap* swap = mp.chained().state_swap();
             return swap != nullptr ? swap->read_state(*leaf, param) : leaf->export_state(param);
           })
      .def_property_readonly("loss_scale", &MP::loss_scale)
      .def_property_readonly("skipped_steps", &MP::skipped_steps)
      .def("main_param", &MP::main_param)
      .def("main_grad",
           [](MP& mp, const std::string& name) { return mp.chained().main_grad_if_defined(name); })
      .def_property_readonly("low_precision_names", &MP::low_precision_names)
      .def_property_readonly("names", [](MP& mp) { return mp.chained().names(); })
      .def("state_dict", &MP::state_dict)
      .def("check_state_dict", &MP::check_state_dict)
      .def("load_state_dict", &MP::load_state_dict)
      .def("scaler_state",
           [](MP& mp) -> py::object {
             const DynamicLossScaler* scaler = mp.loss_scaler();
             if (scaler == nullptr) return py::none();
             return py::make_tuple(scaler->scale(), scaler->growth_tracker(),
                                   scaler->skipped_steps());
           })
      .def("restore_scaler", [](MP& mp, double scale, int64_t growth_tracker, int64_t skipped) {
        DynamicLossScaler* scaler = mp.loss_scaler();
        if (scaler == nullptr)
          throw std::invalid_argument("FP32MainParams: no float16 parameter, no loss scaler");
        scaler->restore(scale, growth_tracker, skipped);
      });
}

}  // namespace mixtrain::python
