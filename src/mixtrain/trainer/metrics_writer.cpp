#include "mixtrain/trainer/metrics_writer.h"

#include <fcntl.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "mixtrain/core/error.h"
#include "mixtrain/core/posix_file.h"

namespace mixtrain {
namespace {

// nlohmann would also print null for NaN/Inf, but saying so here keeps the file's contract
// independent of the library's serializer choices.
nlohmann::ordered_json finite_or_null(double value) {
  if (std::isfinite(value)) return value;
  return nullptr;
}

}  // namespace

std::string metrics_json_line(const StepMetrics& m) {
  // ordered_json keeps the documented key order, which makes the file easy to read by eye.
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["loss"] = finite_or_null(m.loss);
  j["grad_norm"] = finite_or_null(m.grad_norm);
  j["lr"] = finite_or_null(m.lr);
  j["tokens_per_s"] = finite_or_null(m.tokens_per_s);
  j["elapsed_s"] = finite_or_null(m.elapsed_s);
  j["aux_loss"] = finite_or_null(m.aux_loss);
  j["loss_scale"] = finite_or_null(m.loss_scale);
  j["skipped_steps"] = m.skipped_steps;
  if (m.qk_clip) {
    j["qk_clip_heads"] = m.qk_clip->heads_clipped;
    j["qk_max_logit"] = finite_or_null(m.qk_clip->max_logit);
  }
  if (m.profile) {
    const StepTimes& t = *m.profile;
    j["forward_s"] = finite_or_null(t.forward_s);
    j["backward_s"] = finite_or_null(t.backward_s);
    j["reduce_s"] = finite_or_null(t.reduce_s);
    j["clip_s"] = finite_or_null(t.clip_s);
    j["optimizer_s"] = finite_or_null(t.optimizer_s);
    j["checkpoint_s"] = finite_or_null(t.checkpoint_s);
    j["step_s"] = finite_or_null(t.step_s);
    if (t.peak_device_bytes > 0) j["peak_device_bytes"] = t.peak_device_bytes;
  }
  if (m.ops) {
    auto phases = m.ops->phases();
    phases.emplace_back("step", m.ops->step);
    for (const auto& [name, counts] : phases) j[std::string("ops_") + name] = counts.ops;
    for (const auto& [name, counts] : phases) {
      j[std::string("allocations_") + name] = counts.allocations;
    }
    j["collectives"] = m.ops->collectives;
  }
  for (const MuonGroupTelemetry& t : m.muon) {
    const std::string g = "muon_g" + std::to_string(t.group) + "_";
    j[g + "ortho_error_mean"] = finite_or_null(t.ortho_error_mean);
    j[g + "ortho_error_max"] = finite_or_null(t.ortho_error_max);
    j[g + "ortho_sampled"] = t.sampled;
    j[g + "update_rms"] = finite_or_null(t.update_rms);
  }
  return j.dump();
}

std::string metrics_json_line(const EvalMetrics& m) {
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["eval_loss"] = finite_or_null(m.eval_loss);
  j["eval_ppl"] = finite_or_null(m.eval_ppl);
  j["eval_tokens"] = m.eval_tokens;
  return j.dump();
}

MetricsWriter::MetricsWriter(const std::string& run_dir, int64_t resumed_step) {
  std::filesystem::path dir =
      run_dir.empty() ? std::filesystem::path(".") : std::filesystem::path(run_dir);
  path_ = (dir / "metrics.jsonl").string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw UserError("cannot create run directory " + dir.string() + ": " + ec.message());
  }
  // Lines of the steps before a resume point: kept (lines that do not parse are dropped).
  std::string kept;
  if (resumed_step > 0) {
    std::ifstream earlier(path_);
    std::string line;
    while (std::getline(earlier, line)) {
      const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (row.is_object() && row.contains("step") && row["step"].is_number_integer() &&
          row["step"].get<int64_t>() <= resumed_step)
        kept += line + "\n";
    }
  }
  // O_TRUNC: metrics of an earlier run in the same directory must not mix with ours.
  file_ = FileDescriptor::open(path_, O_WRONLY | O_CREAT | O_TRUNC, 0666);
  if (!file_.valid()) {
    throw UserError("cannot open metrics file " + path_ + ": " + errno_text());
  }
  append(kept);
}

void MetricsWriter::write(const StepMetrics& metrics) {
  append(metrics_json_line(metrics) + "\n");
}

void MetricsWriter::write_eval(const EvalMetrics& metrics) {
  append(metrics_json_line(metrics) + "\n");
}

// Unbuffered: a line is in the file when write() returns (a buffer would hold several steps
// that a SIGINT/SIGKILL or crash would lose, and a reader tailing the file would lag behind).
void MetricsWriter::append(const std::string& text) {
  const IoResult r = write_all(file_.get(), text.data(), text.size());
  if (r.done < text.size()) {
    throw UserError("cannot write metrics file " + path_ + ": " +
                    (r.error != 0 ? errno_text(r.error) : "write failed"));
  }
}

}  // namespace mixtrain
