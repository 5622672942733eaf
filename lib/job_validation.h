#pragma once
// The rules that tie a job's parallel settings to its model and cluster (docs/jobs.md
// explains each and why it exists). Every broken rule is reported, not just the first,
// and each message names where the setting came from (job file and JSON pointer, or the
// flag), the value, and the rule:
//
//   job.json: /parallel/tp: 3 does not divide num_attention_heads = 32

#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/job_spec.h"

namespace dhelix {

/// Every broken rule of `job`; empty when the job can be planned.
ProblemList validate_job(const JobSpec& job);

/// Settings that are allowed but worth a second look (e.g. a sequence longer than the
/// model's context length), as "file: /pointer: message" lines.
std::vector<std::string> job_warnings(const JobSpec& job);

}  // namespace dhelix
