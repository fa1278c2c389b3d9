#include "mixtrain/trainer/step_log.h"

#include <string>

#include "mixtrain/config/schema.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/optim/muon_telemetry.h"
#include "mixtrain/trainer/evaluator.h"

namespace mixtrain {

void StepLog::on_step(const StepMetrics& row) {
  if (!row.muon.empty()) {
    log_info("step " + std::to_string(row.step) + ": " + format_muon_telemetry(row.muon));
  }
  if (row.qk_clip && is_log_step(row.step, log_every_, steps_)) {
    log_info("step " + std::to_string(row.step) + " QK-clip: max attention logit " +
             format_number(row.qk_clip->max_logit) + ", " +
             std::to_string(row.qk_clip->heads_clipped) + " head(s) clipped");
  }
  if (row.ops && is_log_step(row.step, log_every_, steps_)) log_info(row.ops->format(row.step));
}

void StepLog::on_eval(const EvalMetrics& row, const EvalResult& result) {
  log_info("eval at step " + std::to_string(row.step) + ": " + format_eval_result(result));
}

void ProfileLog::on_step(const StepMetrics& row) {
  if (!row.profile) return;
  profile_.add(row.step, *row.profile, tokens_per_step_);
  if (is_log_step(row.step, log_every_, steps_)) {
    log_info(profile_.format());
    profile_.clear();
  }
}

}  // namespace mixtrain
