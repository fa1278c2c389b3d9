#include "mixtrain/trainer/metrics_writer.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "mixtrain/core/error.h"

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
  if (m.profile) {
    const StepTimes& t = *m.profile;
    j["forward_s"] = finite_or_null(t.forward_s);
    j["backward_s"] = finite_or_null(t.backward_s);
    j["reduce_s"] = finite_or_null(t.reduce_s);
    j["clip_s"] = finite_or_null(t.clip_s);
    j["optimizer_s"] = finite_or_null(t.optimizer_s);
    j["checkpoint_s"] = finite_or_null(t.checkpoint_s);
    j["step_s"] = finite_or_null(t.step_s);
  }
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
  // "w" truncates: metrics of an earlier run in the same directory must not mix with ours.
  file_.reset(std::fopen(path_.c_str(), "w"));
  if (file_ && !kept.empty() &&
      (std::fwrite(kept.data(), 1, kept.size(), file_.get()) != kept.size() ||
       std::fflush(file_.get()) != 0)) {
    throw UserError("cannot write metrics file " + path_ + ": " + std::strerror(errno));
  }
  if (!file_) {
    throw UserError("cannot open metrics file " + path_ + ": " + std::strerror(errno));
  }
}

void MetricsWriter::write(const StepMetrics& metrics) {
  std::string line = metrics_json_line(metrics);
  line += '\n';
  // fflush after every line: stdio buffering would otherwise hold several steps that a
  // SIGINT/SIGKILL or crash would lose, and a reader tailing the file would lag behind.
  errno = 0;
  if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size() ||
      std::fflush(file_.get()) != 0) {
    int err = errno;
    std::clearerr(file_.get());
    throw UserError("cannot write metrics file " + path_ + ": " +
                    (err != 0 ? std::strerror(err) : "write failed"));
  }
}

}  // namespace mixtrain
