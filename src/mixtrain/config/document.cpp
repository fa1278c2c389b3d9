#include "mixtrain/config/document.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "mixtrain/core/error.h"

namespace mixtrain {

const DocValue* DocValue::find(const std::string& key) const {
  for (const auto& entry : entries) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

DocValue* DocValue::find(const std::string& key) {
  return const_cast<DocValue*>(static_cast<const DocValue*>(this)->find(key));
}

std::string DocValue::describe() const {
  std::ostringstream out;
  out.precision(17);
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return std::string("boolean ") + (bool_value ? "true" : "false");
    case Kind::kInt:
      return "integer " + std::to_string(int_value);
    case Kind::kFloat:
      out << "number " << float_value;
      return out.str();
    case Kind::kString:
      return "string '" + string_value + "'";
    case Kind::kList:
      return "a list of " + std::to_string(items.size()) + " items";
    case Kind::kMap:
      return "a mapping";
  }
  return "?";
}

void throw_config_error(const Where& where, const std::string& message) {
  throw ConfigError(where.origin + ": " + where.key + ": " + message);
}

namespace {

[[noreturn]] void expected(const DocValue& v, const Where& where, const std::string& what) {
  throw_config_error(where, "expected " + what + ", got " + v.describe());
}

}  // namespace

bool read_bool(const DocValue& v, const Where& where) {
  if (v.kind != DocValue::Kind::kBool) expected(v, where, "true or false");
  return v.bool_value;
}

int64_t read_int(const DocValue& v, const Where& where) {
  if (v.kind == DocValue::Kind::kInt) return v.int_value;
  // 2^53: beyond it a double no longer holds every integer, so "no fraction" means nothing.
  constexpr double kExactLimit = 9007199254740992.0;
  if (v.kind == DocValue::Kind::kFloat && std::isfinite(v.float_value) &&
      v.float_value == std::trunc(v.float_value) && std::fabs(v.float_value) <= kExactLimit) {
    return static_cast<int64_t>(v.float_value);
  }
  expected(v, where, "an integer");
}

double read_float(const DocValue& v, const Where& where) {
  if (v.kind == DocValue::Kind::kInt) return static_cast<double>(v.int_value);
  if (v.kind != DocValue::Kind::kFloat) expected(v, where, "a number");
  if (!std::isfinite(v.float_value)) expected(v, where, "a finite number");
  return v.float_value;
}

std::string read_string(const DocValue& v, const Where& where) {
  if (v.kind != DocValue::Kind::kString) expected(v, where, "a string");
  return v.string_value;
}

std::array<double, 2> read_float_pair(const DocValue& v, const Where& where) {
  if (v.kind != DocValue::Kind::kList || v.items.size() != 2) {
    expected(v, where, "a list of 2 numbers");
  }
  return {read_float(v.items[0], where), read_float(v.items[1], where)};
}

std::vector<std::array<double, 3>> read_float_triples(const DocValue& v, const Where& where) {
  std::vector<std::array<double, 3>> triples;
  if (v.kind == DocValue::Kind::kNull) return triples;
  if (v.kind != DocValue::Kind::kList) expected(v, where, "a list of [a, b, c] triples");
  for (size_t i = 0; i < v.items.size(); ++i) {
    const DocValue& item = v.items[i];
    if (item.kind != DocValue::Kind::kList || item.items.size() != 3) {
      expected(item, where, "item " + std::to_string(i) + " to be a list of 3 numbers [a, b, c]");
    }
    triples.push_back({read_float(item.items[0], where), read_float(item.items[1], where),
                       read_float(item.items[2], where)});
  }
  return triples;
}

std::vector<std::string> read_string_list(const DocValue& v, const Where& where) {
  std::vector<std::string> strings;
  if (v.kind == DocValue::Kind::kNull) return strings;
  if (v.kind != DocValue::Kind::kList) expected(v, where, "a list of strings");
  for (const DocValue& item : v.items) strings.push_back(read_string(item, where));
  return strings;
}

Override split_override(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError("--set: '" + text + "': expected key=value (e.g. train.steps=30)");
  }
  Override result{text.substr(0, eq), text.substr(eq + 1)};
  if (result.key.find_first_of(" \t") != std::string::npos) {
    throw ConfigError("--set: '" + result.key + "': a key has no spaces (expected key=value)");
  }
  return result;
}

void set_dotted(DocValue& root, const std::string& key, DocValue value, const std::string& file) {
  DocValue* node = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? dot : dot - start);
    if (node->kind == DocValue::Kind::kNull) *node = DocValue::map();
    if (!node->is_map()) {
      throw_config_error({file, key.substr(0, start - 1)},
                         "expected a mapping, got " + node->describe());
    }
    DocValue* child = node->find(part);
    if (child == nullptr) {
      node->entries.emplace_back(part, DocValue());
      child = &node->entries.back().second;
    }
    if (dot == std::string::npos) {
      *child = std::move(value);
      return;
    }
    node = child;
    start = dot + 1;
  }
}

namespace {

// Optimal string alignment distance: Levenshtein plus adjacent transpositions ("lr" / "rl").
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

}  // namespace

std::string closest_key(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& candidate : candidates) {
    const size_t distance = edit_distance(key, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

void throw_unknown_key(const std::string& origin, const std::string& key, const DocValue& value,
                       const std::vector<std::string>& valid,
                       const std::function<std::string(const std::string&)>& translate) {
  std::string full_key = key;
  for (const DocValue* node = &value; node->is_map() && !node->entries.empty();) {
    full_key += "." + node->entries.front().first;
    node = &node->entries.front().second;
  }
  std::string message = "unknown key";
  std::string suggestion = translate ? translate(full_key) : "";
  if (suggestion.empty()) suggestion = closest_key(full_key, valid);
  if (!suggestion.empty()) message += " (did you mean " + suggestion + "?)";
  throw_config_error({origin, full_key}, message);
}

}  // namespace mixtrain
