#pragma once
// The analytic `model` profiler backend: times every operator of a job's layer DAGs, and
// every pair the planner may overlap, with the cost model of compute_cost.h,
// collective_cost.h and interference.h (docs/cost-model.md). It needs no GPU.
//
// The profile space of a job: the ops of one layer's forward and backward DAGs and of the
// stage extras (embedding, head, loss) on the first rank of every pipeline stage, then the
// chunked ops of the intra-batch baseline's DAGs (lib/dag_builder_intra_batch.h) on the
// same ranks, deduplicated by signature (first seen wins, so example ids are stable); then
// the pairs
//   compute x communication, local x cross-node communication, and communication x
//   communication of the same class (self-pairs included: both strands run the same op),
// so the planner never has to guess a co-run.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "lib/job_spec.h"
#include "lib/json_reader.h"
#include "lib/profile.h"

namespace dhelix {

/// Called after each timed op or pair with (done, total); may be empty.
using ProgressCallback = std::function<void(int64_t done, int64_t total)>;

/// Distinct ops (by signature) and the index pairs to co-run.
struct ProfileSpace {
  std::vector<Op> ops;
  std::vector<std::pair<int64_t, int64_t>> pairs;  ///< indices into ops, first <= second
};

/// The profile's entry for `op`: its signature, kind, stream and id, with the times
/// measured (or predicted) for it over `samples` runs.
ProfiledOp profiled_op(const Op& op, const TimeStats& time_us, int64_t samples);

/// The ops and pairs a profile of `job` must cover (see the file comment).
ProfileSpace collect_profile_space(const JobSpec& job);

/// A profile of `job` from the analytic model; `meta` is stored as is.
Profile make_model_profile(const JobSpec& job, const OrderedJson& meta,
                           const ProgressCallback& progress = {});

/// The profile space as text lines for `dhelix-profile --list`: "op <stream> <signature>
/// (<example op id>)" for each op, then "pair <signature a> x <signature b>" for each pair.
std::vector<std::string> list_profile_space(const JobSpec& job);

}  // namespace dhelix
