// trainer/optim_replay: the replay validates the config it is given, so one built in C++ meets
// fp32-main-params §2.5 too, before any input is read or output written. (The replay's numerics are
// tests/tools/optim_replay_*_test.cpp.) A tensor- or context-parallel degree is refused by name.
#include "mixtrain/trainer/optim_replay.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(OptimReplay, ConfigBuiltInCodeWithoutReduceDtypeIsRefusedFirst) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("mixtrain_optim_replay_" + std::to_string(::getpid()));
  ResolvedConfig resolved;
  resolved.config.optimizer.fp32_main_params = true;
  // Inputs that do not exist: the config error must come before any attempt to read them.
  const ReplayPaths paths{(dir / "params.safetensors").string(),
                          (dir / "grads.safetensors").string(), (dir / "out.safetensors").string()};
  try {
    run_optim_replay(resolved, paths);
    ADD_FAILURE() << "a config without reduce_dtype was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()),
              "TrainerConfig (built in code): optimizer.fp32_main_params: true requires "
              "fsdp_config.mix_precision.reduce_dtype: float32 (it is not set); set it "
              "explicitly, it is never changed automatically");
  }
  EXPECT_FALSE(std::filesystem::exists(paths.out));
  // With reduce_dtype set the config passes and the replay goes on to its (missing) inputs.
  resolved.config.mix_precision.reduce_dtype = "float32";
  try {
    run_optim_replay(resolved, paths);
    ADD_FAILURE() << "missing inputs were accepted";
  } catch (const ConfigError& error) {
    ADD_FAILURE() << "still a config error: " << error.what();
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find(paths.params), std::string::npos) << error.what();
  }
}

TEST(OptimReplay, TensorOrContextParallelDegreesAreRefused) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("mixtrain_optim_replay_tp_" + std::to_string(::getpid()));
  const ReplayPaths paths{(dir / "params.safetensors").string(),
                          (dir / "grads.safetensors").string(), (dir / "out.safetensors").string()};
  for (const bool tp : {true, false}) {
    ResolvedConfig resolved;
    (tp ? resolved.config.parallel.tp : resolved.config.parallel.cp) = 2;
    try {
      run_optim_replay(resolved, paths);
      ADD_FAILURE() << (tp ? "tp" : "cp") << " 2 was accepted";
    } catch (const ConfigError& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("optim-replay has no model"), std::string::npos) << what;
      EXPECT_NE(what.find("parallel.tp (tensor_parallel_degree) = " + std::string(tp ? "2" : "1")),
                std::string::npos)
          << what;
    }
    EXPECT_FALSE(std::filesystem::exists(paths.out));
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
