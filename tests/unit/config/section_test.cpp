// The section registry (section.h): a component's section, registered before the first config
// is read, is read by both dialects, shown, checked with its leaf rule and its cross-key rule,
// resolved, and noted, without config/ knowing it; late or duplicate registrations are refused.
// One TEST, run in a process of its own: the registration must come before anything in the
// process reads the leaves (ctest runs each file's tests in a process of their own; run as part
// of the whole executable, another file's test may have read them first, so the test reruns
// itself in a fresh copy of the executable and passes when that copy does).
#include "mixtrain/config/section.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "mixtrain/config/load.h"
#include "mixtrain/config/schema.h"
#include "mixtrain/config/show.h"
#include "support/child_process.h"
#include "temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

struct FakeOptions {
  int64_t level = 2;
};

ConfigSectionSpec fake_section() {
  ConfigSectionSpec spec;
  spec.name = "fake";
  spec.slot = "optimizer";
  LeafSpec leaf;
  leaf.key = "optimizer.fake_config.fake_level";
  leaf.assign = [](TrainerConfig& c, const DocValue& v, const Where& w) {
    c.optimizer.options.get<FakeOptions>().level = read_int(v, w);
  };
  leaf.format = [](const TrainerConfig& c) {
    return std::to_string(c.optimizer.options.get<FakeOptions>().level);
  };
  leaf.problem = [](const TrainerConfig& c) -> std::string {
    const int64_t level = c.optimizer.options.get<FakeOptions>().level;
    return level > 0 ? "" : "must be > 0, got " + std::to_string(level);
  };
  leaf.toml_key = "optimizer.fake_level";
  spec.leaves.push_back(leaf);
  spec.check = [](const TrainerConfig& c, const ConfigChecker& check) {
    if (c.optimizer.options.get<FakeOptions>().level > 10 && c.train.steps < 5) {
      check.fail("optimizer.fake_config.fake_level", "needs " + check.key("train.steps") + " >= 5");
    }
  };
  spec.notes = [](const TrainerConfig& c) {
    return std::vector<std::string>{"note: fake level " +
                                    std::to_string(c.optimizer.options.get<FakeOptions>().level)};
  };
  spec.resolve = [](TrainerConfig& c, Provenance& provenance) {
    if (c.optimizer.options.get<FakeOptions>().level == 7) {
      c.optimizer.options.get<FakeOptions>().level = 8;
      record_derived(provenance, "optimizer.fake_config.fake_level", "seven means eight");
    }
  };
  return spec;
}

constexpr const char* kFreshProcess = "MIXTRAIN_SECTION_TEST_PROCESS";

TEST(ConfigSections, ARegisteredSectionIsReadShownCheckedAndResolved) {
  if (std::getenv(kFreshProcess) == nullptr) {
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    ASSERT_GT(len, 0);
    self[len] = '\0';
    ::mixtrain::testing::ChildOptions options;
    options.capture_output = true;
    options.env = {{kFreshProcess, "1"}};
    ::mixtrain::testing::ChildProcess child(
        {self, "--gtest_color=no",
         "--gtest_filter=ConfigSections.ARegisteredSectionIsReadShownCheckedAndResolved"},
        options);
    const std::string output = child.read_output();
    EXPECT_EQ(::mixtrain::testing::exit_code_of(child.wait()), 0) << output;
    EXPECT_NE(output.find("[  PASSED  ] 1 test."), std::string::npos) << output;
    return;
  }
  register_config_section(fake_section());
  EXPECT_THROW(register_config_section(fake_section()), std::logic_error);  // same name

  // Its leaf sits in its slot, after optimizer.fp32_main_params, at its default.
  const LeafSpec* leaf = find_canonical_leaf("optimizer.fake_config.fake_level");
  ASSERT_NE(leaf, nullptr);
  EXPECT_EQ(leaf->format(TrainerConfig{}), "2");
  // The leaves are frozen now: a later section is refused.
  ConfigSectionSpec late;
  late.name = "late";
  EXPECT_THROW(register_config_section(late), std::logic_error);

  testing::TempDir dir;
  const ResolvedConfig yaml =
      load_config(dir.write("a.yaml", "optimizer:\n  fake_config:\n    fake_level: 4\n"), {});
  EXPECT_EQ(yaml.config.optimizer.options.get<FakeOptions>().level, 4);
  EXPECT_EQ(yaml.leaf("optimizer.fake_config.fake_level")->source, ValueSource::kFile);
  EXPECT_NE(format_config_show(yaml).find("note: fake level 4\n"), std::string::npos);

  const ResolvedConfig toml = load_config(dir.write("a.toml", "[optimizer]\nfake_level = 3\n"), {});
  EXPECT_EQ(toml.config.optimizer.options.get<FakeOptions>().level, 3);
  EXPECT_EQ(toml.leaf("optimizer.fake_config.fake_level")->origin, "optimizer.fake_level");

  const std::string zero = dir.write("b.yaml", "optimizer:\n  fake_config:\n    fake_level: 0\n");
  EXPECT_EQ(testing::config_error_of([&] { load_config(zero, {}); }),
            zero + ": optimizer.fake_config.fake_level: must be > 0, got 0");
  const std::string toml_zero = dir.write("b.toml", "[optimizer]\nfake_level = 0\n");
  EXPECT_EQ(testing::config_error_of([&] { load_config(toml_zero, {}); }),
            toml_zero + ": optimizer.fake_level: must be > 0, got 0");
  const std::string high =
      dir.write("c.yaml", "optimizer:\n  fake_config:\n    fake_level: 11\ntrain:\n  steps: 2\n");
  EXPECT_EQ(testing::config_error_of([&] { load_config(high, {}); }),
            high + ": optimizer.fake_config.fake_level: needs train.steps >= 5");

  const ResolvedConfig resolved =
      load_config(dir.write("d.yaml", "optimizer:\n  fake_config:\n    fake_level: 7\n"), {});
  EXPECT_EQ(resolved.config.optimizer.options.get<FakeOptions>().level, 8);
  EXPECT_EQ(resolved.leaf("optimizer.fake_config.fake_level")->source, ValueSource::kDerived);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
