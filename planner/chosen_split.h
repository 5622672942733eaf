#pragma once
// The planner's own uneven split (lib/stage_split_choice.h) applied to a job: the stage work
// it balances comes from op solo times, so dhelix-plan (the profile's times) and --search
// (the times its generated profiles hold) choose the same split for the same job.
//
// Work of one kind = the solo times of its ops, forward and backward, summed: the ops of one
// transformer layer of stage 0's rank (with the job's recompute, which repeats forward ops
// in the backward), of the embedding, and of the final norm, head and loss. Summing ignores
// the overlap of communication with compute inside a layer; it is the same reading for the
// three kinds, so their ratio, which is all the rule uses, is what the ops cost.

#include <functional>
#include <string>

#include "lib/job_spec.h"
#include "lib/layer_dag.h"
#include "lib/stage_split_choice.h"

namespace dhelix {

/// The work of a layer, the embedding and the head-loss step of `job` (its stage 0 rank),
/// by `solo_us`.
SplitTimes split_times(const JobSpec& job, const std::function<double(const Op&)>& solo_us);

/// `job` with first/last_stage_layers set to the chosen split when planner_chooses_split,
/// else `job` unchanged. `note` (may be null) receives a sentence naming the split and why,
/// empty when nothing was chosen. Error(kInvalidInput) when no split exists.
JobSpec with_planned_split(const JobSpec& job, const std::function<double(const Op&)>& solo_us,
                           std::string* note = nullptr);

}  // namespace dhelix
