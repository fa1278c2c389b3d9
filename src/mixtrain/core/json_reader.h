// The one validating reader of JSON fields from a file (checkpoint metadata and state,
// safetensors headers): every failure is one DataError "<where>: <field>: <problem>", made
// printable (keys and values come from a file), e.g.
//   "<dir>/.metadata.json: state.loss_scaler.scale: must be a number, got \"2\"".
// `field` is the full path a user finds the value at ("tensors.w.chunks[1].sizes[0]").
//
// A planning step that must report every problem, not the first, reads independent parts
// with collect(): a part that fails adds its message to the list and the rest still runs.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/error.h"

namespace mixtrain {

class JsonFieldReader {
 public:
  explicit JsonFieldReader(std::string where) : where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& problem) const;
  const nlohmann::json& member(const nlohmann::json& object, const std::string& name,
                               const std::string& field) const;
  // The member, or null when it is absent (an optional field).
  const nlohmann::json* optional_member(const nlohmann::json& object,
                                        const std::string& name) const;
  // member() that must be an object.
  const nlohmann::json& object(const nlohmann::json& parent, const std::string& name,
                               const std::string& field) const;
  // A value that must be a list: "must be a list, got <type>", or with `what` (the
  // elements) "must be a list of <what>, got <value>".
  const nlohmann::json& list(const nlohmann::json& value, const std::string& field,
                             const std::string& what = "") const;
  // An integer >= min (not 1.5 or 1e3; not above int64's range).
  int64_t integer(const nlohmann::json& value, const std::string& field, int64_t min) const;
  std::vector<int64_t> integers(const nlohmann::json& value, const std::string& field,
                                int64_t min) const;
  double number(const nlohmann::json& value, const std::string& field) const;  // finite
  bool boolean(const nlohmann::json& value, const std::string& field) const;
  std::string string(const nlohmann::json& value, const std::string& field) const;
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// Runs `read`; a DataError it throws becomes one more entry of `problems` (its message).
// Returns whether `read` finished. Other exceptions (programming errors) pass through.
template <typename Read>
bool collect(std::vector<std::string>& problems, Read&& read) {
  try {
    std::forward<Read>(read)();
    return true;
  } catch (const DataError& error) {
    problems.emplace_back(error.what());
    return false;
  }
}

}  // namespace mixtrain
