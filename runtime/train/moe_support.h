#pragma once
// Which mixture-of-experts plans dhelix-run executes: on both backends
// (runtime/model/moe_layers_cpu.h, and runtime/model/moe_layers_padded.h on CUDA), MoE
// layers with any ep that divides the experts, tp >= 1 (expert tensor parallelism 1 or tp),
// cp >= 1, any recompute, a capacity factor or dropless routing, and a shared expert whose
// width tp divides (the planner rounds Fs/tp up; the runtime does not pad). The rest is
// refused by name before any rank trains.

#include <string>

#include "lib/job_spec.h"

namespace dhelix::rt {

/// Throws Error(kUnsupported) "PLAN: dhelix-run does not run <what> yet; <advice>" when the
/// job's MoE layers (or ep > 1) cannot run on `backend` ("cpu", "cuda"); returns otherwise.
void refuse_unsupported_moe(const JobSpec& job, const std::string& plan_file,
                            const std::string& backend);

}  // namespace dhelix::rt
