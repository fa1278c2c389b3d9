#include "mixtrain/trainer/optimizer_report.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/types.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "mixtrain/config/dialect_defaults.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/muon_config.h"
#include "mixtrain/optim/param_groups.h"
#include "mixtrain/optim/training_optimizer.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// Four parameters whose routing (yaml dialect, Muon target) is known by hand:
//   embed_tokens.weight  [10, 4] float32   adamw, decay     (embed -> AdamW)
//   layers.0.mlp.weight  [4, 3]  bfloat16  muon             (2-D, no AdamW keyword)
//   layers.0.norm.weight [4]     bfloat16  adamw, no decay  (1-D; "norm")
//   layers.0.attn.bias   [3]     float32   adamw, no decay  (1-D; "bias")
NamedParameters make_params() {
  auto param = [](std::vector<int64_t> shape, c10::ScalarType dtype) {
    return torch::randn(shape).to(dtype).requires_grad_(true);
  };
  return {{"embed_tokens.weight", param({10, 4}, torch::kFloat)},
          {"layers.0.mlp.weight", param({4, 3}, torch::kBFloat16)},
          {"layers.0.norm.weight", param({4}, torch::kBFloat16)},
          {"layers.0.attn.bias", param({3}, torch::kFloat)}};
}

ResolvedConfig yaml_muon_config(bool fp32_main_params) {
  ResolvedConfig resolved;
  resolved.config = dialect_default_config("yaml");
  resolved.config.optimizer.target = "Muon";
  resolved.config.optimizer.fp32_main_params = fp32_main_params;
  resolved.config.mix_precision.reduce_dtype =
      "float32";  // fp32-main-params §2.5: set, never filled in
  adamw_config(resolved.config).lr(0.003);
  adamw_config(resolved.config).weight_decay(0.1);
  muon_config(resolved.config).options.lr(0.05);
  muon_config(resolved.config).options.momentum(0.9);
  return resolved;
}

std::vector<std::string> values(const OptimizerReportTable& table, const std::string& row) {
  const OptimizerReportRow* found = table.row(row);
  EXPECT_NE(found, nullptr) << row;
  return found != nullptr ? found->values : std::vector<std::string>{};
}

using Strings = std::vector<std::string>;

TEST(OptimizerReportTest, GroupsCountsHyperParametersAndMainParams) {
  const ResolvedConfig resolved = yaml_muon_config(true);
  const auto optimizer = build_optimizer(make_params(), resolved.config);
  const OptimizerReport report = collect_optimizer_report(*optimizer, resolved);
  EXPECT_EQ(report.dialect, "yaml");
  ASSERT_EQ(report.tables.size(), 2u);

  const OptimizerReportTable& adamw = report.tables[0];
  EXPECT_EQ(adamw.optimizer, "adamw");
  EXPECT_EQ(adamw.groups, (Strings{"group 0", "group 1 (no decay)"}));
  EXPECT_EQ(values(adamw, "params"), (Strings{"1", "2"}));
  EXPECT_EQ(values(adamw, "elements"), (Strings{"40", "7"}));  // 10*4; 4 + 3
  EXPECT_EQ(values(adamw, "lr"), (Strings{"0.003", "0.003"}));
  EXPECT_EQ(values(adamw, "weight_decay"), (Strings{"0.1", "0"}));
  EXPECT_EQ(values(adamw, "betas"), (Strings{"[0.9, 0.999]", "[0.9, 0.999]"}));
  EXPECT_EQ(values(adamw, "eps"), (Strings{"1e-08", "1e-08"}));
  EXPECT_EQ(values(adamw, "amsgrad"), (Strings{"false", "false"}));
  // Rows in config order, then what no key sets.
  Strings names;
  for (const auto& row : adamw.rows) names.push_back(row.name);
  EXPECT_EQ(names,
            (Strings{"params", "elements", "lr", "weight_decay", "betas", "eps", "amsgrad"}));
  // Keys and constructor defaults of the YAML dialect (torch.optim.AdamW's).
  const OptimizerReportRow* lr = adamw.row("lr");
  ASSERT_NE(lr, nullptr);
  EXPECT_EQ(lr->key, "optimizer.adamw_config.adamw_lr");
  EXPECT_EQ(lr->default_value, "0.001");
  EXPECT_EQ(adamw.row("weight_decay")->default_value, "0.01 (no-decay names: 0)");
  EXPECT_EQ(adamw.row("amsgrad")->key, "-");

  const OptimizerReportTable& muon = report.tables[1];
  EXPECT_EQ(muon.optimizer, "muon");
  EXPECT_EQ(muon.groups, (Strings{"group 0"}));
  EXPECT_EQ(values(muon, "params"), (Strings{"1"}));
  EXPECT_EQ(values(muon, "elements"), (Strings{"12"}));  // 4*3
  EXPECT_EQ(values(muon, "lr"), (Strings{"0.05"}));
  EXPECT_EQ(values(muon, "momentum"), (Strings{"0.9"}));
  EXPECT_EQ(muon.row("momentum")->default_value, "0.95");
  EXPECT_EQ(values(muon, "nesterov"), (Strings{"true"}));
  EXPECT_EQ(values(muon, "ns_steps"), (Strings{"5"}));
  EXPECT_EQ(values(muon, "ns_variant"), (Strings{"asym5"}));
  EXPECT_EQ(values(muon, "ns_dtype"), (Strings{"bfloat16"}));
  EXPECT_EQ(muon.row("ns_epsilon")->key, "optimizer.muon_config.muon_ns_epsilon");

  // Main params: the two bfloat16 params get fp32 copies: 12 + 4 elements, 4 bytes each.
  EXPECT_TRUE(report.main_params.enabled);
  EXPECT_EQ(report.main_params.count, 2);
  EXPECT_EQ(report.main_params.elements, 16);
  EXPECT_EQ(report.main_params.bytes, 64);
  EXPECT_EQ(report.main_params.own_count, 2);

  const std::string text = format_optimizer_report(report, "after construction");
  EXPECT_EQ(text.rfind("Optimizer after construction (", 0), 0u) << text;
  EXPECT_NE(text.find("  fp32 main params: 2 (of the bfloat16/float16 model params), 16 elements, "
                      "64 bytes"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("constructor default (yaml)"), std::string::npos) << text;
}

// The value columns are aligned: in every line of the adamw table, group 0's value starts
// where the header's "group 0" does.
TEST(OptimizerReportTest, ColumnsAreAligned) {
  const ResolvedConfig resolved = yaml_muon_config(true);
  const auto optimizer = build_optimizer(make_params(), resolved.config);
  const std::string text =
      format_optimizer_report(collect_optimizer_report(*optimizer, resolved), "x");
  std::istringstream in(text);
  std::string line, header;
  std::vector<std::string> table;
  while (std::getline(in, line)) {
    if (line.rfind("  adamw ", 0) == 0) header = line;
    if (!header.empty() && line.rfind("  muon ", 0) == 0) break;
    if (!header.empty()) table.push_back(line);
  }
  ASSERT_GE(table.size(), 8u) << text;  // header, params, elements, 5 hyper-parameters
  const size_t column = header.find("group 0");
  ASSERT_NE(column, std::string::npos);
  for (const std::string& row : table) {
    ASSERT_GT(row.size(), column) << row;
    EXPECT_NE(row[column], ' ') << row;
    EXPECT_EQ(row[column - 1], ' ') << row;
  }
}

// What the report shows comes from the optimizer, not the config: a param-group restore
// (as from a checkpoint) that changes the lr and Muon's momentum shows up.
TEST(OptimizerReportTest, ShowsLiveValuesNotTheConfig) {
  const ResolvedConfig resolved = yaml_muon_config(false);
  const auto optimizer = build_optimizer(make_params(), resolved.config);
  nlohmann::json groups = optimizer->chained().param_groups_state();
  ASSERT_EQ(groups.size(), 3u);  // adamw 0, adamw 1, muon 0
  groups[0]["base_lr"] = 0.007;
  groups[2]["momentum"] = 0.8;
  groups[2]["nesterov"] = false;
  optimizer->chained().load_param_groups_state(groups);

  const OptimizerReport report = collect_optimizer_report(*optimizer, resolved);
  EXPECT_EQ(values(report.tables[0], "lr"), (Strings{"0.007", "0.003"}));
  EXPECT_EQ(values(report.tables[1], "momentum"), (Strings{"0.8"}));
  EXPECT_EQ(values(report.tables[1], "nesterov"), (Strings{"false"}));
  // No main params without fp32_main_params.
  EXPECT_FALSE(report.main_params.enabled);
  EXPECT_NE(format_optimizer_report(report, "x").find("fp32 main params: none"), std::string::npos);
}

// TOML: torchtitan's keys and defaults; derived values name what they come from.
TEST(OptimizerReportTest, TomlDialectKeysAndDefaults) {
  const std::string dir = [] {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "mixtrain_report_XXXXXX").string();
    return std::string(mkdtemp(pattern.data()));
  }();
  const std::string file = dir + "/c.toml";
  std::ofstream(file) << "[optimizer]\nname = \"Muon\"\nlr = 0.002\neps = 1e-9\n";
  const ResolvedConfig resolved = load_config(file, {});
  std::filesystem::remove_all(dir);
  const auto optimizer = build_optimizer(make_params(), resolved.config);
  const OptimizerReport report = collect_optimizer_report(*optimizer, resolved);
  EXPECT_EQ(report.dialect, "toml");
  ASSERT_EQ(report.tables.size(), 2u);
  const OptimizerReportTable& adamw = report.tables[0];
  // torchtitan applies the shared weight decay 0.1 to every parameter: one adamw group.
  EXPECT_EQ(adamw.groups, (Strings{"group 0"}));
  EXPECT_EQ(values(adamw, "params"), (Strings{"3"}));
  EXPECT_EQ(values(adamw, "lr"), (Strings{"0.002"}));
  EXPECT_EQ(adamw.row("lr")->key, "optimizer.lr");
  EXPECT_EQ(adamw.row("lr")->default_value, "0.0008");
  EXPECT_EQ(adamw.row("weight_decay")->default_value, "0.1");
  EXPECT_EQ(adamw.row("betas")->key, "optimizer.beta1, optimizer.beta2");
  EXPECT_EQ(adamw.row("betas")->default_value, "[0.9, 0.95]");
  const OptimizerReportTable& muon = report.tables[1];
  EXPECT_EQ(values(muon, "ns_epsilon"), (Strings{"1e-09"}));
  EXPECT_EQ(muon.row("ns_epsilon")->key, "from optimizer.eps");
  // match_rms_adamw (the default): Muon takes optimizer.lr, not optimizer.muon_lr.
  EXPECT_EQ(values(muon, "lr"), (Strings{"0.002"}));
  EXPECT_EQ(muon.row("lr")->key,
            "optimizer.muon_lr; now from optimizer.lr (muon_adjust_lr_fn = match_rms_adamw)");
  EXPECT_EQ(muon.row("matched_adamw_rms")->default_value, "0.18");
  EXPECT_EQ(muon.row("momentum_style")->default_value, "ema_add");
  EXPECT_EQ(values(muon, "momentum_style"), (Strings{"ema_add"}));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
