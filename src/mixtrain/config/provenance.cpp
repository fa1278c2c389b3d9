#include "mixtrain/config/provenance.h"

namespace mixtrain {

const char* value_source_name(ValueSource source) {
  switch (source) {
    case ValueSource::kDefault:
      return "default";
    case ValueSource::kFile:
      return "file";
    case ValueSource::kOverride:
      return "--set";
    case ValueSource::kDerived:
      return "derived";
  }
  return "?";
}

ValueSource Provenance::source(const std::string& key) const {
  const auto it = sources.find(key);
  return it == sources.end() ? ValueSource::kDefault : it->second;
}

std::string Provenance::origin_of(const std::string& key) const {
  return source(key) == ValueSource::kOverride ? "--set" : file;
}

std::string Provenance::user_key(const std::string& key) const {
  const auto it = spelled_as.find(key);
  return it == spelled_as.end() ? key : it->second;
}

std::string format_user_error(const UserError& error, const Provenance& provenance) {
  if (error.key().empty()) return error.what();
  return provenance.origin_of(error.key()) + ": " + provenance.user_key(error.key()) + ": " +
         error.problem();
}

}  // namespace mixtrain
