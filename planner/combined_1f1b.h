#pragma once
// Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm): the steady state of
// 1F1B or interleaved 1F1B with each step's forward and backward run as one overlapped pair
// (an SI block whose cost is Megatron's hand-written node order, handwritten_pairs.h).
//
// Megatron builds it from its own schedule (megatron/core/pipeline_parallel/schedules.py):
// every stage runs one warm-up forward more than without the flag, "to ensure the forward
// and backward computations are independent in all 1f1b steps", then each steady step
// pairs the next forward with the oldest pending backward (combined_1f1b.py,
// forward_backward_step: micro-batch i+1's forward with micro-batch i's backward on one
// stage without pipelining), then runs the remaining backwards alone. A head-loss step
// stays right after the forward it follows. So on the interleaved example of
// baseline_schedules.h, pp = 2, m = 2, v = 2, stage 0 (warm-up 4 forwards already, all of
// them) is unchanged, and plain 1F1B on one stage with m = 3 becomes
//
//     F0 H0 F1+B0 H1 F2+B1 H2 B2
//
// Megatron's constraints, from megatron/core/transformer/transformer_config.py
// (__post_init__, the overlap_moe_expert_parallel_comm checks): with PP > 1 a virtual
// pipeline size must be set (interleaved stages); EP > 1 (dhelix prices EP = 1 and dense
// models as the schedule without the flag: there is no all-to-all to hide); the alltoall or
// flex token dispatcher (dhelix models alltoall); no moe_shared_expert_overlap.
// combined_1f1b_applies says whether dhelix prices the scheme.

#include <cstdint>

#include "planner/pipeline_schedule.h"

namespace dhelix {

/// The combined schedule of `base` (a 1F1B or interleaved 1F1B schedule: forwards,
/// backwards and head-loss steps, no split backward): see the file comment.
PipelineSchedule make_combined_1f1b_schedule(const PipelineSchedule& base);

/// Whether Megatron runs --overlap-moe-expert-parallel-comm on pp stages with virtual
/// pipeline size v: pp = 1, or v > 1.
bool combined_1f1b_applies(int64_t pp, int64_t virtual_pipeline);

}  // namespace dhelix
