#include "lib/plan/plan.h"

namespace dhelix {

const PlanScheme* Plan::find_scheme(const std::string& name) const {
  for (const PlanScheme& scheme : schemes) {
    if (scheme.scheme == name) return &scheme;
  }
  return nullptr;
}

const std::vector<std::string>& plan_scheme_names() {
  static const std::vector<std::string> kNames = {"dhelix", "wavelet+", "intra-batch",
                                                  "megatron-1f1b"};
  return kNames;
}

const std::vector<std::string>& plan_comm_types() {
  static const std::vector<std::string> kTypes = {"tp", "cp", "ep", "dp", "pp"};
  return kTypes;
}

}  // namespace dhelix
