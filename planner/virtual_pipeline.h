#pragma once
// Interleaved 1F1B's virtual pipeline size v for a plan: the user's
// --virtual-pipeline-model-parallel-size, checked as Megatron checks it, or the default.
//
// Megatron interleaves only when the micro-batches are a multiple of pp and every stage's
// layers split evenly over its v model chunks: with even stages v divides L/pp; with
// --decoder-first/last-pipeline-num-layers v divides F, La and the middle count; with the
// account_for flags v divides (L + e + l)/pp (lib/stage_split.h, interleaved_stage_layers).
// The default is the largest such v up to kDefaultMaxVirtualPipelineSize (8), and 1 (plain
// 1F1B, as Megatron runs it) when none exists. Llama-3-70B (80 layers) on pp 4: 20 per stage,
// v = 5; Llama-3.1-405B on pp 8 with both account_for flags: 16 per stage, v = 8; with the
// planner's own F = La = 15 instead, no v > 1 divides 15 and 16: v = 1, and a requested 8
// is refused naming Megatron's rule.

#include <cstdint>

#include "lib/job_spec.h"

namespace dhelix {

/// v for `job` with `micro_batches` micro-batches; `requested` 0 asks for the default.
/// Error(kInvalidInput) naming Megatron's rule when it refuses a requested v.
int64_t virtual_pipeline_size(const JobSpec& job, int64_t micro_batches, int64_t requested);

}  // namespace dhelix
