// The values of the sections components own (section.h), inside a TrainerConfig: one value
// per options type T (default-constructible, copyable), created at its defaults on first use.
// A const read of a section never written gives T's defaults.
#pragma once

#include <any>
#include <map>
#include <typeindex>

namespace mixtrain {

class SectionValues {
 public:
  template <typename T>
  T& get() {
    std::any& slot = values_[std::type_index(typeid(T))];
    if (!slot.has_value()) slot = T{};
    return *std::any_cast<T>(&slot);
  }
  template <typename T>
  const T& get() const {
    const auto it = values_.find(std::type_index(typeid(T)));
    if (it == values_.end()) {
      static const T defaults{};
      return defaults;
    }
    return *std::any_cast<T>(&it->second);
  }

 private:
  std::map<std::type_index, std::any> values_;
};

}  // namespace mixtrain
