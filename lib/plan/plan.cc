#include "lib/plan/plan.h"

namespace dhelix {

const PlanScheme* Plan::find_scheme(PipelineScheme scheme) const {
  for (const PlanScheme& s : schemes) {
    if (s.scheme == scheme) return &s;
  }
  return nullptr;
}

}  // namespace dhelix
