#pragma once
// The dhelix plan's shape: the W, the V or interleaved stages, whichever is fastest and fits
// (dhelix-plan --shape w|v|interleaved|auto, default auto). Internal to planner/
// (plan_builder.cc's step 4).
//
// The W and the V fold the layers the same way (stage p holds chunk p on the way down and
// chunk 2·pp-1-p on the way up, pipeline_schedule.h), and both pair a forward on a down chunk
// with a backward on an up chunk and the reverse, so one pairing search serves both and a
// stage's costs are the same; what differs is the order of the tasks:
//   * the W (pipeline_schedule.h) starts micro-batch j at slot 2·j and pairs it with j-pp:
//     few micro-batches in flight, a ramp and a drain of about 2·pp chunk steps each. Its
//     candidates: whole backwards, and the split drain (w_split_drain.h) under each bound
//     on waiting weight gradients 0, 1, 2, 4, ... (a chunk's activations live until its W);
//   * the V (DualPipeV's eight steps, baseline_schedules.h, m >= 2·pp) keeps up to 2·pp + 1
//     chunks in flight and fills its ramp and drain with split backwards; its overlapped
//     pairs are dhelix's SI blocks (the pairing search's, with the layer-by-layer memory of
//     the W's blocks, not DualPipeV's whole extra chunk).
//   * interleaved stages (Megatron's, v model chunks per stage, chunk c of stage p virtual
//     stage c·pp + p; where megatron-interleaved runs, v > 1) bring the ramp down to 1/v of
//     a stage. Two orders: Megatron's combined 1F1B (combined_1f1b.h: one warm-up forward
//     more, then each step the next forward paired with the oldest pending backward) with
//     every pair an SI block of the pairing search, scaled to the model chunk's layers; and
//     the plain interleaved order, no SI block at all (co-execution gains nothing there: it
//     is megatron-interleaved's run, so dhelix is never slower than it).
// Every candidate is simulated on its stage costs with its memory. The choice (auto): the
// fastest candidate that fits, the first listed on a tie (the W, then the V, then
// interleaved; whole backwards before split, SI blocks before none); none fits: the smallest
// peak (the memory check then names it). --no-split-backward keeps auto to the W with whole
// backwards (the paper's). The plan records every candidate and a one-line reason
// (PlanShapeChoice); where the W or the V wins it records the folded candidates only, so
// that its plan stays byte for byte what it was before interleaved stages were tried.
//
// Example (docs/pipeline.md, model profiles): Llama-3.1-405B on PP 16 with 64 micro-batches:
// the W takes 26.11 s (bubble 19.6 %), its split drain 25.05 s (16.1 %), the V 24.12 s
// (12.3 %, DualPipeV's), so auto takes the V; Llama-39B on PP 2 with 256 micro-batches (CP 2):
// the W with a split drain is faster than the V by under 0.1 % and is taken. medium-tp2-pp2
// (pp 2, m 4, v 6): the V 105.776 s (bubble 8.9 %), interleaved stages without SI blocks
// 100.510 s (4.1 %, megatron-interleaved's), with them 100.473 s: auto takes interleaved
// stages with SI blocks.

#include "lib/plan/plan.h"
#include "planner/plan_context.h"

namespace dhelix::plan_detail {

/// The chosen dhelix run and the record of the choice.
struct DhelixChoice {
  SchemeRun run;
  PlanShapeChoice record;
};

/// Tries the shapes `requested` allows (the file comment) and returns the chosen one; with
/// `split_backward` false only the W with whole backwards (or interleaved stages, when asked
/// for). Error(kInvalidInput) when `requested` is kV and the V does not apply (m < 2·pp) or
/// split backwards are refused, or kInterleaved and the job has no interleaved stages (v = 1).
DhelixChoice choose_dhelix_shape(const Context& ctx, const ExtraCosts& extras,
                                 const MemoryBudget& budget, ShapeRequest requested,
                                 bool split_backward);

}  // namespace dhelix::plan_detail
