#include "mixtrain/optim/option_fields.h"

#include <algorithm>

namespace mixtrain {

std::tuple<double, double> PairCodec::from_json(HyperparameterReader& r,
                                                const std::string& n) const {
  const nlohmann::json& pair = r.field(n);
  if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number() || !pair[1].is_number()) {
    throw std::invalid_argument(hyperparameter_type_error(n, "an array of two numbers", pair) +
                                (pair.is_array() ? " of size " + std::to_string(pair.size()) : ""));
  }
  return {pair[0].get<double>(), pair[1].get<double>()};
}

nlohmann::json TriplesCodec::json(const Triples& v) const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [a, b, c] : v) out.push_back({a, b, c});
  return out;
}

TriplesCodec::Triples TriplesCodec::from_json(HyperparameterReader& r, const std::string& n) const {
  const nlohmann::json& triples = r.field(n);
  const char* const what = "an array of [a, b, c] number triples";
  if (!triples.is_array()) throw std::invalid_argument(hyperparameter_type_error(n, what, triples));
  Triples out;
  for (const auto& triple : triples) {
    if (!triple.is_array() || triple.size() != 3 ||
        !std::all_of(triple.begin(), triple.end(), [](const auto& x) { return x.is_number(); })) {
      throw std::invalid_argument("field '" + n + "' must be " + std::string(what) +
                                  ", got the element " + triple.dump());
    }
    out.push_back({triple[0].get<double>(), triple[1].get<double>(), triple[2].get<double>()});
  }
  return out;
}

std::vector<std::string> StringListCodec::from_json(HyperparameterReader& r,
                                                    const std::string& n) const {
  const nlohmann::json& list = r.field(n);
  if (!list.is_array() ||
      !std::all_of(list.begin(), list.end(), [](const auto& x) { return x.is_string(); })) {
    throw std::invalid_argument(hyperparameter_type_error(n, "an array of strings", list));
  }
  return list.get<std::vector<std::string>>();
}

}  // namespace mixtrain
