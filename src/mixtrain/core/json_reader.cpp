#include "mixtrain/core/json_reader.h"

#include <cmath>

#include "mixtrain/core/printable.h"

namespace mixtrain {

void JsonFieldReader::fail(const std::string& field, const std::string& problem) const {
  throw DataError(printable(where_ + ": " + field + ": " + problem));
}

const nlohmann::json& JsonFieldReader::member(const nlohmann::json& object, const std::string& name,
                                              const std::string& field) const {
  auto it = object.find(name);
  if (it == object.end()) fail(field, "missing");
  return *it;
}

const nlohmann::json* JsonFieldReader::optional_member(const nlohmann::json& object,
                                                       const std::string& name) const {
  auto it = object.find(name);
  return it == object.end() ? nullptr : &*it;
}

const nlohmann::json& JsonFieldReader::object(const nlohmann::json& parent, const std::string& name,
                                              const std::string& field) const {
  const nlohmann::json& value = member(parent, name, field);
  if (!value.is_object()) fail(field, "must be an object, got " + value.dump());
  return value;
}

const nlohmann::json& JsonFieldReader::list(const nlohmann::json& value, const std::string& field,
                                            const std::string& what) const {
  if (!value.is_array()) {
    fail(field, "must be a list" + (what.empty() ? "" : " of " + what) + ", got " +
                    (what.empty() ? std::string(value.type_name()) : value.dump()));
  }
  return value;
}

int64_t JsonFieldReader::integer(const nlohmann::json& value, const std::string& field,
                                 int64_t min) const {
  // is_number_integer is false for 1.5 and 1e3; an unsigned value above int64 max is refused.
  if (!value.is_number_integer() ||
      (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(INT64_MAX))) {
    fail(field, "must be an integer, got " + value.dump());
  }
  const int64_t v = value.get<int64_t>();
  if (v < min) fail(field, "must be >= " + std::to_string(min) + ", got " + std::to_string(v));
  return v;
}

std::vector<int64_t> JsonFieldReader::integers(const nlohmann::json& value,
                                               const std::string& field, int64_t min) const {
  list(value, field, "integers");
  std::vector<int64_t> out;
  for (size_t i = 0; i < value.size(); ++i) {
    out.push_back(integer(value[i], field + "[" + std::to_string(i) + "]", min));
  }
  return out;
}

double JsonFieldReader::number(const nlohmann::json& value, const std::string& field) const {
  if (!value.is_number()) fail(field, "must be a number, got " + value.dump());
  const double v = value.get<double>();
  if (!std::isfinite(v)) fail(field, "must be finite, got " + value.dump());
  return v;
}

bool JsonFieldReader::boolean(const nlohmann::json& value, const std::string& field) const {
  if (!value.is_boolean()) fail(field, "must be true or false, got " + value.dump());
  return value.get<bool>();
}

std::string JsonFieldReader::string(const nlohmann::json& value, const std::string& field) const {
  if (!value.is_string()) fail(field, "must be a string, got " + value.dump());
  return value.get<std::string>();
}

}  // namespace mixtrain
