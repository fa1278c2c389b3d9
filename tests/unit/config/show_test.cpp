#include "mixtrain/config/show.h"

#include <gtest/gtest.h>

#include <sstream>

#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::TempDir;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The line for `key`, split on runs of spaces.
std::vector<std::string> row_of(const std::string& text, const std::string& key) {
  for (const std::string& line : lines_of(text)) {
    if (line.rfind(key + " ", 0) != 0) continue;
    std::vector<std::string> cells;
    std::istringstream in(line);
    for (std::string cell; in >> cell;) cells.push_back(cell);
    return cells;
  }
  return {};
}

TEST(ShowTest, EveryLeafWithValueAndSource) {
  TempDir dir;
  const std::string path = dir.write("c.yaml", "train:\n  steps: 50\n");
  const ResolvedConfig r = load_config(path, {"data.seq_len=32"});
  const std::string text = format_config_show(r);
  const auto lines = lines_of(text);
  ASSERT_EQ(lines.size(), 1 + r.leaves.size());  // header + one line per leaf
  EXPECT_EQ(row_of(text, "key"), (std::vector<std::string>{"key", "value", "source", "from"}));
  EXPECT_EQ(row_of(text, "train.steps"), (std::vector<std::string>{"train.steps", "50", "file"}));
  EXPECT_EQ(row_of(text, "data.seq_len"),
            (std::vector<std::string>{"data.seq_len", "32", "--set"}));
  EXPECT_EQ(row_of(text, "model.vocab_size"),
            (std::vector<std::string>{"model.vocab_size", "512", "default"}));
  EXPECT_EQ(row_of(text, "optimizer.routing")[2], "derived");
  EXPECT_EQ(row_of(text, "fsdp_config.mix_precision.reduce_dtype")[1], "null");
}

TEST(ShowTest, ColumnsAreAligned) {
  TempDir dir;
  const std::string text = format_config_show(load_config(dir.write("c.yaml", ""), {}));
  const auto lines = lines_of(text);
  const size_t value_column = lines[0].find("value");
  ASSERT_NE(value_column, std::string::npos);
  for (const std::string& line : lines) {
    EXPECT_EQ(line[value_column - 1], ' ') << line;
    EXPECT_NE(line[value_column], ' ') << line;
  }
}

TEST(ShowTest, TomlShowsTheKeyAsWrittenAndDerivations) {
  TempDir dir;
  const std::string text =
      format_config_show(load_config(dir.write("c.toml", testing::kMuonExample1Toml), {}));
  EXPECT_EQ(row_of(text, "optimizer.adamw_config.adamw_lr"),
            (std::vector<std::string>{"optimizer.adamw_config.adamw_lr", "0.00022", "file",
                                      "optimizer.lr"}));
  const auto muon_wd = row_of(text, "optimizer.muon_config.muon_weight_decay");
  ASSERT_GE(muon_wd.size(), 4u);
  EXPECT_EQ(muon_wd[1], "0.1");
  EXPECT_EQ(muon_wd[2], "derived");
  EXPECT_EQ(muon_wd[3], "optimizer.weight_decay");
  EXPECT_EQ(row_of(text, "optimizer.muon_config.muon_ns_variant")[1], "hybrid");
  EXPECT_EQ(row_of(text, "optimizer.muon_config.muon_momentum_style")[1], "ema_add");
  EXPECT_EQ(row_of(text, "optimizer.muon_config.muon_matched_adamw_rms")[1], "0.18");
  EXPECT_EQ(row_of(text, "optimizer.muon_config.muon_qk_clip_tau")[1], "0");  // off by default
  const std::string clip = format_config_show(load_config(
      dir.write("d.toml", "[optimizer]\nname = \"Muon\"\nmuon_qk_clip_tau = 30\n"), {}));
  EXPECT_EQ(row_of(clip, "optimizer.muon_config.muon_qk_clip_tau"),
            (std::vector<std::string>{"optimizer.muon_config.muon_qk_clip_tau", "30", "file",
                                      "optimizer.muon_qk_clip_tau"}));
}

TEST(ShowTest, NorMuonAndCautiousWeightDecayKeys) {
  TempDir dir;
  const std::string text = format_config_show(load_config(
      dir.write("c.toml",
                "[optimizer]\nname = \"Muon\"\nmuon_normuon = true\nmuon_normuon_beta2 = "
                "0.9\nmuon_cautious_weight_decay = true\n"),
      {}));
  EXPECT_EQ(row_of(text, "optimizer.muon_config.muon_normuon"),
            (std::vector<std::string>{"optimizer.muon_config.muon_normuon", "true", "file",
                                      "optimizer.muon_normuon"}));
  EXPECT_EQ(row_of(text, "optimizer.muon_config.muon_normuon_beta2")[1], "0.9");
  EXPECT_EQ(row_of(text, "optimizer.muon_config.muon_normuon_epsilon")[1], "1e-10");
  EXPECT_EQ(row_of(text, "optimizer.muon_config.muon_normuon_epsilon")[2], "default");
  EXPECT_EQ(row_of(text, "optimizer.muon_config.muon_cautious_weight_decay")[1], "true");
}

TEST(ShowTest, NotesSayWhichNewtonSchulzTriplesRun) {
  TempDir dir;
  const std::string m = "optimizer:\n  _target_: Muon\n  muon_config:\n";
  const std::string quintic = format_config_show(
      load_config(dir.write("q.yaml", m + "    muon_ns_variant: quintic\n"), {}));
  EXPECT_EQ(lines_of(quintic).back(),
            "note: optimizer.muon_config.muon_ns_variant quintic runs asym5's five (a, b, c) "
            "triples");
  const std::string pe8 = format_config_show(load_config(
      dir.write("p.yaml", m + "    muon_ns_variant: polar_express\n    muon_ns_steps: 8\n"), {}));
  EXPECT_NE(lines_of(pe8).back().find("8 steps runs the paper's Algorithm 1 triples (safety 1.01)"),
            std::string::npos);
  const std::string pe5 = format_config_show(
      load_config(dir.write("p5.yaml", m + "    muon_ns_variant: polar_express\n"), {}));
  EXPECT_NE(lines_of(pe5).back().find("5 steps runs the published five-step triples (safety 1.02)"),
            std::string::npos);
  // asym5 (the default) names its triples itself: no note.
  const std::string plain = format_config_show(load_config(dir.write("a.yaml", m), {}));
  EXPECT_EQ(plain.find("note:"), std::string::npos);
}

TEST(ShowTest, NoteSaysWhichMatricesMuonPerHeadSplits) {
  TempDir dir;
  const std::string yaml =
      "optimizer:\n  _target_: Muon\n  muon_config:\n    muon_per_head: true\nmodel:\n"
      "  head_dim: 32\n";
  const std::string text = format_config_show(load_config(dir.write("h.yaml", yaml), {}));
  EXPECT_EQ(row_of(text, "optimizer.muon_config.muon_per_head")[1], "true");
  EXPECT_EQ(lines_of(text).back(),
            "note: optimizer.muon_config.muon_per_head runs Newton-Schulz on blocks of 32 rows of "
            "*self_attn.{q,k,v}_proj.weight and of 32 columns of *self_attn.o_proj.weight "
            "(model.head_dim), each scaled by its block's shape");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
