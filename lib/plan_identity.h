#pragma once
// The identity of a plan, as a measured trace carries it: which ops a run executes, with
// which shapes (their signatures) and in which pipeline schedule, follows from the plan's
// job alone: the model, the cluster (its GPUs per node place the TP groups, which names
// intra- or inter-node collectives) and the parallel settings (sizes, micro-batch, sequence,
// recompute, uneven stages, cost-model settings). Not from provenance (dates, argv, host),
// so planning an identical job again gives the same identity.
//
//   sha256 = sha256(model_to_json.dump() "\n" cluster_to_json.dump() "\n"
//                   parallel_to_json.dump())
//
// dhelix-run --trace records it (runtime/train/run_trace.cc) with the three JSON objects,
// so that a reader holding another plan (dhelix-diff --measured) or another job
// (dhelix-profile --from-trace) can refuse the trace and name the first field that
// differs ("/parallel/seq_length: 256 in the trace, 64 in the plan").

#include <optional>
#include <string>

#include "lib/job_spec.h"
#include "lib/json_reader.h"

namespace dhelix {

struct PlanIdentity {
  std::string sha256;  ///< hex, 64 characters
  /// {"model": ..., "cluster": ..., "parallel": ...}: what the hash covers.
  OrderedJson job;
};

/// The identity of a plan of `job` (the file comment's formula).
PlanIdentity plan_identity(const JobSpec& job);

/// {"sha256": ..., "job": {...}}: what a trace stores under /otherData/plan_identity.
OrderedJson plan_identity_json(const PlanIdentity& identity);

/// Checks a trace's /otherData (`other_data`, of file `trace_file`) against the identity of
/// the plan or job it is read with (`expected`, described by `against`: "the plan
/// plan.json"). Throws Error(kInvalidInput) naming both hashes and the first differing job
/// field when the trace records another identity (or a malformed one). A trace written
/// before dhelix-run recorded identities (no /otherData/plan_identity) is accepted: the
/// returned warning says that only the job's name could be checked.
std::optional<std::string> check_trace_identity(const Json& other_data,
                                                const PlanIdentity& expected,
                                                const std::string& trace_file,
                                                const std::string& against);

}  // namespace dhelix
