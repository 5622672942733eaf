#pragma once
// The pipelines people run today, as task lists in pipeline_schedule.h's vocabulary, so that
// the simulator times them with the same costs as DHelix's W (docs/pipeline.md).
//
// Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021; --virtual-pipeline-model-parallel-
// size v, or --num-layers-per-virtual-pipeline-stage L/(pp·v)). Stage p holds v model chunks
// of L/(pp·v) layers; chunk c is virtual stage c·pp + p. Megatron's order, in groups of pp
// micro-batches: virtual forward k runs chunk (k mod pp·v) / pp of micro-batch
// (k / (pp·v))·pp + k mod pp, and virtual backward k the mirror chunk v-1-that. Stage p runs
// (pp-1-p)·2 + (v-1)·pp warm-up forwards (all m·v when m = pp), then alternates one forward
// and one backward, then the rest of the backwards. pp = 2, m = 2, v = 2 (F1.0 = forward
// of micro-batch 1 on model chunk 0):
//
//     stage 0:  F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0
//     stage 1:  F0.0 F1.0 F0.1 H0 F1.1 H1 B0.1 B1.1 B0.0 B1.0
//
// On uniform stages the bubble is (pp-1)/(v·m + pp-1) (a chunk is 1/v of a stage); the
// first stage keeps L·(1 + (pp-1)/(pp·v)) layers' activations (Korthikanti et al. 2022).
// Megatron requires m to be a multiple of pp; so does this generator.
//
// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024). 1F1B with each backward
// split into I (input gradient: what the previous stage waits for) and W (weight gradient):
// stage p runs min(pp-1-p, m) warm-up forwards, then F and I per micro-batch, each I
// followed by the W of the micro-batch p before (stage p defers its W by p micro-batches, so
// that every stage holds pp micro-batches, stage 0's 1F1B count), then the deferred W. The
// backward wave travels at the speed of I alone and the deferred W fill the cool-down: with
// T_F = T_I = T_W the idle per stage is the paper's (pp-1)·(T_F + T_I - T_W) = (pp-1)·T_F,
// a third of 1F1B's, and the peak activations are 1F1B's. pp = 2, m = 3:
//
//     stage 0:  F0 F1 I0 W0 F2 I1 W1 I2 W2
//     stage 1:  F0 H0 I0 F1 H1 I1 W0 F2 H2 I2 W1 W2
//
// ZB-V (same paper, section 6). The layers sit in the V that DHelix's fold uses (down chunk
// then up chunk, head and loss on stage 0), one micro-batch at a time, backward split into
// I and W. The order is built greedily on the stages' chunk times (the planner passes its
// own; unit times by default), as the paper builds its schedules from profiled F/B/W times:
// whenever a stage is free it runs, in this priority, a ready forward of the
// up chunk, a ready I of the up chunk, a ready I of the down chunk, the oldest pending W, and
// a forward of the down chunk, the last only while fewer than 2·pp chunk activations are live
// (1F1B's peak: pp micro-batches of a whole stage); forwards of the up chunk too, unless
// nothing else can run (holding them back then could deadlock: uneven times may go over). The
// planner allows one chunk more (kZbVPlannerExtraChunks), which its greedy needs on real times: its
// ZB-V keeps 2·pp + 1 chunks, one more than the paper's. With T_F = T_I = T_W every stage is busy
// from its first task to the iteration's end: the idle is the unavoidable (pp-1) forward-chunk
// ramp, bubble (pp-1)/(6m + pp-1). The paper's "zero bubble" counts each stage from its own start
// (its optimizer post-validation lets the next iteration start early); dhelix's iteration ends with
// a synchronous optimizer step, so the ramp stays.
//
// DualPipeV (DeepSeek, 2025: the V-shaped "cut-in-half" DualPipe). The same V, with pairs of
// one micro-batch's forward chunk and another's backward chunk overlapped: an SI block, costed
// like DHelix's. Rank r of n = pp runs DeepSeek's eight steps (m >= 2·pp micro-batches):
//     1. 2(n-r-1) forwards of chunk 0 (down)       5. n-r-1 × (B1, F1+B0)
//     2. r+1 × (F0, F1)                            6. r+1 × (B1, B0), the second half split
//     3. n-r-1 × (I1, W, F1)                       7. n-r-1 × (W, I0)
//     4. m-2n+r+1 × (F0+B1, F1+B0)                 8. r+1 × W
// (F0+B1: forward of the next micro-batch on chunk 0 overlapped with the backward of the next
// on chunk 1; the first pair on the last rank runs unoverlapped; W runs the oldest split
// backward's weight gradient.) DeepSeek state its bubble as (PP/2-1)(F&B + B - 3W) with PP/2 = n
// ranks and chunk times, and its activations as PP+1 = 2n+1 chunks (one more than 1F1B).

#include <cstdint>
#include <vector>

#include "planner/pipeline_schedule.h"

namespace dhelix {

/// Megatron's interleaved 1F1B for pp >= 1, v >= 2 model chunks per stage and m >= 1 a
/// multiple of pp; v = 1 gives plain 1F1B (make_one_f_one_b_schedule), as Megatron runs it.
/// Error(kInvalidInput) otherwise.
PipelineSchedule make_interleaved_schedule(int64_t pp, int64_t num_micro_batches, int64_t v);

/// ZB-H1 for pp >= 1, m >= 1.
PipelineSchedule make_zb_h1_schedule(int64_t pp, int64_t num_micro_batches);

/// The times ZB-V's greedy order is built on, per stage, in microseconds (or any unit).
struct GreedyStageTimes {
  double forward_down_us = 1, forward_up_us = 1;
  double input_down_us = 1, input_up_us = 1;    ///< I of each chunk
  double weight_down_us = 1, weight_up_us = 1;  ///< W of each chunk
  double head_loss_us = 0;                      ///< stage 0's head-loss step
  double p2p_us = 0;                            ///< a transfer this stage sends
};

/// ZB-V for pp >= 1, m >= 1: the greedy order of the file comment on `times` (one per stage;
/// empty: unit chunk times, no head-loss or transfer time), down-chunk forwards allowed while
/// fewer than 2·pp + extra_chunks chunk activations are live (0: the paper's ZB-V memory).
PipelineSchedule make_zb_v_schedule(int64_t pp, int64_t num_micro_batches,
                                    const std::vector<GreedyStageTimes>& times = {},
                                    int64_t extra_chunks = 0);

/// The slack the planner gives ZB-V's greedy on real, uneven times: one chunk (2·pp + 1
/// chunks, DualPipeV's PP+1). Without it the greedy on real times leaves a bubble twice
/// 1F1B's on the shipped jobs (the fill waits for room the head-loss step delays).
inline constexpr int64_t kZbVPlannerExtraChunks = 1;

/// DualPipeV for pp >= 1 and m >= 2·pp (Error(kInvalidInput) otherwise).
PipelineSchedule make_dualpipev_schedule(int64_t pp, int64_t num_micro_batches);

/// Whether DualPipeV can run m micro-batches on pp ranks.
bool dualpipev_applies(int64_t pp, int64_t num_micro_batches);

/// Megatron's virtual pipeline size for `layers_per_stage` layers per stage and m
/// micro-batches when the user set none: the largest divisor of layers_per_stage up to
/// kDefaultMaxVirtualPipelineSize, and 1 (plain 1F1B) when m is not a multiple of pp, m < pp
/// or the stages are uneven (layers_per_stage = 0), where Megatron refuses to interleave.
inline constexpr int64_t kDefaultMaxVirtualPipelineSize = 8;
int64_t default_virtual_pipeline_size(int64_t layers_per_stage, int64_t pp,
                                      int64_t num_micro_batches);

}  // namespace dhelix
