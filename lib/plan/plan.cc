#include "lib/plan/plan.h"

namespace dhelix {

const PlanScheme* Plan::find_scheme(const std::string& name) const {
  for (const PlanScheme& scheme : schemes) {
    if (scheme.scheme == name) return &scheme;
  }
  return nullptr;
}

const std::vector<std::string>& plan_scheme_names() {
  static const std::vector<std::string> kNames = {
      "dhelix", "wavelet+", "intra-batch", "megatron-1f1b", "megatron-interleaved",
      "zb-h1",  "zb-v",     "dualpipev"};
  return kNames;
}

const std::vector<std::string>& plan_scheme_shapes() {
  static const std::vector<std::string> kShapes = {"w", "1f1b", "interleaved", "v"};
  return kShapes;
}

const PlanScheme* Plan::best_baseline() const {
  const PlanScheme* best = nullptr;
  for (const PlanScheme& s : schemes) {
    if (s.scheme == "dhelix" || !s.fits || !(s.iteration_us > 0)) continue;
    if (best == nullptr || s.iteration_us < best->iteration_us) best = &s;
  }
  return best;
}

const std::vector<std::string>& plan_comm_types() {
  static const std::vector<std::string> kTypes = {"tp", "cp", "ep", "dp", "pp"};
  return kTypes;
}

}  // namespace dhelix
