// configure_threads() and the busy-cores warning's rule and text.
#include "mixtrain/trainer/threads.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "mixtrain/distributed/launcher.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(ThreadsTest, WarnsOnlyWithSeveralThreadsOnABusyMachine) {
  EXPECT_EQ(busy_cores_warning(0.99, 2, 2), "");  // nothing else kept a core busy
  EXPECT_EQ(busy_cores_warning(7.0, 1, 2), "");   // one thread waits for nobody
  const std::string warning = busy_cores_warning(1.0, 2, 2);
  EXPECT_NE(warning.find("load average 1.0 on 2 usable cores"), std::string::npos) << warning;
  EXPECT_NE(warning.find("computes on 2 threads"), std::string::npos) << warning;
  EXPECT_NE(warning.find("OMP_NUM_THREADS=1"), std::string::npos) << warning;
  EXPECT_NE(warning.find("OMP_WAIT_POLICY=passive"), std::string::npos) << warning;
}

TEST(ThreadsTest, EveryUsableCoreUnlessOmpNumThreadsIsSet) {
  ::setenv("OMP_NUM_THREADS", "1", 1);
  at::set_num_threads(1);
  configure_threads();
  EXPECT_EQ(at::get_num_threads(), 1);  // an explicit setting is left alone

  ::unsetenv("OMP_NUM_THREADS");
  configure_threads();
  EXPECT_EQ(at::get_num_threads(), threads_per_worker(1));
  at::set_num_threads(1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
