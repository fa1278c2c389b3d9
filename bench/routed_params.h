// The parameters of the model a config file builds, counted as the optimizer routes them
// (optim/routing.h), for the bench programs that size memory (bench_swap_optimizer,
// bench_real_size_bench). The model is built through the library (model/registry.h), in float32
// on the CPU: call this after a program's child runs, whose ru_maxrss would count what the
// parent had resident when it forked. Header-only; the including program links the library.
#pragma once

#include <c10/util/accumulate.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/load.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/routing.h"

namespace mixtrain::bench {

struct RoutedParams {
  mixtrain::ModelConfig model;                 // the config's model section, resolved
  int64_t total = 0;                           // every trainable element
  int64_t adamw = 0;                           // elements routed to AdamW
  int64_t muon = 0;                            // elements routed to Muon
  int64_t largest = 0;                         // the largest parameter's elements
  int64_t expert = 0;                          // elements of routed experts (role kExpert)
  double largest_state = 0, second_state = 0;  // the two largest parameters' state_bytes
  bool experts = false;  // some parameter has the role kExpert (routed experts)
  // The elements one token computes with: every parameter but the routed experts it was not
  // routed to (num_experts_per_tok of num_experts in each routed-experts tensor).
  double active() const {
    if (expert == 0) return static_cast<double>(total);
    const MoeConfig& moe = moe_config(model);
    return total - expert * (1.0 - static_cast<double>(moe.num_experts_per_tok) / moe.num_experts);
  }
  // The optimizer state in float32 (it lives on the fp32 main params): exp_avg and exp_avg_sq
  // per AdamW element, momentum_buffer per Muon element.
  double state_bytes() const { return 8.0 * adamw + 4.0 * muon; }
};

// The config at `path` with `overrides` ("key=value", as --set).
inline RoutedParams routed_params(const std::string& path,
                                  const std::vector<std::string>& overrides = {}) {
  const mixtrain::ResolvedConfig resolved = mixtrain::load_config(path, overrides);
  const auto model = mixtrain::build_model(resolved.config.model, 1);
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : model->named_parameters()) named.emplace_back(item.key(), item.value());
  RoutedParams p;
  p.model = resolved.config.model;
  for (const mixtrain::RouteEntry& route :
       mixtrain::route_parameters(named, resolved.config.optimizer)) {
    const int64_t numel = c10::multiply_integers(route.shape);
    if (model->is_expert(route.name)) {
      p.experts = true;
      p.expert += numel;
    }
    p.total += numel;
    p.largest = std::max(p.largest, numel);
    const bool muon = route.optimizer == "muon";
    (muon ? p.muon : p.adamw) += numel;
    const double state = (muon ? 4.0 : 8.0) * numel;
    if (state > p.largest_state) {
      p.second_state = p.largest_state;
      p.largest_state = state;
    } else {
      p.second_state = std::max(p.second_state, state);
    }
  }
  return p;
}

}  // namespace mixtrain::bench
