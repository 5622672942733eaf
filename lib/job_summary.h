#pragma once
// A human-readable and a JSON summary of a validated job: the model's size and cost, the
// parallel settings, how many GPUs and nodes it uses, the batch shape, and where each kind
// of process group lands (inside one node or across nodes). `dhelix-plan --validate-only`
// prints it.

#include <string>

#include "lib/job_spec.h"
#include "lib/json_reader.h"

namespace dhelix {

/// Multi-line text summary ending in a newline. `job` must pass validate_job().
std::string job_summary_text(const JobSpec& job);

/// The same facts as JSON (stable key order); `job` must pass validate_job().
OrderedJson job_summary_json(const JobSpec& job);

}  // namespace dhelix
