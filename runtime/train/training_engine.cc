#include "runtime/train/training_engine.h"

namespace dhelix::rt {

std::vector<std::string> state_names(const std::vector<std::string>& parameter_names) {
  std::vector<std::string> names;
  for (const std::string& name : parameter_names) {
    names.push_back(name);
    names.push_back("adam_m/" + name);
    names.push_back("adam_v/" + name);
  }
  return names;
}

}  // namespace dhelix::rt
