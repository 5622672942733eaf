#pragma once
// The job inside a plan. A plan carries a full copy of the job it was made for (model,
// cluster, parallel settings) and hashes of them, so dhelix-run can execute a plan without
// its input files, and can refuse a plan made for another job.

#include <string>

#include "lib/job_spec.h"
#include "lib/plan/plan.h"

namespace dhelix {

/// The job `plan` was made for, rebuilt from plan.job. Throws Error(kInvalidInput) naming
/// `plan_file` when the copy is not a valid job.
JobSpec job_from_plan(const Plan& plan, const std::string& plan_file);

/// Throws Error(kInvalidInput) unless `job` is the job `plan` was made for: the model,
/// cluster and parallel settings must hash to the plan's inputs. The message names both
/// files and every part that differs, e.g. "plan.json was made for model llama-tiny
/// (sha256 1f2e...), job.json names model llama-8b (sha256 9a0b...)".
void check_plan_matches_job(const Plan& plan, const std::string& plan_file, const JobSpec& job,
                            const std::string& job_file);

}  // namespace dhelix
