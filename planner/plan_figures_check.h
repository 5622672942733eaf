#pragma once
// The plan checker's recomputation of the figures a plan states but could be made from
// its own job (dhelix-plan --check, dhelix-run before it trains; docs/plan-check.md):
// check 5 (memory) would otherwise trust a plan whose memory_budget or per-stage memory
// was edited, and pass an out-of-memory plan as "memory fits".
//
//   memory_budget  gpu, capacity_bytes, reserve_bytes, usable_bytes: memory_budget() of the
//                  job's GPU under the plan's memory options (planner/memory_model.h)
//   memory         every stage's weight, gradient, optimizer, activation and total bytes
//                  of the dhelix and the Megatron-LM 1F1B schemes: scheme_memory()
//                  (planner/scheme_memory.h), the numbers build_plan writes, byte for byte
//   fits           the dhelix scheme's flag: every recomputed stage within usable_bytes
//
// The memory options are those dhelix-plan plans with (PlanRequest's defaults) and the
// plan's own options.distributed_optimizer. Cost: one pipeline schedule walk per scheme,
// O(pp · micro-batches), no pairing search.
//
// This lives in the planner (the memory model's home); lib/plan/plan_check.h takes it as
// a PlanFiguresCheck, so that the plan library does not depend on the planner.

#include <string>

#include "lib/error.h"
#include "lib/job_spec.h"
#include "lib/plan/plan.h"

namespace dhelix {

/// Adds a problem for every memory figure of `plan` (file `plan_file`) that differs from
/// the one recomputed from `job` (the plan's own, job_from_plan): the JSON pointer, the
/// value in the file and the recomputed value.
void check_plan_memory_figures(const Plan& plan, const JobSpec& job, const std::string& plan_file,
                               ProblemList& problems);

}  // namespace dhelix
