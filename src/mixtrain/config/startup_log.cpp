#include "mixtrain/config/startup_log.h"

#include <algorithm>
#include <array>
#include <sstream>
#include <vector>

#include "mixtrain/config/dialect_defaults.h"
#include "mixtrain/config/model_sections.h"
#include "mixtrain/config/schema.h"
#include "mixtrain/config/show.h"
#include "mixtrain/core/text_table.h"

namespace mixtrain {
namespace {

using Row = std::array<std::string, 4>;

std::string format_rows(const std::string& title, const std::vector<Row>& rows) {
  std::vector<std::vector<std::string>> cells;
  for (const Row& row : rows) cells.emplace_back(row.begin(), row.end());
  return title + "\n" + format_text_table(cells);
}

}  // namespace

std::string format_trainer_config_block(const ResolvedConfig& resolved) {
  return "Trainer config:\n" + format_leaf_table(resolved, "  ", false);
}

std::string format_model_config_block(const ModelConfig& model) {
  TrainerConfig holder;
  holder.model = model;
  std::ostringstream out;
  out << "Model config:\n";
  const std::string prefix = "model.";
  for (const LeafSpec& spec : canonical_leaves()) {
    if (spec.key.rfind(prefix, 0) != 0 || !model_reads_key(model.name, spec.key)) continue;
    out << "  " << spec.key.substr(prefix.size()) << ": " << spec.format(holder) << "\n";
  }
  return out.str();
}

std::string format_effective_block(const ResolvedConfig& resolved, const std::string& title,
                                   const std::string& prefix,
                                   const std::vector<std::string>& also) {
  const TrainerConfig defaults = dialect_default_config(resolved.config.dialect);
  std::vector<Row> rows = {{"parameter", "constructor default", "configured", "final"}};
  for (const LeafSpec& spec : canonical_leaves()) {
    const bool extra = std::find(also.begin(), also.end(), spec.key) != also.end();
    if (spec.key.rfind(prefix, 0) != 0 && !extra) continue;
    const ResolvedLeaf* leaf = resolved.leaf(spec.key);
    const std::string final_value = spec.format(resolved.config);
    std::string configured = "-";
    if (leaf != nullptr &&
        (leaf->source == ValueSource::kFile || leaf->source == ValueSource::kOverride)) {
      configured = leaf->value + " (" + value_source_name(leaf->source) +
                   (leaf->origin.empty() ? "" : ": " + leaf->origin) + ")";
    } else if (leaf != nullptr && leaf->source == ValueSource::kDerived) {
      configured = "derived from " + leaf->origin;
    }
    rows.push_back(
        {extra ? spec.key.substr(spec.key.rfind('.') + 1) : spec.key.substr(prefix.size()),
         spec.format(defaults), configured, final_value});
  }
  return format_rows(title, rows);
}
}  // namespace mixtrain
