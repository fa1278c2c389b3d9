// ParamRole names and the attention-projection predicate.
#include "mixtrain/core/param_role.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(ParamRole, EveryRoleHasItsOwnNameAndOnlyQkvoAreAttentionProjections) {
  const ParamRole all[] = {
      ParamRole::kEmbedding,      ParamRole::kAttentionQuery,  ParamRole::kAttentionKey,
      ParamRole::kAttentionValue, ParamRole::kAttentionOutput, ParamRole::kMlp,
      ParamRole::kRouter,         ParamRole::kExpert,          ParamRole::kNorm,
      ParamRole::kOutputHead};
  std::set<std::string> names;
  int attention = 0;
  for (const ParamRole role : all) {
    const std::string name = param_role_name(role);
    EXPECT_NE(name, "unknown");
    EXPECT_TRUE(names.insert(name).second) << name;
    if (is_attention_projection(role)) {
      ++attention;
      EXPECT_EQ(name.rfind("attention_", 0), 0u) << name;
    }
  }
  EXPECT_EQ(attention, 4);
  EXPECT_STREQ(param_role_name(ParamRole::kAttentionOutput), "attention_output");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
