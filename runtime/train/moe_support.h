#pragma once
// Which mixture-of-experts plans dhelix-run executes (runtime/model/moe_layers_cpu.h):
// on the CPU backend, MoE layers with any ep that divides the experts, tp >= 1 (expert
// tensor parallelism 1 or tp), cp >= 1 and any recompute, and a shared expert whose width
// tp divides (the planner rounds Fs/tp up; the runtime does not pad). On the CUDA backend
// (runtime/model/moe_layers_padded.h): any ep that divides the experts, with tp = 1, cp = 1,
// a capacity factor > 0, a shared expert or none, no recompute. Everything else is refused by
// name before any rank trains.

#include <string>

#include "lib/job_spec.h"

namespace dhelix::rt {

/// Throws Error(kUnsupported) "PLAN: dhelix-run does not run <what> yet; <advice>" when the
/// job's MoE layers (or ep > 1) cannot run on `backend` ("cpu", "cuda"); returns otherwise.
void refuse_unsupported_moe(const JobSpec& job, const std::string& plan_file,
                            const std::string& backend);

}  // namespace dhelix::rt
