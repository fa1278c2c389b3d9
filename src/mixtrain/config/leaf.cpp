#include "mixtrain/config/leaf.h"

#include "mixtrain/config/schema.h"

namespace mixtrain {

void read_into(bool& out, const DocValue& v, const Where& w) {
  out = read_bool(v, w);
}
void read_into(int64_t& out, const DocValue& v, const Where& w) {
  out = read_int(v, w);
}
void read_into(double& out, const DocValue& v, const Where& w) {
  out = read_float(v, w);
}
void read_into(std::string& out, const DocValue& v, const Where& w) {
  out = read_string(v, w);
}
void read_into(std::optional<std::string>& out, const DocValue& v, const Where& w) {
  if (v.kind == DocValue::Kind::kNull) {
    out.reset();
  } else {
    out = read_string(v, w);
  }
}
void read_into(std::array<double, 2>& out, const DocValue& v, const Where& w) {
  out = read_float_pair(v, w);
}
void read_into(std::vector<std::array<double, 3>>& out, const DocValue& v, const Where& w) {
  out = read_float_triples(v, w);
}
void read_into(std::vector<std::string>& out, const DocValue& v, const Where& w) {
  out = read_string_list(v, w);
}

std::string display(bool v) {
  return v ? "true" : "false";
}
std::string display(int64_t v) {
  return std::to_string(v);
}
std::string display(double v) {
  return format_number(v);
}
std::string display(const std::string& v) {
  return v.empty() ? "\"\"" : v;
}
std::string display(const std::optional<std::string>& v) {
  return v ? *v : "null";
}
std::string display(const std::array<double, 2>& v) {
  return format_pair(v);
}
std::string display(const std::vector<std::array<double, 3>>& v) {
  return format_triples(v);
}
std::string display(const std::vector<std::string>& v) {
  return format_string_list(v);
}

}  // namespace mixtrain
