#include "mixtrain/optim/chained_optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/host_sync.h"
#include "mixtrain/core/text.h"
#include "mixtrain/optim/grad_clip.h"
#include "mixtrain/optim/widen_add_fused.h"

namespace mixtrain {
namespace {

// The fields param_groups_state adds around a leaf's group_hyperparameters.
constexpr const char* kGroupFields[] = {"optimizer", "group", "params", "base_lr"};

std::string group_label(const std::string& kind, size_t group) {
  return kind + " group " + std::to_string(group);
}

// A value in a difference line: strings as they are, everything else as JSON (numbers in
// their shortest round-trip form).
std::string format_value(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// "" when the lists are equal, else what differs.
std::string params_difference(const std::vector<std::string>& checkpoint,
                              const std::vector<std::string>& current) {
  if (checkpoint == current) return "";
  size_t i = 0;
  while (i < checkpoint.size() && i < current.size() && checkpoint[i] == current[i]) ++i;
  auto name_at = [i](const std::vector<std::string>& names) {
    return i < names.size() ? "'" + names[i] + "'" : std::string("(none)");
  };
  return "params differ: the checkpoint's group has " + std::to_string(checkpoint.size()) +
         ", this optimizer's has " + std::to_string(current.size()) +
         "; first difference at position " + std::to_string(i) + ": checkpoint " +
         name_at(checkpoint) + ", this optimizer " + name_at(current);
}

}  // namespace

std::string format_load_problems(const std::string& what,
                                 const std::vector<std::string>& problems) {
  std::string message = what + ": " + std::to_string(problems.size()) + " problem(s)";
  for (const auto& problem : problems) message += "\n  - " + problem;
  return message;
}

void ChainedOptimizer::add_leaf(std::shared_ptr<LeafOptimizer> leaf,
                                const NamedTensors& named_params) {
  if (!leaf) throw std::invalid_argument("ChainedOptimizer::add_leaf: null leaf");
  const std::string kind = leaf->kind();
  std::unordered_map<const void*, size_t> in_groups;  // leaf param -> times seen
  for (const auto& group : leaf->param_groups()) {
    for (const auto& p : group.params()) ++in_groups[p.unsafeGetTensorImpl()];
  }
  std::unordered_set<const void*> named;
  for (const auto& [name, param] : named_params) {
    const void* impl = param.unsafeGetTensorImpl();
    if (entries_.count(name))
      throw std::invalid_argument("ChainedOptimizer::add_leaf(" + kind + "): parameter name '" +
                                  name + "' is already in the chain");
    if (optimizer_param_names_.count(impl) || model_param_names_.count(impl))
      throw std::invalid_argument("ChainedOptimizer::add_leaf(" + kind + "): parameter '" + name +
                                  "' is already in the chain under another name");
    auto it = in_groups.find(impl);
    if (it == in_groups.end())
      throw std::invalid_argument("ChainedOptimizer::add_leaf(" + kind + "): parameter '" + name +
                                  "' is not in the leaf's param groups");
    if (it->second != 1 || !named.insert(impl).second)
      throw std::invalid_argument("ChainedOptimizer::add_leaf(" + kind + "): parameter '" + name +
                                  "' appears more than once");
  }
  if (named.size() != in_groups.size())
    throw std::invalid_argument("ChainedOptimizer::add_leaf(" + kind +
                                "): " + std::to_string(in_groups.size() - named.size()) +
                                " parameter(s) of the leaf's groups have no name");

  const size_t index = leaves_.size();
  for (const auto& [name, param] : named_params) {
    entries_[name] =
        Entry{param, param, index, at::Tensor(), whole_placement(name, param.sizes().vec())};
    names_.push_back(name);
    optimizer_param_names_[param.unsafeGetTensorImpl()] = name;
    model_param_names_[param.unsafeGetTensorImpl()] = name;
  }
  std::vector<double> lrs;
  for (const auto& group : leaf->param_groups()) lrs.push_back(group.options().get_lr());
  base_lrs_.push_back(std::move(lrs));
  leaves_.push_back(std::move(leaf));
}

const ChainedOptimizer::Entry& ChainedOptimizer::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    throw std::invalid_argument("optimizer: no trainable parameter named '" + name + "'");
  return it->second;
}

const at::Tensor& ChainedOptimizer::model_param(const std::string& name) const {
  return entry(name).model_param;
}

const at::Tensor& ChainedOptimizer::optimizer_param(const std::string& name) const {
  return entry(name).optimizer_param;
}

LeafOptimizer& ChainedOptimizer::leaf_of(const std::string& name) const {
  return *leaves_[entry(name).leaf];
}

const std::string& ChainedOptimizer::name_of(const at::Tensor& param) const {
  const void* impl = param.unsafeGetTensorImpl();
  auto it = optimizer_param_names_.find(impl);
  if (it != optimizer_param_names_.end()) return it->second;
  it = model_param_names_.find(impl);
  if (it != model_param_names_.end()) return it->second;
  throw std::invalid_argument("optimizer: tensor is neither an optimizer nor a model parameter");
}

void ChainedOptimizer::replace_parameter(const std::string& name, const at::Tensor& new_param) {
  replace_parameters({{name, new_param}});
}

void ChainedOptimizer::replace_parameters(const NamedTensors& replacements) {
  for (const auto& [name, new_param] : replacements) {
    const Entry& e = entry(name);
    if (new_param.sizes() != e.optimizer_param.sizes())
      throw std::invalid_argument("optimizer: replacement for '" + name + "' has shape " +
                                  format_list(new_param.sizes()) + ", expected " +
                                  format_list(e.optimizer_param.sizes()));
  }
  std::set<size_t> touched;
  for (const auto& [name, new_param] : replacements) {
    Entry& e = entries_.at(name);
    leaves_[e.leaf]->replace_parameter(e.optimizer_param, new_param);
    optimizer_param_names_.erase(e.optimizer_param.unsafeGetTensorImpl());
    e.optimizer_param = new_param;
    optimizer_param_names_[new_param.unsafeGetTensorImpl()] = name;
    touched.insert(e.leaf);
  }
  // Muon caches per-parameter batches; they must not keep the replaced tensors (fp32-main-params
  // §7.3).
  for (size_t leaf : touched) leaves_[leaf]->reset_parameter_caches();
}

ChainedOptimizer::StateInitialization ChainedOptimizer::initialize_state() {
  StateInitialization created;
  for (size_t l = 0; l < leaves_.size(); ++l) {
    LeafOptimizer& leaf = *leaves_[l];
    std::vector<std::string> stateless;
    for (const auto& name : names_) {
      const Entry& e = entries_.at(name);
      if (e.leaf == l && leaf.export_state(e.optimizer_param).empty()) stateless.push_back(name);
    }
    if (stateless.empty()) continue;

    // Only the stateless params get a (zero) grad, so the others' state does not advance;
    // lr 0 makes the update and the decoupled weight decay (1 - lr * wd) identities. The
    // values are restored anyway, so even the sign of a zero cannot change.
    std::vector<std::pair<at::Tensor, at::Tensor>> saved_grads;
    std::vector<double> saved_lrs;
    for (auto& group : leaf.param_groups()) {
      for (auto& p : group.params()) {
        saved_grads.emplace_back(p, p.grad());
        p.mutable_grad().reset();
      }
      saved_lrs.push_back(group.options().get_lr());
      group.options().set_lr(0.0);
    }
    std::vector<std::pair<at::Tensor, at::Tensor>> saved_values;
    for (const auto& name : stateless) {
      const at::Tensor& p = entries_.at(name).optimizer_param;
      saved_values.emplace_back(p, p.detach().clone());
      p.mutable_grad() = at::zeros_like(p.detach());
    }
    std::unordered_set<StateKey> keys_before;
    for (const auto& kv : leaf.state()) keys_before.insert(kv.first);

    auto restore = [&] {
      c10::NoGradGuard no_grad;
      for (auto& [p, value] : saved_values) p.copy_(value);
      for (auto& [p, grad] : saved_grads) p.mutable_grad() = grad;
      size_t g = 0;
      for (auto& group : leaf.param_groups()) group.options().set_lr(saved_lrs[g++]);
    };
    try {
      if (swap_) swap_->begin_step();
      leaf.step();
      if (swap_) swap_->end_step();
    } catch (...) {
      restore();
      for (auto it = leaf.state().begin(); it != leaf.state().end();) {
        it = keys_before.count(it->first) ? std::next(it) : leaf.state().erase(it);
      }
      throw;
    }
    restore();
    for (const auto& kv : leaf.state()) {
      if (!keys_before.count(kv.first)) created.keys_.emplace_back(l, kv.first);
    }
    created.names_.insert(created.names_.end(), stateless.begin(), stateless.end());
  }
  return created;
}

void ChainedOptimizer::undo_initialize_state(const StateInitialization& created) {
  for (const auto& [leaf, key] : created.keys_) leaves_[leaf]->state().erase(key);
}

std::vector<std::string> ChainedOptimizer::check_state_dict(const NamedTensors& state) const {
  std::vector<std::string> problems;
  std::map<std::string, at::Tensor> given;
  for (const auto& [key, tensor] : state) {
    if (!starts_with(key, kOptimizerStatePrefix)) {
      problems.push_back("unexpected key " + key);
    } else if (!given.emplace(key, tensor).second) {
      problems.push_back("duplicate key " + key);
    }
  }
  std::set<std::string> expected;
  for (const auto& name : names_) {
    const Entry& e = entries_.at(name);
    for (const auto& [state_name, live] : leaves_[e.leaf]->export_state(e.optimizer_param)) {
      const std::string key = kOptimizerStatePrefix + name + "." + state_name;
      expected.insert(key);
      auto it = given.find(key);
      if (it == given.end()) {
        problems.push_back("missing key " + key);
        continue;
      }
      const at::Tensor& t = it->second;
      if (!t.defined()) {
        problems.push_back(key + ": undefined tensor");
        continue;
      }
      if (t.sizes() != live.sizes())
        problems.push_back(key + ": shape " + format_list(t.sizes()) + ", expected " +
                           format_list(live.sizes()));
      // A count (step) may come in any real dtype; the leaf checks its value below.
      if (!state_dtype_loads_into(t.scalar_type(), live.scalar_type()) &&
          !leaves_[e.leaf]->is_count_field(state_name))
        problems.push_back(key + ": dtype " + dtype_name(t.scalar_type()) + ", expected " +
                           dtype_name(live.scalar_type()));
    }
  }
  // The values, as each leaf checks them, for parameters whose keys, shapes and dtypes passed.
  for (const auto& name : names_) {
    const Entry& e = entries_.at(name);
    const LeafOptimizer& leaf = *leaves_[e.leaf];
    NamedTensorList saved;
    bool complete = true;
    for (const auto& [state_name, live] : leaf.export_state(e.optimizer_param)) {
      auto it = given.find(kOptimizerStatePrefix + name + "." + state_name);
      complete = complete && it != given.end() && it->second.defined() &&
                 it->second.sizes() == live.sizes() &&
                 (state_dtype_loads_into(it->second.scalar_type(), live.scalar_type()) ||
                  leaf.is_count_field(state_name));
      if (complete) saved.emplace_back(state_name, it->second);
    }
    if (!complete || saved.empty()) continue;
    for (const auto& problem : leaf.check_state(e.optimizer_param, saved)) {
      problems.push_back(kOptimizerStatePrefix + name + ": " + leaf.kind() + ": " + problem);
    }
  }
  for (const auto& [key, tensor] : given) {
    if (expected.count(key)) continue;
    const std::string rest = key.substr(std::string(kOptimizerStatePrefix).size());
    const size_t dot = rest.rfind('.');
    const std::string name = dot == std::string::npos ? rest : rest.substr(0, dot);
    problems.push_back("unexpected key " + key +
                       (entries_.count(name)
                            ? " (parameter '" + name + "' is updated by " + leaf_of(name).kind() +
                                  ", which has no such state)"
                            : " (no trainable parameter '" + name + "')"));
  }
  return problems;
}

void ChainedOptimizer::import_checked_state(const NamedTensors& state) {
  std::unordered_map<std::string, at::Tensor> by_key(state.begin(), state.end());
  for (const auto& name : names_) {
    const Entry& e = entries_.at(name);
    LeafOptimizer& leaf = *leaves_[e.leaf];
    NamedTensorList imported;
    for (const auto& [state_name, live] : leaf.export_state(e.optimizer_param)) {
      const at::Tensor& saved = by_key.at(kOptimizerStatePrefix + name + "." + state_name);
      // A floating state of another precision takes the live state's dtype, as in
      // torch.optim.Optimizer.load_state_dict (exact when widening, rounding when narrowing),
      // and the live state's device (a checkpoint is device-agnostic). Same dtype and device:
      // the saved tensor itself.
      imported.emplace_back(state_name, saved.to(live.device(), live.scalar_type()));
    }
    if (!imported.empty()) leaf.import_state(e.optimizer_param, imported);
  }
  if (swap_) {
    swap_->store(leaf_params());
  }
}

void ChainedOptimizer::load_state_dict(const NamedTensors& state) {
  StateInitialization created = initialize_state();
  std::vector<std::string> problems = check_state_dict(state);
  if (!problems.empty()) {
    undo_initialize_state(created);
    throw std::invalid_argument(format_load_problems("optimizer load_state_dict", problems));
  }
  import_checked_state(state);
}

at::Tensor& ChainedOptimizer::main_grad(const std::string& name) {
  entry(name);  // throws for an unknown name
  Entry& e = entries_.at(name);
  if (!e.main_grad.defined())
    e.main_grad = at::zeros(e.model_param.sizes(), e.model_param.options().dtype(at::kFloat));
  return e.main_grad;
}

void ChainedOptimizer::accumulate_main_grad(const std::string& name, const at::Tensor& grad) {
  entry(name);  // throws for an unknown name
  Entry& e = entries_.at(name);
  if (grad.sizes() != e.model_param.sizes()) {
    throw std::logic_error("optimizer: grad of " + name + " has the wrong shape for main_grad");
  }
  const bool first = !e.main_grad.defined();
  if (first) {
    e.main_grad = at::empty(e.model_param.sizes(), e.model_param.options().dtype(at::kFloat));
  }
  if (widen_add_fusable(e.main_grad, grad)) {
    // One pass (widen_add_fused.h); ATen's mixed-dtype add would first copy the grad into a
    // float32 temporary. Same bits as the ATen path below.
    widen_add_fused(e.main_grad, grad, first);
  } else if (first) {
    // 0 + grad in float32: bitwise the zeroed buffer plus grad (-0 becomes +0). A 1-element
    // float32 zero (not 0-dim: that would not promote) makes the sum float32.
    at::add_out(e.main_grad, grad, at::zeros({1}, grad.options().dtype(at::kFloat)));
  } else {
    e.main_grad.add_(grad);
  }
}

at::Tensor ChainedOptimizer::main_grad_if_defined(const std::string& name) const {
  return entry(name).main_grad;
}

void ChainedOptimizer::prepare_grads() {
  for (const auto& name : names_) {
    const Entry& e = entries_.at(name);
    if (!e.main_grad.defined()) continue;
    // float32 params read main_grad itself (fp32-main-params §8.2: model_param.grad = main_grad).
    e.optimizer_param.mutable_grad() = e.main_grad.scalar_type() == e.optimizer_param.scalar_type()
                                           ? e.main_grad
                                           : e.main_grad.to(e.optimizer_param.scalar_type());
  }
}

void ChainedOptimizer::set_placements(const std::vector<ParamPlacement>& placements) {
  for (const auto& placement : placements) {
    if (!contains(placement.name)) {
      throw std::invalid_argument("set_placements: no trainable parameter named '" +
                                  placement.name + "'");
    }
  }
  for (const auto& placement : placements) {
    Entry& e = entries_.at(placement.name);
    e.placement = placement;
    leaves_[e.leaf]->set_placement(e.optimizer_param, placement);
  }
}

double ChainedOptimizer::clip_grad_norm(double max_norm) {
  std::vector<at::Tensor> grads;
  std::vector<const ParamPlacement*> placements;
  grads_and_placements(grads, placements);
  return mixtrain::clip_grad_norm(grads, placements, max_norm);
}

at::Tensor ChainedOptimizer::clip_grad_norm_unread(double max_norm) {
  std::vector<at::Tensor> grads;
  std::vector<const ParamPlacement*> placements;
  grads_and_placements(grads, placements);
  return mixtrain::clip_grad_norm_unread(grads, placements, max_norm);
}

void ChainedOptimizer::grads_and_placements(std::vector<at::Tensor>& grads,
                                            std::vector<const ParamPlacement*>& placements) const {
  for (const auto& name : names_) {
    const Entry& e = entries_.at(name);
    grads.push_back(e.optimizer_param.grad());  // undefined ones still name their group
    placements.push_back(&e.placement);
  }
}

bool ChainedOptimizer::any_piece_holder(bool local) {
  return read_int64(any_piece_holder(at::full({1}, local ? 1 : 0, at::kLong)),
                    "found inf: over the pieces groups") > 0;
}

at::Tensor ChainedOptimizer::any_piece_holder(const at::Tensor& local) {
  // The pieces groups first, then the tp groups of tp-split parameters: after the first
  // rounds every rank of one tp index agrees, the tp rounds join the tp indices.
  std::vector<Collectives*> groups;
  const auto add = [&groups](Collectives* group) {
    if (group != nullptr && group->size() > 1 &&
        std::find(groups.begin(), groups.end(), group) == groups.end()) {
      groups.push_back(group);
    }
  };
  for (const auto& name : names_) add(entries_.at(name).placement.pieces_group().get());
  for (const auto& name : names_) {
    const ParamPlacement& placement = entries_.at(name).placement;
    if (placement.tp_split()) add(placement.tp_group.get());
  }
  at::Tensor any = local.to(at::kLong).reshape({1}).clone();
  for (Collectives* group : groups) {
    group->all_reduce_sum(any);
    any = any.clamp_max(1);  // 0 or 1 again, whatever the group size
  }
  return any;
}

std::vector<at::Tensor> ChainedOptimizer::grads_for_clipping() {
  std::vector<at::Tensor> grads;
  for (const auto& name : names_) {
    const at::Tensor& grad = entries_.at(name).optimizer_param.grad();
    if (grad.defined()) grads.push_back(grad);
  }
  return grads;
}

bool ChainedOptimizer::step_with_ready_grads() {
  if (swap_) swap_->begin_step();
  for (auto& leaf : leaves_) leaf->step();
  if (swap_) swap_->end_step();
  return true;
}

std::vector<std::pair<LeafOptimizer*, at::Tensor>> ChainedOptimizer::leaf_params() const {
  std::vector<std::pair<LeafOptimizer*, at::Tensor>> params;
  for (const auto& name : names_) {
    const Entry& e = entries_.at(name);
    params.emplace_back(leaves_[e.leaf].get(), e.optimizer_param);
  }
  return params;
}

void ChainedOptimizer::enable_state_swap(std::unique_ptr<StateSwap> swap) {
  swap_ = std::move(swap);
  for (auto& leaf : leaves_) leaf->set_state_swap(swap_.get());
  // State that exists already (a restore before this call) goes to the file now.
  swap_->store(leaf_params());
}

void ChainedOptimizer::zero_grad() {
  for (const auto& name : names_) {
    Entry& e = entries_.at(name);
    e.optimizer_param.mutable_grad().reset();
    e.model_param.mutable_grad().reset();
    e.main_grad.reset();
  }
}

void ChainedOptimizer::check_group_counts() const {
  for (size_t l = 0; l < leaves_.size(); ++l) {
    if (leaves_[l]->param_groups().size() != base_lrs_[l].size())
      throw std::logic_error("optimizer: " + leaves_[l]->kind() +
                             " param groups were added after add_leaf; their base lr is unknown");
  }
}

void ChainedOptimizer::set_lr_factor(double factor) {
  check_group_counts();
  for (size_t l = 0; l < leaves_.size(); ++l) {
    auto& groups = leaves_[l]->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(base_lrs_[l][g] * factor);
  }
  lr_factor_ = factor;
}

nlohmann::json ChainedOptimizer::param_groups_state() const {
  check_group_counts();
  nlohmann::json groups = nlohmann::json::array();
  for (size_t l = 0; l < leaves_.size(); ++l) {
    const LeafOptimizer& leaf = *leaves_[l];
    for (size_t g = 0; g < leaf.param_groups().size(); ++g) {
      nlohmann::json entry = leaf.group_hyperparameters(g);
      for (const char* field : kGroupFields) {
        if (entry.contains(field))
          throw std::logic_error("optimizer: " + leaf.kind() + " hyper-parameter '" + field +
                                 "' collides with a param group field");
      }
      nlohmann::json params = nlohmann::json::array();
      for (const auto& p : leaf.param_groups()[g].params()) params.push_back(name_of(p));
      entry["optimizer"] = leaf.kind();
      entry["group"] = g;
      entry["params"] = std::move(params);
      entry["base_lr"] = base_lrs_[l][g];
      groups.push_back(std::move(entry));
    }
  }
  return groups;
}

ChainedOptimizer::ParamGroupsPlan ChainedOptimizer::plan_param_groups(
    const nlohmann::json& groups) const {
  check_group_counts();
  const std::string what = "optimizer param groups";
  ParamGroupsPlan plan;
  std::vector<ParamGroupsPlan::Slot>& slots = plan.slots_;
  for (size_t l = 0; l < leaves_.size(); ++l) {
    for (size_t g = 0; g < base_lrs_[l].size(); ++g)
      slots.push_back({l, g, group_label(leaves_[l]->kind(), g), 0.0, nullptr});
  }
  // A list of another length cannot be matched group by group: one problem, said whole.
  if (!groups.is_array()) {
    plan.error_ = what + ": expected a JSON array, got " + groups.type_name();
  } else if (groups.size() != slots.size()) {
    std::string ours;
    for (const auto& slot : slots) ours += (ours.empty() ? "" : ", ") + slot.label;
    plan.error_ = what + ": the checkpoint has " + std::to_string(groups.size()) +
                  " param group(s), this optimizer has " + std::to_string(slots.size()) + " (" +
                  ours + ")";
  }
  if (!plan.error_.empty()) {
    plan.problems_.push_back(plan.error_);
    return plan;
  }

  std::vector<std::string>& problems = plan.problems_;
  for (size_t i = 0; i < slots.size(); ++i) {
    ParamGroupsPlan::Slot& slot = slots[i];
    const LeafOptimizer& leaf = *leaves_[slot.leaf];
    const nlohmann::json& entry = groups[i];
    const std::string& label = slot.label;
    if (!entry.is_object()) {
      problems.push_back("param group " + std::to_string(i) + " (" + label +
                         "): expected a JSON object, got " + entry.type_name());
      continue;
    }
    auto field = [&](const char* name) -> const nlohmann::json* {
      auto it = entry.find(name);
      if (it != entry.end()) return &*it;
      problems.push_back(label + ": missing field '" + name + "'");
      return nullptr;
    };
    if (const nlohmann::json* kind = field("optimizer")) {
      if (!kind->is_string()) {
        problems.push_back(label + ": " +
                           hyperparameter_type_error("optimizer", "a string", *kind));
        continue;
      }
      if (kind->get<std::string>() != leaf.kind()) {
        problems.push_back("param group " + std::to_string(i) + ": optimizer differs: checkpoint " +
                           kind->get<std::string>() + ", this optimizer " + leaf.kind() + " (" +
                           label + ")");
        continue;  // its fields belong to another optimizer
      }
    } else {
      continue;
    }
    if (const nlohmann::json* index = field("group")) {
      if (!index->is_number_integer()) {
        problems.push_back(label + ": " + hyperparameter_type_error("group", "an integer", *index));
      } else if (index->is_number_unsigned()
                     ? index->get<uint64_t>() != slot.group
                     : index->get<int64_t>() < 0 ||
                           static_cast<uint64_t>(index->get<int64_t>()) != slot.group) {
        problems.push_back(label + ": the checkpoint's group index is " + index->dump() +
                           ", expected " + std::to_string(slot.group));
      }
    }
    if (const nlohmann::json* params = field("params")) {
      std::vector<std::string> names;
      bool strings = params->is_array();
      if (strings) {
        for (const auto& name : *params) {
          strings = strings && name.is_string();
          if (strings) names.push_back(name.get<std::string>());
        }
      }
      if (!strings) {
        problems.push_back(
            label + ": " +
            hyperparameter_type_error("params", "an array of parameter names", *params));
      } else {
        std::vector<std::string> current;
        for (const auto& p : leaf.param_groups()[slot.group].params())
          current.push_back(name_of(p));
        const std::string difference = params_difference(names, current);
        if (!difference.empty()) problems.push_back(label + ": " + difference);
      }
    }
    if (const nlohmann::json* base_lr = field("base_lr")) {
      if (!base_lr->is_number()) {
        problems.push_back(label + ": " +
                           hyperparameter_type_error("base_lr", "a number", *base_lr));
      } else if (!(base_lr->get<double>() >= 0.0)) {
        problems.push_back(label + ": base_lr must be >= 0, got " + base_lr->dump());
      } else {
        slot.base_lr = base_lr->get<double>();
      }
    }
    // The leaf checks the group's values and answers with the options they make (pure).
    nlohmann::json values = entry;
    for (const char* name : kGroupFields) values.erase(name);
    try {
      slot.options = leaf.options_with_hyperparameters(slot.group, values);
    } catch (const std::invalid_argument& error) {
      problems.push_back(label + ": " + error.what());
    }
  }
  if (!problems.empty()) plan.error_ = format_load_problems(what, problems);
  return plan;
}

std::vector<std::string> ChainedOptimizer::apply_param_groups(ParamGroupsPlan plan) {
  if (!plan.ok()) {
    throw std::logic_error("apply_param_groups: the plan has problems: " + plan.error());
  }
  std::vector<std::string> differences;
  for (ParamGroupsPlan::Slot& slot : plan.slots_) {
    LeafOptimizer& leaf = *leaves_[slot.leaf];
    double& base_lr = base_lrs_[slot.leaf][slot.group];
    if (slot.base_lr != base_lr)
      differences.push_back(slot.label + " base_lr: checkpoint " +
                            nlohmann::json(slot.base_lr).dump() + ", config " +
                            nlohmann::json(base_lr).dump());
    const nlohmann::json before = leaf.group_hyperparameters(slot.group);
    leaf.param_groups()[slot.group].set_options(std::move(slot.options));
    const nlohmann::json after = leaf.group_hyperparameters(slot.group);
    for (auto it = after.begin(); it != after.end(); ++it) {
      auto old = before.find(it.key());
      if (old != before.end() && *old == *it) continue;
      differences.push_back(slot.label + " " + it.key() + ": checkpoint " + format_value(*it) +
                            ", config " +
                            (old == before.end() ? std::string("(none)") : format_value(*old)));
    }
    base_lr = slot.base_lr;
    leaf.param_groups()[slot.group].options().set_lr(base_lr * lr_factor_);
  }
  return differences;
}

std::vector<std::string> ChainedOptimizer::load_param_groups_state(const nlohmann::json& groups) {
  ParamGroupsPlan plan = plan_param_groups(groups);
  if (!plan.ok()) throw std::invalid_argument(plan.error());
  return apply_param_groups(std::move(plan));
}

NamedTensors ChainedOptimizer::state_dict() const {
  NamedTensors state;
  for (const auto& name : names_) {
    const Entry& e = entries_.at(name);
    LeafOptimizer& leaf = *leaves_[e.leaf];
    // Swapped state is read from the file (copies); otherwise aliases of the live state.
    for (const auto& [state_name, tensor] : swap_ ? swap_->read_state(leaf, e.optimizer_param)
                                                  : leaf.export_state(e.optimizer_param)) {
      state.emplace_back(kOptimizerStatePrefix + name + "." + state_name, tensor);
    }
  }
  return state;
}

}  // namespace mixtrain
