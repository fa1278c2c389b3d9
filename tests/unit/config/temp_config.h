// Test helpers for the config tests: a fresh temporary directory (mkdtemp, removed at the end)
// to write config files into, and the message of the ConfigError a call throws.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "mixtrain/core/error.h"
#include "support/scoped_temp_dir.h"

namespace mixtrain::testing {

class TempDir {
 public:
  // Writes `text` to <dir>/<name> and returns the full path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file) << text;
    return file;
  }
  const std::string& path() const { return path_; }

 private:
  test_support::ScopedTempDir dir_{"mixtrain_config_"};  // mkdtemp, removed with the object
  std::string path_ = dir_.path().string();
};

// The ConfigError message `call` throws; fails the test if it throws nothing or something else.
inline std::string config_error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "not one line: " << e.what();
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

// The seeds' configurations, verbatim (fp32-main-params §1; the Muon feature's examples 1-3,
// docs/config.md).
inline const char* kRfcSection1Yaml = R"(model_init_dtype: bfloat16

optimizer:
  _target_: hyper_parallel.auto_models.components.optim.optimizer.optimizer.Muon
  fp32_main_params: true
  muon_config:
    muon_lr: 0.02
    muon_weight_decay: 0.0
    muon_momentum: 0.95
    muon_nesterov: true
    muon_ns_steps: 5
    muon_ns_variant: asym5
  adamw_config:
    adamw_lr: 0.001
    adamw_weight_decay: 0.01

fsdp_config:
  mix_precision:
    param_dtype: bfloat16
    reduce_dtype: float32
    output_dtype: bfloat16
    cast_forward_inputs: true
)";

inline const char* kMuonExample1Toml = R"([job]
custom_config_module = "torchtitan_npu.config.custom_config"    # 使能本代码仓的自定义配置

[optimizer]
name = "Muon"                            # 使用 Muon 混合优化器
lr = 2.2e-4                              # 基础学习率（Muon 和 AdamW 共用）
weight_decay = 0.1
muon_momentum = 0.95                     # Muon 动量因子
muon_enable_nesterov = true              # 启用 Nesterov 动量
muon_ns_steps = 10                       # 正交化步数
muon_adjust_lr_fn = "match_rms_adamw"    # 复用 AdamW 超参（默认值，可省略）
muon_hybrid_ns = true                    # 启用混合 NS
)";

inline const char* kMuonExample2Toml = R"([job]
custom_config_module = "torchtitan_npu.config.custom_config"    # 使能本代码仓的自定义配置

[optimizer]
name = "Muon"                            # 使用 Muon 混合优化器
lr = 3e-4                                # AdamW 部分的学习率
muon_lr = 3e-3                           # Muon 专用学习率（通常为 AdamW lr 的 10 倍）
weight_decay = 0.01
muon_momentum = 0.95                     # Muon 动量因子
muon_enable_nesterov = true              # 启用 Nesterov 动量
muon_ns_steps = 5                        # 正交化步数
muon_adjust_lr_fn = "original"           # 使用独立的 lr 调度器
)";

inline const char* kMuonExample3Toml = R"([job]
custom_config_module = "torchtitan_npu.config.custom_config"    # 使能本代码仓的自定义配置

[optimizer]
name = "Muon"                            # 使用 Muon 混合优化器
lr = 2.2e-4
weight_decay = 0.1
muon_momentum = 0.95
muon_enable_nesterov = true
muon_ns_steps = 10
muon_adjust_lr_fn = "match_rms_adamw"
muon_hybrid_ns = true
swap_optimizer = true                    # 启用 Swap Optimizer，优化器状态卸载到 CPU
swap_merge_buckets = 4                   # 每 4 个 bucket 合并一次 H2D/D2H，平衡性能与显存
)";

}  // namespace mixtrain::testing
