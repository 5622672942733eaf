#include "lib/plan/plan.h"

namespace dhelix {

const PlanScheme* Plan::find_scheme(PipelineScheme scheme) const {
  for (const PlanScheme& s : schemes) {
    if (s.scheme == scheme) return &s;
  }
  return nullptr;
}

const PlanScheme* Plan::best_baseline() const {
  const PlanScheme* best = nullptr;
  for (const PlanScheme& s : schemes) {
    if (!run_as_priced(s.scheme) || !s.fits || !(s.iteration_us > 0)) continue;
    if (best == nullptr || s.iteration_us < best->iteration_us) best = &s;
  }
  return best;
}

const PlanScheme* Plan::upper_bound() const {
  const PlanScheme* s = find_scheme(PipelineScheme::kDualPipeV);
  return s != nullptr && s->fits && s->iteration_us > 0 ? s : nullptr;
}

}  // namespace dhelix
