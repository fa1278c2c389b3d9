#include "mixtrain/config/show.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace mixtrain {
namespace {

std::string pad(const std::string& text, size_t width) {
  return text + std::string(width > text.size() ? width - text.size() : 0, ' ');
}

// What runs, where a value names it only indirectly (docs/architecture.md §5).
std::vector<std::string> notes(const TrainerConfig& config) {
  const MuonConfig& muon = config.optimizer.muon;
  const std::string key = "optimizer.muon_config.muon_ns_variant";
  if (muon.ns_variant == "quintic") {
    return {"note: " + key + " quintic runs asym5's five (a, b, c) triples"};
  }
  if (muon.ns_variant == "polar_express" && muon.ns_steps == 8) {
    return {"note: " + key +
            " polar_express with 8 steps runs the paper's Algorithm 1 triples (safety 1.01) on "
            "X / (||X||_F * 1.01 + eps)"};
  }
  if (muon.ns_variant == "polar_express" && muon.ns_steps == 5) {
    return {"note: " + key +
            " polar_express with 5 steps runs the published five-step triples (safety 1.02) on "
            "X / (||X||_F * 1.02 + eps)"};
  }
  return {};
}

// muon_per_head names no matrices itself: which ones it splits, and how.
std::vector<std::string> per_head_notes(const TrainerConfig& config) {
  if (config.optimizer.target != "Muon" || !config.optimizer.muon.per_head) return {};
  const std::string d = std::to_string(config.model.head_dim);
  return {"note: optimizer.muon_config.muon_per_head runs Newton-Schulz on blocks of " + d +
          " rows of *self_attn.{q,k,v}_proj.weight and of " + d +
          " columns of *self_attn.o_proj.weight (model.head_dim), each scaled by its block's "
          "shape"};
}

}  // namespace

std::string format_leaf_table(const ResolvedConfig& resolved, const std::string& indent,
                              bool with_header) {
  size_t key_width = 3, value_width = 5, source_width = 6;
  for (const ResolvedLeaf& leaf : resolved.leaves) {
    key_width = std::max(key_width, leaf.key.size());
    value_width = std::max(value_width, leaf.value.size());
    source_width = std::max(source_width, std::string(value_source_name(leaf.source)).size());
  }
  std::ostringstream out;
  auto row = [&](const std::string& key, const std::string& value, const std::string& source,
                 const std::string& origin) {
    std::string line = indent + pad(key, key_width + 2) + pad(value, value_width + 2) +
                       (origin.empty() ? source : pad(source, source_width + 2) + origin);
    out << line << "\n";
  };
  if (with_header) row("key", "value", "source", "from");
  for (const ResolvedLeaf& leaf : resolved.leaves) {
    row(leaf.key, leaf.value, value_source_name(leaf.source), leaf.origin);
  }
  return out.str();
}

std::string format_config_show(const ResolvedConfig& resolved) {
  std::string text = format_leaf_table(resolved, "", true);
  for (const std::string& note : notes(resolved.config)) text += note + "\n";
  for (const std::string& note : per_head_notes(resolved.config)) text += note + "\n";
  return text;
}

}  // namespace mixtrain
