#pragma once
// dhelix-profile --from-trace: a profile (lib/profile.h) from measured timelines of
// dhelix-run --trace (runtime/train/run_trace.h), so that planning again from what a run
// really did closes the loop profile -> plan -> run -> profile.
//
//   solo times  from sequential traces (dhelix-run --sequential): every op runs alone, one
//               after the other, on the compute thread. Each op slice's duration is one
//               sample of its signature (op id -> signature through the job's layer DAGs and
//               stage extras, as the profile space names them); the statistics are those of
//               the cpu backend (median, p10, p90, min, max over all samples: every layer,
//               micro-batch, rank and step).
//   pairs       from co-executed traces: in an SI block, the first op of each stream starts
//               at the block's barrier, so the first ops of two streams of one block are a
//               co-run "started together" (the profile's definition). finish_a and finish_b
//               are each op's end minus the earlier of the two starts; a pair's figures are
//               the medians over its instances, its makespan the larger finish and its OEF
//               follows from the solo medians (lib/profile.h).
//
// Pairs are fitted as the cpu backend fits its samples (profiler/cpu/cpu_timing.h:
// finish times raised to the solo medians, OEF at least -1).
//
// What the traces do not cover (the intra-batch baseline's chunked ops, pairs the plan did
// not co-run) comes from --base PROFILE, a profile of the same job (the cpu backend's);
// without one, the missing entries are an error that lists them. meta.from_trace counts
// the entries taken from the traces.
//
// Stable figures: 5 steps or more per trace (docs/runtime.md measures how the medians move
// with the step count).

#include <string>
#include <utility>
#include <vector>

#include "lib/job_spec.h"
#include "lib/json_reader.h"
#include "lib/profile.h"

namespace dhelix {

/// A parsed trace and its file name (for messages).
struct NamedTrace {
  std::string file;
  Json trace;
};

/// The profile of `job` from `traces` (and `base` for what they lack; may be null); `meta`
/// is stored with "from_trace" added. Throws Error(kInvalidInput) naming the file for a
/// trace that is not a dhelix-run trace of this job (its name, or its plan identity,
/// lib/plan_identity.h: a trace of the same job name with another sequence length is
/// refused), and listing what is missing when neither the traces nor `base` give an entry
/// of the profile space. A trace without a plan identity (older dhelix-run) is read with a
/// warning added to `warnings` (when given).
Profile profile_from_traces(const JobSpec& job, const std::vector<NamedTrace>& traces,
                            const Profile* base, OrderedJson meta,
                            std::vector<std::string>* warnings = nullptr);

}  // namespace dhelix
